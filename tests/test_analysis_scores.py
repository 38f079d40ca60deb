"""Head scores on hand-built attention maps with known answers; zeroing == pruning; errors."""

from __future__ import annotations

import math

import pytest
import torch

from analysis import AnalysisError, LMConfig, TinyLM, scores


def _causal_uniform(t: int) -> torch.Tensor:
    a = torch.ones(t, t).tril()
    return a / a.sum(-1, keepdim=True)


def _maps(*heads: torch.Tensor) -> torch.Tensor:
    """(1 layer, b=1, h, t, t) from (t t) maps."""
    return torch.stack(heads)[None, None]


def test_each_pattern_scores_one_on_its_own_map_and_zero_elsewhere():
    block = torch.tensor([5, 9, 2, 7, 3])
    tokens = torch.cat([block, block])[None]  # a block repeated: no accidental duplicates
    t = tokens.shape[1]
    prev = torch.zeros(t, t)
    prev[0, 0] = 1
    prev[torch.arange(1, t), torch.arange(t - 1)] = 1
    first = torch.zeros(t, t)
    first[:, 0] = 1
    induction = torch.zeros(t, t)
    duplicate = torch.zeros(t, t)
    for q in range(t):
        if q >= 5:  # second copy: the token after the first occurrence, and the occurrence itself
            induction[q, q - 4] = 1
            duplicate[q, q - 5] = 1
        else:
            induction[q, 0] = duplicate[q, 0] = 1
    maps = _maps(prev, induction, duplicate, first)
    before = maps.clone()
    s = scores.scores_from_maps(maps, tokens)
    assert torch.equal(maps, before), "scoring must not write to the maps"
    expect = {
        # Rows 1..9 count; row 1's only earlier key is key 0, which is also its previous token.
        "previous_token": [1, 1 / 9, 1 / 9, 1 / 9],
        "induction": [0, 1, 0, 0],
        "duplicate_token": [0, 0, 1, 1 / 5],  # row 5's earlier copy is key 0
        "first_token": [1 / 9, 4 / 9, 5 / 9, 1],
        "confidence": [1, 1, 1, 1],
    }
    for name, want in expect.items():
        torch.testing.assert_close(s[name][0, 0], torch.tensor(want, dtype=torch.float32), msg=name)


def test_uniform_causal_attention_scores_its_closed_form():
    t = 12
    tokens = torch.arange(t)[None]  # no repeats: induction and duplicate rows don't exist
    s = scores.scores_from_maps(_maps(_causal_uniform(t)), tokens)
    want = sum(1 / (q + 1) for q in range(1, t)) / (t - 1)
    assert float(s["previous_token"][0, 0, 0]) == pytest.approx(want)
    assert float(s["first_token"][0, 0, 0]) == pytest.approx(want)
    assert float(s["confidence"][0, 0, 0]) == pytest.approx(want)
    assert math.isnan(float(s["induction"][0, 0, 0])), "no row has an earlier copy: NaN, not 0"


def test_detector_form_and_its_exclude_options():
    t = 6
    tokens = torch.arange(t)[None]
    half = torch.zeros(t, t)
    half[0, 0] = 1
    for q in range(1, t):
        half[q, q] = half[q, q - 1] = 0.5
    s = scores.scores_from_maps(_maps(half), tokens)
    assert float(s["detector_previous_token"][0, 0, 0]) == pytest.approx(2.5 / 6)
    s = scores.scores_from_maps(_maps(half), tokens, exclude_current_token=True)
    assert float(s["detector_previous_token"][0, 0, 0]) == pytest.approx(1.0)
    s = scores.scores_from_maps(_maps(half), tokens, exclude_bos=True, exclude_current_token=True)
    assert float(s["detector_previous_token"][0, 0, 0]) == pytest.approx(1.0)


def test_a_list_of_inputs_scores_as_the_mean_of_each():
    torch.manual_seed(1)
    model = TinyLM(LMConfig(vocab_size=20, context=16, d_model=32, layers=2, heads=(2, 2))).eval()
    a = torch.randint(20, (3, 16))
    b = torch.randint(20, (2, 10))
    together = scores.head_scores(model, [a, b])
    each = [scores.head_scores(model, row) for row in [*a, *b]]
    for name, v in together.items():
        torch.testing.assert_close(v, torch.stack([e[name] for e in each]).nanmean(0), msg=name)


def test_zeroing_heads_equals_pruning_them():
    torch.manual_seed(2)
    model = TinyLM(LMConfig(vocab_size=30, context=20, d_model=32, layers=2, heads=(4, 4))).eval()
    tokens = torch.randint(30, (3, 20))
    hm = torch.ones(2, 4)
    hm[0, 1] = hm[1, 0] = hm[1, 3] = 0
    pruned = model.prune({0: [1], 1: [0, 3]})
    assert pruned.config.heads == (3, 2)
    with torch.no_grad():
        torch.testing.assert_close(pruned(tokens), model(tokens, head_mask=hm), atol=1e-5, rtol=0)
    maps = pruned.attention_map_list(tokens)
    assert [m.shape[1] for m in maps] == [3, 2]


def test_bad_input_is_one_clear_error():
    model = TinyLM(LMConfig(vocab_size=10, context=8, d_model=16, layers=1, heads=(2,)))
    with pytest.raises(AnalysisError, match="outside the vocabulary"):
        model(torch.tensor([[1, 2, 10]]))
    with pytest.raises(AnalysisError, match="longer than"):
        model(torch.zeros(1, 9, dtype=torch.long))
    with pytest.raises(AnalysisError, match="integer ids"):
        model(torch.zeros(1, 3))
    with pytest.raises(AnalysisError, match="head_mask has shape"):
        model(torch.zeros(1, 3, dtype=torch.long), head_mask=torch.ones(3, 2))
    with pytest.raises(AnalysisError, match="cannot prune"):
        model.prune({0: [5]})
    with pytest.raises(AnalysisError, match="t == s"):
        scores.scores_from_maps(torch.rand(1, 1, 1, 3, 4), torch.zeros(1, 3, dtype=torch.long))


def test_picture_of_any_zoo_block(tmp_path):
    import zoo
    from analysis import plot

    block = zoo.create("mha-causal", d_model=32, heads=2)
    _, attn = block(torch.randn(1, 200, 32), need_weights=True)  # a few hundred tokens stay readable
    out = plot.plot_attention_grid(attn, tmp_path / "block.png", suptitle="mha-causal")
    assert out.stat().st_size > 10_000
    with pytest.raises(AnalysisError, match="does not exist"):
        plot.plot_attention_grid(attn, tmp_path / "no" / "x.png")
