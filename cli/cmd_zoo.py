"""The zoo's commands: list, show, audit (no ONNX)."""

from __future__ import annotations

import argparse
import sys

import zoo
from export.names import DTYPES

from .common import CliError, positive, seed, with_set

parse_overrides = zoo.parse_overrides  # spec overrides are parsed next to the spec (zoo/spec.py)


def cmd_list(args: argparse.Namespace) -> int:
    names = zoo.names(args.pattern)
    if not names:
        print(f"no attention block matches {args.pattern!r}; try `attnzoo list`", file=sys.stderr)
        return 1
    width = max(len(n) for n in names)
    for n in names:
        e = zoo.entry(n)
        params = zoo.count_parameters(e.spec)
        print(f"{n:<{width}}  {params:>12,} params  {e.spec.describe()}")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from zoo.report import show_spec

    spec = zoo.spec(args.name, **parse_overrides(args.set))
    print(
        show_spec(
            args.name,
            spec,
            batch=args.batch,
            seq=args.seq,
            ctx_seq=args.ctx_seq,
            description=_description(args.name, spec),
            itemsize=2 if args.dtype == "float16" else 4,
        )
    )
    return 0


def _description(name: str, spec: zoo.AttentionSpec) -> str:
    """The preset's own words describe the preset's spec; with overrides they are marked as such."""
    entry = zoo.entry(name)
    if spec == entry.spec or not entry.description:
        return entry.description
    return f"{spec.describe()} (overridden; the preset {name} is: {entry.description})"


def cmd_audit(args: argparse.Namespace) -> int:
    from zoo.audit import format_audit, run_audit

    names = zoo.names(args.name) if any(c in args.name for c in "*?[") else [args.name]
    if not names:
        raise CliError(f"no attention block matches {args.name!r}")
    failed = 0
    for i, name in enumerate(names):
        _check_audit_fits(zoo.spec(name, **parse_overrides(args.set)), args)
        m = zoo.create(name, **parse_overrides(args.set))
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
    sp = sub.add_parser("list", help="list registered attention blocks")
    sp.add_argument("pattern", nargs="?", default="*", help="fnmatch pattern, e.g. 'mha-*'")
    sp.set_defaults(func=cmd_list)

    sp = sub.add_parser("show", help="spec, exact parameter count, shapes, score entries, FLOPs, bytes")
    sp.add_argument("name")
    with_set(sp)
    sp.add_argument("--batch", "-b", type=positive, default=1, help="B (default 1)")
    sp.add_argument("--seq", "-t", type=positive, default=128, help="T (default 128)")
    sp.add_argument("--ctx-seq", "-s", type=positive, default=None, help="S for cross-attention (default T)")
    sp.add_argument("--dtype", choices=DTYPES, default="float32", help="for the byte counts")
    sp.set_defaults(func=cmd_show)

    sp = sub.add_parser("audit", help="the seeds' audit order as checks on a random input (exit 1 on FAIL)")
    sp.add_argument("name", help="a name, or a pattern such as '*' to audit several")
    with_set(sp)
    sp.add_argument("--batch", "-b", type=positive, default=2)
    sp.add_argument("--seq", "-t", type=positive, default=5)
    sp.add_argument("--ctx-seq", "-s", type=positive, default=7)
    sp.add_argument("--seed", type=seed, default=0, help="0..2**63-1 (default 0)")
    sp.set_defaults(func=cmd_audit)


def families_markdown() -> str:
    """The transformers families from_hf knows, as the README's table (zoo.hf.family_table())."""
    from zoo.hf import family_table

    lines = ["| family | class | status | modifiers | refused by name |", "|---|---|---|---|---|"]
    for r in family_table():
        status = r["status"] if r["status"] == "exact" else f"refused: {r['reason']}"
        mods = ", ".join(r["modifiers"]) or "-"
        lines.append(f"| {r['family']} | `{r['class']}` | {status} | {mods} | {', '.join(r['refuses']) or '-'} |")
    return "\n".join(lines)


def cmd_families(args: argparse.Namespace) -> int:
    from zoo.files import ensure_writable_parent, write_atomic
    from zoo.hf import family_table

    if args.json:
        ensure_writable_parent(args.json)
    print(families_markdown())
    rows = family_table()
    print(f"\n{sum(r['status'] == 'exact' for r in rows)} exact, {sum(r['status'] != 'exact' for r in rows)} refused")
    if args.json:
        import json

        write_atomic(args.json, lambda tmp: tmp.write_text(json.dumps(rows, indent=2) + "\n"))
        print(f"wrote {args.json}")
    return 0


def add_families(sub) -> None:
    sp = sub.add_parser("families", help="the transformers attention classes from_hf takes, exact or refused")
    sp.add_argument("--json", metavar="PATH", help="also write the table as JSON")
    sp.set_defaults(func=cmd_families)
