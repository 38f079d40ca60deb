"""The four head experiments of seed 000, on the same held-out data and metric.

  (a) zero   heads zeroed for each input at the head-output location (head_mask = 0), or zeroed or
             mean-ablated at another named location (zoo/hooks.py: q, k, v, scores, pattern, z, result)
  (b) prune  the heads physically removed at evaluation (zoo.prune_heads): same outputs as (a)
  (c) prune + fine-tune   (b), then trained for a stated number of steps
  (d) scratch             a model with that many fewer heads, trained from scratch

Such results are evidence about one model, task, metric and procedure; the caption says which.
ONNX latency is measured by a callback the caller passes (the CLI in `export`), since analysis
does not import `export`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace

import torch
from torch import nn

from .errors import AnalysisError
from .importance import evaluate, mask_without
from .patching import PATCH_LOCATIONS, ablation_hooks, head_name
from .tasks import Task
from .training import TRAIN_SEED, train

# latency(blocks, head_masks) -> ms; blocks as Task.attention_blocks gives them.
# latency([(blocks, head_masks), ...]) -> ms for each request: blocks as Task.attention_blocks
# gives them, one head_mask (or None) per block. All rows are measured together at the end,
# interleaved, so that a drift in the machine's speed does not fall on one row.
LatencyFn = Callable[[list[tuple[list[tuple[nn.Module, int, "int | None"]], list["torch.Tensor | None"]]]], list[float]]

FINETUNE_SEED = TRAIN_SEED + 1  # fine-tuning draws other batches than the original training


def parse_heads(text: str, layers: int, heads: int | Sequence[int]) -> list[tuple[int, int]]:
    """ "1.0,0.3" -> [(1, 0), (0, 3)], checked against the model's layers and heads."""
    per_layer = [heads] * layers if isinstance(heads, int) else list(heads)
    out = []
    for part in re.split(r"[,\s]+", text.strip()):
        if not part:
            continue
        m = re.fullmatch(r"L?(\d+)[.:H](\d+)", part, flags=re.IGNORECASE)
        if not m:
            raise AnalysisError(f"head {part!r} is not LAYER.HEAD, e.g. --heads 1.0,0.3")
        layer, h = int(m.group(1)), int(m.group(2))
        if layer >= layers:
            raise AnalysisError(f"head {part!r}: layer {layer} does not exist; layers are 0..{layers - 1}")
        if h >= per_layer[layer]:
            raise AnalysisError(f"head {part!r}: layer {layer} has heads 0..{per_layer[layer] - 1}")
        if (layer, h) not in out:
            out.append((layer, h))
    if not out:
        raise AnalysisError("no heads given; pass e.g. --heads 1.0,0.3")
    return out


@dataclass
class Row:
    experiment: str
    heads: int
    parameters: int
    flops: int
    loss: float
    metric: float
    latency_ms: float | None = None
    note: str = ""


@dataclass
class Ablation:
    model: str
    pruned: list[tuple[int, int]]
    rows: list[Row] = field(default_factory=list)
    max_diff_zero_vs_prune: float = float("nan")
    caption: str = ""

    def to_dict(self) -> dict:
        return {
            "model": self.model,
            "pruned": [list(p) for p in self.pruned],
            "max_diff_zero_vs_prune": self.max_diff_zero_vs_prune,
            "caption": self.caption,
            "rows": [asdict(r) for r in self.rows],
        }


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def run_ablation(
    model: nn.Module,
    task: Task,
    heads: list[tuple[int, int]],
    batches: list,
    *,
    finetune_steps: int,
    scratch_steps: int,
    latency: LatencyFn | None = None,
    progress: Callable[[str], None] | None = None,
    train_progress: Callable[[int, float], None] | None = None,
    location: str = "z",
    mode: str = "zero",
) -> Ablation:
    """The table of experiments (a)-(d) plus the full model, on the same `batches`; (a) acts at
    `location` with `mode` ("zero" or "mean": `patching.ablation_hooks`), head_mask for z and zero."""
    hooks = ablation_hooks(model, heads, location, mode)
    by_mask = location == "z" and mode == "zero"
    layers, per_layer = model.layers, model.heads_per_layer
    drop: dict[int, list[int]] = {}
    for layer, h in heads:
        drop.setdefault(layer, []).append(h)
    full = [layer for layer, d in drop.items() if len(set(d)) >= per_layer[layer]]
    if full:
        raise AnalysisError(
            f"heads {', '.join(head_name(model, a, b) for a, b in heads)} leave layer {full[0]} with no head "
            f"(it has {per_layer[full[0]]}); a zoo block keeps at least one"
        )
    n_heads = sum(per_layer)
    kept_heads = tuple(per_layer[layer] - len(set(drop.get(layer, []))) for layer in range(layers))
    hm = mask_without(heads, (layers, model.heads))
    result = Ablation(model=task.name, pruned=list(heads))

    pending: list[tuple[int, list, list]] = []  # (row index, blocks, head masks) to time at the end

    def lat(m: nn.Module, masks: list | None = None) -> None:
        if latency is not None:
            blocks = task.attention_blocks(m)
            pending.append((len(result.rows), blocks, masks or [None] * len(blocks)))

    def step(name: str) -> None:
        if progress:
            progress(name)

    step("full model")
    loss, metric = evaluate(model, task, batches)
    flops_full = task.model_flops(model)
    result.rows.append(
        Row("full model", n_heads, count_params(model), flops_full, loss, metric, lat(model), "as shipped")
    )

    step("(a) zero")
    if by_mask:
        loss, metric = evaluate(model, task, batches, hm)
    else:
        with model.hooks(hooks):
            loss, metric = evaluate(model, task, batches)
    result.rows.append(
        Row(
            "(a) zero (head_mask)" if by_mask else f"(a) {mode} at {location}",
            n_heads - len(heads),
            count_params(model),
            flops_full,
            loss,
            metric,
            lat(model, [hm[layer, : per_layer[layer]] for layer in range(layers)]) if by_mask else None,
            "heads still computed, output scaled by 0" if by_mask else _how(location, mode),
        )
    )

    step("(b) prune")
    pruned = model.prune(drop)
    with torch.no_grad():
        result.max_diff_zero_vs_prune = max(
            float((task.logits(model, b, hm) - task.logits(pruned, b)).abs().max()) for b in batches
        )
    loss, metric = evaluate(pruned, task, batches)
    result.rows.append(
        Row(
            "(b) prune at evaluation",
            n_heads - len(heads),
            count_params(pruned),
            task.model_flops(pruned),
            loss,
            metric,
            lat(pruned),
            f"logits differ from (a) by at most {result.max_diff_zero_vs_prune:.1e}",
        )
    )

    step("(c) prune + fine-tune")
    # Fine-tuning adapts the pruned model as it is: no head gates (they shape training from scratch).
    tuned, _ = train(
        replace(task, gate="none"),
        steps=finetune_steps,
        seed=FINETUNE_SEED,
        model=pruned,
        progress=train_progress,
    )
    loss, metric = evaluate(tuned, task, batches)
    result.rows.append(
        Row(
            "(c) prune + fine-tune",
            n_heads - len(heads),
            count_params(tuned),
            task.model_flops(tuned),
            loss,
            metric,
            lat(tuned),
            f"{finetune_steps} steps, AdamW lr {task.lr:g}, batch {task.batch}, no gates",
        )
    )

    step("(d) fewer heads from scratch")
    scratch, _ = train(
        task, steps=scratch_steps, seed=TRAIN_SEED, config=task.config_with(kept_heads), progress=train_progress
    )
    loss, metric = evaluate(scratch, task, batches)
    result.rows.append(
        Row(
            "(d) fewer heads from scratch",
            sum(kept_heads),
            count_params(scratch),
            task.model_flops(scratch),
            loss,
            metric,
            lat(scratch),
            f"{scratch_steps} steps, heads per layer {list(kept_heads)}",
        )
    )
    if pending:
        step("ONNX latency")
        for (i, _, _), ms in zip(pending, latency([(blocks, masks) for _, blocks, masks in pending])):
            result.rows[i].latency_ms = ms
    n_eval = sum(_batch_len(b) for b in batches)
    result.caption = (
        f"Model {task.name} ({task.description}); heads removed: "
        f"{', '.join(head_name(model, layer, h) for layer, h in heads)}. Task and metric: {task.procedure}; "
        f"{n_eval} held-out examples (seed {batches_seed_note()}), the same for every row. Procedure: the "
        f"shipped weights, one run each, no error bars; (c) fine-tunes for {finetune_steps} steps, (d) trains "
        f"for {scratch_steps} steps from seed {TRAIN_SEED} with the shipped model's recipe{_gate_note(task)}. "
        f"FLOPs: matmul FLOPs of one example."
    )
    if latency is not None:
        how = getattr(latency, "description", "")
        result.caption += (
            " Latency: the attention blocks head_mask acts on, exported alone to ONNX and run under ONNX Runtime"
            + (f" ({how})." if how else ".")
        )
    return result


def _how(location: str, mode: str) -> str:
    what = "set to 0" if mode == "zero" else "replaced by its mean over the batch, position by position"
    if location == "scores" and mode == "zero":
        what = "set to 0 where the mask allows (uniform attention)"
    group = " (the head's kv head: its whole group under GQA)" if location in ("k", "v") else ""
    return f"the heads' {location}{group} {what}"


@dataclass
class LocationRow:
    location: str
    mode: str
    loss: float
    metric: float
    note: str


def location_table(model: nn.Module, task: Task, heads: list[tuple[int, int]], batches: list) -> list[LocationRow]:
    """The heads ablated at each named location, zeroed and mean-ablated, on the same batches
    (the first row: the full model)."""
    loss, metric = evaluate(model, task, batches)
    rows = [LocationRow("-", "-", loss, metric, "full model")]
    for location in PATCH_LOCATIONS:
        for mode in ("zero", "mean"):
            with model.hooks(ablation_hooks(model, heads, location, mode)):
                loss, metric = evaluate(model, task, batches)
            rows.append(LocationRow(location, mode, loss, metric, _how(location, mode)))
    return rows


def format_locations(rows: list[LocationRow], metric_name: str, loss_name: str) -> str:
    lines = [f"| location | ablation | {loss_name} | {metric_name} | what |", "|---|---|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r.location} | {r.mode} | {r.loss:.3f} | {r.metric:.3f} | {r.note} |")
    return "\n".join(lines)


def _gate_note(task) -> str:
    if task.gate == "none":
        return ""
    return f" (including its {task.gate.upper()} head gates, lambda {task.gate_lambda:g})"


def batches_seed_note() -> str:
    from .training import EVAL_SEED

    return f"{EVAL_SEED}, never used in training"


def _batch_len(batch) -> int:
    return len(batch[0]) if isinstance(batch, tuple) else int(batch.shape[0])


def format_table(result: Ablation, metric_name: str, loss_name: str) -> str:
    """A Markdown table with its caption."""
    head = f"| experiment | heads | parameters | FLOPs | {loss_name} | {metric_name} | ONNX latency | note |"
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in result.rows:
        lat = f"{r.latency_ms:.3f} ms" if r.latency_ms is not None else "-"
        lines.append(
            f"| {r.experiment} | {r.heads} | {r.parameters:,} | {r.flops:,} | {r.loss:.3f} | {r.metric:.3f} | "
            f"{lat} | {r.note} |"
        )
    return "\n".join(lines) + "\n\n" + result.caption
