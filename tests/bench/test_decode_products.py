"""scripts/decode_products.py: its operand orders (and the torch reference) compute the same attention, and the
script runs."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "decode_products.py"


def _script():
    spec = importlib.util.spec_from_file_location("decode_products", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_operand_order_is_the_same_attention():
    """Each order (ONNX graph or torch call) gives softmax(Q K^T) V per query head against its kv head, written
    out in numpy: the fp32 orders to rounding, fp16 to its rounding, the int8 caches (k8, kv8) to their quantization."""
    dp = _script()
    rng = np.random.default_rng(0)
    b, n = 2, 2 * dp.CHUNK  # h1c in two chunks
    q = rng.standard_normal((b, dp.G, dp.R, dp.D), np.float32) * dp.D**-0.5  # the scale folded in, as measured
    k = rng.standard_normal((b, dp.G, n, dp.D), np.float32)
    v = rng.standard_normal((b, dp.G, n, dp.D), np.float32)
    scores = np.einsum("bgrd,bgnd->bgrn", q.astype(np.float64), k)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    want = np.einsum("bgrn,bgnd->bgrd", weights / weights.sum(-1, keepdims=True), v)
    np.testing.assert_allclose(dp.reference(q, k, v), want, rtol=1e-12)
    threads = torch.get_num_threads()  # the torch order sets it: given back for the tests after this one
    try:
        for order in dp.ORDERS:
            feeds = dp.feeds(order, q, k, v)
            y = dp.runner(order, b, n, threads=1)(feeds).reshape(want.shape)
            error = np.abs(y - want).max() / np.abs(want).max()
            if order in ("k8", "kv8"):
                assert feeds["k"].dtype == np.int8 and (feeds["v"].dtype == np.int8) == (order == "kv8")
                # quantized in 63 levels (dp.INT8_LEVELS: exact products on every x86 host), by its rounding
                assert 1e-4 < error < (8e-2 if order == "kv8" else 4e-2), (order, error)
            elif order == "qk16":
                assert feeds["k"].dtype == np.float16 and 1e-5 < error < 5e-3, error  # half precision's rounding
            else:
                np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4, err_msg=order)
    finally:
        torch.set_num_threads(threads)


def test_the_script_prints_a_row_per_order_and_refuses_an_unknown_one():
    run = [sys.executable, str(SCRIPT), "--past", "32", "--batch", "1", "--threads", "1", "--bytes", "1e5"]
    out = subprocess.run([*run, "--orders", "qk,h1"], capture_output=True, text=True, check=True).stdout
    rows = [line for line in out.splitlines() if line.startswith("| 1 | 32 |")]
    assert [r.split("|")[3].strip() for r in rows] == ["qk", "h1"], out
    assert all(float(r.split("|")[4]) > 0 for r in rows), out
    assert all(0 < float(r.split("|")[6]) < 1e-5 for r in rows), out  # each order's error against numpy
    bad = subprocess.run([*run, "--orders", "qq"], capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown order(s) ['qq']" in bad.stderr


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__]))
