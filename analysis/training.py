"""Training a task's model: deterministic (fixed seed, fixed thread count), AdamW with warm-up and
cosine decay, optional L0 head gates folded into W_O at the end."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from .gates import HeadGates, fold
from .lm import TinyLM
from .names import EVAL_SEED as EVAL_SEED  # handed on; spelled in names.py for the command line's help

if TYPE_CHECKING:
    from .tasks import Task

# Seeds: training uses TRAIN_SEED; every check of the shipped weights draws from EVAL_SEED,
# which no training run ever used.
TRAIN_SEED = 0
# Each task trains with a fixed thread count (Task.threads), since float reductions, so the
# weights, depend on it. tiny-induction's batched attention gains from 2 (117 -> 72 ms a step).


def _lr_at(step: int, steps: int, lr: float) -> float:
    warm = min(100, steps // 10 + 1)
    if step < warm:
        return lr * (step + 1) / warm
    frac = (step - warm) / max(1, steps - warm)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def train(
    task: Task,
    *,
    steps: int | None = None,
    seed: int = TRAIN_SEED,
    model: nn.Module | None = None,
    config: Any = None,
    lr: float | None = None,
    progress: Callable[[int, float], None] | None = None,
) -> tuple[nn.Module, dict[str, Any]]:
    """Train (or fine-tune `model`) deterministically: fixed seed, fixed thread count.

    AdamW, linear warm-up then cosine decay to 10%. Returns the model (eval mode) and a log.
    With task.gate != "none", from task.gate_from of the steps on every head's output is scaled
    by a gate at the head_mask location (analysis.gates) and the loss pays task.gate_lambda per
    open head: with "l0" (hard-concrete gates, Louizos et al. 2018, as Voita et al. 2019 used on
    heads) a head that only repeats what another already does is shut, so one head takes a job
    instead of every head sharing it. At the end each gate is folded into its head's columns of
    W_O (analysis.gates.fold), so the saved model has no gates. task.pos_lr multiplies the
    learning rate of the position biases (positions="relative").
    """
    steps = task.steps if steps is None else steps
    lr = task.lr if lr is None else lr
    threads = torch.get_num_threads()
    torch.set_num_threads(task.threads)
    try:
        torch.manual_seed(seed)
        if model is None:
            model = task.build(config)
        gen = torch.Generator().manual_seed(seed + 1)
        gater = None
        if task.gate != "none":
            gater = HeadGates(task.gate, model.heads_per_layer, torch.Generator().manual_seed(seed + 2))
        no_decay = {id(p) for name, p in model.named_parameters() if "pos_bias" in name}
        # Adam moves a parameter by about lr per step, which caps how sharp a position bias can
        # get in a few thousand steps; pos_lr lifts the cap (tried at 30x: README "Heads").
        groups = [
            {"params": [p for p in model.parameters() if id(p) not in no_decay], "weight_decay": 0.01, "scale": 1.0},
            {"params": [p for p in model.parameters() if id(p) in no_decay], "weight_decay": 0.0, "scale": task.pos_lr},
            {"params": list(gater.parameters()) if gater else [], "weight_decay": 0.0, "fixed": task.gate_lr},
        ]
        opt = torch.optim.AdamW(groups, lr=lr)
        model.train()
        started, cpu0 = time.perf_counter(), time.process_time()
        losses = []
        for step in range(steps):
            for g in opt.param_groups:
                g["lr"] = g["fixed"] if "fixed" in g else _lr_at(step, steps, lr) * g["scale"]
            batch = task.train_batch(gen)
            # Gates switch on late (gate_from): a gate shut before its head is useful never gets a
            # gradient again, and the induction circuit forms late (about step 1,000 of 3,000).
            gated = gater is not None and step >= task.gate_from * steps
            loss = task.train_loss(model, batch, gater.gates() if gated else None)
            total = loss + task.gate_lambda * gater.penalty() if gated else loss
            opt.zero_grad(set_to_none=True)
            total.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            if gater:
                gater.after_step()
            losses.append(float(loss.detach()))
            if progress:
                progress(step, losses[-1])
        model.eval()
        gates = gater.final() if gater else None
        if gates:
            fold(_gated_blocks(model), gates)
        log = {
            "steps": steps,
            "seed": seed,
            "lr": lr,
            "batch": task.batch,
            "threads": task.threads,
            "wall_s": round(time.perf_counter() - started, 1),
            "cpu_s": round(time.process_time() - cpu0, 1),
            "final_train_loss": sum(losses[-50:]) / max(1, len(losses[-50:])),
            "gate": task.gate,
            "gate_lambda": task.gate_lambda,
            "gate_from": task.gate_from,
            "gates": [[round(float(v), 4) for v in g.detach()] for g in gates] if gates else None,
        }
        return model, log
    finally:
        torch.set_num_threads(threads)


def _gated_blocks(model: nn.Module) -> list:
    """The zoo blocks whose heads a head_mask (and so a gate) addresses."""
    return list(model.attn) if isinstance(model, TinyLM) else list(model.dec_cross)
