"""Token-by-token runs of a static-cache decode model (export_onnx(..., decode=True, cache="static")).

The model takes the cache as two buffers of capacity n (past_key, past_value: b g n d) and
past_len, and writes this call's keys and values into them at past_len (ScatterElements). Each
buffer is bound once, as the input *and* as the output of the same name, so ONNX Runtime writes
the new positions in place: a step reads the weights and the cache and writes one position, and
nothing of the cache's size is allocated or copied per step.

The calls keep the growing-cache API: `decode(x, past_key, past_value)` places a past (b g p d)
into buffers of the model's capacity, and both calls return the presents holding the p + t valid
positions. A run that would write past the capacity is refused before anything is written.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

import zoo

from .decoding import _check

if TYPE_CHECKING:
    from .session import OnnxSession


def capacity(sess: OnnxSession) -> int:
    """The static cache's capacity n recorded at export (attnzoo.max_len)."""
    try:
        return int(sess.metadata["attnzoo.max_len"])
    except (KeyError, ValueError):
        raise zoo.InputError(f"{sess.path} has no attnzoo.max_len metadata; re-export it with attnzoo") from None


class _Buffers:
    """The bound cache of one run: numpy buffers (b g n d), their OrtValues, the key mask (b n)."""

    def __init__(self, sess: OnnxSession, pk: np.ndarray, pv: np.ndarray, km: np.ndarray | None, new: int) -> None:
        import onnxruntime as ort

        n = capacity(sess)
        b, g, p = pk.shape[:3]
        if p + new > n:
            raise zoo.CacheFullError(
                f"this model's static cache holds {n} positions (max_len); a past of {p} and {new} new do not "
                f"fit: re-export with a larger --max-len (max_len=)"
            )
        self.p, self.n = p, n
        self.key = np.zeros((b, g, n, pk.shape[3]), pk.dtype)
        self.value = np.zeros((b, g, n, pv.shape[3]), pv.dtype)
        self.key[:, :, :p] = pk
        self.value[:, :, :p] = pv
        self.device = "cuda" if sess.provider == "cuda" else "cpu"
        # On the CPU the OrtValue wraps the numpy buffer itself (no copy): writes land in self.key.
        self.key_ov = ort.OrtValue.ortvalue_from_numpy(self.key, self.device, 0)
        self.value_ov = ort.OrtValue.ortvalue_from_numpy(self.value, self.device, 0)
        self.key_mask = None
        if km is not None:  # (b, p + new) -> the whole capacity; positions past p + new are never read
            self.key_mask = np.ones((b, n), np.bool_)
            self.key_mask[:, : km.shape[1]] = km

    def bind(self, sess: OnnxSession):
        binding = sess.new_binding()
        binding.bind_output("y", self.device)  # first: get_outputs()[0] is y
        binding.bind_ortvalue_input("past_key", self.key_ov)
        binding.bind_ortvalue_input("past_value", self.value_ov)
        binding.bind_ortvalue_output("present_key", self.key_ov)
        binding.bind_ortvalue_output("present_value", self.value_ov)
        if self.key_mask is not None:
            binding.bind_cpu_input("key_mask", self.key_mask)
        return binding

    def presents(self, length: int) -> tuple[np.ndarray, np.ndarray]:
        if self.device != "cpu":
            key, value = self.key_ov.numpy(), self.value_ov.numpy()
        else:
            key, value = self.key, self.value
        return np.ascontiguousarray(key[:, :, :length]), np.ascontiguousarray(value[:, :, :length])


def _run_step(sess: OnnxSession, binding, x: np.ndarray, past_len: int) -> np.ndarray:
    binding.bind_cpu_input("x", np.ascontiguousarray(x))
    binding.bind_cpu_input("past_len", np.array(past_len, np.int64))
    sess.run_with_iobinding(binding)
    return binding.get_outputs()[0].numpy()


def decode(sess: OnnxSession, x, past_key=None, past_value=None, key_mask=None):
    """One call: x (b t c) after a past (b g p d) -> y (b t c), present_key, present_value (b g p+t d)."""
    as_torch = isinstance(x, torch.Tensor)
    x, pk, pv, km, p = _check(sess, x, past_key, past_value, key_mask)
    t = x.shape[1]
    bufs = _Buffers(sess, pk, pv, km, t)
    y = _run_step(sess, bufs.bind(sess), x, p)
    out = (y, *bufs.presents(p + t))
    return tuple(torch.from_numpy(o) for o in out) if as_torch else out


def generate_steps(sess: OnnxSession, x_steps, past_key=None, past_value=None, key_mask=None):
    """x_steps (b k c) one position at a time into buffers bound once -> y (b k c), presents (b g p+k d).

    key_mask, if the model takes one, is (b p+k) for the whole run."""
    as_torch = isinstance(x_steps, torch.Tensor)
    x, pk, pv, km, p = _check(sess, x_steps, past_key, past_value, key_mask, steps=None)
    k = x.shape[1]
    bufs = _Buffers(sess, pk, pv, km, k)
    binding = bufs.bind(sess)
    ys = np.empty_like(x)
    for i in range(k):
        ys[:, i] = _run_step(sess, binding, x[:, i : i + 1], p + i)[:, 0]
    out = (ys, *bufs.presents(p + k))
    return tuple(torch.from_numpy(o) for o in out) if as_torch else out
