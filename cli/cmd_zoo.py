"""The zoo's commands: list, show, audit, families, preset (no ONNX)."""

from __future__ import annotations

import argparse
import sys

import zoo
from export.names import DTYPES

from .common import CliError, number_in, positive, seed, source_of, with_set, with_source


def _is_pattern(text: str) -> bool:
    """An fnmatch pattern (zoo.names' wildcards) rather than a name or a word."""
    return any(c in text for c in "*?[")


def cmd_list(args: argparse.Namespace) -> int:
    if _is_pattern(args.pattern):
        names = zoo.names(args.pattern)
    else:  # a plain word: the names that hold it, in any case
        names = [n for n in zoo.names() if args.pattern.lower() in n.lower()]
    if not names:
        raise CliError(f"no attention block matches {args.pattern!r}; `attnzoo list` shows them all")
    width = max(len(n) for n in names)
    for n in names:
        e = zoo.entry(n)
        params = zoo.count_parameters(e.spec)
        print(f"{n:<{width}}  {params:>12,} params  {e.spec.describe()}")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    source = source_of(args, "name")  # a mistake costs no import
    from zoo.report import show_spec

    if source == "config":
        layer = args.layer or 0
        spec = zoo.spec_from_config(args.config, layer=layer)
        spec = spec.replace(**zoo.parse_overrides(args.set)) if args.set else spec
        label, description = f"{args.config} layer {layer}", "the spec of a transformers config (spec_from_config)"
    else:
        spec = zoo.spec(args.name, **zoo.parse_overrides(args.set))
        label, description = args.name, _description(args.name, spec)
    print(
        show_spec(
            label,
            spec,
            batch=args.batch,
            seq=args.seq,
            ctx_seq=args.ctx_seq,
            description=description,
            itemsize=2 if args.dtype in ("float16", "bfloat16") else 4,
        )
    )
    return 0


def cmd_preset(args: argparse.Namespace) -> int:
    from pathlib import Path

    from zoo.files import ensure_writable_parent, write_atomic

    if args.output is not None and Path(args.output).stem != args.name:
        raise CliError(
            f"-o {args.output}: a preset's name is its file's stem; write --name {args.name} to {args.name}.toml"
        )
    text = zoo.preset_toml(args.config, args.name, layer=args.layer)  # a shipped name is refused before any write
    if args.output is not None:
        ensure_writable_parent(args.output)
    if args.output is None:
        sys.stdout.write(text)
        return 0
    try:
        write_atomic(args.output, lambda tmp: tmp.write_text(text, encoding="utf-8"), overwrite=args.force)
    except FileExistsError as e:
        raise CliError(str(e)) from None
    print(f"wrote {args.output}: load it with zoo.add_presets(folder) or ATTNZOO_PRESETS=folder")
    return 0


def _description(name: str, spec: zoo.AttentionSpec) -> str:
    """The preset's own words describe the preset's spec; with overrides they are marked as such."""
    entry = zoo.entry(name)
    if spec == entry.spec or not entry.description:
        return entry.description
    return f"{spec.describe()} (overridden; the preset {name} is: {entry.description})"


def cmd_audit(args: argparse.Namespace) -> int:
    import torch

    from zoo.audit import format_audit, run_audit

    names = zoo.names(args.name) if _is_pattern(args.name) else [args.name]
    if not names:
        raise CliError(f"no attention block matches {args.name!r}")
    failed = 0
    for i, name in enumerate(names):
        _check_audit_fits(zoo.spec(name, **zoo.parse_overrides(args.set)), args)
        torch.manual_seed(args.seed)  # the block's weights too: one seed, one report
        m = zoo.create(name, **zoo.parse_overrides(args.set))
        steps = run_audit(m, batch=args.batch, seq=args.seq, ctx_seq=args.ctx_seq, seed=args.seed)
        if i:
            print()
        print(format_audit(name, steps))
        failed += sum(not s.ok for s in steps)
    return 1 if failed else 0


# The audit builds the block, its combined/separate/permuted/pruned copies and a float64
# copy (at most four alive at once, in float64).
_AUDIT_PARAMETER_COPIES = 4


def _check_audit_fits(spec: zoo.AttentionSpec, args: argparse.Namespace) -> None:
    from zoo.accounting import working_set_bytes
    from zoo.limits import check_fits

    ctx = args.ctx_seq if spec.is_cross else None
    need = _AUDIT_PARAMETER_COPIES * zoo.count_parameters(spec) * 8 + working_set_bytes(
        spec, args.batch, args.seq, ctx, itemsize=8, score_copies=3
    )
    check_fits(need, f"auditing {spec.describe()} at b={args.batch}, t={args.seq}")


# -- parser ----------------------------------------------------------------------------------


def add_commands(sub) -> None:
    """Register list, show, audit and families on the `attnzoo` subparsers."""
    add_families(sub)
    add_preset(sub)
    sp = sub.add_parser(
        "list",
        help="list registered attention blocks",
        description="The registered blocks (presets in models/ and your own, ATTNZOO_PRESETS), each with its exact "
        "parameter count and a one-line spec.",
    )
    sp.add_argument(
        "pattern",
        nargs="?",
        default="*",
        help="a word the names hold, in any case (llama), or an fnmatch pattern ('mha-*'); default all",
    )
    sp.set_defaults(func=cmd_list)

    sp = sub.add_parser(
        "show",
        help="spec, exact parameter count, shapes, score entries, FLOPs, bytes",
        description="Show a registered block (NAME) or one layer of a transformers config (--config, --layer).",
    )
    sp.add_argument("name", nargs="?", help="a registered name (or give --config)")
    with_source(sp, checkpoint=False)
    with_set(sp)
    sp.add_argument("--batch", "-b", type=positive, default=1, help="B (default 1)")
    sp.add_argument("--seq", "-t", type=positive, default=128, help="T (default 128)")
    sp.add_argument("--ctx-seq", "-s", type=positive, default=None, help="S for cross-attention (default T)")
    sp.add_argument("--dtype", choices=DTYPES, default="float32", help="for the byte counts")
    sp.set_defaults(func=cmd_show)

    sp = sub.add_parser(
        "audit",
        help="the seeds' audit order as checks on a random input (exit 1 on FAIL)",
        description="Run the seeds' audit order on a block: dimensions and bias convention, projection widths, "
        "the head split and merge, scores, mask and softmax per head, separate vs combined, head removal and "
        "permutation, the fused path against the explicit one; each a PASS/FAIL line.",
    )
    sp.add_argument("name", help="a name, or a pattern such as '*' to audit several")
    with_set(sp)
    sp.add_argument("--batch", "-b", type=positive, default=2)
    sp.add_argument("--seq", "-t", type=positive, default=5)
    sp.add_argument("--ctx-seq", "-s", type=positive, default=7)
    sp.add_argument("--seed", type=seed, default=0, help="0..2**63-1 (default 0)")
    sp.set_defaults(func=cmd_audit)


def families_markdown() -> str:
    """The transformers families from_hf knows, as the README's table (peers.transformers.family_table())."""
    from peers.transformers import family_table

    lines = [
        "| family | class | status (eager max abs err, fp32) | modifiers | refused by name |",
        "|---|---|---|---|---|",
    ]
    for r in family_table():
        if r["status"] == "exact":
            status = "exact" if r["max_error"] is None else f"exact ({r['max_error']:.1e})"
        else:
            status = f"refused: {r['reason']}"
        mods = ", ".join(r["modifiers"]) or "-"
        lines.append(f"| {r['family']} | `{r['class']}` | {status} | {mods} | {', '.join(r['refuses']) or '-'} |")
    return "\n".join(lines)


def lm_families_markdown() -> str:
    """The families read as whole models (zoo.lm_from_checkpoint / lm_from_hf), from peers.lm_rows.LM_FAMILIES."""
    from peers.lm_rows import LM_FAMILIES
    from peers.model_types import FAMILIES

    lines = ["| model_type | attention class | the rest of the model |", "|---|---|---|"]
    for kind, row in LM_FAMILIES.items():
        lines.append(f"| {kind} | `{FAMILIES[kind].cls}` | {row.covers} |")
    return "\n".join(lines)


def encoder_families_markdown() -> str:
    """The families read as whole encoders (zoo.encoder_from_checkpoint), from peers.encoder_rows."""
    from peers.classes import ROWS
    from peers.encoder_rows import ENCODER_FAMILIES

    by_family = {r.family.lower().replace("-", ""): r.cls for r in ROWS}
    lines = ["| model_type | attention class | the rest of the model |", "|---|---|---|"]
    for kind, row in ENCODER_FAMILIES.items():
        lines.append(f"| {kind} | `{by_family.get(kind.replace('-', ''), '-')}` | {row.covers} |")
    return "\n".join(lines)


def cmd_families(args: argparse.Namespace) -> int:
    from peers.transformers import family_table
    from zoo.files import ensure_writable_parent, write_atomic

    if args.json:
        ensure_writable_parent(args.json)
    if args.coverage:
        return _coverage(args)
    print(families_markdown())
    rows = family_table()
    print(f"\n{sum(r['status'] == 'exact' for r in rows)} exact, {sum(r['status'] != 'exact' for r in rows)} refused")
    print(
        "\nWhole decoders (zoo.lm_from_checkpoint, zoo.lm_from_hf; attnzoo generate); other model_types are refused:\n"
    )
    print(lm_families_markdown())
    print("\nWhole encoders (zoo.encoder_from_checkpoint; sentence-transformers folders: attnzoo embed):\n")
    print(encoder_families_markdown())
    from .cmd_seq2seq import families_markdown as seq2seq_markdown

    print("\nWhole encoder-decoder models (zoo.seq2seq_from_checkpoint; export --whole, generate):\n")
    print(seq2seq_markdown())
    if args.json:
        import json

        write_atomic(args.json, lambda tmp: tmp.write_text(json.dumps(rows, indent=2) + "\n"))
        print(f"wrote {args.json}")
    return 0


def _coverage(args: argparse.Namespace) -> int:
    """One row per causal-LM model type of the installed transformers (peers.coverage)."""
    from peers.coverage import coverage, installed_version, markdown, to_json
    from zoo.files import write_atomic

    rows = coverage()
    print(f"transformers {installed_version()}")
    print(markdown(rows))
    if args.json:
        write_atomic(args.json, lambda tmp: tmp.write_text(to_json(rows)))
        print(f"wrote {args.json}")
    return 0


def add_preset(sub) -> None:
    sp = sub.add_parser(
        "preset",
        help="write a preset TOML from a transformers config.json (one layer's spec, config values cited)",
        description="Write a user preset (the models/*.toml format) holding --layer's spec of a transformers "
        "config, each field commented with the config values it came from. Without -o it prints the file. "
        "Load it with zoo.add_presets(FOLDER) or ATTNZOO_PRESETS=FOLDER.",
    )
    sp.add_argument("--config", required=True, metavar="CONFIG_JSON", help="a config.json (or its folder)")
    sp.add_argument("--name", required=True, help="the preset's name (the file is NAME.toml)")
    sp.add_argument("--layer", type=number_in(int, 0), default=0, help="which layer (default 0)")
    sp.add_argument("-o", "--output", help="the .toml file to write, NAME.toml (default: print it)")
    sp.add_argument("--force", action="store_true", help="overwrite an existing file")
    sp.set_defaults(func=cmd_preset)


def add_families(sub) -> None:
    sp = sub.add_parser(
        "families",
        help="the transformers attention classes from_hf takes, exact or refused",
        description="The transformers attention classes the zoo reads (from_hf, from_checkpoint): each exact, "
        "with its measured error, or refused with the reason; then the model types read as whole models: decoders "
        "(generate) and encoders (embed).",
    )
    sp.add_argument("--json", metavar="PATH", help="also write the table as JSON")
    sp.add_argument(
        "--coverage",
        action="store_true",
        help="every causal-LM model type of the installed transformers: exact, refused (the missing feature) or "
        "not-attention (imports every modeling module: a minute or two)",
    )
    sp.set_defaults(func=cmd_families)
