"""A whole model's cache buffers as its graph declares them: each `past_key_values.*` input in its own element
type and axes ("b" rows, "n" positions, the rest fixed), so an fp32 cache's (b g n d) and an int8 cache's
(b g dk n) keys and (b g 1 n) scales (export/kv_int8.py) are allocated by the same code. numpy only."""

from __future__ import annotations

import numpy as np

_NP = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int8)": np.int8}


def _shape(x, b: int, n: int) -> list[int]:
    return [b if d == "b" else n if d == "n" else int(d) for d in x.shape]


def buffer_arrays(inputs, b: int, n: int, prefix: str) -> dict[str, np.ndarray]:
    """Zeroed cache buffers for a session's inputs (onnxruntime NodeArg) whose names start with `prefix`."""
    return {x.name: np.zeros(_shape(x, b, n), _NP[x.type]) for x in inputs if x.name.startswith(prefix)}


def buffer_bytes(inputs, b: int, n: int, prefix: str) -> int:
    """The bytes buffer_arrays would allocate, before allocating them."""
    return sum(
        np.dtype(_NP[x.type]).itemsize * int(np.prod(_shape(x, b, n))) for x in inputs if x.name.startswith(prefix)
    )


__all__ = ["buffer_arrays", "buffer_bytes"]
