"""Continuous batching with speculative decoding (`attnzoo serve MODEL --prompt-lookup K` or `--draft FOLDER`):
every running row verifies candidates (the text's own n-grams, or a draft model's tokens) k at a time,
exactly: runtime/speculative.py's RowRound and verdict, the one accept rule of `attnzoo generate`.

Rows accept different counts, so no write index is shared (generate.continuous's P): each row owns its cache
slots from 0, a request's real tokens with its left padding dropped (generate.packed's layout, on a left-padded
export's host buffers, its key mask all real), and every call is one row's (runtime/candidates.RowCalls on the
row's slice: ONNX Runtime's CPU GroupQueryAttention takes a chunk after a past for one row only). A joining
request takes the lowest free rows; each row's prompt runs in chunks (runtime.generation.prefill_chunk; the
prefix cache's blocks copied in first, slot j being position j) into the target's rows and the draft's. Each
step then takes every running row's next token from its RowRound (a round when its queue is empty: one target
call of its last token and its candidates) and hands it to the path every batcher feeds, one token a step
(GenItem.decoder.add: stop strings, eos ids, streaming, max_tokens; its logprobs from the target's logits at
that token), so a request's answer is what the batcher without speculation gives it: greedy's tokens, or under
sampling the target's distribution (drawn from the row's own stream: a seed reproduces it).

The target must return the logits of every position (an all_logits export: runtime/speculative.check_target).
Counts (runtime/speculative.TALLY) go to the batcher's `tally` (GET /metrics) and each request's timings.
Plain numpy and a thread: no Ray.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from runtime.candidates import DraftRow, RowCalls
from runtime.device_decode import pack
from runtime.generation import prefill_chunk
from runtime.io import LM_PAST
from runtime.kv_buffers import buffer_arrays
from runtime.sampling import Sampling
from runtime.speculative import DRAFT_TOKENS, NGRAM, TALLY, RowRound, Speculation, check_target, count
from zoo import AttnzooError

from ..schema import ServeError
from .prefix import chunks
from .protocol import GenItem
from .rows import OwnSlotsBatcher

GREEDY = Sampling()  # a /generate request: the argmax of the model's own logits (the graph's next_token)
SPEC_HEADERS = {name: f"x-attnzoo-spec-{name.replace('_', '-')}" for name in TALLY}  # a request's counts


@dataclass(frozen=True)
class ServeSpeculation:
    """What a server speculates with (serve --prompt-lookup K [--ngram N] | --draft FOLDER [--draft-tokens K]):
    prompt lookup of at most `prompt_lookup` candidates a round, or a draft export's files (serve.replica.
    model_files: they travel to the replicas as the target's do) proposing `draft_tokens` (default 5)."""

    prompt_lookup: int | None = None
    ngram: int | None = None
    draft: dict | None = field(default=None, repr=False)
    draft_tokens: int | None = None

    def __post_init__(self) -> None:
        if (self.prompt_lookup is None) == (self.draft is None):
            raise ServeError("speculative decoding takes prompt_lookup=K (--prompt-lookup) or a draft (--draft), one")
        if self.ngram is not None and self.draft is not None:
            raise ServeError("ngram (--ngram) sizes prompt lookup's n-grams; a draft (--draft) proposes without them")
        if self.draft_tokens is not None and self.draft is None:
            raise ServeError("draft_tokens (--draft-tokens) goes with a draft (--draft FOLDER), not prompt lookup")
        try:
            count("prompt_lookup", self.prompt_lookup)
            count("ngram", self.ngram)
            count("draft_tokens", self.draft_tokens)
        except AttnzooError as e:
            raise ServeError(str(e)) from None

    @property
    def k(self) -> int:
        """Candidates a round proposes at most."""
        return self.prompt_lookup if self.draft is None else self.draft_tokens or DRAFT_TOKENS

    def describe(self) -> dict:
        """GET /metadata's "speculation"."""
        if self.draft is not None:
            return {"kind": "draft", "k": self.k, "draft": next(iter(self.draft))}
        return {"kind": "prompt lookup", "k": self.k, "ngram": self.ngram or NGRAM}

    def open(self, sess, provider: str = "cpu", threads: int | None = None) -> Speculation:
        """The Speculation of a replica over `sess` (its draft's session opened from its files), checked."""
        from ..replica import open_session

        draft = open_session(self.draft, provider, threads) if self.draft is not None else None
        spec = Speculation(self.k, self.ngram or NGRAM, draft)
        check_speculating(sess, spec)
        return spec


def check_speculating(sess, spec: Speculation, path=None) -> None:
    """ServeError, in one line, when `sess` (and spec's draft) cannot speculate: runtime/speculative.check_target's
    rules (a left-padded export with the logits of every position, no longrope layers) and one vocabulary."""
    from runtime.candidates import check_draft
    from runtime.generation import lm_vocab, position_dependent

    try:
        check_target(sess, spec, position_dependent)
        if spec.draft is not None:
            check_draft(spec.draft, (lm_vocab(spec.draft), lm_vocab(sess)))
    except AttnzooError as e:
        raise ServeError(f"{path or sess.path.name}: {e}") from None


def generate_options(spec: Speculation) -> dict:
    """OnnxSession.generate's options for `spec` (a static batch's run speculates so)."""
    if spec.draft is not None:
        return {"assistant_model": spec.draft, "num_assistant_tokens": spec.k}
    return {"prompt_lookup_num_tokens": spec.k, "max_matching_ngram_size": spec.max_ngram}


class RowBuffers:
    """`b` rows x `n` slots of a left-padded export's caches on the host (each row's real tokens from slot 0,
    the key mask all real), and one RowCalls per row over its slice, bound once."""

    def __init__(self, sess, b: int, n: int) -> None:
        self.cache_arrays = buffer_arrays(sess._sess.get_inputs(), b, n, LM_PAST.split("{", 1)[0])
        self.key_mask = np.ones((b, n), np.bool_)
        self.calls = [RowCalls(sess, self, r) for r in range(b)]

    def prefill(self, sess, row: int, ids: np.ndarray, prefix=None) -> tuple[np.ndarray, int]:
        """Row `row`'s real tokens (t,) from slot 0, in chunks (a prefix cache's blocks copied first) -> (the
        logits at its last token (v), a copy; the tokens the prefix cache gave)."""
        calls, t = self.calls[row], len(ids)
        cached = 0
        if prefix is not None:
            cached, blocks = prefix.match(ids)
            for i, blob in enumerate(blocks):
                for name, arr in blob.items():
                    self.cache_arrays[name][row, :, i * prefix.block : (i + 1) * prefix.block] = arr
        calls.length = cached
        for start, end in chunks(cached, t, prefill_chunk(sess, 1, t)):
            logits = calls.run(ids[start:end])
        if prefix is not None:
            prefix.store(ids, lambda a, b: {k: v[row, :, a:b] for k, v in self.cache_arrays.items()})
        return logits[-1].copy(), cached


class SpeculativeBatcher(OwnSlotsBatcher):
    """The continuous batcher of a speculating server (the module docstring). speculation: runtime/speculative's
    Speculation (its draft an OnnxSession); tally: a dict the rounds add their counts to (GET /metrics reads it).

    capacity: the slots n of every row: a request needs its prompt + max_new_tokens - 1 <= n."""

    def __init__(
        self, sess, max_rows: int, capacity: int, wait_s: float = 0.0, *, speculation: Speculation, **options
    ) -> None:
        tally = options.pop("tally", None)
        self.tally: dict = {} if tally is None else tally  # a server's own, shared with /metrics (even empty)
        super().__init__(sess, max_rows, capacity, wait_s, **options)
        self.spec = speculation
        self.target = RowBuffers(sess, max_rows, capacity)
        self.draft = RowBuffers(speculation.draft, max_rows, capacity) if speculation.draft is not None else None
        self.held = np.zeros(max_rows, np.bool_)
        self.rounds: dict[int, RowRound] = {}  # row -> its round
        self.seqs: dict[int, list[int]] = {}  # row -> its real tokens so far
        self._counts: dict[int, dict] = {}  # id(GenItem) -> the request's own counts (its timings)

    def _join(self, it: GenItem, done) -> None:
        started = time.perf_counter()
        packed, lengths = pack(it.ids, it.mask)
        rows = [int(r) for r in np.flatnonzero(~self.held)[: it.rows]]  # the lowest free rows
        counts = {}
        eos = it.decoder.eos if it.decoder is not None else () if it.eos_token_id is None else (it.eos_token_id,)
        last = []
        self._cached = 0
        for i, row in enumerate(rows):
            ids = packed[i, : lengths[i]]
            logits, cached = self.target.prefill(self.sess, row, ids, self.prefix)
            last.append(logits)
            self._cached += cached
            draft = None
            if self.draft is not None:
                self.draft.prefill(self.spec.draft, row, ids)
                draft = DraftRow(self.draft.calls[row])
            self.rounds[row] = RowRound(self.spec, self.target.calls[row], draft, eos, (self.tally, counts))
            self.seqs[row] = ids.tolist()
        logits = np.stack(last)
        first = logits.argmax(-1)
        if it.decoder is not None:
            first = it.decoder.choose(logits, first)
        self._counts[id(it)] = counts  # read by _timing when it leaves
        self.held[rows] = True
        self.used += it.rows
        self._started(it, rows, done, started, first)

    def _step(self) -> None:
        for run in self.running:
            it, decoder = run.item, run.item.decoder
            left = it.max_new_tokens - len(run.tokens) - 1  # tokens it may make after this one
            params = GREEDY if decoder is None else decoder.sampler.params
            rng = decoder.sampler.rngs[0] if decoder is not None and params.do_sample else None
            scores_for = _raw if decoder is None else decoder.scores_for
            token = np.empty(len(run.rows), np.int64)
            for i, row in enumerate(run.rows):
                seq = self.seqs[row]
                seq.append(int(run.tokens[-1][i]))
                token[i], logits = self.rounds[row].next(np.asarray(seq, np.int64), params, rng, scores_for, left)
                if decoder is not None:
                    decoder.took(logits[None])  # its logprobs: the target's at this token
            run.tokens.append(token)
            run.peak_rows = max(run.peak_rows, self.used)
        for run in list(self.running):
            self._finish_if_done(run)

    def _release(self, run) -> None:
        self.held[run.rows] = False
        self.used -= len(run.rows)
        for row in run.rows:
            self.rounds.pop(row, None)
            self.seqs.pop(row, None)

    def _timing(self, run) -> dict:
        out = super()._timing(run)
        counts = self._counts.pop(id(run.item), {})
        out.update({header: counts.get(name, 0) for name, header in SPEC_HEADERS.items()})
        return out


def _raw(cand: np.ndarray, logits: np.ndarray):
    """A /generate request's verdict scores: the model's own logits (greedy's argmax is the graph's)."""
    return lambda j: logits[j]


__all__ = [
    "GREEDY",
    "SPEC_HEADERS",
    "RowBuffers",
    "ServeSpeculation",
    "SpeculativeBatcher",
    "check_speculating",
    "generate_options",
]
