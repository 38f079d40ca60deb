"""Greedy generation under ONNX Runtime from a whole-model export (export/lm_export.py).

    tokens = OnnxSession("lm.onnx").generate(input_ids, max_new_tokens=64)     # (b, t + 64) int64

The per-layer buffers (b g n d), sized to the call (prompt + new tokens, rounded up to ROUND, at most
the exported max_len), are bound ONCE, each as past_key_values.i.* and as present.i.*, so every step
writes its keys in place. The step's other inputs (input_ids (b 1), past_len) and outputs (logits
(b 1 v), next_token (b)) are preallocated arrays bound once too: a step writes a token id and a
position into them and reads b int64 back; nothing of the cache's size is allocated or copied.

Left padding: attention_mask (b t) marks the real prompt tokens; it becomes the key mask over the
capacity, and each row's positions count its real tokens only (DecoderLM.step), so a row's tokens
are its own. eos_token_id: a row that produced it is padded (pad_token_id, default eos) while the
others go on; the loop stops when every row has ended, as transformers' generate does.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

import numpy as np

import zoo
from zoo.generation_inputs import check_token_ids, left_padded_mask, new_token_count, token_id
from zoo.spec_fields import rope_switch_at

from .io import ATTENTION_MASK, INPUT_IDS, LM_PAST, LM_PRESENT, LOGITS, NEXT_TOKEN, PAST_LEN
from .tensors import from_numpy, is_tensor

if TYPE_CHECKING:
    from .runtime import RuntimeSession

ROUND = 32  # a call's capacity is prompt + new tokens rounded up to this (each step reads all of it)
# One row's prompt runs in calls of at most this many tokens, each after the ones before: ONNX Runtime's
# CPU GroupQueryAttention scores every query against every key up to the call's last one (no causal skip),
# so chunks leave out most of the masked half, and each call's scores are a chunk's, not the prompt's.
# Measured on the random LLaMA at prompt 1024 (AVX-512 Xeon, 2 threads, best of 4): prefill 615 ms in one
# call, 467 / 455 / 493 ms in chunks of 256 / 128 / 64 (fp32); 666 against 499 / 490 / 507 ms (int4).
PREFILL_CHUNK = 128


def _as_ids(sess: RuntimeSession, input_ids) -> np.ndarray:
    if is_tensor(input_ids):
        input_ids = input_ids.detach().cpu().numpy()
    if isinstance(input_ids, (list, tuple)):
        input_ids = np.asarray(input_ids)
    if not isinstance(input_ids, np.ndarray) or input_ids.dtype.kind not in "iu" or input_ids.ndim != 2:
        what = getattr(input_ids, "dtype", type(input_ids).__name__)
        raise zoo.InputTypeError(
            f"input_ids must be a (batch, tokens) integer tensor or array, got {what} "
            f"of shape {getattr(input_ids, 'shape', '?')}"
        )
    check_token_ids(input_ids, lm_vocab(sess))
    return np.ascontiguousarray(input_ids, np.int64)


def lm_vocab(sess: RuntimeSession) -> int:
    raw = sess.metadata.get("attnzoo.vocab", "")
    if not (raw.isascii() and raw.isdigit()):
        raise zoo.InputError(f"{sess.path} is not a whole-model export (no attnzoo.vocab); export one with --whole")
    return int(raw)


def positions_needed(prompt: int, max_new_tokens: int) -> int:
    """Cache positions a generation of `max_new_tokens` after a prompt of `prompt` tokens writes: the last
    new token is not fed back."""
    return prompt + max_new_tokens - 1


def lm_max_len(sess: RuntimeSession) -> int | None:
    raw = sess.metadata.get("attnzoo.max_len")
    return int(raw) if raw and raw.isascii() and raw.isdigit() else None


def one_call_prompt_len(sess: RuntimeSession) -> int | None:
    """The longest prompt that may run in chunks, or None for any: a longrope layer picks its frequencies
    by the call's largest position, so a prompt past its rope_original_max rotates every key with the long
    set in one call (as eager and transformers do) but its first chunks with the short set."""
    specs = json.loads(sess.metadata.get("attnzoo.layer_specs", "[]"))
    return longrope_switch((s.get("rope_scaling"), s.get("rope_original_max")) for s in specs)


def longrope_switch(layers) -> int | None:
    """The first prompt length at which a layer's longrope switches frequency sets, over (rope_scaling,
    rope_original_max) pairs, one per layer; None when no layer switches."""
    limits = [rope_switch_at(kind, original_max) for kind, original_max in layers]
    return min((n for n in limits if n is not None), default=None)


def prefill_chunk(sess: RuntimeSession, rows: int, t: int) -> int:
    """The positions of a prompt of `rows` x `t` tokens per prefill call: PREFILL_CHUNK for one row, each
    chunk after the ones before (ORT's CPU GroupQueryAttention scores every query against every key up to
    the call's last, so chunks skip most of the masked half); the whole prompt for a batch (the op takes a
    chunk after a past for one row only) and for a prompt whose longrope frequencies depend on its length
    (one_call_prompt_len)."""
    longest = one_call_prompt_len(sess)
    return PREFILL_CHUNK if rows == 1 and (longest is None or t <= longest) else t


def generate(
    sess: RuntimeSession,
    input_ids,
    max_new_tokens: int,
    attention_mask=None,
    eos_token_id=None,
    pad_token_id=None,
    *,
    timings: dict | None = None,
):
    """(b, t + N) int64: the prompt then greedy tokens (fewer than N when every row ended at eos).

    torch in -> torch out; numpy (or lists) in -> numpy out. `timings`, a dict, receives
    prefill_s, decode_s, steps and capacity."""
    import onnxruntime as ort

    as_torch = is_tensor(input_ids)
    ids = _as_ids(sess, input_ids)
    vocab = lm_vocab(sess)
    max_new_tokens = new_token_count(max_new_tokens)
    eos_token_id = token_id(eos_token_id, vocab, "eos_token_id")
    pad_token_id = token_id(pad_token_id, vocab, "pad_token_id")
    b, t = ids.shape
    need = positions_needed(t, max_new_tokens)
    cap = lm_max_len(sess)
    if cap is not None and need > cap:
        raise zoo.ArgumentError(
            f"a prompt of {t} token{'s' * (t != 1)} and {max_new_tokens} new ones write {need} cache positions "
            f"(the last new token is not fed back), past this export's max_len {cap}: export it with "
            f"max_len={need} (CLI: --max-len {need}) or more"
        )
    n = -(-need // ROUND) * ROUND
    n = min(n, cap) if cap is not None else n
    real = None
    if attention_mask is not None:
        am = attention_mask.detach().cpu().numpy() if is_tensor(attention_mask) else attention_mask
        real = left_padded_mask(am, (b, t))
    from zoo.limits import check_fits

    prefix = LM_PAST.split("{", 1)[0]  # "past_key_values."
    buffers = [(i, ins) for i, ins in enumerate(sess._sess.get_inputs()) if ins.name.startswith(prefix)]
    need_bytes = sum(b * int(x.shape[1]) * n * int(x.shape[3]) * 4 for _, x in buffers)
    need_bytes += b * n + b * (t + max_new_tokens) * 8  # the key mask and the tokens out, allocated next
    check_fits(need_bytes, f"a cache of {b} rows x {n} positions for {sess.path.name}")
    key_mask = np.ones((b, n), np.bool_)
    if real is not None:
        key_mask[:, :t] = real

    binding = sess.new_binding()
    keep = []  # the arrays the bound OrtValues wrap (CPU: no copy) stay alive for the whole loop

    def bound(arr: np.ndarray):
        keep.append(arr)
        return ort.OrtValue.ortvalue_from_numpy(arr, "cpu", 0)

    dtype = np.float16 if "float16" in buffers[0][1].type else np.float32
    for _, x in buffers:
        buf = bound(np.zeros((b, int(x.shape[1]), n, int(x.shape[3])), dtype))
        layer, kv = x.name.split(".")[1:3]
        binding.bind_ortvalue_input(x.name, buf)
        binding.bind_ortvalue_output(LM_PRESENT.format(i=layer, kv=kv), buf)
    binding.bind_ortvalue_input(ATTENTION_MASK.name, bound(key_mask))
    past_len = np.zeros((), np.int64)
    binding.bind_ortvalue_input(PAST_LEN.name, bound(past_len))
    has_argmax = NEXT_TOKEN.name in sess.output_names
    if has_argmax:
        next_token = np.zeros((b,), np.int64)
        binding.bind_ortvalue_output(NEXT_TOKEN.name, bound(next_token))
    step_logits = np.zeros((b, 1, vocab), dtype)
    step_ids = np.zeros((b, 1), np.int64)

    out = np.empty((b, t + max_new_tokens), np.int64)
    out[:, :t] = ids
    done = np.zeros(b, np.bool_)
    pad = pad_token_id if pad_token_id is not None else eos_token_id
    started = time.perf_counter()
    # the prefill: the prompt at positions 0..t-1, its logits into a fresh (b t|1 v) output, in chunks
    # for one row (prefill_chunk)
    chunk = prefill_chunk(sess, b, t)
    binding.bind_output(LOGITS.name, "cpu")
    for start in range(0, t, chunk):
        binding.bind_ortvalue_input(INPUT_IDS.name, bound(np.ascontiguousarray(ids[:, start : start + chunk])))
        past_len[()] = start
        sess.run_with_iobinding(binding)
    if has_argmax:
        token = next_token.copy()
    else:
        token = binding.get_outputs()[0].numpy()[:, -1].argmax(-1)
    prefill = time.perf_counter() - started
    binding.bind_ortvalue_input(INPUT_IDS.name, bound(step_ids))
    binding.bind_ortvalue_output(LOGITS.name, bound(step_logits))
    length = t
    for i in range(max_new_tokens):
        if eos_token_id is not None:
            token = np.where(done, pad, token)
            done |= token == eos_token_id
        out[:, t + i] = token
        if (eos_token_id is not None and done.all()) or i + 1 == max_new_tokens:
            length = t + i + 1
            break
        step_ids[:, 0] = token
        past_len[()] = t + i
        sess.run_with_iobinding(binding)
        token = next_token.copy() if has_argmax else step_logits[:, -1].argmax(-1)
    decode = time.perf_counter() - started - prefill
    if timings is not None:
        timings.update(prefill_s=prefill, decode_s=decode, steps=length - t - 1, capacity=n)
    out = out[:, :length]
    return from_numpy(out) if as_torch else out


__all__ = [
    "PREFILL_CHUNK",
    "ROUND",
    "generate",
    "lm_max_len",
    "lm_vocab",
    "longrope_switch",
    "one_call_prompt_len",
    "positions_needed",
    "prefill_chunk",
]
