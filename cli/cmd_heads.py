"""The analysis half of the `attnzoo` CLI: heads, importance, ablate.

`ablate` measures the exported attention under ONNX Runtime (bench/latency.py, imported only
when it runs); `analysis` itself never imports `export`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from zoo.files import ensure_writable_parent, write_atomic

from .common import CliError, number_in, one_model, seed

if TYPE_CHECKING:
    import torch

MAX_EXAMPLES = 4096  # held-out examples per batch: more says nothing new and only costs memory
MAX_BATCHES = 1024
MAX_STEPS = 10**7


def _finite(obj: object) -> object:
    """NaN (no such head, nothing to score) -> null: strict JSON has no NaN."""
    if isinstance(obj, float) and obj != obj:
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def _write_json(path: str, data: object) -> None:
    text = json.dumps(_finite(data), indent=2, default=str, allow_nan=False)
    write_atomic(Path(path), lambda tmp: tmp.write_text(text))
    print(f"wrote {path}")


def _check_out(path: str | None) -> None:
    if path:
        ensure_writable_parent(Path(path))


def _check_picture(path: str | None) -> None:
    if path:
        from analysis.plot import picture_format

        picture_format(path)


def _bar(total: int, desc: str, quiet: bool):
    from zoo.progress import bar

    return bar(total, desc, disable=quiet, leave=False)


def _lm_tokens(model, args: argparse.Namespace) -> tuple[torch.Tensor, list[str] | None]:
    """(b t) tokens and their labels: --tokens ids, --text ASCII characters (vocab 128 = ASCII),
    or held-out repeated blocks."""
    import torch

    from analysis import AnalysisError

    if args.tokens is not None:
        from .lm_inputs import token_ids

        tokens = token_ids(model, args.tokens)
        return tokens, [str(i) for i in tokens[0].tolist()]
    if args.text is not None:
        if not args.text:
            raise AnalysisError("--text is empty; give some text, e.g. --text 'the cat sat. the cat sat.'")
        bad = sorted({ch for ch in args.text if ord(ch) >= model.vocab_size})
        if bad:
            raise AnalysisError(
                f"--text has characters outside the vocabulary (ids 0..{model.vocab_size - 1}, ASCII): {''.join(bad)!r}"
            )
        return model.check_tokens(torch.tensor([[ord(ch) for ch in args.text]])), list(args.text)
    from analysis.importance import eval_batches
    from analysis.tasks import get_task

    tokens = eval_batches(get_task(args.name), 1, args.batch, seed=args.seed)[0]
    return tokens, None


def cmd_heads(args: argparse.Namespace) -> int:
    one_model(args)  # the one-line mistakes first: they cost no torch
    _check_picture(args.plot)
    _check_out(args.json)
    import analysis
    from analysis import AnalysisError, plot, scores

    if args.checkpoint is not None:
        from .checkpoint_heads import load_whole, whole_tokens

        model, tok = load_whole(args.checkpoint)
        tokens, labels = whole_tokens(model, tok, args)
        args.name = model.name
    else:
        model = analysis.load(args.name)
        if isinstance(model, analysis.DatesModel):
            return _heads_dates(model, args)
        tokens, labels = _lm_tokens(model, args)
    if tokens.shape[1] < 2:
        raise AnalysisError(
            f"{tokens.shape[1]} token: every score reads a row's weight on earlier tokens; give 2 or more"
        )
    result = scores.head_scores(model, tokens)
    source = "your input" if labels is not None else f"{len(tokens)} held-out repeated blocks (seed {args.seed})"
    print(f"{args.name}: head scores on {source}, {tokens.shape[1]} tokens each (NaN: no such rows)")
    shut = model.shut_heads()
    print(scores.format_scores(result, shut=shut))
    if any(map(any, shut)):
        print("shut: the head's W_O columns are zero (training's L0 gates), so its map is not in use")
    if args.plot:
        best = scores.best_scores(result)
        maps = model.attention_maps(tokens[:1])
        lab = labels if labels is not None else [str(i) for i in tokens[0].tolist()]
        plot.plot_attention_grid(
            maps,
            args.plot,
            query_labels=lab,
            key_labels=lab,
            titles=plot.score_titles(best, shut),
            suptitle=f"{args.name}: attention per layer x head (title: best score on {source})",
        )
        print(f"wrote {args.plot}")
    if args.json:
        _write_json(args.json, {"model": args.name, "scores": {k: v.tolist() for k, v in result.items()}, "shut": shut})
    return 0


def _heads_dates(model, args: argparse.Namespace) -> int:
    import torch

    from analysis import AnalysisError, dates, plot, roles
    from analysis.tasks import get_task

    if args.tokens is not None:
        raise AnalysisError("tiny-dates reads text: use --text '29 August 1958' (several: separate with ';')")
    if args.text is not None:
        sources = [s.strip() for s in args.text.split(";")]
        if not any(sources):
            raise AnalysisError("--text is empty; give a date such as --text '29 August 1958'")
        for s in sources:
            dates.field_spans(s)  # a clear line for text that is not a date in a known format
    else:  # one held-out date in every format: the fields move, the date does not
        sources = roles.in_every_format(roles.example_date(args.seed))
    translations = model.translate(sources)
    for s, t in zip(sources, translations):
        print(f"{s!r:>24} -> {t}")
    report = roles.dates_heads(model, get_task(args.name), n=args.n, seed=args.seed)
    print(roles.format_dates_heads(report))
    if args.plot:
        maps = model.cross_attention_maps(sources, translations)  # (layers b h t s)
        flat = [(layer, h) for layer in range(model.layers) for h in range(model.heads_per_layer[layer])]
        per_example = [torch.stack([maps[layer, j, h] for layer, h in flat]) for j in range(len(sources))]
        named: dict[tuple[int, int], str] = {}  # as the text names them; a head that is both says both
        for head, name in ((report.day_head, "the day head"), (report.year_head, "the year head")):
            if head is not None:
                named[head] = f"{named[head]} and {name}" if head in named else name
        plot.plot_head_formats(
            per_example,
            sources,
            translations,
            args.plot,
            titles=[
                f"X{layer}H{h}"  # tiny-dates' cross-attention heads, named as every command names them
                + (f" ({named[(layer, h)]})" if (layer, h) in named else "")
                + f": {report.roles[layer][h].title()}"
                for layer, h in flat
            ],
            suptitle=f"{args.name} cross-attention per head (row i writes target character i; roles measured "
            f"on {report.n} held-out dates)",
            marked=[r for r, head in enumerate(flat) if head in named],
        )
        print(f"wrote {args.plot}")
    if args.json:
        _write_json(
            args.json, {"model": args.name, "translations": dict(zip(sources, translations)), **report.to_dict()}
        )
    return 0


def cmd_importance(args: argparse.Namespace) -> int:
    import analysis
    from analysis import plot
    from analysis.importance import eval_batches, head_importance, pruning_sweep, ranked_heads, remove_half
    from analysis.patching import head_name
    from analysis.tasks import get_task

    _check_picture(args.plot)
    _check_out(args.json)
    model = analysis.load(args.name)
    task = get_task(args.name)
    batches = eval_batches(task, args.batches, args.batch, seed=args.seed)
    bar = _bar(len(batches) + 11, "importance", args.quiet)
    try:
        norm, raw = head_importance(model, task, batches, progress=bar.update)
        sweep = pruning_sweep(model, task, norm, batches, progress=bar.update)
    finally:
        bar.close()
    print(f"{args.name}: head importance |dL/d head_mask| (Michel et al. 2019), normalised per layer (L2)")
    print(f"loss: {task.loss_name} on {args.batches * args.batch} held-out examples (seed {args.seed})")
    print("head  importance   raw |dL/dxi|")
    for layer, h in reversed(ranked_heads(norm)):
        print(f"{head_name(model, layer, h)}  {float(norm[layer, h]):>10.3f}   {float(raw[layer, h]):>12.3e}")
    print(f"\npruning sweep (least important first, by head_mask; stop below 0.9 x start = {sweep.threshold:.3f})")
    print(f"{'pruned':>7}  {task.loss_name:>22}  {task.metric_name:>20}  heads zeroed")
    for f, p, loss, m in zip(sweep.fractions, sweep.pruned, sweep.losses, sweep.metrics):
        names = ",".join(head_name(model, a, b) for a, b in p) or "-"
        print(f"{f:>7.0%}  {loss:>22.3f}  {m:>20.3f}  {names}")
    half, half_loss, half_metric = remove_half(model, task, norm, batches)
    print(
        f"half the heads zeroed ({len(half)}, least important first): {task.loss_name} {half_loss:.3f}, "
        f"{task.metric_name} {half_metric:.3f} (full model {sweep.metrics[0]:.3f})"
    )
    if args.plot:
        added = [p[len(q) :] for q, p in zip([[], *sweep.pruned], sweep.pruned)]  # the heads each point zeroed
        n = len(ranked_heads(norm))  # the sweep's fractions are of these heads
        plot.plot_curve(
            [100 * f for f in sweep.fractions],
            sweep.metrics,
            args.plot,
            xlabel="heads zeroed, least important first (%)",
            ylabel=task.metric_name,
            title=f"{args.name}: pruning by importance",
            threshold=sweep.threshold,
            point_labels=["+" + ",".join(head_name(model, a, b) for a, b in heads) if heads else "" for heads in added],
            extra=[(100 * len(half) / n, half_metric, f"half the heads zeroed ({len(half)}): {half_metric:.3f}")],
        )
        print(f"wrote {args.plot}")
    if args.json:
        _write_json(
            args.json,
            {
                "model": args.name,
                "importance": norm.tolist(),
                "raw": raw.tolist(),
                "sweep": sweep.to_dict(),
                "half": {"heads": [list(p) for p in half], "loss": half_loss, "metric": half_metric},
            },
        )
    return 0


def cmd_ablate(args: argparse.Namespace) -> int:
    if args.heads is not None and not args.heads.strip():
        raise CliError("--heads is empty; give LAYER.HEAD,... (e.g. --heads 1.2), or leave it out for the top head")
    import analysis
    from analysis.ablate import format_locations, format_table, location_table, parse_heads, run_ablation
    from analysis.importance import eval_batches, head_importance, ranked_heads
    from analysis.patching import check_location, head_name
    from analysis.tasks import get_task

    if args.location != "all":
        check_location(args.location)
    _check_out(args.json)
    model = analysis.load(args.name)
    task = get_task(args.name)
    batches = eval_batches(task, args.batches, args.batch, seed=args.seed)
    if args.heads:
        heads = parse_heads(args.heads, model.layers, model.heads_per_layer)
    else:
        norm, _ = head_importance(model, task, batches)
        heads = [ranked_heads(norm)[-1]]
        print(f"--heads not given: removing the most important head, {head_name(model, *heads[0])}")
    if args.location == "all":
        rows = location_table(model, task, heads, batches)
        names = ", ".join(head_name(model, a, b) for a, b in heads)
        print(f"{args.name}: heads {names} ablated at each location, {args.batches * args.batch} held-out examples")
        print(format_locations(rows, task.metric_name, task.loss_name))
        if args.json:
            from dataclasses import asdict

            _write_json(args.json, {"model": args.name, "heads": heads, "rows": [asdict(r) for r in rows]})
        return 0
    finetune = args.finetune_steps
    scratch = args.scratch_steps if args.scratch_steps is not None else task.steps
    total = 5 + finetune + scratch
    bar = _bar(total, "ablate", args.quiet)

    def progress(name: str) -> None:
        bar.set_description(f"ablate: {name}")
        bar.update()

    latency = None
    if not args.no_latency:
        from bench.latency import OnnxLatency

        latency = OnnxLatency()
    try:
        result = run_ablation(
            model,
            task,
            heads,
            batches,
            finetune_steps=finetune,
            scratch_steps=scratch,
            latency=latency,
            progress=progress,
            train_progress=lambda step, loss: bar.update(),
            location=args.location,
            mode=args.mode,
        )
    finally:
        bar.close()
        if latency is not None:
            latency.close()
    print(format_table(result, task.metric_name, task.loss_name))
    if args.json:
        _write_json(args.json, result.to_dict())
    return 0


def add_commands(sub) -> None:
    """Register heads, importance and ablate on the `attnzoo` subparsers."""
    from analysis.names import EVAL_SEED, TASK_NAMES

    names = ", ".join(sorted(TASK_NAMES))
    examples = number_in(int, 1, below=MAX_EXAMPLES + 1)
    batches = number_in(int, 1, below=MAX_BATCHES + 1)
    steps0, steps = number_in(int, 0, below=MAX_STEPS + 1), number_in(int, 1, below=MAX_STEPS + 1)

    def common(sp: argparse.ArgumentParser, batch: int, checkpoint: bool = False) -> None:
        if checkpoint:
            sp.add_argument("name", nargs="?", help=f"a trained model: {names} (or --checkpoint DIR)")
            sp.add_argument(
                "--checkpoint",
                metavar="DIR",
                help="a whole model's heads instead: a transformers checkpoint folder (config.json, *.safetensors, "
                "tokenizer.json for --text), e.g. models/tiny-stdlib-llama",
            )
        else:
            sp.add_argument("name", help=f"a trained model: {names}")
        sp.add_argument(
            "--batch",
            type=examples,
            default=batch,
            help=f"held-out examples per batch, 1..{MAX_EXAMPLES} (default {batch})",
        )
        sp.add_argument("--seed", type=seed, default=EVAL_SEED, help="seed of the held-out data, 0..2**63-1")
        sp.add_argument("--json", metavar="PATH", help="also write the results as JSON")

    sp = sub.add_parser(
        "heads",
        help="head scores (previous-token, induction, ...) and a picture of the maps",
        description="Score every head of a shipped tiny model or a checkpoint's whole model (--checkpoint DIR) on "
        "text or tokens: previous-token, duplicate-token, induction and first-token scores (tiny-dates: field "
        "scores and roles); --plot draws the maps.",
    )
    common(sp, 16, checkpoint=True)
    src = sp.add_mutually_exclusive_group()
    src.add_argument(
        "--text",
        help="LM: ASCII text (one token per character); tiny-dates: dates separated by ';'; --checkpoint: text "
        "read with the folder's tokenizer.json",
    )
    src.add_argument("--tokens", help="LM: token ids, e.g. '5 9 2 5 9 2'")
    sp.add_argument("--plot", metavar="PNG", help="write a layers x heads grid of attention maps")
    sp.add_argument("--n", type=examples, default=300, help="tiny-dates: held-out dates the roles are measured on")
    sp.set_defaults(func=cmd_heads)

    sp = sub.add_parser(
        "importance",
        help="head importance |dL/d head_mask| and a pruning sweep by importance",
        description="Each head's importance as |dL/d head_mask| on held-out data (Michel et al.), then the loss as "
        "heads are zeroed in that order; --plot draws the sweep.",
    )
    common(sp, 64)
    sp.add_argument("--batches", type=batches, default=4, help=f"held-out batches, 1..{MAX_BATCHES} (default 4)")
    sp.add_argument("--plot", metavar="PNG", help="draw the pruning curve")
    sp.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    sp.set_defaults(func=cmd_importance)

    sp = sub.add_parser("ablate", help="zero vs prune vs prune+fine-tune vs fewer heads from scratch: one table")
    common(sp, 64)
    sp.add_argument("--heads", help="heads to remove as LAYER.HEAD,... (default: the most important one)")
    sp.add_argument("--batches", type=batches, default=4, help=f"held-out batches, 1..{MAX_BATCHES} (default 4)")
    sp.add_argument("--finetune-steps", type=steps0, default=300, help="(c) fine-tuning steps (default 300)")
    sp.add_argument(
        "--scratch-steps", type=steps, default=None, help="(d) training steps (default: the shipped budget)"
    )
    sp.add_argument("--no-latency", action="store_true", help="skip the ONNX export and latency column")
    sp.add_argument(
        "--location",
        default="z",
        help="where (a) ablates: q, k, v, scores, pattern, z (default), result; 'all': only the table of every "
        "location, zeroed and mean-ablated (k, v: the head's kv head, its whole group under GQA)",
    )
    sp.add_argument("--mode", choices=("zero", "mean"), default="zero", help="(a): zero, or the batch mean")
    sp.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    sp.set_defaults(func=cmd_ablate)
