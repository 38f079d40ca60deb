"""Choosing the next token as transformers' `generate` does, in numpy (no torch): the logits processors of the
resolved settings (runtime/processors.py, in transformers' order), then the argmax, or, when sampling, the
warpers (runtime/warpers.py) and one draw.

    params = resolve({"temperature": 0.7, "seed": 1}, checkpoint_defaults)   # call knobs over the checkpoint's
    sampler = Sampler(params, prompt_ids, prompt_mask, vocab, eos=(2,), max_new_tokens=64)
    token = sampler.choose(logits)                                          # (b v) -> (b,) int64
    sampler.observe(token)                                                  # the token joins each row's history

Sampling is on when `do_sample=True`; or a temperature above 0 given without `do_sample` (OpenAI's rule); a
temperature of 0 is greedy. Keys a call leaves unset come from the checkpoint's generation_config.json, then
transformers' defaults (runtime/generation_keys.py: top_k 50 when sampling, as there).

Each row draws from its own stream, numpy's PCG64 seeded by SeedSequence([seed, row]), so a row's tokens
do not depend on its batch-mates; with one seed per row (a list), row r draws as a call of that row alone
with seed[r]. A call without a seed takes a fresh one (`Sampler.seed` reports it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import zoo

from .generation_keys import DEFAULTS, refuse_call
from .processors import LogitsProcessorList, logits_processors
from .warpers import F32, NEG_INF, live_columns

KNOBS = tuple(DEFAULTS)
_FLOATS = ("temperature", "top_p", "typical_p", "epsilon_cutoff", "eta_cutoff", "repetition_penalty")
_IDS = ("suppress_tokens", "begin_suppress_tokens", "forced_eos_token_id")  # a token id or a list of them


def _int(v) -> bool:
    return not isinstance(v, (bool, np.bool_)) and isinstance(v, (int, np.integer))


def _ids(v) -> bool:
    return isinstance(v, (list, tuple)) and all(_int(x) and x >= 0 for x in v)


@dataclass(frozen=True)
class Sampling:
    """What chooses a token: every GenerationConfig key applied here (runtime/generation_keys.py's APPLIED
    processors), at transformers' defaults. do_sample False: the argmax after the processors."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 50  # transformers' default when sampling; 0 = off
    top_p: float = 1.0  # 1 = off
    min_p: float | None = None  # None = off
    top_h: float | None = None
    typical_p: float = 1.0
    epsilon_cutoff: float = 0.0
    eta_cutoff: float = 0.0
    repetition_penalty: float = 1.0  # 1 = off; > 1 makes tokens already in the row less likely
    encoder_repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    encoder_no_repeat_ngram_size: int = 0
    bad_words_ids: tuple | None = None
    sequence_bias: tuple | None = None  # ((ids...), bias) pairs
    min_length: int = 0
    min_new_tokens: int | None = None
    forced_bos_token_id: int | None = None
    forced_eos_token_id: tuple | None = None
    remove_invalid_values: bool = False
    exponential_decay_length_penalty: tuple | None = None
    suppress_tokens: tuple | None = None
    begin_suppress_tokens: tuple | None = None
    renormalize_logits: bool = False
    num_return_sequences: int = 1
    seed: int | tuple[int, ...] | None = None  # one per row: row r draws as a call of one row with seed[r]

    def __post_init__(self) -> None:
        def bad(name, rule):
            raise zoo.ArgumentError(f"{name}={getattr(self, name)!r} {rule}")

        for name in ("do_sample", "remove_invalid_values", "renormalize_logits"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                bad(name, "must be True or False")
        for name in (*_FLOATS, "min_p", "top_h", "encoder_repetition_penalty"):
            v = getattr(self, name)
            if v is None and name in ("min_p", "top_h"):
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float, np.floating, np.integer)) or not np.isfinite(v):
                bad(name, "must be a finite number")
        rules = (
            ("temperature", self.temperature >= 0, "must be >= 0 (0 is greedy)"),
            ("top_p", 0 <= self.top_p <= 1, "must be in [0, 1] (1 keeps every token; 0 the likeliest)"),
            ("min_p", self.min_p is None or 0 <= self.min_p <= 1, "must be in [0, 1]"),
            ("top_h", self.top_h is None or 0 < self.top_h <= 1, "must be in (0, 1]"),
            ("typical_p", 0 < self.typical_p <= 1, "must be in (0, 1] (1 is off)"),
            ("epsilon_cutoff", 0 <= self.epsilon_cutoff < 1, "must be in [0, 1) (0 is off)"),
            ("eta_cutoff", 0 <= self.eta_cutoff < 1, "must be in [0, 1) (0 is off)"),
            ("repetition_penalty", self.repetition_penalty > 0, "must be > 0 (1 is off)"),
            ("encoder_repetition_penalty", self.encoder_repetition_penalty > 0, "must be > 0 (1 is off)"),
        )
        for name, ok, rule in rules:
            if not ok:
                bad(name, rule)
        for name in ("top_k", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "min_length"):
            if not _int(getattr(self, name)) or getattr(self, name) < 0:
                bad(name, "must be an int >= 0 (0 is off)")
        if not _int(self.num_return_sequences) or self.num_return_sequences < 1:
            bad("num_return_sequences", "must be an int >= 1")
        if self.num_return_sequences > 1 and not self.do_sample:
            bad("num_return_sequences", "> 1 needs sampling or num_beams >= it (greedy rows would be copies)")
        for name in ("min_new_tokens", "forced_bos_token_id"):
            v = getattr(self, name)
            if v is not None and (not _int(v) or v < 0):
                bad(name, "must be an int >= 0, or None")
        for name in _IDS:
            v = getattr(self, name)
            if v is not None and not _ids(v):
                bad(name, "must be a list of token ids")
        if self.bad_words_ids is not None and not (
            self.bad_words_ids and all(_ids(w) and w for w in self.bad_words_ids)
        ):
            bad("bad_words_ids", "must be a non-empty list of non-empty lists of token ids")
        if self.sequence_bias is not None and not all(
            _ids(s) and s and isinstance(b, (int, float)) and not isinstance(b, bool) for s, b in self.sequence_bias
        ):
            bad("sequence_bias", "must map token-id sequences to numbers ([[[ids], bias], ...] or {(ids): bias})")
        e = self.exponential_decay_length_penalty
        if e is not None and not (len(e) == 2 and _int(e[0]) and e[0] >= 0 and isinstance(e[1], (int, float))):
            bad("exponential_decay_length_penalty", "must be (start_index, decay_factor)")
        seeds = self.seed if isinstance(self.seed, (list, tuple)) else [self.seed]
        if self.seed is not None and not all(_int(v) and v >= 0 for v in seeds):
            bad("seed", "must be an int >= 0 (or one per row), or None for a fresh one")

    @property
    def needs_logits(self) -> bool:
        """Whether the choice reads the logits (else the graph's own argmax, next_token, is the token)."""
        return any(getattr(self, k) != DEFAULTS[k] for k in KNOBS if k not in ("top_k", "num_return_sequences"))


def _as_setting(key: str, v):
    """A generation_config.json value as Sampling holds it (lists as tuples; one id as a list of one)."""
    if v is None:
        return None
    if key in _IDS:
        return tuple(v) if isinstance(v, (list, tuple)) else (v,) if _int(v) else v
    if key == "bad_words_ids" and isinstance(v, (list, tuple)):
        return tuple(tuple(w) if isinstance(w, (list, tuple)) else w for w in v)
    if key == "sequence_bias":
        pairs = v.items() if isinstance(v, dict) else v
        try:
            return tuple((tuple(ids), b) for ids, b in pairs)
        except (TypeError, ValueError):
            return ((v, None),)  # fails Sampling's check, by name
    if key == "exponential_decay_length_penalty" and isinstance(v, (list, tuple)):
        return tuple(v)
    return v


def resolve(call: dict, defaults: dict | None = None) -> Sampling:
    """The call's keys (None = not given) over `defaults` (a generation_config.json's) over transformers'.
    A temperature given without do_sample turns sampling on when above 0; a temperature of 0 is greedy.
    A call key that is not applied here is refused by name (runtime/generation_keys.py)."""
    merged = dict(DEFAULTS)
    for k in KNOBS:
        if defaults and defaults.get(k) is not None:
            merged[k] = defaults[k]
    given = {k: v for k, v in call.items() if v is not None}
    refuse_call(given)
    unknown = sorted(set(given) - set(KNOBS) - {"seed"})
    if unknown:
        raise zoo.ArgumentError(f"unknown generation keys {unknown}; known: {', '.join((*KNOBS, 'seed'))}")
    merged.update(given)
    if "temperature" in given and "do_sample" not in given:
        merged["do_sample"] = given["temperature"] > 0
    if merged["temperature"] == 0:
        merged["do_sample"] = False
    if merged["min_p"] == 0:
        merged["min_p"] = None
    return Sampling(**{k: _as_setting(k, v) for k, v in merged.items()})


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """(... v) -> (... v) float64: the model's log-probabilities, as torch.log_softmax (no knob applied)."""
    x = np.asarray(logits, np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _probs(row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A row of processed scores -> (the live tokens, their probabilities in float64)."""
    keep = np.flatnonzero(row > NEG_INF)
    x = row[keep].astype(np.float64)
    e = np.exp(x - x.max()) if len(x) else x
    return keep, e / e.sum() if len(x) else e


def distribution(
    scores: np.ndarray, p: Sampling, input_ids: np.ndarray | None = None, mask: np.ndarray | None = None
) -> np.ndarray:
    """The probabilities a call draws from (its argmax when greedy): (b v) logits -> (b v), rows summing to 1.
    input_ids (b t): the tokens so far (the repetition penalty and the n-gram bans read them)."""
    scores = np.asarray(scores, F32)
    ids = np.zeros((len(scores), 0), np.int64) if input_ids is None else np.asarray(input_ids, np.int64)
    procs = logits_processors(p, input_len=ids.shape[1], max_length=None, prompt=ids, mask=mask)
    out = np.zeros(scores.shape, np.float64)
    for r, row in enumerate(procs(ids, scores)):
        keep, probs = _probs(row)
        out[r, keep] = probs
    return out


def draw(scores: np.ndarray, rngs) -> np.ndarray:
    """One draw per row of processed scores (b v) from softmax(scores), row r with rngs[r]: the first token whose
    cumulative probability passes u x the total (u uniform in [0, 1)). Over each row's live tokens only where
    few are left (after top_k, say): the others have probability 0."""
    live = scores > NEG_INF
    k, v = int(live.sum(-1).max(initial=0)), scores.shape[-1]
    if 0 < k <= v // 4:
        idx = live_columns(live, k)
        return idx[np.arange(len(idx)), _draw(np.take_along_axis(scores, idx, -1), rngs)]
    return _draw(scores, rngs)


def _draw(scores: np.ndarray, rngs) -> np.ndarray:
    probs = np.exp(scores.astype(np.float64) - scores.max(-1, keepdims=True))
    probs[~(scores > NEG_INF)] = 0.0  # removed tokens, and a row with every token removed (all 0)
    cum = np.cumsum(probs, -1)
    u = np.array([rng.random() for rng in rngs]) * cum[:, -1]
    idx = np.minimum((cum <= u[:, None]).sum(-1), scores.shape[-1] - 1)
    # where the clamp at the end landed on a token of probability 0: the last live token before it
    live_at = np.maximum.accumulate(np.where(probs > 0, np.arange(scores.shape[-1]), -1), axis=-1)
    return np.maximum(live_at[np.arange(len(idx)), idx], 0).astype(np.int64)


class Sampler:
    """The per-step choice for a batch: `choose(logits (b v)) -> (b,)`, then `observe(tokens)`.

    prompt (b t) int64 and its left-padding mask (b t) (None: all real) start each row's history; eos (the ids
    min_length and the like hold back), max_new_tokens (where forced_eos_token_id lands) and encoder_ids (an
    encoder-decoder's input: encoder_repetition_penalty and encoder_no_repeat_ngram_size read it; a decoder's is
    its prompt) build the processors as transformers' generate does (runtime/processors.py)."""

    def __init__(
        self,
        params: Sampling,
        prompt: np.ndarray,
        mask: np.ndarray | None,
        vocab: int,
        *,
        eos: tuple[int, ...] = (),
        max_new_tokens: int | None = None,
        encoder_ids: np.ndarray | None = None,
    ) -> None:
        self.params = params
        prompt = np.asarray(prompt, np.int64)
        b, t = prompt.shape
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
        _check_ids(params, vocab)
        self.processors: LogitsProcessorList = logits_processors(
            params,
            input_len=t,
            max_length=None if max_new_tokens is None else t + max_new_tokens,
            eos=tuple(eos),
            prompt=prompt,
            mask=mask,
            encoder_ids=encoder_ids,
        )
        # grown as tokens come (observe): sized by the call's budget, a huge one would allocate before the room check
        self._ids = np.empty((b, t + min(max_new_tokens or 64, 1024)), np.int64)
        self._ids[:, :t] = prompt
        self.length = t

    @property
    def input_ids(self) -> np.ndarray:
        """(b, t') the tokens so far: the prompt, then each observed step's."""
        return self._ids[:, : self.length]

    def choose(self, logits: np.ndarray) -> np.ndarray:
        """logits (b v) -> (b,) int64: the argmax (first of ties, as torch) or one draw per row."""
        scores = self.processors(self.input_ids, np.asarray(logits, F32))
        if not self.params.do_sample:
            return scores.argmax(-1)
        return draw(scores, self.rngs)

    def observe(self, tokens: np.ndarray) -> None:
        if self.length == self._ids.shape[1]:
            self._ids = np.concatenate([self._ids, np.empty_like(self._ids)], 1)
        self._ids[:, self.length] = tokens
        self.length += 1


def _check_ids(p: Sampling, vocab: int) -> None:
    """Token ids the settings name are inside the vocabulary (transformers raises on one past it)."""
    named = {
        "suppress_tokens": p.suppress_tokens or (),
        "begin_suppress_tokens": p.begin_suppress_tokens or (),
        "forced_eos_token_id": p.forced_eos_token_id or (),
        "forced_bos_token_id": () if p.forced_bos_token_id is None else (p.forced_bos_token_id,),
        "bad_words_ids": [t for w in p.bad_words_ids or () for t in w],
        "sequence_bias": [t for s, _ in p.sequence_bias or () for t in s],
    }
    for name, ids in named.items():
        past = [t for t in ids if t >= vocab]
        if past:
            raise zoo.ArgumentError(f"{name}: token id {past[0]} is past the vocabulary (ids 0..{vocab - 1})")


__all__ = ["KNOBS", "Sampler", "Sampling", "distribution", "log_softmax", "resolve"]
