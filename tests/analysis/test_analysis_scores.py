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


# -- positional, punctuation, field ------------------------------------------------------------


def _full(t: int) -> torch.Tensor:
    return torch.ones(1, t, t, dtype=torch.bool)


def test_positional_scores_one_on_a_band_and_previous_token_zero_on_uniform():
    t = 10
    rows = torch.ones(1, t, dtype=torch.bool)
    band = (torch.arange(t)[:, None] - torch.arange(t)[None, :]).abs() <= 1
    band = band.float() / band.float().sum(-1, keepdim=True)  # a narrow diagonal band, both sides
    uniform = torch.full((t, t), 1 / t)
    stripe = torch.zeros(t, t)
    stripe[:, 4] = 1  # every row on key 4: a vertical stripe
    s = scores.positional_score(_maps(band, uniform, stripe), _full(t), rows, width=1)[0, 0]
    assert float(s[0]) == pytest.approx(1.0)
    assert float(s[1]) == pytest.approx(0.0, abs=1e-6)
    # The stripe is in the band on rows 3..5 only (score 1 there); elsewhere -U/(1-U) = -3/7.
    interior = [1.0 if 3 <= q <= 5 else -3 / 7 for q in range(1, t - 1)]
    edges = [-2 / 8, -2 / 8]  # rows 0 and 9: 2 keys of 10 in the band, neither is key 4
    assert float(s[2]) == pytest.approx(sum(interior + edges) / t)
    # An exact previous-token map in a causal LM: 1 with the band |t - s| <= 1, and at offset 1.
    prev = torch.zeros(t, t)
    prev[0, 0] = 1
    prev[torch.arange(1, t), torch.arange(t - 1)] = 1
    tokens = torch.arange(t)[None]
    assert float(scores.scores_from_maps(_maps(prev), tokens)["positional"][0, 0, 0]) == pytest.approx(1.0)
    causal = torch.ones(1, t, t, dtype=torch.bool).tril()
    assert float(scores.positional_score(_maps(prev), causal, rows, width=0, offset=1)[0, 0, 0]) == pytest.approx(1)
    # Uniform causal attention: exactly the uniform share, so 0.
    uni = scores.scores_from_maps(_maps(_causal_uniform(t)), tokens)["positional"]
    assert float(uni[0, 0, 0]) == pytest.approx(0.0, abs=1e-6)


def test_punctuation_score_is_the_share_on_punctuation_keys():
    t = 8
    tokens = torch.tensor([[3, 7, 0, 4, 5, 0, 6, 2]])  # id 0 is the "comma"
    comma = torch.tensor([0])
    stripes = torch.zeros(t, t)
    stripes[:, 2] = 1  # all rows on the first comma: a vertical stripe
    uniform = torch.full((t, t), 1 / t)
    none = torch.eye(t)  # the diagonal: on a comma only in rows 2 and 5
    maps = _maps(stripes, uniform, none)
    rows = torch.ones(1, t, dtype=torch.bool)
    s = scores.punctuation_score(maps, torch.isin(tokens, comma), rows)[0, 0]
    torch.testing.assert_close(s, torch.tensor([1.0, 2 / 8, 2 / 8]))
    no_punct = scores.punctuation_score(maps, torch.zeros(1, t, dtype=torch.bool), rows)
    assert no_punct.isnan().all(), "a sequence without punctuation says nothing: NaN"


def test_field_score_is_the_share_on_the_span_while_the_field_is_written():
    t, s = 4, 6
    rows = torch.tensor([[False, True, True, False]])
    span = torch.tensor([[False, False, True, True, False, False]])
    on = torch.zeros(t, s)
    on[:, 2] = 1
    half = torch.zeros(t, s)
    half[1, 3] = half[1, 0] = 0.5
    half[2, 2] = 1.0
    off = torch.zeros(t, s)
    off[:, 5] = 1
    off[0, 2] = off[3, 2] = 1  # weight on the span outside the field's rows does not count
    off[0, 5] = off[3, 5] = 0
    got = scores.field_score(torch.stack([on, half, off])[None, None], rows, span)[0, 0]
    torch.testing.assert_close(got, torch.tensor([1.0, 0.75, 0.0]))


def test_model_scores_and_their_errors():
    import analysis

    torch.manual_seed(3)
    lm = TinyLM(LMConfig(vocab_size=128, context=16, d_model=32, layers=1, heads=(2,))).eval()
    text = torch.tensor([[ord(c) for c in "ab, cd. ab, cd."]])
    s = analysis.head_scores(lm, text)
    assert s["punctuation"].shape == (1, 2) and s["positional"].shape == (1, 2)
    assert torch.equal(analysis.punctuation_ids(lm, ",."), torch.tensor([44, 46]))
    with pytest.raises(AnalysisError, match="'\u00e9' is not in the model's vocabulary"):
        analysis.head_scores(lm, text, punctuation="\u00e9")
    with pytest.raises(AnalysisError, match="outside the vocabulary 0..127"):
        analysis.head_scores(lm, text, punctuation=[44, 300])
    with pytest.raises(AnalysisError, match="decoder-only"):
        analysis.field_scores(lm, ["29 August 1958"])
    d = analysis.DatesModel(analysis.DatesConfig()).eval()
    with pytest.raises(AnalysisError, match="field 'hour' is not one of this model's fields: day, month, year"):
        analysis.field_scores(d, ["29 August 1958"], ["1958-08-29"], fields=["hour"])
    with pytest.raises(AnalysisError, match="'x' is not in the model's vocabulary"):
        analysis.head_scores(d, ["29 August 1958"], punctuation="x")
    f = analysis.field_scores(d, ["29 August 1958", "August 3, 2001"], ["1958-08-29", "2001-08-03"])
    assert set(f) == {"day", "month", "year"} and f["day"].shape == (2, 4)
    assert ((f["year"] > 0) & (f["year"] < 1)).all()
    both = analysis.head_scores(d, ["29 August 1958", "August 3, 2001"])
    assert both["punctuation"].shape == (2, 4) and both["field_year"].shape == (2, 4)


def test_public_scoring_names_are_exported():
    import analysis

    for name in ("head_scores", "field_scores", "encoder_scores", "scores_from_maps", "best_scores"):
        assert callable(getattr(analysis, name)), name
        assert name in analysis.__all__
