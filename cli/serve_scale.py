"""`attnzoo serve`'s scaling flags: a fixed number of replicas, or Ray Serve's own autoscaler (--autoscale MIN:MAX
and its knobs, serve.app.scaling); and whether a joined cluster's HTTP proxy retries a lost replica's requests
(serve/failover.py)."""

from __future__ import annotations

import argparse

from .common import number_in, positive

_nonneg = number_in(float, 0)
_positive_float = number_in(float, 0, low_open=True)


def add_scale_flags(sp) -> None:
    sp.add_argument(
        "--autoscale",
        type=_autoscale,
        default=None,
        metavar="MIN:MAX",
        help="let Ray Serve's autoscaler size the deployment between MIN and MAX replicas (autoscaling_config)",
    )
    sp.add_argument(
        "--target-ongoing-requests",
        type=_positive_float,
        default=2.0,
        help="--autoscale: the requests per replica it aims at (default 2)",
    )
    sp.add_argument(
        "--max-ongoing-requests",
        type=positive,
        default=None,
        help="most requests a replica takes at once, the rest wait in Serve's router (default max(2 * max-batch, 8))",
    )
    sp.add_argument(
        "--upscale-delay", type=_nonneg, default=30.0, help="--autoscale: seconds of load before adding (default 30)"
    )
    sp.add_argument(
        "--downscale-delay", type=_nonneg, default=600.0, help="--autoscale: seconds idle before removing (default 600)"
    )
    sp.add_argument(
        "--autoscale-window",
        type=_positive_float,
        default=30.0,
        help="--autoscale: seconds its load figures are averaged over (look_back_period_s, default 30)",
    )


def scale_options(args: argparse.Namespace) -> dict:
    """The flags as serve.app.start's keywords."""
    return {
        "autoscale": args.autoscale,
        "target_ongoing_requests": args.target_ongoing_requests,
        "max_ongoing_requests": args.max_ongoing_requests,
        "upscale_delay_s": args.upscale_delay,
        "downscale_delay_s": args.downscale_delay,
        "autoscale_window_s": args.autoscale_window,
    }


def failover_on(url: str) -> bool:
    """Whether the HTTP proxy in front of `url` runs serve/failover.py (its answers carry x-attnzoo-failover)."""
    import urllib.request

    from serve.failover import HEADER

    try:
        with urllib.request.urlopen(f"{url}healthz", timeout=10) as reply:
            return reply.headers.get(HEADER.decode()) is not None
    except OSError:
        return False


def _autoscale(text: str) -> tuple[int, int]:
    """An argparse type: MIN:MAX replicas for Ray Serve's autoscaler, 0 <= MIN <= MAX, MAX >= 1."""
    low, sep, high = text.partition(":")
    try:
        pair = (int(low), int(high))
    except ValueError:
        pair = None
    if not sep or pair is None or not 0 <= pair[0] <= pair[1] or pair[1] < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not MIN:MAX replicas (integers, 0 <= MIN <= MAX, MAX >= 1)")
    return pair
