"""Speculative decoding of a whole model under ONNX Runtime: candidate tokens (runtime/candidates.py: prompt lookup,
or a draft model of the same tokenizer) verified by the target in one call per row, exact. numpy + onnxruntime only.

    tokens = sess.generate(ids, 128, prompt_lookup_num_tokens=10)                 # n-grams of the text so far
    tokens = sess.generate(ids, 128, assistant_model=draft_sess, num_assistant_tokens=5)

A round for one row: its last token (not yet in the cache) and k candidates run as one chunk after the row's past
(input_ids (1, k + 1) at past_len: the static cache takes a chunk after a past), which writes k + 1 slots and
returns the logits at each (the export must have all_logits=True). The candidates are kept while the target
agrees; then one token of the target's own. The cache keeps the accepted ones by advancing the row's length past
them only: the slots of the rejected ones are written over by the next call (the static cache is positional,
nothing is copied or cleared).

Exact: greedy keeps a candidate while it is the target's argmax (after any repetition penalty), so the tokens are
plain greedy's; sampling keeps a prompt-lookup candidate while the target's own draw equals it (transformers'
rule for candidates without a distribution), a draft's with probability min(1, p/q) and draws a rejected one's
replacement from the residual max(p - q, 0) (Leviathan et al. 2023; transformers' _speculative_sampling), so
each token is distributed as the target's. Each row draws from its own stream (runtime/sampling.py), so a seed
reproduces a call.

Each row runs its own calls (its slice of the bound buffers, its own past_len): rows accept different counts, and
ONNX Runtime's CPU GroupQueryAttention takes a chunk after a past for one row only. The generation loop
(runtime/generation.Generation) takes one token per row per step from each row's queue of accepted tokens, so eos
ids, stop strings, streaming and max_time work as before. Back-off: k starts at 2 (at most K), doubles after a
round that kept every candidate and is one more than the kept count after one that did not (within 1..K: a
rejected candidate costs a chunk position), and a round that kept none pauses the row's speculation for 1, 2, 4 ...
16 plain steps (no candidates: a one-token call, bound once, as plain decoding).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

import zoo

from .candidates import Draft, RowCalls, draft_choice, draw, lookup
from .device_decode import LeftRows, is_packed, returns_all_logits

if TYPE_CHECKING:
    from .core import RuntimeSession

MAX_PAUSE = 16  # plain steps at most between two tries of a row whose candidates were all rejected
NGRAM = 2  # transformers' max_matching_ngram_size default
DRAFT_TOKENS = 5  # transformers' num_assistant_tokens default
FIRST_K = 2  # a row's first round proposes at most this many: a rejected candidate costs a position of the chunk


@dataclass(frozen=True)
class Speculation:
    """What proposes candidates: prompt lookup (draft None) or a draft session; k the most per round."""

    k: int
    max_ngram: int = NGRAM
    draft: RuntimeSession | None = None

    @property
    def kind(self) -> str:
        return "draft" if self.draft is not None else "prompt lookup"


def count(name: str, v, default=None) -> int | None:
    """A speculation count (k, an n-gram size) checked: an int >= 1, or `default` for None."""
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
        raise zoo.ArgumentError(f"{name}={v!r} must be an int >= 1")
    return int(v)


def speculation(
    prompt_lookup_num_tokens=None, max_matching_ngram_size=None, assistant_model=None, num_assistant_tokens=None
) -> Speculation | None:
    """The call's speculation from transformers' names, checked; None when none is asked."""
    from .core import RuntimeSession

    k = count("prompt_lookup_num_tokens", prompt_lookup_num_tokens)
    ngram = count("max_matching_ngram_size", max_matching_ngram_size, NGRAM)
    n_draft = count("num_assistant_tokens", num_assistant_tokens, DRAFT_TOKENS)
    if assistant_model is None:
        if num_assistant_tokens is not None:
            raise zoo.ArgumentError("num_assistant_tokens needs assistant_model=... (a draft model's session)")
        return None if k is None else Speculation(k, ngram)
    if k is not None:
        raise zoo.ArgumentError("give prompt_lookup_num_tokens or assistant_model, not both")
    if not isinstance(assistant_model, RuntimeSession):
        raise zoo.InputTypeError(
            f"assistant_model must be an OnnxSession of a whole-model export (the draft), got "
            f"{type(assistant_model).__name__}"
        )
    return Speculation(n_draft, ngram, assistant_model)


def check_target(sess: RuntimeSession, spec: Speculation, longrope) -> None:
    """Refuse, in one line, an export the rounds cannot run on; longrope(session) says whether its layers' rotary
    frequencies depend on a call's positions (runtime/generation.py's one_call_prompt_len and recompute_at)."""
    for s, role in ((sess, "target"), (spec.draft, "draft")):
        if s is None:
            continue
        if is_packed(s) or s.cuda_graph:
            raise zoo.ArgumentError(
                f"speculative decoding runs each row's chunk after its past on a left-padded export; the {role} "
                f"{s.path.name} takes packed rows (attnzoo.padding=packed): export it with padding='left'"
            )
        if longrope(s):
            raise zoo.ArgumentError(
                f"the {role} {s.path.name} has longrope layers, whose frequencies depend on a call's largest "
                "position: a chunk of candidates could change them, so speculative decoding is refused for it"
            )
    if not returns_all_logits(sess):
        raise zoo.ArgumentError(
            f"{sess.path.name} returns the logits of a call's last position only: verifying k candidates in one "
            "call reads the logits at each; export it with all_logits=True (attnzoo generate --prompt-lookup / "
            "--draft exports a folder so itself)"
        )


TALLY = ("target_calls", "proposed", "accepted", "emitted", "draft_calls")  # what a round counts


class RowRound:
    """One row's speculation (the module docstring): its target calls (RowCalls), its draft's (a DraftRow; None:
    prompt lookup), k with back-off, and the tokens its last round kept and not yet taken, each with the target's
    logits (v) it was chosen from (read before the row's next round: a one-token call's are its bound array).
    `tallies`: dicts of TALLY counts each round adds to (a call's, a server's, a request's)."""

    def __init__(self, spec: Speculation, calls: RowCalls, draft=None, eos=(), tallies: tuple = ()) -> None:
        self.spec, self.calls, self.draft, self.tallies = spec, calls, draft, tallies
        self.eos = np.asarray(eos, np.int64)
        self.k = min(spec.k, FIRST_K)  # grows by doubling while every candidate is kept
        self.pause = self.backoff = 0
        self.queue: list[tuple[int, np.ndarray]] = []

    def _count(self, **counts) -> None:
        for tally in self.tallies:
            for name, n in counts.items():
                tally[name] = tally.get(name, 0) + n

    def next(self, seq: np.ndarray, params, rng, scores_for, remaining: int) -> tuple[int, np.ndarray]:
        """(the row's next token, the target's logits at it) after seq (int64: its real tokens, the last not yet
        in the cache): from the queue, after a round when it is empty. scores_for(cand, logits) -> scores(j) (the
        verdict's: row_scores, or a server request's processors); rng: the row's stream (sampling);
        `remaining`: the tokens the row may still make after this one (a round proposes no more)."""
        if not self.queue:
            self._round(seq, params, rng, scores_for, remaining)
        for tally in self.tallies:  # _count's work without its keywords: this runs once a token
            tally["emitted"] = tally.get("emitted", 0) + 1
        return self.queue.pop(0)

    def _round(self, seq: np.ndarray, params, rng, scores_for, remaining: int) -> None:
        spec, calls = self.spec, self.calls
        k = 0 if self.pause else int(min(self.k, remaining))
        self.pause = max(0, self.pause - 1)
        qs: list = []
        runs = 0
        if k and self.draft is None:
            cand = lookup(seq, k, spec.max_ngram, self.eos)
        elif k:
            before = self.draft.runs
            cand, qs = self.draft.propose(seq, k, draft_choice(params, rng))
            runs = self.draft.runs - before
        else:
            cand = np.zeros(0, np.int64)
        base = calls.length
        logits = calls.run(np.concatenate([seq[-1:], cand]))
        kept, token = verdict(logits, cand, qs, params, scores_for(cand, logits), rng)
        calls.length = base + 1 + kept  # the rejected candidates' slots are written over next time
        if self.draft is not None and len(cand):
            self.draft.keep(len(seq) + min(kept, len(cand) - 1))
        self.queue = [(int(c), logits[j]) for j, c in enumerate(cand[:kept])] + [(token, logits[kept])]
        m = len(cand)
        self._count(target_calls=1, proposed=m, accepted=kept, draft_calls=runs)
        if m:
            self.k = min(spec.k, 2 * self.k) if kept == m else max(1, kept + 1)
            if kept == 0:
                self.backoff = min(MAX_PAUSE, max(1, 2 * self.backoff))
                self.pause = self.backoff
            else:
                self.backoff = 0


def summary(stats: dict, spec: Speculation) -> dict:
    """A tally (TALLY's counts) with its kind, k, acceptance rate and tokens per target call."""
    s = {name: stats.get(name, 0) for name in TALLY}
    s.update(kind=spec.kind, k=spec.k)
    s["acceptance_rate"] = s["accepted"] / s["proposed"] if s["proposed"] else 0.0
    s["tokens_per_target_call"] = s["emitted"] / s["target_calls"] if s["target_calls"] else 0.0
    return s


class SpeculativeRows:
    """The driver runtime/generation.Generation runs (prefill, step) when a call speculates (the module
    docstring): a RowRound per row. `done` (b) bool, set by the loop, marks the rows that ended: they make no
    more calls."""

    def __init__(
        self, sess, b: int, t: int, n: int, prompt_mask, argmax: bool, sampler, spec: Speculation, eos, vocabs
    ):
        """vocabs: (the draft's, the target's) vocabulary sizes."""
        self.sess, self.spec, self.sampler, self.eos = sess, spec, sampler, eos
        self.rows = LeftRows(sess, b, t, n, prompt_mask, argmax, sampler.choose)
        self.draft = Draft(spec.draft, b, t, n, prompt_mask, vocabs) if spec.draft is not None else None
        self.real = np.full(b, t, np.int64) if prompt_mask is None else np.asarray(prompt_mask).sum(1).astype(np.int64)
        self.done = np.zeros(b, np.bool_)
        self.stats: dict = {}

    def prefill(self, ids: np.ndarray, chunk: int) -> np.ndarray:
        token = self.rows.prefill(ids, chunk)
        b, t = ids.shape
        if self.draft is not None:
            self.draft.prefill(ids, chunk)
        self.rounds = []
        for r in range(b):
            calls = RowCalls(self.sess, self.rows, r)
            calls.length = t
            draft = self.draft.row[r] if self.draft is not None else None
            self.rounds.append(RowRound(self.spec, calls, draft, self.eos, (self.stats,)))
        # each row's real tokens so far, in a buffer of its own (a round reads a view: no list made an array a step)
        self.seqs = np.zeros((b, self.rows.key_mask.shape[1]), np.int64)  # t + new slots
        self.lengths = [int(n) for n in self.real]
        for r in range(b):
            self.seqs[r, : self.real[r]] = ids[r, t - self.real[r] :]
        # what a step hands each row's round, made once (a step's own work is per token: docs/benchmarks.md)
        sampler = self.sampler
        self.scorers = [lambda cand, logits, r=r: row_scores(sampler, r, cand, logits) for r in range(b)]
        self.streams = list(sampler.rngs) if sampler.params.do_sample else [None] * b
        return token

    def recompute(self, seq: np.ndarray) -> np.ndarray:  # never reached: check_target refuses longrope exports
        raise zoo.ArgumentError("speculative decoding does not recompute a longrope model's cache")

    def step(self, token: np.ndarray, i: int, remaining: int) -> np.ndarray:
        """The tokens after step i's `token` (b): each active row's next from its queue, after a round if empty.
        `remaining`: the tokens the call may still make after the next one (a round proposes no more)."""
        out, params, seqs, lengths = token.copy(), self.sampler.params, self.seqs, self.lengths
        for r in np.flatnonzero(~self.done) if self.done.any() else range(len(out)):
            n = lengths[r]
            seqs[r, n] = token[r]
            lengths[r] = n + 1
            out[r] = self.rounds[r].next(seqs[r, : n + 1], params, self.streams[r], self.scorers[r], remaining)[0]
        return out

    def summary(self) -> dict:
        return summary(self.stats, self.spec)


def row_scores(sampler, r: int, cand: np.ndarray, logits: np.ndarray):
    """scores(j) -> (v,) float32: the target's logits at candidate position j (after the row's last token and
    cand[:j]) through the sampler's processors (every generation_config key, runtime/processors.py), as plain
    decoding's step would process them with those tokens made. The processors hold per-row state (a row's
    padding, its prompt, its encoder input), so they run over the whole batch: every row's history gets cand[:j]
    (the other rows' answers are dropped), and row r's is taken."""
    history = sampler.input_ids
    b = len(history)
    if not sampler.processors:  # none configured (plain greedy or sampling): the logits as they are

        def raw(j: int) -> np.ndarray:
            return np.asarray(logits[j], np.float32)

        raw.unprocessed = True  # verdict's greedy then takes every position's argmax of its logits at once
        return raw

    def scores(j: int) -> np.ndarray:
        ids = np.concatenate([history, np.broadcast_to(np.asarray(cand[:j], np.int64), (b, j))], 1)
        batch = np.broadcast_to(np.asarray(logits[j], np.float32), (b, logits.shape[-1])).copy()
        return sampler.processors(ids, batch)[r]

    return scores


def _probs(scores: np.ndarray) -> np.ndarray:
    """softmax over the live tokens (the removed ones, -inf, get 0), float64."""
    live = scores > -np.inf
    p = np.zeros(scores.shape, np.float64)
    x = scores[live].astype(np.float64)
    e = np.exp(x - x.max())
    p[live] = e / e.sum()
    return p


def verdict(logits: np.ndarray, cand: np.ndarray, qs: list, params, scores, rng) -> tuple[int, int]:
    """(candidates kept, the target's token after them) from the target's logits (m + 1, v) at the row's last
    token and each of its m candidates. qs: the draft's distribution each candidate was drawn from ([] for prompt
    lookup, or greedy); scores(j): position j's logits through the row's processors (row_scores); rng: the row's
    stream (sampling)."""
    if getattr(scores, "unprocessed", False) and not params.do_sample:  # greedy: where the target first disagrees
        picks = logits[: len(cand) + 1].argmax(-1)  # first of ties, as plain greedy
        agree = picks[: len(cand)] == cand
        j = len(cand) if agree.all() else int(np.argmin(agree))  # the first False (all() of none: every kept)
        return j, int(picks[j])
    for j, c in enumerate(int(x) for x in cand):
        processed = scores(j)
        if not params.do_sample:
            token = int(processed.argmax())  # first of ties, as plain greedy
            if token != c:
                return j, token
            continue
        p = _probs(processed)
        if not qs:  # prompt lookup: the target's own draw must be the candidate
            token = draw(p, rng)
            if token != c:
                return j, token
        elif rng.random() * qs[j][c] >= p[c]:  # rejected with probability 1 - min(1, p / q)
            residual = np.maximum(p - qs[j], 0.0)
            return j, draw(residual if residual.sum() > 0 else p, rng)
    processed = scores(len(cand))  # every candidate kept: the target's own token after them
    return len(cand), int(processed.argmax()) if not params.do_sample else draw(_probs(processed), rng)


__all__ = [
    "DRAFT_TOKENS",
    "FIRST_K",
    "MAX_PAUSE",
    "NGRAM",
    "TALLY",
    "RowRound",
    "Speculation",
    "SpeculativeRows",
    "check_target",
    "count",
    "row_scores",
    "speculation",
    "summary",
    "verdict",
]
