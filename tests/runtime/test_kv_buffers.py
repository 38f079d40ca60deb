"""Cache buffers in the graph's element type (runtime/kv_buffers.py): bfloat16, which numpy lacks, is held as
its uint16 bits, bound to ONNX Runtime as BFLOAT16 and read back widened exactly; numpy feeds refuse it."""

from collections import namedtuple

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

from runtime.kv_buffers import BF16, as_float32, buffer_arrays, buffer_bytes, ort_value, widen
from runtime.providers import SessionError

Arg = namedtuple("Arg", "name type shape")
INPUTS = [
    Arg("input_ids", "tensor(int64)", ["b", "t"]),
    Arg("past_key_values.0.key", BF16, ["b", 2, "n", 4]),
    Arg("past_key_values.0.value", BF16, ["b", 2, "n", 4]),
]


def _bits(x: torch.Tensor) -> np.ndarray:
    return x.contiguous().view(torch.int16).numpy().view(np.uint16).copy()


def test_a_bfloat16_cache_is_its_bits_and_numpy_feeds_refuse_it():
    with pytest.raises(SessionError, match=r"past_key_values.0.key is bfloat16, which numpy cannot feed") as e:
        buffer_arrays(INPUTS, 3, 7, "past_key_values.")
    assert "\n" not in str(e.value)
    got = buffer_arrays(INPUTS, 3, 7, "past_key_values.", bf16_bits=True)
    assert {k: (v.dtype, v.shape) for k, v in got.items()} == {
        "past_key_values.0.key": (np.uint16, (3, 2, 7, 4)),
        "past_key_values.0.value": (np.uint16, (3, 2, 7, 4)),
    }
    assert not any(v.any() for v in got.values())  # zero bits are bf16 zeros
    assert buffer_bytes(INPUTS, 3, 7, "past_key_values.") == 2 * 2 * 3 * 2 * 7 * 4


def test_bfloat16_bits_widen_exactly():
    x = torch.randn(257) * torch.logspace(-30, 30, 257)
    x = torch.cat([x, torch.tensor([0.0, -0.0, float("inf"), -float("inf")])]).to(torch.bfloat16)
    assert np.array_equal(widen(_bits(x)), x.float().numpy())


def test_a_bound_bfloat16_buffer_round_trips_through_onnx_runtime():
    """A graph taking and giving bfloat16 (Identity: the CPU provider has it for every type), fed and read through
    IO binding with OrtValues made by ort_value, as the decode drivers bind caches and logits."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "bf16",
        [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, ["b", 3])],
        [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, ["b", 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    onnx.checker.check_model(model)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = torch.randn(2, 3).to(torch.bfloat16)
    out = np.zeros((2, 3), np.uint16)
    binding = sess.io_binding()
    binding.bind_ortvalue_input("x", ort_value(_bits(x), BF16, "cpu"))
    y = ort_value(out, BF16, "cpu")
    binding.bind_ortvalue_output("y", y)
    sess.run_with_iobinding(binding)
    assert y.data_type() == BF16
    assert np.array_equal(as_float32(y), x.float().numpy())
    assert np.array_equal(widen(out), x.float().numpy())  # the CPU OrtValue wrote into the array it wraps
    with pytest.raises(SessionError, match="uint16 bits, not float32"):
        ort_value(np.zeros(3, np.float32), BF16, "cpu")
