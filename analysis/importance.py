"""Head importance (Michel et al. 2019) and the pruning sweep it orders.

    I_lh = mean over batches of | dL / d xi_lh |,   xi = head_mask = 1 (layers h)
    I_l. = I_l. / ||I_l.||_2                         (normalised per layer)

L is the task's held-out loss (tasks.Task.eval_loss). The sweep zeroes the least important
heads with head_mask in steps of 10% of all heads (importance computed once, on the full
model) and stops after the first step whose metric falls below 0.9 x the full model's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from .tasks import Task
from .training import EVAL_SEED


def _grid(model: nn.Module) -> tuple[int, int]:
    """(layers, heads) of the head_mask; a layer with fewer heads leaves the rest of its row unused."""
    return model.layers, model.heads


def exists(model: nn.Module) -> Tensor:
    """(layers h) bool: which head_mask entries are real heads."""
    layers, heads = _grid(model)
    return torch.arange(heads)[None, :] < torch.tensor(model.heads_per_layer)[:, None]


def eval_batches(task: Task, n_batches: int, batch: int, seed: int = EVAL_SEED) -> list:
    gen = torch.Generator().manual_seed(seed)
    return [task.eval_batch(gen, batch) for _ in range(n_batches)]


def head_importance(
    model: nn.Module, task: Task, batches: list, *, progress: Callable[[], None] | None = None
) -> tuple[Tensor, Tensor]:
    """(normalised, raw) importance, each (layers h); NaN where a layer has no such head."""
    layers, heads = _grid(model)
    total = torch.zeros(layers, heads)
    for batch in batches:
        xi = torch.ones(layers, heads, requires_grad=True)
        loss = task.eval_loss(model, batch, xi)
        (grad,) = torch.autograd.grad(loss, xi)
        total += grad.abs()
        if progress:
            progress()
    raw = total / len(batches)
    norm = raw / raw.norm(dim=1, keepdim=True).clamp_min(1e-12)
    real = exists(model)
    return norm.where(real, torch.nan), raw.where(real, torch.nan)


def ranked_heads(importance: Tensor) -> list[tuple[int, int]]:
    """(layer, head) from least to most important (NaN entries, no such head, left out)."""
    heads = importance.shape[1]
    flat = importance.flatten()
    order = torch.argsort(flat.nan_to_num(float("inf")), stable=True).tolist()
    return [(i // heads, i % heads) for i in order if not torch.isnan(flat[i])]


def mask_without(heads: list[tuple[int, int]], shape: tuple[int, int]) -> Tensor:
    hm = torch.ones(shape)
    for layer, h in heads:
        hm[layer, h] = 0.0
    return hm


@dataclass
class Sweep:
    """Pruning sweep: fraction of heads zeroed -> loss and metric on held-out data."""

    fractions: list[float] = field(default_factory=list)
    pruned: list[list[tuple[int, int]]] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    metrics: list[float] = field(default_factory=list)
    threshold: float = math.nan

    def to_dict(self) -> dict:
        return {
            "fractions": self.fractions,
            "pruned": [[list(p) for p in ps] for ps in self.pruned],
            "losses": self.losses,
            "metrics": self.metrics,
            "threshold": self.threshold,
        }


def evaluate(model: nn.Module, task: Task, batches: list, head_mask: Tensor | None = None) -> tuple[float, float]:
    """Mean held-out loss and metric over batches (each batch weighs the same)."""
    with torch.no_grad():
        losses = [float(task.eval_loss(model, b, head_mask)) for b in batches]
        metrics = [task.metric(model, b, head_mask) for b in batches]
    return sum(losses) / len(losses), sum(metrics) / len(metrics)


def pruning_sweep(
    model: nn.Module,
    task: Task,
    importance: Tensor,
    batches: list,
    *,
    progress: Callable[[], None] | None = None,
) -> Sweep:
    layers, heads = _grid(model)
    order = ranked_heads(importance)
    n = len(order)
    sweep = Sweep()
    seen = set()
    for step in range(11):
        k = min(n, round(step * n / 10))
        if k in seen:
            continue
        seen.add(k)
        pruned = order[:k]
        loss, metric = evaluate(model, task, batches, mask_without(pruned, (layers, heads)))
        sweep.fractions.append(k / n)
        sweep.pruned.append(pruned)
        sweep.losses.append(loss)
        sweep.metrics.append(metric)
        if progress:
            progress()
        if step == 0:
            sweep.threshold = 0.9 * metric
        elif metric < sweep.threshold:
            break
    return sweep


def remove_half(
    model: nn.Module, task: Task, importance: Tensor, batches: list
) -> tuple[list[tuple[int, int]], float, float]:
    """The seeds' "removing half the heads": zero the floor(n/2) least important heads (head_mask)
    -> (those heads, held-out loss, metric), whatever the sweep's stopping rule would do."""
    order = ranked_heads(importance)
    heads = order[: len(order) // 2]
    loss, metric = evaluate(model, task, batches, mask_without(heads, _grid(model)))
    return heads, loss, metric
