"""Shared fixtures (shared helpers live in helpers.py; the registry drives the parametrization)."""

from __future__ import annotations

import os

import pytest
import torch

# A user's own presets (ATTNZOO_PRESETS) must not join the registry-driven parametrization: the
# registry reads the variable when it first loads, at collection. Tests that need it set it
# themselves (tests/test_user_presets.py, with monkeypatch and a fresh registry).
os.environ.pop("ATTNZOO_PRESETS", None)


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
