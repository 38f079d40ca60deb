"""Speculative sampling is the target's distribution (runtime/speculative.verdict), checked empirically as
tests/runtime/test_sampling.py checks a draw: over many rounds on fixed logits of a two-token target, the joint
frequency of the first two tokens matches p(x1) p(x2 | x1) (chi-square at the 0.999 quantile), whether the
candidate comes from a draft distribution q far from p, or from prompt lookup (a fixed token, no q); and prompt
lookup's candidates are transformers' PromptLookupCandidateGenerator's own, on random sequences."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from runtime.candidates import draw, lookup
from runtime.sampling import Sampler, Sampling, distribution
from runtime.speculative import row_scores, verdict

V = 6
RNG = np.random.default_rng(7)
FIRST = RNG.normal(size=V) * 1.5  # the target's logits for x1
SECOND = RNG.normal(size=(V, V)) * 1.5  # the target's logits for x2, one row per x1
PARAMS = Sampling(do_sample=True, temperature=0.9, top_k=5, seed=0)


def processed(logits: np.ndarray, cand: np.ndarray, params: Sampling, history=(0,)):
    """verdict's scores(j): the logits through the processors of a one-row sampler whose row holds `history`."""
    return row_scores(Sampler(params, np.array([history], np.int64), None, V), 0, cand, logits)


def chi2_below_quantile(counts: np.ndarray, p: np.ndarray) -> None:
    n = counts.sum()
    kept = p > 0
    assert counts[~kept].sum() == 0  # a token the knobs removed is never drawn
    chi2 = (((counts[kept] - n * p[kept]) ** 2) / (n * p[kept])).sum()
    df = kept.sum() - 1  # the 0.999 quantile of chi-square(df), Wilson-Hilferty (z = 3.09)
    assert chi2 < df * (1 - 2 / (9 * df) + 3.09 * np.sqrt(2 / (9 * df))) ** 3, chi2


def joint_of_two_tokens(candidate, rounds: int = 8000) -> np.ndarray:
    """Counts (V V) of (x1, x2) over rounds: one round with one candidate (its q, or None), and where that round
    made one token only, the next token drawn from the target as the next round would."""
    rng = np.random.Generator(np.random.PCG64(11))
    counts = np.zeros((V, V), np.int64)
    for _ in range(rounds):
        c, q = candidate(rng)
        logits = np.stack([FIRST, SECOND[c]])  # the target's logits at the last token and at the candidate
        cand = np.array([c])
        kept, token = verdict(logits, cand, [] if q is None else [q], PARAMS, processed(logits, cand, PARAMS), rng)
        x1, x2 = (c, token) if kept else (token, draw(distribution(SECOND[token][None], PARAMS)[0], rng))
        counts[x1, x2] += 1
    return counts


def target_joint() -> np.ndarray:
    p1 = distribution(FIRST[None], PARAMS)[0]
    return p1[:, None] * distribution(SECOND, PARAMS)


DRAFT_Q = distribution((RNG.normal(size=V) * 2)[None], Sampling(do_sample=True, top_k=0))[0]  # far from p


@pytest.mark.parametrize(
    "candidate",
    [
        pytest.param(lambda rng: (draw(DRAFT_Q, rng), DRAFT_Q), id="draft"),
        pytest.param(lambda rng: (int(np.argmax(FIRST)), None), id="prompt-lookup-likely"),
        pytest.param(lambda rng: (int(np.argmin(FIRST)), None), id="prompt-lookup-unlikely"),
    ],
)
def test_the_first_two_tokens_are_distributed_as_the_targets(candidate):
    chi2_below_quantile(joint_of_two_tokens(candidate).ravel(), target_joint().ravel())


def test_greedy_keeps_candidates_while_they_are_the_argmax():
    logits = np.array([[0, 3, 1.0], [5, 0, 0], [0, 0, 2]])
    greedy = Sampling()
    for cand, want in (([1, 0], (2, 2)), ([1, 2], (1, 0)), ([0, 0], (0, 1))):
        cand = np.array(cand)
        assert verdict(logits, cand, [], greedy, processed(logits, cand, greedy), None) == want
    # a repetition penalty of 4 makes token 1 (in the row's history) lose: 3/4 < 1
    penalty, cand = Sampling(repetition_penalty=4.0), np.array([1])
    assert verdict(logits, cand, [], penalty, processed(logits, cand, penalty, history=(1,)), None) == (0, 2)


@pytest.mark.parametrize("seed", range(6))
def test_prompt_lookup_proposes_transformers_candidates(seed):
    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

    rng = np.random.default_rng(seed)
    seq = rng.integers(3, 8, size=int(rng.integers(2, 40)))
    for k, ngram, eos in ((4, 2, 5), (10, 3, None), (2, 1, 4)):
        gen = PromptLookupCandidateGenerator(
            eos_token_id=None if eos is None else torch.tensor([eos]),
            num_output_tokens=k,
            max_matching_ngram_size=ngram,
            max_length=1000,
        )
        ids = torch.tensor(seq)[None]
        theirs = gen.get_candidates(ids)[0][0, len(seq) :].numpy()
        ours = lookup(seq, k, ngram, np.array([] if eos is None else [eos], np.int64), latest=False)
        assert ours.tolist() == theirs.tolist(), (seq.tolist(), k, ngram, eos)


def test_prompt_lookup_prefers_the_latest_occurrence_with_k_tokens_after_it():
    """A loop continues as it went last time: the most recent match with k tokens after it proposes (transformers'
    first match would propose the prompt's continuation); with none that long, the first match (the longest)."""
    none = np.array([], np.int64)
    seq = np.array([1, 2, 9, 9, 9, 1, 2, 3, 4, 5, 6, 1, 2])  # "1 2" once before "9 9 9", then before "3 4 5 6"
    assert lookup(seq, 3, 2, none).tolist() == [3, 4, 5]
    assert lookup(seq, 3, 2, none, latest=False).tolist() == [9, 9, 9]
    assert lookup(seq, 7, 2, none).tolist() == [9, 9, 9, 1, 2, 3, 4]  # the latest has 6 after it: not k
    assert lookup(np.array([1, 2, 3, 1, 2]), 5, 2, none).tolist() == [3, 1, 2]  # none has k after it: the first
    assert lookup(np.array([7, 7, 7, 7]), 3, 1, none).tolist() == [7, 7, 7]  # not the 1 token after the last 7
