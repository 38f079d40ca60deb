"""The `attnzoo` command line: list, show, audit, export, run, parity, bench."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import zoo


class CliError(Exception):
    """A user mistake on the command line: printed as one line, exit status 2."""


def parse_value(text: str) -> Any:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def parse_overrides(items: Sequence[str] | None) -> dict[str, Any]:
    """['d_model=256', 'heads=4'] -> {'d_model': 256, 'heads': 4}."""
    out: dict[str, Any] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"--set {item!r}: expected KEY=VALUE, e.g. --set d_model=256")
        out[key.strip()] = parse_value(value.strip())
    return out


def _positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"{v} must be positive")
    return v


def _int_list(text: str) -> list[int]:
    return [_positive(p) for p in text.replace(",", " ").split()]


# -- zoo commands --------------------------------------------------------------------------


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
            description=zoo.entry(args.name).description,
            itemsize=2 if args.dtype == "float16" else 4,
        )
    )
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    from zoo.audit import format_audit, run_audit

    names = zoo.names(args.name) if any(c in args.name for c in "*?[") else [args.name]
    if not names:
        raise CliError(f"no attention block matches {args.name!r}")
    failed = 0
    for i, name in enumerate(names):
        m = zoo.create(name, **parse_overrides(args.set))
        steps = run_audit(m, batch=args.batch, seq=args.seq, ctx_seq=args.ctx_seq, seed=args.seed)
        if i:
            print()
        print(format_audit(name, steps))
        failed += sum(not s.ok for s in steps)
    return 1 if failed else 0


# -- parser ----------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="attnzoo",
        description="A zoo of multi-head attention variants: inspect, audit, export to ONNX, "
        "run under ONNX Runtime, check parity, benchmark.",
    )
    p.add_argument("--version", action="version", version=f"attnzoo {zoo.__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    def with_set(sp: argparse.ArgumentParser) -> None:
        sp.add_argument(
            "--set",
            action="append",
            metavar="KEY=VALUE",
            help="override a spec field, e.g. --set d_model=256 --set heads=4 (repeatable)",
        )

    sp = sub.add_parser("list", help="list registered attention blocks")
    sp.add_argument("pattern", nargs="?", default="*", help="fnmatch pattern, e.g. 'mha-*'")
    sp.set_defaults(func=cmd_list)

    sp = sub.add_parser("show", help="spec, exact parameter count, shapes, score entries, FLOPs, bytes")
    sp.add_argument("name")
    with_set(sp)
    sp.add_argument("--batch", "-b", type=_positive, default=1, help="B (default 1)")
    sp.add_argument("--seq", "-t", type=_positive, default=128, help="T (default 128)")
    sp.add_argument("--ctx-seq", "-s", type=_positive, default=None, help="S for cross-attention (default T)")
    sp.add_argument("--dtype", choices=["float32", "float16"], default="float32", help="for the byte counts")
    sp.set_defaults(func=cmd_show)

    sp = sub.add_parser("audit", help="the seeds' audit order as checks on a random input (exit 1 on FAIL)")
    sp.add_argument("name", help="a name, or a pattern such as '*' to audit several")
    with_set(sp)
    sp.add_argument("--batch", "-b", type=_positive, default=2)
    sp.add_argument("--seq", "-t", type=_positive, default=5)
    sp.add_argument("--ctx-seq", "-s", type=_positive, default=7)
    sp.add_argument("--seed", type=int, default=0)
    sp.set_defaults(func=cmd_audit)

    try:
        from . import cli_onnx
    except ImportError as e:  # ONNX tooling missing: the zoo commands still work
        missing = str(e)

        def _no_onnx(args: argparse.Namespace) -> int:
            raise CliError(f"this command needs the ONNX packages ({missing}); pip install attnzoo[...]")

        for cmd in ("export", "run", "parity", "bench"):
            sub.add_parser(cmd, help=f"(unavailable: {missing})").set_defaults(func=_no_onnx)
    else:
        cli_onnx.add_commands(sub, with_set, _positive, _int_list)
    return p


def _user_errors() -> tuple[type[BaseException], ...]:
    # OSError: unwritable output paths and the like, reported by the OS in one line already.
    errors: list[type[BaseException]] = [CliError, ValueError, OSError]
    try:
        from .session import SessionError  # a model that won't load, CUDA that won't start
    except ImportError:
        pass
    else:
        errors.append(SessionError)
    return tuple(errors)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except _user_errors() as e:
        # User mistakes surface as typed errors from the library: one line, no traceback.
        print(f"attnzoo {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
