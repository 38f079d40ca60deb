"""A whole model's cache buffers as its graph declares them: each `past_key_values.*` input in its own element
type and axes ("b" rows, "n" positions, the rest fixed), so an fp32 cache's (b g n d) and an int8 cache's
(b g dk n) keys and (b g 1 n) scales (export/kv_int8.py) are allocated by the same code. numpy only, but for
`ort_value` and `as_float32`, which meet onnxruntime's OrtValue.

numpy has no bfloat16: a bf16 buffer (a CUDA export's cache and logits) is held as its uint16 bits
(`buffer_arrays(..., bf16_bits=True)`), bound through `ort_value` as ONNX's BFLOAT16 and read back through
`as_float32`, which widens the bits exactly."""

from __future__ import annotations

import numpy as np

from .providers import SessionError

BFLOAT16 = 16  # onnx.TensorProto.BFLOAT16
BF16 = "tensor(bfloat16)"
_NP = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int8)": np.int8, BF16: np.uint16}


def _shape(x, b: int, n: int) -> list[int]:
    return [b if d == "b" else n if d == "n" else int(d) for d in x.shape]


def _np_type(x, bf16_bits: bool):
    if x.type == BF16 and not bf16_bits:
        raise SessionError(
            f"{x.name} is bfloat16, which numpy cannot feed: generate from this export with OnnxSession.generate "
            "(it binds the cache as bfloat16) on a provider with bf16 kernels (CUDA), or export in float16"
        )
    if x.type not in _NP:
        raise SessionError(f"{x.name} has element type {x.type}, which no cache buffer here takes")
    return _NP[x.type]


def buffer_arrays(inputs, b: int, n: int, prefix: str, *, bf16_bits: bool = False) -> dict[str, np.ndarray]:
    """Zeroed cache buffers for a session's inputs (onnxruntime NodeArg) whose names start with `prefix`; a
    bfloat16 one as its uint16 bits where `bf16_bits` (bind it with ort_value), else refused in one line."""
    return {x.name: np.zeros(_shape(x, b, n), _np_type(x, bf16_bits)) for x in inputs if x.name.startswith(prefix)}


def buffer_types(inputs, prefix: str) -> dict[str, str]:
    """Each cache input's element type, e.g. "tensor(bfloat16)"."""
    return {x.name: x.type for x in inputs if x.name.startswith(prefix)}


def buffer_bytes(inputs, b: int, n: int, prefix: str) -> int:
    """The bytes buffer_arrays would allocate, before allocating them."""
    return sum(
        np.dtype(_np_type(x, True)).itemsize * int(np.prod(_shape(x, b, n)))
        for x in inputs
        if x.name.startswith(prefix)
    )


def ort_value(arr: np.ndarray, element_type: str, device: str):
    """An OrtValue of `arr` on `device` ("cpu": it wraps arr, no copy; "cuda": a copy) of the given ONNX element
    type: numpy's own, or bfloat16 from arr's uint16 bits."""
    import onnxruntime as ort

    if element_type != BF16:
        return ort.OrtValue.ortvalue_from_numpy(arr, device, 0)
    if arr.dtype != np.uint16:
        raise SessionError(f"a bfloat16 buffer is held as uint16 bits, not {arr.dtype}")
    host = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(arr, BFLOAT16)
    if device == "cpu":
        return host
    value = ort.OrtValue.ortvalue_from_shape_and_type(list(arr.shape), BFLOAT16, device, 0)
    value.update_inplace(host)
    return value


def widen(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bits (uint16) -> float32, exactly (a bf16 is a float32's upper half)."""
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32)


def as_float32(value) -> np.ndarray:
    """An OrtValue's contents as a numpy array, a bfloat16 one widened to float32 (copied to the host first)."""
    if value.data_type() != BF16:
        return value.numpy()
    import onnxruntime as ort

    bits = np.empty(value.shape(), np.uint16)
    host = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(bits, BFLOAT16)
    host.update_inplace(value)  # device to host where value is on the device (unproven on CUDA: no GPU run yet)
    return widen(bits)


__all__ = ["BF16", "as_float32", "buffer_arrays", "buffer_bytes", "buffer_types", "ort_value", "widen"]
