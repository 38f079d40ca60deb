"""OpenAI's frequency and presence penalties and logit_bias (runtime/penalties.py) against a reference written
from OpenAI's statement of the formula, vLLM's statement of it (over the output tokens only), and transformers'
SequenceBiasLogitsProcessor for one-token biases."""

from __future__ import annotations

import numpy as np
import pytest

import zoo
from runtime.penalties import LogitBias, OpenAIPenalties


def _openai_reference(scores, ids, prompt_len, frequency, presence):
    """OpenAI's text (docs: advanced usage): mu[j] -> mu[j] - c[j] * alpha_frequency - float(c[j] > 0) *
    alpha_presence, c[j] how often token j was sampled before the current position; one token at a time."""
    out = np.array(scores, np.float64)
    for r in range(len(out)):
        made = list(ids[r, prompt_len:])
        for j in range(out.shape[1]):
            c = made.count(j)
            out[r, j] -= c * frequency + float(c > 0) * presence
    return out


def _vllm_statement(scores, ids, prompt_len, frequency, presence):
    """vLLM's apply_penalties (model_executor/layers/utils.py): bin counts of the output tokens, then
    logits -= frequency * counts; logits -= presence * (counts > 0)."""
    out = np.array(scores, np.float64)
    counts = np.stack([np.bincount(row[prompt_len:], minlength=out.shape[1]) for row in ids])
    out -= frequency * counts
    out -= presence * (counts > 0)
    return out


@pytest.mark.parametrize("frequency,presence", [(0.5, 0.0), (0.0, 1.5), (-1.2, 0.7), (2.0, -2.0)])
def test_openai_penalties_are_openais_formula_over_the_made_tokens(frequency, presence):
    rng = np.random.default_rng(0)
    b, v, t = 3, 40, 6
    ids = rng.integers(0, v, (b, t + 9))
    ids[:, t:] = rng.integers(0, 8, (b, 9))  # repeats among the made tokens
    scores = rng.standard_normal((b, v)).astype(np.float32)
    got = OpenAIPenalties(t, frequency, presence)(ids, scores)
    want = _openai_reference(scores, ids, t, frequency, presence)
    assert got.dtype == np.float32 and np.allclose(got, want, atol=1e-5)
    assert np.allclose(got, _vllm_statement(scores, ids, t, frequency, presence), atol=1e-5)
    # the prompt's tokens are not counted: a token only in the prompt keeps its logit
    only_prompt = np.setdiff1d(ids[0, :t], ids[0, t:])
    assert np.array_equal(got[0, only_prompt], scores[0, only_prompt])


def test_zero_penalties_and_no_tokens_made_change_nothing():
    scores = np.arange(10, dtype=np.float32)[None]
    ids = np.array([[1, 2, 3]])
    assert OpenAIPenalties(3, 1.0, 1.0)(ids, scores) is scores  # nothing made yet
    assert not OpenAIPenalties(0, 0, 0).active


def test_logit_bias_equals_transformers_sequence_bias_for_one_token_sequences():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    rng = np.random.default_rng(1)
    scores = rng.standard_normal((2, 30)).astype(np.float32)
    ids = rng.integers(0, 30, (2, 5))
    bias = {"3": -100, "7": 12.5, "29": 100}
    got = LogitBias(bias, 30)(ids, scores)
    hf = transformers.SequenceBiasLogitsProcessor(sequence_bias=[[[int(k)], float(v)] for k, v in bias.items()])
    want = hf(torch.from_numpy(ids), torch.from_numpy(scores.copy())).numpy()
    assert np.allclose(got, want, atol=1e-6)
    assert got[0, 3] == pytest.approx(scores[0, 3] - 100)


@pytest.mark.parametrize(
    "make",
    [
        lambda: OpenAIPenalties(0, 2.5),
        lambda: OpenAIPenalties(0, 0, "1"),
        lambda: LogitBias({"300": 1}, 259),
        lambda: LogitBias({"x": 1}, 259),
        lambda: LogitBias({"5": -101}, 259),
        lambda: LogitBias([5], 259),
    ],
)
def test_a_bad_penalty_or_bias_is_an_argument_error(make):
    with pytest.raises(zoo.ArgumentError):
        make()
