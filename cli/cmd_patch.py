"""`attnzoo patch`: activation patching per head at a named location, with direct logit attribution."""

from __future__ import annotations

import argparse

from .cmd_heads import _check_out, _check_picture, _write_json
from .common import number_in, one_model, seed
from .lm_inputs import lm_pair


def _dates_pair(model, args: argparse.Namespace):
    from analysis import patching

    def split(s):
        return None if s is None else [p.strip() for p in s.split(";") if p.strip()]

    return patching.dates_experiment(model, split(args.clean), split(args.corrupt), n=args.n, seed=args.seed)


def cmd_patch(args: argparse.Namespace) -> int:
    one_model(args)  # before the imports: this mistake costs no torch
    import torch

    import analysis
    from analysis import patching, plot, scores

    patching.check_location(args.location)
    _check_picture(args.plot)
    _check_out(args.json)
    if args.checkpoint is not None:
        from .checkpoint_heads import clean_corrupt, load_whole

        model, tok = load_whole(args.checkpoint)
        args.name, dates = model.name, False
        clean, corrupt, metric, what = clean_corrupt(model, tok, args)
    else:
        model = analysis.load(args.name)
        dates = isinstance(model, analysis.DatesModel)
        clean, corrupt, metric, what = (_dates_pair if dates else lm_pair)(model, args)
    restored = patching.patch_heads(model, clean, corrupt, metric, args.location)
    shut = model.shut_heads()
    prefix = patching.head_prefix(model)
    extra, extra_name = None, ""
    if not dates:
        tokens = clean
        start = args.span if args.clean is None else 0
        target = torch.zeros_like(tokens)
        target[:, :-1] = tokens[:, 1:]
        where = torch.zeros_like(tokens, dtype=torch.bool)
        where[:, start:-1] = True
        extra = patching.logit_attribution(model, tokens, target, where)
        extra_name = "direct logit (clean next token)"
        induction = scores.head_scores(model, tokens)["induction"]
    print(f"{args.name}: activation patching at {args.location!r}, one head at a time, clean -> corrupt run")
    print(what)
    head = f"head  restored ({args.location})"
    if extra is not None:
        head += f"  {extra_name}  induction score"
    print(head + "  output")
    for layer, n in enumerate(model.heads_per_layer):
        for h in range(n):
            row = f"{prefix}{layer}H{h}  {float(restored[layer, h]):>{len(args.location) + 10}.3f}"
            if extra is not None:
                row += f"  {float(extra[layer, h]):>{len(extra_name)}.3f}  {float(induction[layer, h]):>15.3f}"
            lines = "shut" if shut[layer][h] else "in use"
            print(f"{row}  {lines}")
    print("restored: (metric with that head's activation from the clean run - corrupt) / (clean - corrupt)")
    if args.plot:
        plot.plot_head_values(
            restored,
            args.plot,
            title=f"{args.name}: share of the clean-corrupt gap restored by patching each head at {args.location!r}",
            label="restored share",
            shut=shut,
            prefix=prefix,
        )
        print(f"wrote {args.plot}")
    if args.json:
        data = {
            "model": args.name,
            "location": args.location,
            "experiment": what,
            "restored": restored.tolist(),
            "shut": shut,
            "heads": f"{prefix}{{layer}}H{{head}}",
        }
        if extra is not None:
            data["direct_logit"] = extra.tolist()
        _write_json(args.json, data)
    return 0


def add_commands(sub) -> None:
    from analysis.names import EVAL_SEED, PATCH_LOCATIONS, TASK_NAMES

    sp = sub.add_parser("patch", help="activation patching per head at a named location, and direct logit attribution")
    sp.add_argument("name", nargs="?", help=f"a trained model: {', '.join(sorted(TASK_NAMES))} (or --checkpoint DIR)")
    sp.add_argument(
        "--checkpoint",
        metavar="DIR",
        help="a whole model's heads instead: a transformers checkpoint folder (tokenizer.json for --clean text)",
    )
    sp.add_argument(
        "--clean",
        help="LM: ASCII text (--checkpoint: text read with its tokenizer); tiny-dates: dates separated by ';' "
        "(default: the model's own experiment)",
    )
    sp.add_argument("--corrupt", help="LM: text of the same length; tiny-dates: default the clean dates, day swapped")
    sp.add_argument(
        "--location",
        default="z",
        help=f"where to patch: {', '.join(PATCH_LOCATIONS)} (default z; k and v: the head's kv head)",
    )
    sp.add_argument("--n", type=number_in(int, 1, below=1025), default=16, help="default experiment: examples")
    sp.add_argument("--span", type=number_in(int, 2, below=33), default=16, help="LM default: block length")
    sp.add_argument("--seed", type=seed, default=EVAL_SEED, help="seed of the held-out data")
    sp.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    sp.add_argument("--plot", metavar="PNG", help="draw the layers x heads grid of restored shares")
    sp.set_defaults(func=cmd_patch)
