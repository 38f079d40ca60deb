"""The `attnzoo` command line: list, show, audit, export, run, parity, bench."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Sequence

import zoo

# The command-line vocabulary shared by every command module (cli_onnx, cli_heads, cli_serve):
# they import it from cli_common, never from this module, which imports them.
from . import interrupt
from .cli_common import CliError, _int_list, _positive, seed  # noqa: E402
from .names import DTYPES

parse_overrides = zoo.parse_overrides  # spec overrides are parsed next to the spec (zoo/spec.py)


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


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="attnzoo",
        description="A zoo of multi-head attention variants: inspect, audit, export to ONNX, "
        "run under ONNX Runtime, check parity, benchmark.",
    )
    p.add_argument("--version", action="version", version=f"attnzoo {zoo.__version__}")
    p.add_argument("--verbose", action="store_true", help="on an error, also print its full text")
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
    sp.add_argument("--dtype", choices=DTYPES, default="float32", help="for the byte counts")
    sp.set_defaults(func=cmd_show)

    sp = sub.add_parser("audit", help="the seeds' audit order as checks on a random input (exit 1 on FAIL)")
    sp.add_argument("name", help="a name, or a pattern such as '*' to audit several")
    with_set(sp)
    sp.add_argument("--batch", "-b", type=_positive, default=2)
    sp.add_argument("--seq", "-t", type=_positive, default=5)
    sp.add_argument("--ctx-seq", "-s", type=_positive, default=7)
    sp.add_argument("--seed", type=seed, default=0, help="0..2**63-1 (default 0)")
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
        from . import cli_heads  # heads, importance, ablate: analysis, with ONNX latency in ablate

        cli_heads.add_commands(sub, with_set, _positive, _int_list)
        from . import cli_serve  # serve, triton, loadtest: Ray/Triton are imported only when run

        cli_serve.add_commands(sub, with_set, _positive, _int_list)
    return p


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line on stderr (exit 2) like every other mistake."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _one_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    text = lines[0] if lines else type(e).__name__
    # An OSError's str() carries its errno; the strerror and the file are what a user needs.
    if isinstance(e, OSError) and e.strerror and e.filename:
        text = f"{e.filename}: {e.strerror}"
    return text + (" (more with --verbose)" if len(lines) > 1 or getattr(e, "detail", "") else "")


def _out_of_memory(e: BaseException) -> bool:
    """An allocation failure from torch, numpy or ONNX Runtime (they raise different types)."""
    if isinstance(e, MemoryError):
        return True
    text = str(e).lower()
    return isinstance(e, RuntimeError) and any(
        k in text for k in ("can't allocate memory", "out of memory", "failed to allocate", "bad_alloc")
    )


def _silence_stdout() -> None:
    # The reader went away (`attnzoo list | head -1`): drop the rest of the output quietly,
    # including what the interpreter would flush at exit.
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def _sigterm_as_interrupt():
    """SIGTERM (`kill`, a CI timeout) unwinds like Ctrl-C, so temp files and folders are removed;
    Python's default is to die on the spot. Returns the handler to restore (None off the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, _raise_interrupt)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command. Exit status: 0 done, 1 a check failed, 2 a mistake (one line on stderr;
    the library's AttnzooError or an OSError), 130 interrupted, 141 the reader closed the pipe.
    Anything else is a bug in attnzoo and keeps its traceback."""
    prog = "attnzoo"
    verbose = False
    old_term = _sigterm_as_interrupt()
    try:
        parser = build_parser()  # imports the command modules (onnx, onnxruntime, ...)
        if interrupt.seen():  # a Ctrl-C that some import swallowed
            raise KeyboardInterrupt
        args = parser.parse_args(argv)
        prog = f"attnzoo {args.command}"
        verbose = bool(getattr(args, "verbose", False))
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        _silence_stdout()
        return 141
    except (zoo.AttnzooError, OSError) as e:
        print(f"{prog}: error: {_one_line(e)}", file=sys.stderr)
        if verbose:
            detail = getattr(e, "detail", "")
            print(str(e) + (f"\n{detail}" if detail else ""), file=sys.stderr)
        return 2
    except Exception as e:
        if not _out_of_memory(e):
            raise
        print(f"{prog}: error: out of memory: {_one_line(e)}; ask for a smaller size", file=sys.stderr)
        return 2
    finally:
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)


if __name__ == "__main__":
    sys.exit(main())
