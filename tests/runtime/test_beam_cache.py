"""A beam search's cache reorder (runtime/beam_cache.py): host buffers taken along their rows in place over
the written positions, whatever their positions axis (fp32 (b g n d), int8 keys (b g dk n)); device OrtValues
through the Gather + Identity graphs, run here on the CPU provider; a step in order copies nothing."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from runtime.beam_cache import GraphReorder, HostReorder, position_axes


class _Input:  # an onnxruntime NodeArg's name and shape
    def __init__(self, name, shape):
        self.name, self.shape = name, shape


def buffers(rng):
    return {
        "past_key_values.0.key": rng.standard_normal((6, 2, 8, 4)).astype(np.float32),
        "past_key_values.0.value": rng.integers(-128, 127, (6, 2, 4, 8)).astype(np.int8),  # (b g dk n)
    }


def test_position_axes_are_read_from_the_graphs_dims():
    inputs = [_Input("a", ["b", 2, "n", 4]), _Input("k", ["b", 2, 4, "n"]), _Input("s", ["b", 2, 1, "n"])]
    assert position_axes(inputs, ["a", "k", "s", "missing"]) == {"a": 2, "k": 3, "s": 3, "missing": 2}


def test_host_buffers_are_reordered_in_place_over_the_written_positions():
    rng = np.random.default_rng(0)
    arrays = buffers(rng)
    before = {k: v.copy() for k, v in arrays.items()}
    held = {k: v.ctypes.data for k, v in arrays.items()}  # the memory the bound OrtValues wrap
    reorder = HostReorder(arrays, {"past_key_values.0.key": 2, "past_key_values.0.value": 3})
    idx = np.array([1, 1, 0, 5, 3, 3])
    reorder(idx, 5)
    assert np.array_equal(arrays["past_key_values.0.key"][:, :, :5], before["past_key_values.0.key"][idx, :, :5])
    assert np.array_equal(arrays["past_key_values.0.key"][:, :, 5:], before["past_key_values.0.key"][:, :, 5:])
    assert np.array_equal(arrays["past_key_values.0.value"][..., :5], before["past_key_values.0.value"][idx, ..., :5])
    assert np.array_equal(arrays["past_key_values.0.value"][..., 5:], before["past_key_values.0.value"][..., 5:])
    assert {k: v.ctypes.data for k, v in arrays.items()} == held and reorder.copies == 1
    reorder(np.arange(6), 5)  # in order: nothing moves
    assert reorder.copies == 1


@pytest.mark.parametrize("seed", [0, 1])
def test_device_values_are_reordered_by_the_gather_graph_on_the_sessions_provider(seed):
    rng = np.random.default_rng(seed)
    arrays = buffers(rng)
    before = {k: v.copy() for k, v in arrays.items()}
    values = {k: ort.OrtValue.ortvalue_from_numpy(v, "cpu", 0) for k, v in arrays.items()}

    class Session:  # what GraphReorder reads of a RuntimeSession
        provider = "cpu"
        session_providers = ["CPUExecutionProvider"]

    types = {"past_key_values.0.key": "tensor(float)", "past_key_values.0.value": "tensor(int8)"}
    reorder = GraphReorder(Session(), values, types)
    idx = rng.permutation(6)
    reorder(idx, 3)
    for k in arrays:
        assert np.array_equal(values[k].numpy(), before[k][idx]), k  # every position: a device buffer's shape is fixed
    reorder(np.arange(6), 3)
    assert reorder.copies == 1
