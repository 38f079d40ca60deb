"""Shared fixtures: the registry drives the parametrization (tests follow zoo.names())."""

from __future__ import annotations

import pytest
import torch

import zoo

ALL_NAMES = zoo.names()
# Presets wider than this are exercised with their real spec where it's cheap (counts, audit)
# and at their real width in the ONNX tests marked `slow`.
SMALL_NAMES = [n for n in ALL_NAMES if zoo.count_parameters(zoo.spec(n)) <= 3_000_000]


def make_inputs(spec: zoo.AttentionSpec, b: int = 2, t: int = 5, s: int = 7, dtype=torch.float32):
    """x (b t c), context (b s c_ctx) or None, and the key length."""
    x = torch.randn(b, t, spec.d_model, dtype=dtype)
    if spec.is_cross:
        return x, torch.randn(b, s, spec.d_context, dtype=dtype), s
    return x, None, t


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def cuda_ok():
    from export.session import cuda_status

    ok, why = cuda_status()
    if not ok:
        pytest.skip(f"no working CUDA provider in ONNX Runtime: {why}")
    return True
