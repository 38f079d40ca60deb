"""The sampling warpers as units (runtime/processors.py's interface: `warper(input_ids, scores) -> scores`), in
numpy with transformers' semantics (generation/logits_process.py, min_tokens_to_keep 1): temperature, top_h,
top_k, top_p, min_p, typical_p, epsilon_cutoff, eta_cutoff. Removed tokens get -inf.

A warper that sorts (top_p, typical_p) or sums over the vocabulary runs on each row's live tokens only (those
above -inf) once most are gone (after top_k, say): the tokens at -inf have probability 0 and sort first, so the
result is the same, at the cost of the kept few instead of the vocabulary.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np

F32 = np.float32
NEG_INF = F32(-np.inf)


def softmax32(scores: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.exp(scores - scores.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)


def log_softmax32(scores: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        x = scores - scores.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))


def kth_largest(scores: np.ndarray, k: int) -> np.ndarray:
    """(b v) -> (b 1): each row's k-th largest value (torch.topk(scores, k)[0][..., -1, None])."""
    v = scores.shape[-1]
    k = min(k, v)
    return np.partition(scores, v - k, axis=-1)[:, v - k, None]


def _to_vocab(sorted_mask: np.ndarray, order: np.ndarray) -> np.ndarray:
    """A mask over each row's sorted positions back at the tokens' positions."""
    out = np.empty_like(sorted_mask)
    np.put_along_axis(out, order, sorted_mask, -1)
    return out


def live_columns(live: np.ndarray, k: int) -> np.ndarray:
    """(b v) bool, k >= each row's count, k < v -> (b k): each row's live columns in order, then a removed
    column of that row repeated (its score is -inf: it changes no result)."""
    b = len(live)
    rows, cols = np.nonzero(live)
    counts = live.sum(-1)
    idx = np.repeat((~live).argmax(-1)[:, None], k, -1)
    idx[rows, np.arange(len(cols)) - np.repeat(np.cumsum(counts) - counts, counts)] = cols
    return idx if b else idx.reshape(0, k)


class Warper(ABC):
    """A unit whose `remove(scores) -> mask` names the tokens to drop; it runs over the live tokens when few are."""

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        live = scores > NEG_INF
        k = int(live.sum(-1).max())
        v = scores.shape[-1]
        if 0 < k <= v // 4:
            idx = live_columns(live, k)
            sub = np.take_along_axis(scores, idx, -1)
            out = np.full_like(scores, NEG_INF)
            np.put_along_axis(out, idx, np.where(self.remove(sub), NEG_INF, sub), -1)
            return out
        return np.where(self.remove(scores), NEG_INF, scores)

    @abstractmethod
    def remove(self, scores: np.ndarray) -> np.ndarray:
        """(n v) bool: the tokens this warper removes from its rows."""


class Temperature:
    """temperature: the scores divided by it."""

    def __init__(self, temperature: float) -> None:
        self.temperature = float(temperature)

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        return scores / self.temperature


class TopK:
    """top_k: tokens below the k-th largest score are removed (ties with it kept)."""

    def __init__(self, top_k: int) -> None:
        self.top_k = int(top_k)

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        return np.where(scores < kth_largest(scores, self.top_k), NEG_INF, scores)


class TopP(Warper):
    """top_p: the least likely tokens whose probabilities add up to at most 1 - top_p are removed (the most
    likely one is kept)."""

    def __init__(self, top_p: float) -> None:
        self.top_p = float(top_p)

    def remove(self, scores: np.ndarray) -> np.ndarray:
        order = np.argsort(scores, axis=-1, kind="stable")  # ascending, as TopPLogitsWarper sorts
        cum = np.cumsum(softmax32(np.take_along_axis(scores, order, -1)), -1, dtype=F32)
        drop = cum <= F32(1 - self.top_p)
        drop[:, -1] = False
        return _to_vocab(drop, order)


class MinP(Warper):
    """min_p: tokens less likely than min_p x the top token's probability are removed (the top one kept)."""

    def __init__(self, min_p: float) -> None:
        self.min_p = float(min_p)

    def remove(self, scores: np.ndarray) -> np.ndarray:
        probs = softmax32(scores)
        drop = probs < F32(self.min_p) * probs.max(-1, keepdims=True)
        drop[np.arange(len(drop)), probs.argmax(-1)] = False
        return drop


class Typical(Warper):
    """typical_p: tokens are kept in order of how close their surprise is to the entropy, until typical_p of the
    probability (TypicalLogitsWarper)."""

    def __init__(self, mass: float) -> None:
        self.mass = float(mass)

    def remove(self, scores: np.ndarray) -> np.ndarray:
        logp = log_softmax32(scores)
        p = np.exp(logp)
        with np.errstate(invalid="ignore"):
            ent = -np.nansum(logp * p, -1, keepdims=True)
            shifted = np.abs(-logp - ent)
        order = np.argsort(shifted, axis=-1, kind="stable")
        sorted_shifted = np.take_along_axis(shifted, order, -1)
        cum = np.cumsum(softmax32(np.take_along_axis(scores, order, -1)), -1, dtype=F32)
        last = np.minimum((cum < F32(self.mass)).sum(1), shifted.shape[-1] - 1)
        drop = sorted_shifted > sorted_shifted[np.arange(len(last)), last][:, None]
        drop[:, :1] = False
        return _to_vocab(drop, order)


class Epsilon(Warper):
    """epsilon_cutoff: tokens of probability below epsilon are removed (the top one kept)."""

    def __init__(self, epsilon: float) -> None:
        self.epsilon = float(epsilon)

    def remove(self, scores: np.ndarray) -> np.ndarray:
        return (softmax32(scores) < F32(self.epsilon)) & (scores < kth_largest(scores, 1))


def _entropy(scores: np.ndarray) -> np.ndarray:
    """(b v) -> (b,): torch.distributions.Categorical(logits=scores).entropy() (-inf logits clamped: 0 terms)."""
    logp = np.maximum(log_softmax32(scores), np.finfo(F32).min)
    return -(logp * softmax32(scores)).sum(-1)


class Eta(Warper):
    """eta_cutoff: tokens of probability below min(eta, sqrt(eta) x exp(-entropy)) are removed (top one kept)."""

    def __init__(self, epsilon: float) -> None:
        self.epsilon = F32(epsilon)

    def remove(self, scores: np.ndarray) -> np.ndarray:
        eta = np.minimum(self.epsilon, np.sqrt(self.epsilon) * np.exp(-_entropy(scores)))[:, None]
        return (softmax32(scores) < eta) & (scores < kth_largest(scores, 1))


class TopH(Warper):
    """top_h: of the 100 likeliest tokens, those kept in order while their entropy terms add up to at most
    top_h x the entropy of the 100 (the first always kept) (TopHLogitsWarper)."""

    TOP_N = 100

    def __init__(self, top_h: float) -> None:
        self.top_h = float(top_h)

    def remove(self, scores: np.ndarray) -> np.ndarray:
        n = min(self.TOP_N, scores.shape[-1])
        order = np.argsort(-scores, axis=-1, kind="stable")[:, :n]
        top = np.take_along_axis(scores, order, -1)
        probs = softmax32(top)
        with np.errstate(invalid="ignore", divide="ignore"):
            terms = -probs * np.log(probs)
        tau = (_entropy(top) * F32(self.top_h))[:, None]
        keep = np.cumsum(terms, -1, dtype=F32) <= tau
        keep[:, 0] = True
        drop = np.ones(scores.shape, np.bool_)
        np.put_along_axis(drop, order, ~keep, -1)
        return drop


__all__ = [
    "F32",
    "NEG_INF",
    "Epsilon",
    "Eta",
    "MinP",
    "Temperature",
    "TopH",
    "TopK",
    "TopP",
    "Typical",
    "Warper",
    "kth_largest",
    "live_columns",
    "log_softmax32",
    "softmax32",
]
