"""Training is deterministic, and a short budget moves the models the right way."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from analysis import dates, store
from analysis.errors import AnalysisError
from analysis.gates import HeadGates, fold
from analysis.importance import eval_batches, evaluate
from analysis.tasks import get_task
from analysis.training import train


def _same_weights(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_training_is_deterministic_and_gates_fold_into_w_o():
    task = dataclasses.replace(get_task("tiny-induction"), batch=8)
    a, log = train(task, steps=6)
    b, _ = train(task, steps=6)
    assert _same_weights(a, b)
    assert log["gates"] is not None and all(0.0 <= g <= 1.0 for row in log["gates"] for g in row)
    c, _ = train(task, steps=6, seed=1)
    assert not _same_weights(a, c)


def test_the_same_training_writes_the_same_bytes(tmp_path):
    """The weight file holds what the run determines: no run timings, no temp-file name inside."""
    task = dataclasses.replace(get_task("tiny-dates"), batch=8)
    a, log_a = train(task, steps=4)
    b, log_b = train(task, steps=4)
    store.save(a, "tiny-dates", tmp_path / "a.pt", {**log_a, "wall_s": 1.0, "cpu_s": 2.0})
    store.save(b, "tiny-dates", tmp_path / "b.pt", {**log_b, "wall_s": 3.0, "cpu_s": 4.0})
    assert (tmp_path / "a.pt").read_bytes() == (tmp_path / "b.pt").read_bytes()
    loaded = store.load("tiny-dates", tmp_path / "a.pt")
    assert loaded.training_log["steps"] == 4 and "wall_s" not in loaded.training_log
    assert _same_weights(loaded, a)


def test_encoder_window_is_a_positive_width_or_none():
    assert dates.DatesConfig(encoder_window=3).encoder_window == 3
    for bad in (0, -1, 2.5, True):
        with pytest.raises(AnalysisError, match="encoder_window"):
            dates.DatesConfig(encoder_window=bad)


def test_short_dates_budget_learns_the_task():
    task = get_task("tiny-dates")
    batches = eval_batches(task, 1, 64)
    torch.manual_seed(0)
    untrained = task.build().eval()
    loss0, exact0 = evaluate(untrained, task, batches)
    model, _ = train(task, steps=120)
    loss1, exact1 = evaluate(model, task, batches)
    assert loss1 < 0.5 * loss0
    assert exact1 >= exact0
    # Most characters already right: the year's century and the separators come first.
    ids = model.generate(batches[0][0])
    assert float((ids == batches[0][1]).float().mean()) > 0.5
    assert all(len(t) == dates.TARGET_LEN for t in model.translate(["1 May 1999"]))


def test_l0_gates_sample_in_training_and_are_fixed_in_eval():
    gates = HeadGates("l0", (4, 2), torch.Generator().manual_seed(0))
    with torch.no_grad():
        gates.params[0].copy_(torch.tensor([-8.0, 0.0, 1.0, 8.0]))
    drawn = torch.stack([gates.gates()[0] for _ in range(400)])
    assert drawn.min() >= 0 and drawn.max() <= 1
    assert (drawn[:, 0] == 0).float().mean() > 0.99 and (drawn[:, 3] == 1).float().mean() > 0.99
    assert 0.1 < (drawn[:, 1] == 0).float().mean() < 0.25  # log_alpha 0: shut when u < sigmoid(-1.6) = 0.17
    final = gates.final()[0]
    assert final[0] == 0 and final[3] == 1 and 0 < final[1] < final[2] < 1
    # The penalty is the expected number of open gates: it falls as log_alpha falls.
    p = gates.penalty()
    with torch.no_grad():
        gates.params[0].sub_(1.0)
    assert gates.penalty() < p <= 6


def test_folding_keeps_the_function_and_makes_shut_heads_uniform():
    torch.manual_seed(0)
    model = get_task("tiny-induction").build().eval()
    tokens = torch.randint(model.vocab_size, (3, 20))
    g = [torch.tensor([0.0, 1.0, 0.5, 0.0]), torch.tensor([1.0, 0.0, 1.0, 1.0])]
    with torch.no_grad():
        want = model(tokens, head_mask=g)
        fold(list(model.attn), g)
        torch.testing.assert_close(model(tokens), want, rtol=0, atol=1e-6)
        maps = model.attention_maps(tokens)
    t = tokens.shape[1]
    uniform = torch.ones(t, t).tril() / torch.arange(1, t + 1)[:, None]
    for layer, head in ((0, 0), (0, 3), (1, 1)):
        torch.testing.assert_close(maps[layer, :, head], uniform.expand(3, t, t), rtol=0, atol=1e-6)
    assert not torch.allclose(maps[0, :, 1], uniform.expand(3, t, t), atol=1e-3)
