"""Beam search for an encoder-decoder (Seq2SeqSession.generate(..., num_beams=k)), as transformers'
`generate(num_beams=k, do_sample=False)`: the session runs the encoder once over the b rows and repeats its
outputs k times (every beam of a row reads the same encoder states, so they are never reordered); this loop
feeds each step's tokens to the decoder, hands the logits to runtime/beam_search.py, and reorders the
decoder's self-attention buffers (host arrays bound in place) by the rows it returns over the written
positions (runtime/beam_cache.py).

The decoder prompt is the start token (transformers' decoder_prompt_len 1: the length penalty counts the
generated tokens, the eos included), max_length is 1 + max_new_tokens. The session's processors, in
transformers' order over the log-softmax: the suppressed ids (single-token bad_words_ids and suppress_tokens)
-inf, then forced_bos_token_id at the first step and forced_eos_token_id at the last a budget allows, every
other id -inf and the forced ones 0. Processors given to the call replace them.
"""

from __future__ import annotations

import time

import numpy as np

from .beam_search import Beams, BeamSearch


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


__all__ = ["beam_search", "forced_processor"]
