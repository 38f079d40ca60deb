"""Sampling (runtime/sampling.py) against transformers' own logits processors and warpers, on the same
logits: each knob and combinations give the same filtered, renormalised distribution; the resolution of
call, checkpoint and transformers' defaults; seeded draws are reproducible and match the distribution."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hf_generation import hf_processors
from transformers.generation import logits_process as lp

import zoo
from runtime.sampling import Sampler, Sampling, distribution, resolve

KNOB_CASES = [
    {"temperature": 0.7},
    {"temperature": 1.6},
    {"top_k": 5},
    {"top_p": 0.9},
    {"top_p": 0.3},
    {"min_p": 0.1},
    {"repetition_penalty": 1.3},
    {"temperature": 0.6, "top_k": 20, "top_p": 0.9},
    {"temperature": 1.3, "top_p": 0.8, "min_p": 0.05, "repetition_penalty": 1.2},
    {"temperature": 0.9, "top_k": 12, "min_p": 0.2, "repetition_penalty": 0.8},
    {"typical_p": 0.6},
    {"epsilon_cutoff": 0.005},
    {"eta_cutoff": 0.01},
    {"top_h": 0.7},
    {"top_p": 0.0},
    {"temperature": 0.8, "top_k": 30, "typical_p": 0.9, "eta_cutoff": 0.002, "no_repeat_ngram_size": 2},
]


def _transformers(scores: torch.Tensor, ids: torch.Tensor, knobs: dict) -> torch.Tensor:
    """The distribution transformers' generate draws from: its own processors for these keys, as it builds
    them (tests/peers/hf_generation.py: _get_logits_processor over GenerationConfig's defaults)."""
    procs = hf_processors({"do_sample": True, **knobs}, input_len=ids.shape[1], max_new_tokens=1)
    return procs(ids, scores.clone()).softmax(-1)


@pytest.mark.parametrize("knobs", KNOB_CASES, ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()))
def test_the_distribution_is_transformers_for_each_knob_and_combination(knobs):
    gen = torch.Generator().manual_seed(0)
    scores = torch.randn(3, 200, generator=gen) * 3
    ids = torch.randint(0, 200, (3, 9), generator=gen)
    ours = distribution(scores.numpy(), resolve({"do_sample": True, **knobs}), ids.numpy())
    theirs = _transformers(scores, ids, knobs).numpy()
    assert np.abs(ours - theirs).max() < 1e-6
    assert np.allclose(ours.sum(-1), 1)


def test_greedy_takes_the_repetition_penalty_as_transformers_does():
    gen = torch.Generator().manual_seed(1)
    scores = torch.randn(4, 50, generator=gen)
    ids = scores.argmax(-1, keepdim=True)  # the favourite is already in each row: the penalty moves it
    expected = lp.RepetitionPenaltyLogitsProcessor(3.0)(ids, scores.clone()).argmax(-1).numpy()
    params = resolve({"repetition_penalty": 3.0})
    assert not params.do_sample
    assert (Sampler(params, ids.numpy(), None, 50).choose(scores.numpy()) == expected).all()


@pytest.mark.parametrize(
    ("call", "config", "expected"),
    [
        ({}, None, {"do_sample": False}),  # greedy stays the default
        ({"temperature": 0.8}, None, {"do_sample": True, "temperature": 0.8, "top_k": 50}),  # OpenAI's rule
        ({"temperature": 0}, {"do_sample": True, "temperature": 0.6}, {"do_sample": False}),  # 0 is greedy
        ({"do_sample": True}, None, {"do_sample": True, "temperature": 1.0, "top_k": 50, "top_p": 1.0}),
        ({}, {"do_sample": True, "temperature": 0.6, "top_p": 0.9}, {"do_sample": True, "temperature": 0.6}),
        ({"top_p": 0.5}, {"do_sample": True, "top_p": 0.9}, {"top_p": 0.5}),  # the call overrides the checkpoint
        ({"temperature": 0.7, "do_sample": False}, None, {"do_sample": False}),
    ],
)
def test_the_call_overrides_the_checkpoint_over_transformers_defaults(call, config, expected):
    got = resolve(call, config)
    assert {k: getattr(got, k) for k in expected} == expected


@pytest.mark.parametrize(
    "knobs",
    [{"temperature": -1}, {"top_p": -0.1}, {"top_p": 1.5}, {"typical_p": 0}, {"eta_cutoff": 1},
     {"no_repeat_ngram_size": -1}, {"bad_words_ids": [[]]}, {"suppress_tokens": [1.5]}, {"num_beams": 4},
     {"guidance_scale": 3.0}, {"num_return_sequences": 2}, {"top_k": -2}, {"min_p": 2}, {"repetition_penalty": 0},
     {"seed": -1}, {"temperature": float("nan")}, {"top_k": 1.5}, {"bogus": 1}],
)  # fmt: skip
def test_bad_knobs_are_refused_by_name(knobs):
    with pytest.raises(zoo.ArgumentError, match=next(iter(knobs))):
        resolve(knobs)


def test_seeded_draws_reproduce_and_each_row_has_its_own_stream():
    logits = np.random.default_rng(0).normal(size=(3, 40)) * 2
    prompt = np.zeros((3, 1), np.int64)

    def draws(seed, rows=3, steps=30):
        s = Sampler(Sampling(do_sample=True, top_k=0, seed=seed), prompt[:rows], None, 40)
        return np.stack([s.choose(logits[:rows]) for _ in range(steps)], 1)

    a = draws(7)
    assert (a == draws(7)).all()
    assert (a != draws(8)).any()
    assert (draws(7, rows=2) == a[:2]).all()  # a row's draws do not depend on the rows after it
    alone = Sampler(Sampling(do_sample=True, top_k=0, seed=(11, 7, 5)), prompt, None, 40)
    one = Sampler(Sampling(do_sample=True, top_k=0, seed=7), prompt[:1], None, 40)
    ours = np.stack([alone.choose(logits[[0, 0, 0]]) for _ in range(20)], 1)
    theirs = np.stack([one.choose(logits[:1]) for _ in range(20)], 1)
    assert (ours[1] == theirs[0]).all()  # one seed per row: row r draws as its call alone with seed[r]
    assert Sampler(Sampling(do_sample=True), prompt, None, 40).seed is not None  # a fresh seed, reported


def _chi2_bound(df: int) -> float:
    """The 0.999 quantile of chi-square(df), Wilson-Hilferty (z = 3.09): no scipy needed."""
    return df * (1 - 2 / (9 * df) + 3.09 * np.sqrt(2 / (9 * df))) ** 3


@pytest.mark.parametrize("knobs", KNOB_CASES, ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()))
def test_the_draws_of_choose_follow_transformers_distribution_for_each_knob(knobs):
    """Sampler.choose, the path that draws: 20,000 seeded draws (4,000 rows of the same logits, each row its
    own stream, 5 steps) against transformers' processed distribution: no removed token is ever drawn, and the
    frequencies pass a chi-square test at the 0.999 level."""
    gen = torch.Generator().manual_seed(3)
    v, rows, steps = 40, 4000, 5
    logits = torch.randn(1, v, generator=gen) * 1.5
    prompt = torch.randint(0, v, (1, 6), generator=gen)
    want = _transformers(logits, prompt, knobs).numpy()[0].astype(np.float64)
    sampler = Sampler(resolve({"do_sample": True, "seed": 11, **knobs}), np.repeat(prompt.numpy(), rows, 0), None, v)
    counts = np.zeros(v, np.int64)
    for _ in range(steps):  # nothing observed: each step draws again from the prompt's distribution
        counts += np.bincount(sampler.choose(np.repeat(logits.numpy(), rows, 0)), minlength=v)
    n = counts.sum()
    kept = want > 0
    assert counts[~kept].sum() == 0, f"drew removed tokens {np.flatnonzero(counts * ~kept)}"
    chi2 = (((counts[kept] - n * want[kept]) ** 2) / (n * want[kept])).sum()
    df = max(int(kept.sum()) - 1, 1)
    assert kept.sum() == 1 or chi2 < _chi2_bound(df), (chi2, df)
