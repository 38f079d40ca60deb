"""Shared fixtures (shared helpers live in helpers.py; the registry drives the parametrization)."""

from __future__ import annotations

import pytest
import torch


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
