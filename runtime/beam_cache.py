"""A beam search's cache reorder, done where the cache lives (runtime/beam_search.py says which rows):

- HostReorder: buffers held as numpy arrays that the bound OrtValues wrap (the CPU's way: runtime/device_decode.py
  LeftRows, a CPU PackedRows, the encoder-decoders' self-attention buffers): each buffer's written positions
  are taken along the row axis in place, `buf[:, .., :length] = buf[idx, .., :length]`; the OrtValues keep their
  memory, so the bound decode step reads the new rows.
- GraphReorder: buffers that are OrtValues on the session's device (a CUDA PackedRows): a two-node-kind graph
  run on the session's provider with I/O binding, Gather(cache, idx, axis=0) into a scratch value per buffer,
  then Identity from the scratch back into the bound buffer (ORT writes a bound output in place), so the
  cache never leaves the device and its addresses stay those a captured CUDA graph replays. Only the row
  indices (rows x int64) go up per step. Tested on the CPU provider; not yet run on a GPU (docs/gpu.md).

A step whose rows are already in order (idx == arange) copies nothing.
"""

from __future__ import annotations

import numpy as np

from .kv_buffers import BF16, BFLOAT16

_ONNX_TYPES = {"tensor(float)": 1, "tensor(float16)": 10, "tensor(int8)": 3, BF16: BFLOAT16}


def position_axes(inputs, names) -> dict[str, int]:
    """Each buffer's positions axis: the dim its graph input names "n" (fp32 (b g n d), int8 keys (b g dk n)),
    else 2."""
    shapes = {x.name: x.shape for x in inputs}
    return {name: next((i for i, d in enumerate(shapes.get(name, ())) if d == "n"), 2) for name in names}


def _identity(idx: np.ndarray) -> bool:
    return bool((idx == np.arange(len(idx))).all())


class HostReorder:
    """Reorders host buffers in place (the module docstring). arrays: name -> array; axes: name -> positions axis."""

    def __init__(self, arrays: dict[str, np.ndarray], axes: dict[str, int]) -> None:
        self.arrays, self.axes = arrays, axes
        self.copies = 0  # the reorders that moved rows (tests read it)

    def __call__(self, idx: np.ndarray, length: int) -> None:
        """Row r of every buffer becomes row idx[r], over positions < length."""
        if _identity(idx):
            return
        for name, arr in self.arrays.items():
            where = [slice(None)] * arr.ndim
            where[self.axes[name]] = slice(0, length)
            view = arr[tuple(where)]
            view[...] = view[idx]  # the fancy index copies first: no row is read after it was overwritten
        self.copies += 1


class GraphReorder:
    """Reorders device-resident OrtValues with Gather then Identity on the session's provider (the module
    docstring). values: name -> the bound OrtValue; types: name -> its ONNX element type ("tensor(float)", ...)."""

    def __init__(self, sess, values: dict, types: dict[str, str]) -> None:
        import onnxruntime as ort
        from onnx import TensorProto, helper

        self.values, self.copies = values, 0
        names = list(values)
        shape = lambda i: [f"d{i}_{j}" for j in range(len(values[names[i]].shape()))]  # noqa: E731
        gather, copy = [], []
        ins, outs, s_ins, s_outs = [], [], [], []
        for i, name in enumerate(names):
            t = _ONNX_TYPES[types[name]]
            gather.append(helper.make_node("Gather", [f"c{i}", "idx"], [f"s{i}"], axis=0))
            copy.append(helper.make_node("Identity", [f"t{i}"], [f"o{i}"]))
            ins.append(helper.make_tensor_value_info(f"c{i}", t, shape(i)))
            outs.append(helper.make_tensor_value_info(f"s{i}", t, shape(i)))
            s_ins.append(helper.make_tensor_value_info(f"t{i}", t, shape(i)))
            s_outs.append(helper.make_tensor_value_info(f"o{i}", t, shape(i)))
        idx = helper.make_tensor_value_info("idx", TensorProto.INT64, ["rows"])
        opset = [helper.make_opsetid("", 17)]
        models = [
            helper.make_model(helper.make_graph(gather, "beam_gather", [*ins, idx], outs), opset_imports=opset),
            helper.make_model(helper.make_graph(copy, "beam_copy", s_ins, s_outs), opset_imports=opset),
        ]
        options = ort.SessionOptions()
        options.log_severity_level = 3
        providers = sess.session_providers
        self.gather, self.copy = (
            ort.InferenceSession(_ir(m).SerializeToString(), options, providers=providers) for m in models
        )
        device = "cuda" if sess.provider == "cuda" else "cpu"
        self.rows = values[names[0]].shape()[0]
        self.idx_host = np.zeros((self.rows,), np.int64)
        self.idx = ort.OrtValue.ortvalue_from_numpy(self.idx_host, device, 0)
        scratch = {
            name: ort.OrtValue.ortvalue_from_shape_and_type(values[name].shape(), _ONNX_TYPES[types[name]], device, 0)
            for name in names
        }
        self.gather_binding, self.copy_binding = self.gather.io_binding(), self.copy.io_binding()
        for i, name in enumerate(names):
            self.gather_binding.bind_ortvalue_input(f"c{i}", values[name])
            self.gather_binding.bind_ortvalue_output(f"s{i}", scratch[name])
            self.copy_binding.bind_ortvalue_input(f"t{i}", scratch[name])
            self.copy_binding.bind_ortvalue_output(f"o{i}", values[name])
        self.gather_binding.bind_ortvalue_input("idx", self.idx)
        self.scratch = scratch  # alive as long as the bindings

    def __call__(self, idx: np.ndarray, length: int) -> None:
        """Row r of every buffer becomes row idx[r] (every position: a device buffer's shape is fixed)."""
        if _identity(idx):
            return
        self.idx_host[:] = idx
        self.idx.update_inplace(self.idx_host)
        self.gather.run_with_iobinding(self.gather_binding)
        self.copy.run_with_iobinding(self.copy_binding)
        self.copies += 1


def _ir(model):
    model.ir_version = 9  # what onnxruntime 1.17+ reads, whatever the onnx package writes by default
    return model


__all__ = ["GraphReorder", "HostReorder", "position_axes"]
