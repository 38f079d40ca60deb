"""The task-level effect of weight precision on the shipped tiny models:
python scripts/precision_tasks.py [--models tiny-induction,tiny-dates] [--json PATH].

Every attention block of the model is exported alone to ONNX at the precision (export_onnx,
mask input included) and the model's own forward runs with each block replaced by its ONNX
Runtime session (CPU); embeddings, norms, MLPs and the unembedding stay eager fp32. fp32 goes
through ONNX too, so its row is the one the quantized rows compare with; the eager row is there
to show that fp32 through ONNX changes nothing. Held-out data: the tasks' own (seed 12345, never
used in training). Reported: tiny-induction's second-copy loss and accuracy, tiny-dates' exact
match (greedy decoding) and teacher-forced loss. A precision whose loss moves by more than
MAX_LOSS_SHIFT nats from the fp32 ONNX row is marked.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from torch import nn  # noqa: E402

import zoo  # noqa: E402
from analysis import load  # noqa: E402
from analysis.importance import eval_batches  # noqa: E402
from analysis.tasks import get_task, second_copy_loss  # noqa: E402
from analysis.training import EVAL_SEED  # noqa: E402
from export.names import PRECISIONS  # noqa: E402
from export.writer import export_onnx  # noqa: E402
from runtime.session import OnnxSession  # noqa: E402

MODELS = ("tiny-induction", "tiny-dates")
MAX_LOSS_SHIFT = 0.1  # nats: the line for "the task moved"


class OnnxBlock(nn.Module):
    """A zoo block's forward (x, context, bool key mask) through an ONNX Runtime session."""

    def __init__(self, block: zoo.MultiHeadAttention, path: Path, precision: str) -> None:
        super().__init__()
        self.spec = block.spec
        r = export_onnx(block, path, with_mask=True, precision=precision, overwrite=True)
        self.lowering = r.lowering
        self.sess = OnnxSession(path, "cpu", verbose=False)

    def forward(self, x, context=None, mask=None, need_weights=False, head_mask=None):
        if need_weights or head_mask is not None:
            raise ValueError("the ONNX stand-in computes y only (no weights, no head_mask)")
        b, t = x.shape[:2]
        s = context.shape[1] if context is not None else t
        if mask is None:
            mask = torch.ones(b, t, s, dtype=torch.bool)
        elif mask.dtype != torch.bool or mask.dim() != 4 or mask.shape[1] != 1:
            raise ValueError(
                f"the ONNX stand-in takes a bool mask (b, 1, t|1, s), got {mask.dtype} {tuple(mask.shape)}"
            )
        else:
            mask = mask[:, 0].expand(b, t, s).contiguous()
        return self.sess.run(x.contiguous(), context=context, mask=mask)


def with_onnx_blocks(model: nn.Module, precision: str, folder: Path) -> tuple[nn.Module, list[str]]:
    """A copy of `model` whose every zoo block runs under ONNX Runtime at `precision`; the lowerings used."""
    import copy

    model = copy.deepcopy(model).eval()
    lowerings = []
    blocks = [(n, m) for n, m in model.named_modules() if isinstance(m, zoo.MultiHeadAttention)]
    for i, (name, block) in enumerate(blocks):
        parent = model.get_submodule(name.rpartition(".")[0]) if "." in name else model
        stand_in = OnnxBlock(block, folder / f"block{i}-{precision}.onnx", precision)
        lowerings.append(stand_in.lowering)
        setattr(parent, name.rpartition(".")[2], stand_in)
    return model, lowerings


@torch.no_grad()
def evaluate(name: str, model: nn.Module, batches: list) -> dict[str, float]:
    task = get_task(name)
    if name.startswith("tiny-induction"):
        parts = [second_copy_loss(model(tokens), tokens, task.span) for tokens in batches]
        return {
            "loss": sum(float(p[0]) for p in parts) / len(parts),
            "accuracy": sum(float(p[1]) for p in parts) / len(parts),
        }
    loss = sum(float(task.eval_loss(model, batch)) for batch in batches) / len(batches)
    exact = sum(task.metric(model, batch) for batch in batches) / len(batches)
    return {"loss": loss, "exact_match": exact}


def run(models=MODELS, precisions=PRECISIONS, batches: int = 4, batch: int = 64) -> list[dict]:
    torch.set_num_threads(1)  # the eager parts; ORT takes what it takes
    rows = []
    with tempfile.TemporaryDirectory(prefix="attnzoo-precision-tasks-") as tmp:
        for name in models:
            model = load(name)
            data = eval_batches(get_task(name), batches, batch, seed=EVAL_SEED)
            rows.append({"model": name, "path": "eager", "precision": "fp32", **evaluate(name, model, data)})
            for prec in precisions:
                started = time.perf_counter()
                onnx_model, lowerings = with_onnx_blocks(model, prec, Path(tmp))
                row = {"model": name, "path": "onnx", "precision": prec, "lowerings": sorted(set(lowerings))}
                row.update(evaluate(name, onnx_model, data), seconds=round(time.perf_counter() - started, 1))
                rows.append(row)
    for row in rows:
        ref = next(
            (r for r in rows if r["model"] == row["model"] and r["path"] == "onnx" and r["precision"] == "fp32"), None
        )
        if ref is not None:
            row["loss_shift"] = row["loss"] - ref["loss"]
            row["moved"] = abs(row["loss_shift"]) > MAX_LOSS_SHIFT
    return rows


def format_table(rows: list[dict], examples: int) -> str:
    lines = [
        "| model | weights | blocks through | loss | accuracy (2nd copy) | exact match | loss vs fp32 ONNX |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        where = "eager torch" if r["path"] == "eager" else f"ONNX Runtime ({', '.join(r['lowerings'])})"
        acc = f"{r['accuracy']:.3f}" if "accuracy" in r else ""
        em = f"{r['exact_match']:.1%}" if "exact_match" in r else ""
        shift = f"{r['loss_shift']:+.3f}" + (f" (moved > {MAX_LOSS_SHIFT} nats)" if r.get("moved") else "")
        lines.append(f"| {r['model']} | {r['precision']} | {where} | {r['loss']:.4f} | {acc} | {em} | {shift} |")
    lines.append("")
    lines.append(
        f"{examples} held-out examples per model (seed {EVAL_SEED}); loss: second-copy loss (tiny-induction), "
        f"teacher-forced loss (tiny-dates), nats."
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, from {', '.join(MODELS)}")
    p.add_argument("--precisions", default=",".join(PRECISIONS), help=f"comma-separated, from {', '.join(PRECISIONS)}")
    p.add_argument("--batches", type=int, default=4)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--json", help="also write the rows as JSON")
    args = p.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    precisions = [q for q in args.precisions.split(",") if q]
    bad = [m for m in models if m not in MODELS] + [q for q in precisions if q not in PRECISIONS]
    if bad or args.batches < 1 or args.batch < 1:
        p.error(f"unknown {', '.join(bad)}" if bad else "--batches and --batch must be positive")
    rows = run(models, precisions, args.batches, args.batch)
    print(format_table(rows, args.batches * args.batch))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
