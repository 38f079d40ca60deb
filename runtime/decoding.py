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

from typing import TYPE_CHECKING

import numpy as np

from .feeds import DecodeInputError, check_decode_inputs
from .io import KEY_MASK, PAST_KEY, PAST_VALUE, PRESENT_KEY, PRESENT_VALUE, X, Y
from .tensors import from_numpy, is_tensor

if TYPE_CHECKING:
    from .core import RuntimeSession


def decode(sess: RuntimeSession, x, past_key=None, past_value=None, key_mask=None):
    """One call: x (b t c) at positions p..p+t-1 -> y (b t c), present_key, present_value (b g p+t d).
    torch in -> torch out (on the CPU); numpy in -> numpy out."""
    as_torch = is_tensor(x)
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
    return tuple(from_numpy(o) for o in outs) if as_torch else tuple(outs)


def chunks_one_row_at_a_time(sess: RuntimeSession) -> bool:
    """Whether `sess` must run a chunk (t > 1) after a past one row at a time: its lowering's record
    says so (ort-gqa: GroupQueryAttention takes b > 1 only for a prompt or a single token)."""
    return sess.lowering is not None and not sess.lowering.batched_chunks


def _run(sess: RuntimeSession, x, pk, pv, km) -> list[np.ndarray]:
    feeds = {X.name: x, PAST_KEY.name: pk, PAST_VALUE.name: pv}
    if km is not None:
        feeds[KEY_MASK.name] = km
    return sess.run_feeds(feeds)


def generate_steps(sess: RuntimeSession, x_steps, past_key=None, past_value=None, key_mask=None):
    """Feed x_steps (b k c) one position at a time, starting from the given cache (None: empty).

    Returns y (b k c), one row per step, and the final cache (b g p+k d). key_mask, if the model
    takes one, is (b p+k) for the whole run. The cache stays an ONNX Runtime value on the session's
    device between steps (bound output -> bound input), never copied out until the end.
    """
    import onnxruntime as ort

    as_torch = is_tensor(x_steps)
    x, pk, pv, km, p = check_decode_inputs(sess, x_steps, past_key, past_value, key_mask, steps=None)
    k = x.shape[1]
    device = "cuda" if sess.provider == "cuda" else "cpu"
    binding = sess.new_binding()
    cache_k = ort.OrtValue.ortvalue_from_numpy(pk, device, 0)
    cache_v = ort.OrtValue.ortvalue_from_numpy(pv, device, 0)
    ys = np.empty((x.shape[0], k, x.shape[2]), dtype=x.dtype)
    for i in range(k):
        binding.bind_cpu_input(X.name, np.ascontiguousarray(x[:, i : i + 1]))
        binding.bind_ortvalue_input(PAST_KEY.name, cache_k)
        binding.bind_ortvalue_input(PAST_VALUE.name, cache_v)
        if km is not None:
            binding.bind_cpu_input(KEY_MASK.name, np.ascontiguousarray(km[:, : p + i + 1]))
        for name in (Y.name, PRESENT_KEY.name, PRESENT_VALUE.name):
            binding.bind_output(name, device)
        sess.run_with_iobinding(binding)
        y, cache_k, cache_v = binding.get_outputs()
        ys[:, i] = y.numpy()[:, 0]
        binding.clear_binding_inputs()
        binding.clear_binding_outputs()
    out = (ys, cache_k.numpy(), cache_v.numpy())
    return tuple(from_numpy(o) for o in out) if as_torch else out


__all__ = ["DecodeInputError", "chunks_one_row_at_a_time", "decode", "generate_steps"]
