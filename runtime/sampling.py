"""Choosing the next token as transformers' `generate` does, in numpy (no torch): greedy by default, or
sampling with temperature, top_k, top_p and min_p, and a repetition penalty in either mode.

    params = resolve({"temperature": 0.7, "seed": 1}, checkpoint_defaults)   # call knobs over the checkpoint's
    sampler = Sampler(params, prompt_ids, prompt_mask, vocab)               # one RNG stream per row
    token = sampler.choose(logits)                                          # (b v) -> (b,) int64

The order is transformers' (generation/utils.py `_get_logits_processor`): the repetition penalty (a
processor: greedy too), then, when sampling, the warpers temperature -> top_k -> top_p -> min_p, then a
softmax and one draw. When sampling is on: `do_sample=True`; or a temperature above 0 given without
`do_sample` (OpenAI's rule); a temperature of 0 is greedy. Knobs a call leaves unset come from the
checkpoint's generation_config.json, then transformers' defaults (top_k 50 when sampling, as there).

Each row draws from its own stream, numpy's PCG64 seeded by SeedSequence([seed, row]), so a row's tokens
do not depend on its batch-mates; with one seed per row (a list), row r draws as a call of that row alone
with seed[r]. A call without a seed takes a fresh one (`Sampler.seed` reports it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import zoo

# transformers' GenerationConfig defaults for the knobs we take (configuration_utils._get_default_generation_params)
DEFAULTS = {"do_sample": False, "temperature": 1.0, "top_k": 50, "top_p": 1.0, "min_p": None, "repetition_penalty": 1.0}
KNOBS = tuple(DEFAULTS)


@dataclass(frozen=True)
class Sampling:
    """What chooses a token. do_sample False: the argmax (after any repetition penalty)."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 50  # transformers' default when sampling; 0 = off
    top_p: float = 1.0  # 1 = off
    min_p: float | None = None  # None or 0 = off
    repetition_penalty: float = 1.0  # 1 = off; > 1 makes tokens already in the row less likely
    seed: int | tuple[int, ...] | None = None  # one per row: row r draws as a call of one row with seed[r]

    def __post_init__(self) -> None:
        def bad(name, value, rule):
            raise zoo.ArgumentError(f"{name}={value!r} {rule}")

        if not isinstance(self.do_sample, (bool, np.bool_)):
            bad("do_sample", self.do_sample, "must be True or False")
        for name in ("temperature", "top_p", "repetition_penalty", "min_p"):
            v = getattr(self, name)
            if v is None and name == "min_p":
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v):
                bad(name, v, "must be a finite number")
        if self.temperature < 0:
            bad("temperature", self.temperature, "must be >= 0 (0 is greedy)")
        if not 0 < self.top_p <= 1:
            bad("top_p", self.top_p, "must be in (0, 1] (1 keeps every token)")
        if self.min_p is not None and not 0 <= self.min_p <= 1:
            bad("min_p", self.min_p, "must be in [0, 1]")
        if self.repetition_penalty <= 0:
            bad("repetition_penalty", self.repetition_penalty, "must be > 0 (1 is off)")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, (int, np.integer)) or self.top_k < 0:
            bad("top_k", self.top_k, "must be an int >= 0 (0 is off)")
        seeds = self.seed if isinstance(self.seed, (list, tuple)) else [self.seed]
        if self.seed is not None and not all(
            not isinstance(v, bool) and isinstance(v, (int, np.integer)) and v >= 0 for v in seeds
        ):
            bad("seed", self.seed, "must be an int >= 0 (or one per row), or None for a fresh one")

    @property
    def needs_logits(self) -> bool:
        """Whether the choice reads the logits (else the graph's own argmax, next_token, is the token)."""
        return self.do_sample or self.repetition_penalty != 1.0


def resolve(call: dict, defaults: dict | None = None) -> Sampling:
    """The call's knobs (None = not given) over `defaults` (a generation_config.json's) over transformers'.
    A temperature given without do_sample turns sampling on when above 0; a temperature of 0 is greedy."""
    merged = dict(DEFAULTS)
    for k in KNOBS:
        if defaults and defaults.get(k) is not None:
            merged[k] = defaults[k]
    given = {k: v for k, v in call.items() if v is not None}
    unknown = sorted(set(given) - set(KNOBS) - {"seed"})
    if unknown:
        raise zoo.ArgumentError(f"unknown sampling knobs {unknown}; known: {', '.join((*KNOBS, 'seed'))}")
    merged.update(given)
    if "temperature" in given and "do_sample" not in given:
        merged["do_sample"] = given["temperature"] > 0
    if merged["temperature"] == 0:
        merged["do_sample"] = False
    if merged["min_p"] == 0:
        merged["min_p"] = None
    return Sampling(**merged)


def penalize(scores: np.ndarray, seen: np.ndarray, penalty: float) -> np.ndarray:
    """transformers' RepetitionPenaltyLogitsProcessor: a token already in the row has its score divided by
    the penalty (multiplied where negative). scores (b v), seen (b v) bool."""
    if penalty == 1.0:
        return scores
    return np.where(seen, np.where(scores < 0, scores * penalty, scores / penalty), scores)


def _softmax(scores: np.ndarray) -> np.ndarray:
    e = np.exp(scores - scores.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """(... v) -> (... v) float64: the model's log-probabilities, as torch.log_softmax (no knob applied)."""
    x = np.asarray(logits, np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def warp(scores: np.ndarray, p: Sampling) -> np.ndarray:
    """The warpers of a sampling call in transformers' order (temperature, top_k, top_p, min_p); removed
    tokens get -inf. scores (b v) float64 -> (b v)."""
    if p.temperature != 1.0:
        scores = scores / p.temperature
    v = scores.shape[-1]
    if p.top_k and p.top_k < v:
        kth = np.partition(scores, v - p.top_k, axis=-1)[:, v - p.top_k, None]
        scores = np.where(scores < kth, -np.inf, scores)
    return _top_p_min_p(scores, p)


def _top_p_min_p(scores: np.ndarray, p: Sampling) -> np.ndarray:
    if p.top_p < 1.0:
        order = np.argsort(scores, axis=-1, kind="stable")  # ascending, as TopPLogitsWarper sorts
        cum = np.cumsum(_softmax(np.take_along_axis(scores, order, -1)), -1)
        drop_sorted = cum <= 1 - p.top_p
        drop_sorted[:, -1] = False  # min_tokens_to_keep = 1
        drop = np.empty_like(drop_sorted)
        np.put_along_axis(drop, order, drop_sorted, -1)
        scores = np.where(drop, -np.inf, scores)
    if p.min_p is not None:
        probs = _softmax(scores)
        drop = probs < p.min_p * probs.max(-1, keepdims=True)
        drop[np.arange(len(drop)), probs.argmax(-1)] = False
        scores = np.where(drop, -np.inf, scores)
    return scores


def distribution(scores: np.ndarray, p: Sampling, seen: np.ndarray | None = None) -> np.ndarray:
    """The probabilities a sampling call draws from: (b v) logits -> (b v), rows summing to 1."""
    scores = np.asarray(scores, np.float64)
    if seen is not None:
        scores = penalize(scores, seen, p.repetition_penalty)
    return _softmax(warp(scores, p))


class Sampler:
    """The per-step choice for a batch: `choose(logits (b v)) -> (b,)`, then `observe(tokens)`.

    prompt (b t) int64 and its mask (b t) (None: all real) seed the repetition penalty's record of what each
    row holds (its real tokens, as transformers skips the left padding)."""

    def __init__(self, params: Sampling, prompt: np.ndarray, mask: np.ndarray | None, vocab: int) -> None:
        self.params = params
        b = prompt.shape[0]
        self.seed = params.seed
        if params.do_sample and self.seed is None:
            self.seed = int(np.random.SeedSequence().entropy % (2**63))
        if isinstance(self.seed, (list, tuple)) and len(self.seed) != b:
            raise zoo.ArgumentError(
                f"seed={list(self.seed)} gives {len(self.seed)} seeds for {b} rows; give one per row"
            )
        # row r's stream: SeedSequence([seed, r]), or [seed[r], 0] with one seed per row (its run alone)
        keys = (
            [(s, 0) for s in self.seed] if isinstance(self.seed, (list, tuple)) else [(self.seed, r) for r in range(b)]
        )
        self.rngs = (
            [np.random.Generator(np.random.PCG64(np.random.SeedSequence(k))) for k in keys] if params.do_sample else []
        )
        self.seen = None
        if params.repetition_penalty != 1.0:
            self.seen = np.zeros((b, vocab), np.bool_)
            rows = np.repeat(np.arange(b), prompt.shape[1])
            real = np.ones(prompt.shape, np.bool_) if mask is None else np.asarray(mask, np.bool_)
            self.seen[rows[real.ravel()], prompt.ravel()[real.ravel()]] = True

    def choose(self, logits: np.ndarray) -> np.ndarray:
        """logits (b v) -> (b,) int64: the argmax (first of ties, as torch) or one draw per row."""
        p = self.params
        scores = np.asarray(logits, np.float64)
        if self.seen is not None:
            scores = penalize(scores, self.seen, p.repetition_penalty)
        if not p.do_sample:
            return scores.argmax(-1)
        if p.temperature != 1.0:
            scores = scores / p.temperature
        v = scores.shape[-1]
        out = np.empty(len(scores), np.int64)
        for row, rng in enumerate(self.rngs):
            s = scores[row]
            keep = None
            if p.top_k and p.top_k < v:  # the rest is -inf after top_k: warp and draw over the kept few only
                keep = np.flatnonzero(s >= np.partition(s, v - p.top_k)[v - p.top_k])
                s = s[keep]
            probs = _softmax(_top_p_min_p(s[None], p))[0]
            cum = np.cumsum(probs)
            i = min(int(np.searchsorted(cum, rng.random() * cum[-1], side="right")), len(probs) - 1)
            while probs[i] == 0:  # the clamp at the end landed on a removed token: step back to a kept one
                i -= 1
            out[row] = i if keep is None else keep[i]
        return out

    def observe(self, tokens: np.ndarray) -> None:
        if self.seen is not None:
            self.seen[np.arange(len(tokens)), tokens] = True


__all__ = ["DEFAULTS", "KNOBS", "Sampler", "Sampling", "distribution", "log_softmax", "penalize", "resolve", "warp"]
