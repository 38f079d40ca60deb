"""The beam search's rules (runtime/beam_search.py) on their own, driven by a transformers model's full-sequence
forward (no cache, no ONNX): the sequences and sequences_scores of transformers' generate(num_beams=k) for each
early_stopping value, length penalties, several eos ids and num_return_sequences; torch.topk's order; the
settings' checks and their precedence (the call over the checkpoint over transformers' defaults)."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import zoo
from runtime.beam_search import Beams, BeamSearch, beam_settings, topk

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "peers"))
import lm_cases  # noqa: E402 - small random transformers models


def beams_by_forward(hf, ids, mask, beams: Beams, new: int, eos, pad):
    search = BeamSearch(ids.numpy(), beams, ids.shape[1] + new, eos, pad)
    rows_mask = np.repeat(mask.numpy(), beams.num_beams, 0)
    while not search.done:
        seq = search.ids()
        am = np.concatenate([rows_mask, np.ones((seq.shape[0], seq.shape[1] - rows_mask.shape[1]), np.int64)], 1)
        with torch.no_grad():
            logits = hf(torch.from_numpy(seq), attention_mask=torch.from_numpy(am)).logits[:, -1].numpy()
        search.advance(logits)
    return search.result()


@pytest.mark.parametrize(
    "beams, eos",
    [
        (Beams(4), [2]),
        (Beams(3, 2.0, True, 2), [5, 7]),
        (Beams(4, -0.5, "never", 3), [9]),
        (Beams(3, 1.5, False, 3), [6]),
        (Beams(2, 1.0, False, 2), []),
    ],
    ids=str,
)
def test_the_rules_give_transformers_beams(beams, eos):
    hf = lm_cases.hf_model("llama")
    ids = lm_cases.prompt(batch=3, t=9)
    mask = torch.ones_like(ids)
    for r, pad in enumerate((0, 4, 2)):
        mask[r, :pad] = 0
        ids[r, :pad] = 0
    seqs, scores = beams_by_forward(hf, ids, mask, beams, 10, eos, 0)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = hf.generate(
            ids, attention_mask=mask, max_new_tokens=10, num_beams=beams.num_beams, do_sample=False,
            length_penalty=beams.length_penalty, early_stopping=beams.early_stopping, eos_token_id=eos or None,
            num_return_sequences=beams.num_return_sequences, pad_token_id=0, output_scores=True,
            return_dict_in_generate=True,
        )  # fmt: skip
    assert np.array_equal(seqs, want.sequences.numpy()), f"{seqs}\n{want.sequences}"
    np.testing.assert_allclose(scores, want.sequences_scores.numpy(), atol=1e-5)


def test_topk_orders_as_torch_topk_largest_first_ties_by_lower_index():
    x = np.array([[0.5, 2.0, -np.inf, 2.0, 1.0, 0.5]], np.float32)
    values, index = topk(x, 4)
    assert index.tolist() == [[1, 3, 4, 0]] and values.tolist() == [[2.0, 2.0, 1.0, 0.5]]
    x = np.random.default_rng(0).standard_normal((3, 50)).astype(np.float32)  # distinct values
    values, index = topk(x, 7)
    want = torch.topk(torch.from_numpy(x), 7)
    assert np.array_equal(values, want.values.numpy()) and np.array_equal(index, want.indices.numpy())


def test_settings_come_from_the_call_then_the_checkpoint_then_transformers_defaults():
    config = {"num_beams": 4, "length_penalty": 2, "early_stopping": True}
    assert beam_settings({}, config) == Beams(4, 2.0, True, 1)
    assert beam_settings({"num_beams": 1, "early_stopping": None}, config) == Beams(1, 2.0, True, 1)
    assert beam_settings({}, None) == Beams()
    assert not beam_settings({}, {"num_beams": 1}).on


@pytest.mark.parametrize(
    "call, match",
    [
        ({"num_beams": 2, "num_return_sequences": 3}, "num_return_sequences=3 must be <= num_beams=2"),
        ({"num_beams": True}, "num_beams=True must be an int >= 1"),
        ({"num_beams": 2, "length_penalty": float("nan")}, "length_penalty=nan"),
        ({"num_beams": 2, "early_stopping": "always"}, "early_stopping='always'"),
        ({"num_beams": 2, "early_stopping": 1}, "early_stopping=1"),
        ({"num_return_sequences": 2}, "needs num_beams >= 2"),
    ],
)
def test_bad_settings_are_refused_by_name(call, match):
    with pytest.raises(zoo.ArgumentError, match=match):
        beam_settings(call)
