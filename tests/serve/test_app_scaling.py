"""serve.app's sizing of a deployment (`attnzoo serve --replicas N`, `--autoscale MIN:MAX` and its knobs): the options
handed to Ray Serve, read back through Ray Serve's own deployment and AutoscalingConfig (its validation, its
defaults), the refusals of settings that cannot serve, and the CLI's flags. No Ray cluster is started; the cluster
itself (replicas growing, shrinking, spread over two nodes) is tests/serve/test_cluster.py (slow)."""

from __future__ import annotations

import pytest

from serve import ServeError
from serve.app import check_options, scaling

ray_serve = pytest.importorskip("ray.serve")

BASE = dict(
    provider="cpu", replicas=1, max_batch=4, max_tokens=100, port=8000, max_new_tokens=16, capacity=64,
    batching="continuous", batch_wait_ms=5.0, cpus_per_replica=1.0, route_prefix="/",
)  # fmt: skip
KNOBS = dict(target_ongoing_requests=2.0, max_ongoing_requests=None, upscale_delay_s=30.0, downscale_delay_s=600.0)


def _deployment(**sizing):
    """Ray Serve's own Deployment made with those options: what it would run."""

    class Model:
        pass

    return ray_serve.deployment(Model, name="onnx", **sizing)


def test_a_fixed_number_of_replicas():
    sizing = scaling(replicas=3, max_batch=4, autoscale=None, autoscale_window_s=30.0, **KNOBS)
    dep = _deployment(**sizing)
    assert dep.num_replicas == 3 and dep.max_ongoing_requests == 8  # room for two batches of 4, at least 8
    assert dep._deployment_config.autoscaling_config is None


def test_autoscale_hands_ray_serve_its_own_autoscaling_config():
    knobs = {**KNOBS, "target_ongoing_requests": 1.5, "max_ongoing_requests": 3, "upscale_delay_s": 0.0}
    sizing = scaling(replicas=5, max_batch=4, autoscale=(1, 4), autoscale_window_s=2.0, **knobs)
    dep = _deployment(**sizing)
    config = dep._deployment_config.autoscaling_config
    assert (config.min_replicas, config.max_replicas, config.initial_replicas) == (1, 4, 4)  # 5 clipped into 1..4
    assert config.target_ongoing_requests == 1.5 and config.look_back_period_s == 2.0
    assert config.metrics_interval_s < config.look_back_period_s  # else Ray warns it will refuse it
    assert (config.upscale_delay_s, config.downscale_delay_s) == (0.0, 600.0)
    assert dep.max_ongoing_requests == 3


def test_autoscale_from_zero_starts_at_its_minimum():
    sizing = scaling(replicas=1, max_batch=4, autoscale=(0, 2), autoscale_window_s=30.0, **KNOBS)
    config = _deployment(**sizing)._deployment_config.autoscaling_config
    assert (config.min_replicas, config.initial_replicas, config.max_replicas) == (0, 1, 2)


@pytest.mark.parametrize(
    "extra, said",
    [
        ({"autoscale": (3, 1)}, "MIN:MAX"),
        ({"autoscale": (0, 0)}, "MAX >= 1"),
        ({"autoscale": (1, 2), "target_ongoing_requests": 0}, "target_ongoing_requests"),
        ({"autoscale": (1, 2), "downscale_delay_s": -1}, "downscale_delay_s"),
        ({"autoscale": (1, 2), "autoscale_window_s": 0}, "autoscale_window_s"),
        ({"max_ongoing_requests": 0}, "max_ongoing_requests"),
    ],
)
def test_settings_that_cannot_scale_are_refused(extra, said):
    with pytest.raises(ServeError, match=said):
        check_options(**BASE, **extra)


def test_the_cli_flags_reach_the_options():
    import argparse

    from cli.serve_scale import add_scale_flags, scale_options

    parser = argparse.ArgumentParser()
    add_scale_flags(parser)
    args = parser.parse_args(
        ["--autoscale", "1:3", "--target-ongoing-requests", "1", "--upscale-delay", "0", "--max-ongoing-requests", "2"]
    )
    options = scale_options(args)
    assert options["autoscale"] == (1, 3) and options["target_ongoing_requests"] == 1.0
    assert options["upscale_delay_s"] == 0.0 and options["max_ongoing_requests"] == 2
    assert scale_options(parser.parse_args([]))["autoscale"] is None
    for bad in ("3:1", "1", "a:b", "0:0"):
        with pytest.raises(SystemExit):
            parser.parse_args(["--autoscale", bad])
