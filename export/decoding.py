"""Token-by-token runs of a decode model (export_onnx(..., decode=True)) under ONNX Runtime.

    y, present_key, present_value = sess.decode(x, past_key, past_value, key_mask=None)
    y, present_key, present_value = sess.generate_steps(x_steps, past_key, past_value)

`generate_steps` feeds x_steps (b k c) one position at a time and keeps the cache inside ONNX
Runtime between steps: each step's present_key / present_value come back as OrtValues (on the
session's device) and are bound, as they are, as the next step's past. Nothing crosses to numpy
but the (b 1 c) output of each step, so a step costs the op and the binding, not a copy of the
whole past through Python.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

import zoo

if TYPE_CHECKING:
    from .session import OnnxSession


class DecodeInputError(zoo.AttnzooError, ValueError):
    """A decode call whose x, cache or key mask does not fit the model."""


def _require_decode_model(sess: OnnxSession) -> zoo.AttentionSpec:
    if "past_key" not in sess.input_names:
        raise DecodeInputError(
            f"{sess.path} is a full-sequence model (inputs {sess.input_names}); export one for token-by-token "
            f"runs with `attnzoo export NAME --decode` (export_onnx(..., decode=True))"
        )
    if sess.spec is None:
        raise DecodeInputError(f"{sess.path} carries no attnzoo spec metadata; export it with attnzoo")
    return sess.spec


def _as_numpy(name: str, v: Any, dtype: np.dtype | None) -> np.ndarray:
    if isinstance(v, torch.Tensor):
        if v.device.type == "meta":
            raise zoo.InputTypeError(f"{name} is a meta tensor (no data); pass a tensor on the CPU or a numpy array")
        if v.device.type != "cpu":
            v = v.cpu()
        v = v.detach().numpy()
    if not isinstance(v, np.ndarray):
        raise zoo.InputTypeError(f"{name} must be a torch.Tensor or numpy array, got {type(v).__name__}")
    if dtype is not None and v.dtype != dtype:
        raise zoo.InputTypeError(f"{name} has dtype {v.dtype}; this model takes {dtype} (convert with .astype/.to)")
    return np.ascontiguousarray(v)


def check_x(sess: OnnxSession, x, *, batch: int | None = None) -> np.ndarray:
    """x of a decode call as a contiguous numpy array, checked against the model: a torch tensor or
    numpy array of the model's dtype, shaped (b >= 1, t >= 1, d_model), with b = `batch` when given
    (a static cache's bound buffers fix it). The one check of x that sess.decode, generate_steps
    and OrtStaticCache.step share; raises InputTypeError or DecodeInputError."""
    spec = _require_decode_model(sess)
    x = _as_numpy("x", x, sess.dtype)
    if x.ndim != 3 or x.shape[-1] != spec.d_model or x.shape[0] == 0 or x.shape[1] == 0:
        raise DecodeInputError(f"x has shape {x.shape}; expected (b >= 1, t >= 1, c={spec.d_model})")
    if batch is not None and x.shape[0] != batch:
        raise DecodeInputError(
            f"x has shape {x.shape}, batch {x.shape[0]}; this cache was made for batch={batch}: "
            f"send (b={batch}, t, c={spec.d_model}), or make one with sess.static_cache({x.shape[0]})"
        )
    return x


def check_decode_inputs(sess: OnnxSession, x, past_key, past_value, key_mask, *, steps: int | None = None):
    """numpy x, past_key, past_value, key_mask (or None) checked against the spec; p."""
    spec = _require_decode_model(sess)
    dtype = sess.dtype
    x = check_x(sess, x)
    b = x.shape[0]
    g, dk, dv = spec.kv_heads_, spec.d_k_, spec.d_v_
    if (past_key is None) != (past_value is None):
        raise DecodeInputError("pass past_key and past_value together (or neither, for an empty cache)")
    if past_key is None:
        past_key, past_value = np.zeros((b, g, 0, dk), dtype), np.zeros((b, g, 0, dv), dtype)
    past_key, past_value = _as_numpy("past_key", past_key, dtype), _as_numpy("past_value", past_value, dtype)
    for name, past, d in (("past_key", past_key, dk), ("past_value", past_value, dv)):
        if past.ndim != 4 or past.shape[0] != b or past.shape[1] != g or past.shape[3] != d:
            raise DecodeInputError(f"{name} has shape {past.shape}; expected (b={b}, g={g}, p, {d})")
    p = past_key.shape[2]
    if past_value.shape[2] != p:
        raise DecodeInputError(f"past_key holds {p} positions but past_value {past_value.shape[2]}")
    new = x.shape[1] if steps is None else steps
    if key_mask is not None:
        if "key_mask" not in sess.input_names:
            raise DecodeInputError("this model has no key_mask input; re-export with --mask (with_mask=True)")
        key_mask = _as_numpy("key_mask", key_mask, None)
        if key_mask.dtype != np.bool_ or key_mask.shape != (b, p + new):
            raise DecodeInputError(
                f"key_mask is {key_mask.dtype} {key_mask.shape}; expected bool (b, p+t) = {(b, p + new)}"
            )
    elif "key_mask" in sess.input_names:
        key_mask = np.ones((b, p + new), dtype=np.bool_)
    sess.check_size(b, new, p + new)
    return x, past_key, past_value, key_mask, p


def decode(sess: OnnxSession, x, past_key=None, past_value=None, key_mask=None):
    """One call: x (b t c) at positions p..p+t-1 -> y (b t c), present_key, present_value (b g p+t d).
    torch in -> torch out (on the CPU); numpy in -> numpy out."""
    as_torch = isinstance(x, torch.Tensor)
    x, pk, pv, km, p = check_decode_inputs(sess, x, past_key, past_value, key_mask)
    b, t = x.shape[:2]
    if b > 1 and t > 1 and p > 0 and chunks_one_row_at_a_time(sess):
        # GroupQueryAttention refuses b > 1 with t > 1 and a past ("batch_size must be 1 when
        # sequence_length > 1 and past context is given"): run each row alone. A row's positions
        # come from its own key_mask row and its cache from its own index, so each row computes
        # exactly what it would in a batch.
        rows = [
            _run(sess, x[r : r + 1], pk[r : r + 1], pv[r : r + 1], None if km is None else km[r : r + 1])
            for r in range(b)
        ]
        outs = [np.concatenate(parts) for parts in zip(*rows)]
    else:
        outs = _run(sess, x, pk, pv, km)
    return tuple(torch.from_numpy(o) for o in outs) if as_torch else tuple(outs)


def chunks_one_row_at_a_time(sess: OnnxSession) -> bool:
    """Whether `sess` must run a chunk (t > 1) after a past one row at a time: its lowering's record
    says so (ort-gqa: GroupQueryAttention takes b > 1 only for a prompt or a single token)."""
    from .lowerings import RECORDS

    rec = RECORDS.get(sess.metadata.get("attnzoo.lowering", ""))
    return rec is not None and not rec.batched_chunks


def _run(sess: OnnxSession, x, pk, pv, km) -> list[np.ndarray]:
    feeds = {"x": x, "past_key": pk, "past_value": pv}
    if km is not None:
        feeds["key_mask"] = km
    return sess.run_feeds(feeds)


def generate_steps(sess: OnnxSession, x_steps, past_key=None, past_value=None, key_mask=None):
    """Feed x_steps (b k c) one position at a time, starting from the given cache (None: empty).

    Returns y (b k c), one row per step, and the final cache (b g p+k d). key_mask, if the model
    takes one, is (b p+k) for the whole run. The cache stays an ONNX Runtime value on the session's
    device between steps (bound output -> bound input), never copied out until the end.
    """
    import onnxruntime as ort

    as_torch = isinstance(x_steps, torch.Tensor)
    x, pk, pv, km, p = check_decode_inputs(sess, x_steps, past_key, past_value, key_mask, steps=None)
    k = x.shape[1]
    device = "cuda" if sess.provider == "cuda" else "cpu"
    binding = sess.new_binding()
    cache_k = ort.OrtValue.ortvalue_from_numpy(pk, device, 0)
    cache_v = ort.OrtValue.ortvalue_from_numpy(pv, device, 0)
    ys = np.empty((x.shape[0], k, x.shape[2]), dtype=x.dtype)
    for i in range(k):
        binding.bind_cpu_input("x", np.ascontiguousarray(x[:, i : i + 1]))
        binding.bind_ortvalue_input("past_key", cache_k)
        binding.bind_ortvalue_input("past_value", cache_v)
        if km is not None:
            binding.bind_cpu_input("key_mask", np.ascontiguousarray(km[:, : p + i + 1]))
        for name in ("y", "present_key", "present_value"):
            binding.bind_output(name, device)
        sess.run_with_iobinding(binding)
        y, cache_k, cache_v = binding.get_outputs()
        ys[:, i] = y.numpy()[:, 0]
        binding.clear_binding_inputs()
        binding.clear_binding_outputs()
    out = (ys, cache_k.numpy(), cache_v.numpy())
    return tuple(torch.from_numpy(o) for o in out) if as_torch else out
