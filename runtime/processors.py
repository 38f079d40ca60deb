"""Logits processors as small units, in numpy (no torch): transformers' `LogitsProcessorList`, one class per
generation_config key, each with transformers' semantics (generation/logits_process.py), and the list built in
transformers' order (`GenerationMixin._get_logits_processor`: `logits_processors` below).

    procs = logits_processors(settings, input_len=t, max_length=t + new, eos=(2,), vocab=v, prompt=ids, mask=mask)
    scores = procs(input_ids, scores)      # input_ids (b, t') int64 the tokens so far; scores (b, v) float32

A unit is any callable `proc(input_ids, scores) -> scores`: `input_ids` (b, t') the tokens so far (a decoder's
prompt, left padding as the run time holds it, then the new tokens; an encoder-decoder's decoder tokens),
`scores` (b, v) float32, never changed in place. Warpers (temperature, top_k, top_p, min_p, top_h, typical_p,
epsilon, eta) are units too, added only when sampling. Removed tokens get -inf, as transformers' filter_value.
The arithmetic is float32 as transformers' on float32 logits (scalars meet the array as float32: NEP 50).
"""

from __future__ import annotations

import numpy as np

from .warpers import F32, NEG_INF, Epsilon, Eta, MinP, Temperature, TopH, TopK, TopP, Typical, log_softmax32


class LogitsProcessorList(list):
    """The units in order; calling the list applies each to the previous one's scores."""

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        for proc in self:
            scores = proc(input_ids, scores)
        return scores


# --- processors (greedy and sampling alike) -------------------------------------------------------------------


class SequenceBias:
    """sequence_bias: {(ids...): bias} or [[ids], bias] pairs; a one-token sequence's bias is always added, a
    longer one's to its last token where the row ends with the rest (SequenceBiasLogitsProcessor)."""

    def __init__(self, sequence_bias) -> None:
        pairs = sequence_bias.items() if isinstance(sequence_bias, dict) else sequence_bias
        self.bias = {tuple(int(t) for t in ids): float(b) for ids, b in pairs}
        self._single: np.ndarray | None = None
        groups: dict[int, list] = {}
        for ids, b in self.bias.items():
            if len(ids) > 1:
                groups.setdefault(len(ids) - 1, []).append((ids, b))
        self.groups = [
            (np.array([s[:-1] for s, _ in g]), np.array([s[-1] for s, _ in g]), np.array([b for _, b in g], F32))
            for g in groups.values()
        ]

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        v = scores.shape[-1]
        if self._single is None or len(self._single) != v:
            self._single = np.zeros(v, F32)
            for ids, b in self.bias.items():
                if len(ids) == 1:
                    self._single[ids[0]] = b
        bias = np.zeros_like(scores) + self._single
        for prefixes, last, biases in self.groups:
            n = prefixes.shape[1]
            if n > input_ids.shape[1]:  # the prefix is longer than the context
                continue
            match = (input_ids[:, None, -n:] == prefixes[None]).all(-1)  # (b k)
            np.add.at(bias, (slice(None), last), np.where(match, biases, F32(0)))
        with np.errstate(invalid="ignore"):
            return scores + bias


class NoBadWords(SequenceBias):
    """bad_words_ids: a sequence's last token never completes it (a bias of -inf); a sequence that is one eos id
    alone is left out, as transformers does (NoBadWordsLogitsProcessor)."""

    def __init__(self, bad_words_ids, eos: tuple[int, ...] = ()) -> None:
        kept = [w for w in bad_words_ids if not any(list(w) == [e] for e in eos)]
        super().__init__({tuple(w): float("-inf") for w in kept})


class EncoderRepetitionPenalty:
    """encoder_repetition_penalty: tokens of the encoder's input (a decoder's prompt) made MORE likely by the
    penalty (its inverse applied as RepetitionPenalty's), rows repeated per returned sequence."""

    def __init__(self, penalty: float, encoder_ids: np.ndarray) -> None:
        self.penalty, self.encoder_ids = 1 / penalty, np.asarray(encoder_ids, np.int64)

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        enc = self.encoder_ids
        if len(scores) > len(enc):
            enc = np.repeat(enc, len(scores) // len(enc), axis=0)
        return _penalised(scores, enc, self.penalty)


def _penalised(scores: np.ndarray, ids: np.ndarray, penalty: float) -> np.ndarray:
    """scores with each row's `ids` (b k; an id == v is dropped) divided by the penalty (multiplied where < 0)."""
    b, v = scores.shape
    padded = np.concatenate([scores, np.zeros((b, 1), scores.dtype)], 1)  # column v absorbs dropped ids
    ids = np.minimum(ids, v)
    rows = np.arange(b)[:, None]
    s = padded[rows, ids]
    padded[rows, ids] = np.where(s < 0, s * penalty, s / penalty)
    return padded[:, :v]


class RepetitionPenalty:
    """repetition_penalty: a token already in the row has its score divided by the penalty (multiplied where
    negative). `ignore` (b,): leading positions not counted per row: transformers' generate passes each row's
    left padding (its attention mask's first 1) as prompt_ignore_length, so pad ids are not penalised there."""

    def __init__(self, penalty: float, ignore: np.ndarray | None = None) -> None:
        self.penalty, self.ignore = penalty, None if ignore is None else np.asarray(ignore, np.int64)

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        ids = input_ids
        if self.ignore is not None:
            ids = np.where(np.arange(ids.shape[1])[None] < self.ignore[:, None], scores.shape[-1], ids)
        return _penalised(scores, ids, self.penalty)


def _ngram_bans(history: np.ndarray, tail: np.ndarray, n: int) -> np.ndarray:
    """The tokens that follow `tail` (n-1 ids) in `history`'s n-grams."""
    if len(history) < n or len(tail) != n - 1:
        return np.empty(0, np.int64)
    windows = np.lib.stride_tricks.sliding_window_view(history, n)
    return windows[(windows[:, :-1] == tail).all(-1), -1]


class NoRepeatNGram:
    """no_repeat_ngram_size n: a token that would repeat an n-gram already in the row is banned (the row's whole
    input_ids, a decoder's prompt and its padding included, as transformers reads them)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        t, n = input_ids.shape[1], self.n
        if t < n:
            return scores
        windows = np.lib.stride_tricks.sliding_window_view(input_ids, n, axis=1)  # (b, t - n + 1, n)
        match = (windows[..., :-1] == input_ids[:, None, t + 1 - n :]).all(-1)
        rows = np.broadcast_to(np.arange(len(input_ids))[:, None], match.shape)
        out = scores.copy()
        out[rows[match], windows[..., -1][match]] = NEG_INF
        return out


class EncoderNoRepeatNGram:
    """encoder_no_repeat_ngram_size n: a token that would repeat an n-gram of the encoder's input (a decoder's
    prompt) is banned (EncoderNoRepeatNGramLogitsProcessor)."""

    def __init__(self, n: int, encoder_ids: np.ndarray) -> None:
        self.n, self.encoder_ids = n, np.asarray(encoder_ids, np.int64)

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        t, n = input_ids.shape[1], self.n
        per = max(len(scores) // len(self.encoder_ids), 1)
        out = scores.copy()
        for r, row in enumerate(input_ids):
            out[r, _ngram_bans(self.encoder_ids[r // per], row[t + 1 - n : t] if n > 1 else row[:0], n)] = NEG_INF
        return out


class MinLength:
    """min_length: the eos ids are banned while the row (prompt included) is shorter."""

    def __init__(self, min_length: int, eos: tuple[int, ...]) -> None:
        self.min_length, self.eos = min_length, list(eos)

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        if input_ids.shape[-1] >= self.min_length:
            return scores
        out = scores.copy()
        out[:, self.eos] = NEG_INF
        return out


class MinNewTokens(MinLength):
    """min_new_tokens: the eos ids are banned until that many tokens follow the prompt's `skip` columns."""

    def __init__(self, skip: int, min_new_tokens: int, eos: tuple[int, ...]) -> None:
        super().__init__(skip + min_new_tokens, eos)


class ForcedBOS:
    """forced_bos_token_id: the first token after a one-token start is this id."""

    def __init__(self, token: int) -> None:
        self.token = token

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        if input_ids.shape[-1] != 1:
            return scores
        out = np.full_like(scores, NEG_INF)
        out[:, self.token] = 0
        return out


class ForcedEOS:
    """forced_eos_token_id: the token that reaches max_length is this id (of several, each scores 0)."""

    def __init__(self, max_length: int, eos: tuple[int, ...]) -> None:
        self.max_length, self.eos = max_length, list(eos)

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        if input_ids.shape[-1] != self.max_length - 1:
            return scores
        out = np.full_like(scores, NEG_INF)
        out[:, self.eos] = 0
        return out


class InfNanRemove:
    """remove_invalid_values: NaN -> 0, +-inf -> the dtype's largest / smallest finite value."""

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        big = np.finfo(scores.dtype).max
        return np.nan_to_num(scores, nan=0.0, posinf=big, neginf=-big)


class ExponentialDecayLengthPenalty:
    """exponential_decay_length_penalty (start, factor): past `start` new tokens the eos ids' scores grow by
    |score| x (factor^k - 1), k the tokens past it."""

    def __init__(self, penalty, eos: tuple[int, ...], input_len: int) -> None:
        self.start, self.factor, self.eos = int(penalty[0]) + input_len, float(penalty[1]), list(eos)

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        cur = input_ids.shape[-1]
        if cur <= self.start:
            return scores
        s = scores[:, self.eos]
        add = np.abs(s) * F32(pow(self.factor, cur - self.start) - 1)
        out = scores.copy()
        out[:, self.eos] = s + np.where(np.isfinite(s), add, F32(0))
        return out


class SuppressTokens:
    """suppress_tokens: never made."""

    def __init__(self, tokens) -> None:
        self.tokens = [int(t) for t in tokens]

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        out = scores.copy()
        out[:, [t for t in self.tokens if t < scores.shape[-1]]] = NEG_INF
        return out


class SuppressTokensAtBegin(SuppressTokens):
    """begin_suppress_tokens: not made as the first generated token (at column `begin`)."""

    def __init__(self, tokens, begin: int) -> None:
        super().__init__(tokens)
        self.begin = begin

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        return super().__call__(input_ids, scores) if input_ids.shape[-1] == self.begin else scores


class LogitNormalization:
    """renormalize_logits: the scores become log-probabilities (last in the list)."""

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        return log_softmax32(scores)


def logits_processors(
    settings,
    *,
    input_len: int,
    max_length: int | None,
    eos: tuple[int, ...] = (),
    prompt: np.ndarray | None = None,
    mask: np.ndarray | None = None,
    encoder_ids: np.ndarray | None = None,
) -> LogitsProcessorList:
    """The units a resolved setting (runtime/sampling.py's Sampling) asks for, in transformers' order
    (`_get_logits_processor`). input_len: the columns before the first new token (a decoder's padded prompt,
    an encoder-decoder's 1); max_length: input_len + max_new_tokens; mask (b, input_len): the left padding a
    decoder's repetition penalty skips; encoder_ids (b, s): the encoder's input (a decoder's prompt: `prompt`)."""
    s, procs = settings, LogitsProcessorList()
    enc = encoder_ids if encoder_ids is not None else prompt
    if s.sequence_bias:
        procs.append(SequenceBias(s.sequence_bias))
    if s.encoder_repetition_penalty != 1.0 and enc is not None:
        procs.append(EncoderRepetitionPenalty(s.encoder_repetition_penalty, enc))
    if s.repetition_penalty != 1.0:
        ignore = None if mask is None else (np.asarray(mask) != 0).argmax(1)
        procs.append(RepetitionPenalty(s.repetition_penalty, ignore))
    if s.no_repeat_ngram_size:
        procs.append(NoRepeatNGram(s.no_repeat_ngram_size))
    if s.encoder_no_repeat_ngram_size and enc is not None:
        procs.append(EncoderNoRepeatNGram(s.encoder_no_repeat_ngram_size, enc))
    if s.bad_words_ids:
        procs.append(NoBadWords(s.bad_words_ids, eos))
    # transformers' _prepare_generated_length: min_new_tokens sets min_length to the prompt plus it
    min_length = s.min_length if s.min_new_tokens is None else input_len + s.min_new_tokens
    if eos and min_length:
        procs.append(MinLength(min_length, eos))
    if eos and s.min_new_tokens:
        procs.append(MinNewTokens(input_len, s.min_new_tokens, eos))
    if s.forced_bos_token_id is not None:
        procs.append(ForcedBOS(s.forced_bos_token_id))
    if s.forced_eos_token_id is not None and max_length is not None:
        procs.append(ForcedEOS(max_length, s.forced_eos_token_id))
    if s.remove_invalid_values:
        procs.append(InfNanRemove())
    if s.exponential_decay_length_penalty is not None and eos:
        procs.append(ExponentialDecayLengthPenalty(s.exponential_decay_length_penalty, eos, input_len))
    if s.suppress_tokens:
        procs.append(SuppressTokens(s.suppress_tokens))
    if s.begin_suppress_tokens:
        begin = input_len if input_len > 1 or s.forced_bos_token_id is None else input_len + 1
        procs.append(SuppressTokensAtBegin(s.begin_suppress_tokens, begin))
    if s.do_sample:
        procs.extend(sampling_warpers(s))
    if s.renormalize_logits:
        procs.append(LogitNormalization())
    return procs


def sampling_warpers(s) -> list:
    """The warpers of a sampling call, in transformers' order (one returned sequence per row: keep 1)."""
    out = []
    if s.temperature != 1.0:
        out.append(Temperature(s.temperature))
    if s.top_h is not None:
        out.append(TopH(s.top_h))
    if s.top_k:
        out.append(TopK(s.top_k))
    if s.top_p < 1.0:
        out.append(TopP(s.top_p))
    if s.min_p is not None:
        out.append(MinP(s.min_p))
    if s.typical_p < 1.0:
        out.append(Typical(s.typical_p))
    if 0.0 < s.epsilon_cutoff < 1.0:
        out.append(Epsilon(s.epsilon_cutoff))
    if 0.0 < s.eta_cutoff < 1.0:
        out.append(Eta(s.eta_cutoff))
    return out


__all__ = [
    "EncoderNoRepeatNGram",
    "EncoderRepetitionPenalty",
    "Epsilon",
    "Eta",
    "ExponentialDecayLengthPenalty",
    "ForcedBOS",
    "ForcedEOS",
    "InfNanRemove",
    "LogitNormalization",
    "LogitsProcessorList",
    "MinLength",
    "MinNewTokens",
    "MinP",
    "NoBadWords",
    "NoRepeatNGram",
    "RepetitionPenalty",
    "SequenceBias",
    "SuppressTokens",
    "SuppressTokensAtBegin",
    "Temperature",
    "TopH",
    "TopK",
    "TopP",
    "Typical",
    "logits_processors",
    "sampling_warpers",
]
