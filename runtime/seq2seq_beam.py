"""Beam search for an encoder-decoder (Seq2SeqSession.generate(..., num_beams=k)), as transformers'
`generate(num_beams=k, do_sample=False)`: the session runs the encoder once over the b rows and repeats its
outputs k times (every beam of a row reads the same encoder states, so they are never reordered); this loop
feeds each step's tokens to the decoder, hands the logits to runtime/beam_search.py, and reorders the
decoder's self-attention buffers (host arrays bound in place) by the rows it returns over the written
positions (runtime/beam_cache.py).

The decoder prompt is the start token (transformers' decoder_prompt_len 1: the length penalty counts the
generated tokens, the eos included), max_length is 1 + max_new_tokens. The processors are the generation's own
(runtime/processors.py: every generation_config key of the checkpoint and the call, in transformers' order over
the log-softmax); processors given to the call replace them. Beam sampling (do_sample with num_beams > 1) is
refused by name.
"""

from __future__ import annotations

import time

import numpy as np

from .beam_cache import HostReorder, position_axes
from .beam_search import Beams, BeamSearch
from .seq2seq_generation import Seq2SeqGeneration, as_ids, as_mask


def forced_processor(suppress, forced_bos, forced_eos, max_length: int):
    """transformers' NoBadWords / SuppressTokens, ForcedBOS and ForcedEOS processors over (ids, scores), or None
    when none is set. forced_eos: a tuple of ids (each gets 0 at the last step)."""
    suppress = list(suppress or ())
    if not suppress and forced_bos is None and not forced_eos:
        return None

    def proc(ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        scores = scores.copy()
        if suppress:
            scores[:, suppress] = -np.inf
        cur = ids.shape[1]
        forced = [forced_bos] if forced_bos is not None and cur == 1 else []
        forced = list(forced_eos) if forced_eos and cur == max_length - 1 else forced
        if forced:
            scores[:] = -np.inf
            scores[:, forced] = 0.0
        return scores

    return proc


def beam_search(step, reorder, b: int, start: int, max_new_tokens: int, beams: Beams, eos, pad, processors):
    """The loop. step(tokens (b*k,), past_len) -> the decoder's logits (b*k v); reorder(rows (b*k,), length):
    the self-attention buffers' rows over positions < length. Returns (sequences (b * n, 1 + made),
    sequences_scores (b * n,), timings {decode_s, steps, beam_reorders})."""
    search = BeamSearch(np.full((b, 1), start, np.int64), beams, 1 + max_new_tokens, eos, pad, processors)
    started = time.perf_counter()
    tokens, length, moved = search.tokens, 1, 0
    while True:
        rows = search.advance(step(tokens, length - 1))
        if search.done:
            break
        reorder(rows, length)  # the slots 0..length-1 this and the earlier steps wrote
        moved += not bool((rows == np.arange(len(rows))).all())
        tokens, length = search.tokens, length + 1
    sequences, scores = search.result()
    timings = dict(decode_s=time.perf_counter() - started, steps=length, beam_reorders=moved)
    return sequences, scores, timings


def beam_generate(sess, input_ids, max_new_tokens: int, attention_mask, beams: Beams, processors, options: dict):
    """Seq2SeqSession.generate with num_beams > 1 -> (sequences (b * n, 1 + made), sequences_scores, timings).
    The encoder runs once over the b rows; its outputs are repeated num_beams times and bound with the decoder's
    buffers of a generation over the b * k rows (runtime/seq2seq_generation.py), whose processors, token ids and
    checks the beams share."""
    import zoo

    started = time.perf_counter()
    ids = np.ascontiguousarray(as_ids(input_ids, "input_ids", sess.vocab), np.int64)
    mask = as_mask(attention_mask, ids.shape)
    k = beams.num_beams
    config = {**sess.generation, **(options.pop("generation_config", None) or {}), "num_beams": 1}  # the beams are ours
    run = Seq2SeqGeneration(
        sess, np.repeat(ids, k, 0), max_new_tokens, np.repeat(mask, k, 0), generation_config=config, **options
    )
    if run.params.do_sample:
        raise zoo.ArgumentError(
            f"num_beams={k} with sampling (beam sampling) is not done here: give do_sample=False (beam search) "
            "or num_beams=1 (sampling)"
        )
    if run.rows is not None or run.max_time is not None:
        raise zoo.ArgumentError("stop strings and max_time end rows one by one: not taken with num_beams > 1 here")
    enc = [np.repeat(e, k, axis=0) for e in sess.encode(ids, mask)]
    binding, arrays, n, _keep = run._bind(enc)
    encoded = time.perf_counter()

    def step(tokens: np.ndarray, past_len: int) -> np.ndarray:
        arrays["input_ids"][:, 0] = tokens
        arrays["past_len"][()] = past_len
        sess.decoder.run_with_iobinding(binding)
        return arrays["logits"][:, 0]

    reorder = HostReorder(run.buffers, position_axes(sess.decoder._sess.get_inputs(), run.buffers))
    procs = run.sampler.processors if processors is None else processors
    seqs, scores, spent = beam_search(
        step, reorder, len(ids), run.start, max_new_tokens, beams, run.eos, run.pad, procs
    )
    spent.update(encode_s=encoded - started, capacity=n)
    return seqs, scores, spent


__all__ = ["beam_generate", "beam_search", "forced_processor"]
