"""The shipped tiny models meet the issue's targets on fresh data (a seed training never used)."""

from __future__ import annotations

import math

import pytest
import torch

import analysis
from analysis import dates, scores
from analysis.importance import eval_batches, evaluate, head_importance, mask_without, ranked_heads
from analysis.tasks import get_task
from analysis.training import EVAL_SEED, TRAIN_SEED


def real(v: torch.Tensor) -> torch.Tensor:
    """The entries of real heads (NaN: a layer with fewer heads than the widest)."""
    return v[~v.isnan()]


@pytest.fixture(scope="module")
def induction():
    return analysis.load("tiny-induction")


@pytest.fixture(scope="module")
def induction_data():
    task = get_task("tiny-induction")
    return task, eval_batches(task, 2, 32, seed=EVAL_SEED)


@pytest.fixture(scope="module")
def induction_scores(induction, induction_data):
    _, batches = induction_data
    return scores.head_scores(induction, batches)


def test_eval_seed_is_not_the_training_seed():
    assert EVAL_SEED != TRAIN_SEED
    for name in analysis.TASKS:
        assert analysis.load(name).training_log["seed"] != EVAL_SEED


def test_induction_has_an_induction_head(induction_scores):
    assert float(real(induction_scores["induction"][1]).max()) > 0.4


def test_layer_0_has_a_previous_token_head_above_0_4(induction_scores):
    assert float(real(induction_scores["previous_token"][0]).max()) > 0.4


def test_one_layer_control_has_no_induction_head(induction_data):
    control = analysis.load("tiny-induction-1layer")
    s = scores.head_scores(control, induction_data[1])
    assert float(real(s["induction"]).max()) < 0.2


def test_untrained_heads_score_like_uniform_attention(induction_data):
    task, batches = induction_data
    torch.manual_seed(TRAIN_SEED)
    fresh = task.build().eval()
    s = scores.head_scores(fresh, batches)
    t = batches[0].shape[1]
    uniform = torch.ones(t, t).tril()
    uniform = (uniform / uniform.sum(-1, keepdim=True)).expand(1, len(batches[0]), 1, t, t)
    base = {k: float(v.nanmean()) for k, v in scores.scores_from_maps(uniform, batches[0]).items()}
    assert base["induction"] < 3 / t  # about 1/T
    for name in ("previous_token", "induction", "duplicate_token"):
        assert float(real(s[name]).max()) < 2 * base[name], name
        assert float(real(s[name]).min()) > 0.5 * base[name], name


@pytest.fixture(scope="module")
def zeroing(induction, induction_data, induction_scores):
    """Held-out loss: as shipped, with the top induction head zeroed, with the lowest- and the
    highest-importance head zeroed."""
    task, batches = induction_data
    loss, _ = evaluate(induction, task, batches)
    top = int(induction_scores["induction"][1].nan_to_num(-1.0).argmax())
    shape = (induction.layers, induction.heads)
    importance, _ = head_importance(induction, task, batches)
    order = ranked_heads(importance)
    out = {"loss": loss, "ln_v": math.log(induction.vocab_size)}
    for key, head in (("top_induction", (1, top)), ("low", order[0]), ("high", order[-1])):
        out[key] = evaluate(induction, task, batches, mask_without([head], shape))[0]
    return out


def test_induction_second_copy_loss(zeroing):
    assert zeroing["loss"] < 0.5 * zeroing["ln_v"]


def test_zeroing_the_top_importance_head_hurts_more_than_the_bottom_one(zeroing):
    assert zeroing["high"] > zeroing["low"]
    assert zeroing["top_induction"] > zeroing["loss"] + 0.3  # a real rise (measured +4.4)


def test_zeroing_the_top_induction_head_closes_half_the_gap(zeroing):
    assert zeroing["top_induction"] - zeroing["loss"] >= 0.5 * (zeroing["ln_v"] - zeroing["loss"])


def test_zeroing_the_lowest_importance_head_changes_little(zeroing):
    assert abs(zeroing["low"] - zeroing["loss"]) < 0.1 * zeroing["loss"]


def test_dates_translate_held_out_dates():
    model = analysis.load("tiny-dates")
    assert model.translate(["29 August 1958"]) == ["1958-08-29"]
    task = get_task("tiny-dates")
    batches = eval_batches(task, 1, 100, seed=EVAL_SEED)
    _, exact = evaluate(model, task, batches)
    assert exact >= 0.95
    importance, _ = head_importance(model, task, batches)
    order = ranked_heads(importance)
    shape = (model.layers, model.heads)
    low, _ = evaluate(model, task, batches, mask_without([order[0]], shape))
    high, _ = evaluate(model, task, batches, mask_without([order[-1]], shape))
    assert high > low


def test_dates_has_a_cross_attention_head_that_finds_the_year():
    model = analysis.load("tiny-dates")
    gen = torch.Generator().manual_seed(EVAL_SEED)
    pairs = dates.sample_dates(gen, 60, split="test")
    sources = [s for s, _ in pairs]
    maps = model.cross_attention_maps(sources, [t for _, t in pairs])
    weights = dates.field_weights(maps, sources)
    assert float(weights["year"].max()) >= 0.5
    assert maps.shape[:3] == (model.layers, len(sources), model.heads)


@pytest.mark.parametrize("name, drop", [("tiny-induction", {0: [1, 3]}), ("tiny-dates", {0: [1, 6]})])
def test_zeroing_equals_pruning_on_the_shipped_models(name, drop):
    model, task = analysis.load(name), get_task(name)
    batch = eval_batches(task, 1, 8)[0]
    hm = mask_without([(layer, h) for layer, hs in drop.items() for h in hs], (model.layers, model.heads))
    with torch.no_grad():
        torch.testing.assert_close(
            task.logits(model.prune(drop), batch), task.logits(model, batch, hm), atol=1e-5, rtol=0
        )


def test_unknown_model_name_lists_the_known_ones():
    with pytest.raises(analysis.AnalysisError, match="tiny-induction"):
        analysis.load("tiny-nope")
