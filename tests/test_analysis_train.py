"""Training is deterministic, and a short budget moves the models the right way."""

from __future__ import annotations

import dataclasses

import torch

from analysis import dates
from analysis.importance import eval_batches, evaluate
from analysis.tasks import get_task, train


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
