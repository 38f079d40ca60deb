"""Where speculative decoding's candidate tokens come from (runtime/speculative.py verifies them): the text so far
(prompt lookup) or a smaller model of the same tokenizer (a draft). numpy + onnxruntime only.

- PromptLookup: transformers' PromptLookupCandidateGenerator, row by row: the longest n-gram (at most
  `max_ngram` tokens) ending the row's text that occurs earlier in it; its most recent occurrence with k tokens
  after it (transformers takes the first: `lookup(latest=False)`) proposes the tokens that followed it (at most
  k), cut before the first eos id. No match: no candidates (the
  step is a plain one). No distribution: under sampling the target's own draw must equal the candidate.
- DraftRow: one row of a draft model (a whole-model export of the same vocabulary) on its slice of a batch
  cache: it is fed what it has not seen of the row's text, then proposes k tokens one call each, greedy or drawn
  from its distribution (which the accept rule reads). After the target's verdict its cache is rolled back by not
  advancing its length past the tokens that stay (nothing copied). Draft: a call's rows, the draft's cache bound
  once (runtime/device_decode.LeftRows); a server's batcher makes its rows over its own buffers
  (serve/generate/speculating.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

import zoo

from .device_decode import LeftRows, returns_all_logits
from .io import ATTENTION_MASK, INPUT_IDS, LM_PRESENT, LOGITS, NEXT_TOKEN, PAST_LEN
from .kv_buffers import as_float32, buffer_types, ort_value
from .sampling import distribution

if TYPE_CHECKING:
    from .core import RuntimeSession

PREFIX = "past_key_values."
# the longest chunk whose ids and logits stay bound (a verify call is k + 1 positions; onnxruntime-genai's K is at
# most 16): views of one (1 HELD) and one (1 HELD v) buffer per row; a longer one (a server's prefill) allocates
HELD = 17


def lookup(seq: np.ndarray, k: int, max_ngram: int, eos: np.ndarray, latest: bool = True) -> np.ndarray:
    """Prompt lookup on one row's tokens (int64, its real tokens then the new ones): at most k candidates after
    the longest n-gram (at most max_ngram) ending the row that occurs earlier in it, cut before the first eos id.
    latest=False: its first occurrence decides, as transformers' PromptLookupCandidateGenerator.get_candidates
    chooses; latest (the default): its most recent occurrence with k tokens after it (else its first), as
    llama.cpp's and onnxruntime-genai's lookups prefer the recent text: a model's loop or the copy it is making
    continues as it did last time. The tokens are the target's either way (only the speed differs)."""
    n_tok = len(seq)
    for n in range(min(max_ngram, n_tok - 1), 0, -1):
        # windows starting at 0..n_tok-n-1 (the one at n_tok-n is the tail itself, which proposes nothing)
        hits = np.ones(n_tok - n, np.bool_)
        for j in range(n):
            hits &= seq[j : n_tok - n + j] == seq[n_tok - n + j]
        where = np.flatnonzero(hits)
        if len(where):
            full = where[where + n + k <= n_tok] if latest else where[:0]
            start = int(full[-1] if len(full) else where[0]) + n
            found = seq[start : start + k]
            stop = np.flatnonzero(np.isin(found, eos)) if len(eos) else ()
            return found[: stop[0]] if len(stop) else found
    return seq[:0]


class RowCalls:
    """One row's calls on a whole-model session over a batch cache: the row's slice of each buffer (a view, no
    copy), its key mask row and its own past_len; input_ids (1 t) after the row's past. A one-token call runs a
    binding made once (its ids and logits arrays bound as plain decoding binds them). `rows`: what holds the
    batch's host arrays, `cache_arrays` {name: (b ...)} and `key_mask` (b n) bool (LeftRows, or a server's
    buffers)."""

    def __init__(self, sess: RuntimeSession, rows: LeftRows, r: int) -> None:
        self.sess, self.keep, self.length = sess, [], 0
        self.past_len = np.zeros((), np.int64)
        self.logits_type = next(o.type for o in sess._sess.get_outputs() if o.name == LOGITS.name)
        self.binding = self._bind(rows, r)
        self.single = None
        self.chunks: dict[int, tuple] = {}  # t <= HELD -> OrtValues of views (1 t) and (1 t|1 v) of the buffers
        self.all_logits = returns_all_logits(sess)  # else a call's logits are its last position's (1 1 v)
        if self.logits_type == "tensor(float)":
            self.one_ids = np.zeros((1, 1), np.int64)
            self.one_logits = np.zeros((1, 1, int(sess.metadata["attnzoo.vocab"])), np.float32)
            self.single = self._bind(rows, r)
            self.single.bind_ortvalue_input(INPUT_IDS.name, self._held(self.one_ids))
            self.single.bind_ortvalue_output(LOGITS.name, self._held(self.one_logits))
            self.chunk_ids = np.zeros((1, HELD), np.int64)
            self.chunk_logits = np.zeros((1, HELD if self.all_logits else 1, self.one_logits.shape[-1]), np.float32)

    def _held(self, arr: np.ndarray, element_type: str = ""):
        self.keep.append(arr)  # a CPU OrtValue wraps its array: it stays alive with this object
        return ort_value(arr, element_type, "cpu")

    def _bind(self, rows: LeftRows, r: int):
        binding = self.sess.new_binding()
        types = buffer_types(self.sess._sess.get_inputs(), PREFIX)
        for name, arr in rows.cache_arrays.items():
            value = self._held(arr[r : r + 1], types[name])  # the row is the leading axis: contiguous, in place
            layer, kv = name.split(".")[1:3]
            binding.bind_ortvalue_input(name, value)
            binding.bind_ortvalue_output(LM_PRESENT.format(i=layer, kv=kv), value)
        binding.bind_ortvalue_input(ATTENTION_MASK.name, self._held(rows.key_mask[r : r + 1]))
        binding.bind_ortvalue_input(PAST_LEN.name, self._held(self.past_len))
        if NEXT_TOKEN.name in self.sess.output_names:
            binding.bind_output(NEXT_TOKEN.name, "cpu")
        return binding

    def run(self, ids: np.ndarray) -> np.ndarray:
        """ids (t,) at slots length..length+t-1 -> the logits (t v) float32 (all_logits) or the last one's (1 v);
        length advances by t (the caller rolls it back by setting it lower). The result is read before the next
        call (float32 logits, at most HELD tokens: a view of buffers made once and bound, so the call allocates
        nothing)."""
        t = len(ids)
        self.past_len[()] = self.length
        self.length += t
        if t == 1 and self.single is not None:
            self.one_ids[0, 0] = ids[0]
            self.sess.run_with_iobinding(self.single)
            return self.one_logits[0]
        if self.single is not None and t <= HELD:  # float32 logits, a verify call: the buffers' views, bound
            rows = t if self.all_logits else 1
            if t not in self.chunks:
                self.chunks[t] = (self._held(self.chunk_ids[:, :t]), self._held(self.chunk_logits[:, :rows]))
            self.chunk_ids[0, :t] = ids
            self.binding.bind_ortvalue_input(INPUT_IDS.name, self.chunks[t][0])
            self.binding.bind_ortvalue_output(LOGITS.name, self.chunks[t][1])
            self.sess.run_with_iobinding(self.binding)
            return self.chunk_logits[0, :rows]
        chunk = np.ascontiguousarray(ids, np.int64)[None]
        self.binding.bind_ortvalue_input(INPUT_IDS.name, ort_value(chunk, "", "cpu"))
        self.binding.bind_output(LOGITS.name, "cpu")
        self.sess.run_with_iobinding(self.binding)
        logits = next(o for o in self.binding.get_outputs() if len(o.shape()) == 3)
        return as_float32(logits)[0]


class DraftRow:
    """One row's draft calls (RowCalls on the draft's cache); `offset`: the slots before the row's real tokens
    (its left padding); `runs`: the draft calls made."""

    def __init__(self, calls: RowCalls, offset: int = 0) -> None:
        self.calls, self.offset, self.runs = calls, offset, 0

    def propose(self, seq: np.ndarray, k: int, choose) -> tuple[np.ndarray, list]:
        """k tokens after the row's text seq (its real tokens): (tokens, the draft's distribution at each, or
        None each when choose is greedy). `choose(logits (v)) -> (token, q)`."""
        calls = self.calls
        done = calls.length - self.offset  # the row's tokens already in the draft cache
        logits = calls.run(seq[done:])[-1]
        self.runs += 1
        tokens, dists = [], []
        for j in range(k):
            token, q = choose(logits)
            tokens.append(token)
            dists.append(q)
            if j + 1 < k:
                logits = calls.run(np.array([token], np.int64))[-1]
                self.runs += 1
        return np.array(tokens, np.int64), dists

    def keep(self, tokens: int) -> None:
        """The row's draft cache keeps its first `tokens` real tokens (the rest are past the target's verdict)."""
        self.calls.length = min(self.calls.length, self.offset + tokens)


def check_draft(sess: RuntimeSession, vocabs: tuple[int, int]) -> None:
    """vocabs: (the draft's, the target's); a draft must share the target's tokenizer."""
    if vocabs[0] != vocabs[1]:
        raise zoo.ArgumentError(
            f"the draft {sess.path.name} has a vocabulary of {vocabs[0]}, the target {vocabs[1]}: a draft must "
            "share the target's tokenizer"
        )


class Draft:
    """A draft model's rows for a call (the module docstring): its cache bound once, each row a DraftRow."""

    def __init__(self, sess: RuntimeSession, b: int, t: int, n: int, prompt_mask, vocabs: tuple[int, int]) -> None:
        """vocabs: (the draft's, the target's)."""
        check_draft(sess, vocabs)
        self.sess = sess
        self.rows = LeftRows(sess, b, t, n, prompt_mask, False, lambda logits: logits.argmax(-1))
        self.real = np.full(b, t, np.int64) if prompt_mask is None else np.asarray(prompt_mask).sum(1)
        self.row: list[DraftRow] = []

    def prefill(self, ids: np.ndarray, chunk: int) -> None:
        """The prompt into the draft's cache (its own first token is not used: the target's is)."""
        self.rows.prefill(ids, chunk)
        b, t = ids.shape
        self.row = [DraftRow(RowCalls(self.sess, self.rows, r), t - int(self.real[r])) for r in range(b)]
        for d in self.row:
            d.calls.length = t


def draft_choice(params, rng):
    """The draft's choice for one row: greedy (token, None), or a draw from its distribution under the call's
    warpers (token, q (v)); any q keeps the output the target's (the accept rule reads the q drawn from)."""

    def choose(logits: np.ndarray):
        if not params.do_sample:
            return int(logits.argmax()), None
        q = distribution(logits[None], params)[0]
        return draw(q, rng), q

    return choose


def draw(probs: np.ndarray, rng) -> int:
    """One draw from probs (v) with the row's stream, as runtime/sampling.Sampler draws."""
    cum = np.cumsum(probs)
    i = min(int(np.searchsorted(cum, rng.random() * cum[-1], side="right")), len(probs) - 1)
    while probs[i] == 0:
        i -= 1
    return i


__all__ = ["Draft", "DraftRow", "RowCalls", "check_draft", "draft_choice", "draw", "lookup"]
