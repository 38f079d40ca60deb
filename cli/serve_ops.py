"""`attnzoo serve`'s operations flags for a whole model (serve/ops.py ServeOps: docs/serving.md "Operations",
"Admission control", "Prefix caching")."""

from __future__ import annotations

import argparse

from .common import number_in, positive

# serve.ops.DEFAULT_PREFIX_CACHE_MB, not imported: building the parser imports nothing of serve (numpy, Ray)
# before the command is known (tests/serve/test_ops.py checks the two agree)
DEFAULT_PREFIX_CACHE_MB = 256.0


def with_ops(sp: argparse.ArgumentParser) -> None:
    sp.add_argument(
        "--max-waiting",
        type=positive,
        default=None,
        help="a whole model on continuous batching: requests queued (not yet running) past which one more is "
        "refused at once with 429 and Retry-After (default: no bound)",
    )
    sp.add_argument(
        "--request-timeout",
        type=number_in(float, 0, low_open=True),
        default=None,
        metavar="S",
        help="end a request S seconds after it arrived: still waiting, 503; running, it ends with finish_reason "
        "'length' and the text so far (default: none)",
    )
    sp.add_argument(
        "--prefix-cache-mb",
        type=number_in(float, 0, below=float(1 << 20)),
        default=DEFAULT_PREFIX_CACHE_MB,
        help=f"keys and values of shared prompt prefixes kept per replica, least recently used out; 0: off "
        f"(default {DEFAULT_PREFIX_CACHE_MB:g})",
    )
    sp.add_argument(
        "--access-log",
        default=None,
        metavar="PATH",
        help="append each request's access-log line (JSON) to PATH (default: the replica's log, in Ray's logs)",
    )
    sp.add_argument("--log-prompts", action="store_true", help="put each prompt's text in its access-log line")


def ops_from(args: argparse.Namespace):
    """The ServeOps of the parsed flags."""
    from serve.ops import ServeOps

    return ServeOps(
        max_waiting=args.max_waiting,
        request_timeout=args.request_timeout,
        prefix_cache_mb=args.prefix_cache_mb,
        access_log=args.access_log,
        log_prompts=args.log_prompts,
    )
