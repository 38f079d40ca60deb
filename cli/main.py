"""`attnzoo`: the parser from every command group, and the exit-code rule (0 done, 1 a check
failed, 2 a mistake in one line, 130 interrupted, 141 the reader went away)."""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import threading
from collections.abc import Sequence

import zoo

# The command modules import their shared vocabulary from .common, never from this module,
# which imports them.
from . import interrupt
from .common import CliError


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="attnzoo",
        description="A zoo of multi-head attention variants: inspect, audit, export to ONNX, "
        "run under ONNX Runtime, check parity, benchmark; whole decoder models from transformers checkpoints, "
        "exported and generated from (attnzoo generate FOLDER --prompt TEXT).",
    )
    p.add_argument("--version", action="version", version=f"attnzoo {zoo.__version__}")
    p.add_argument(
        "--verbose", action="store_true", help="on an error, also print its full text (before or after the command)"
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    p.commands = sub.choices  # name -> that command's parser, filled in below

    from . import cmd_zoo

    cmd_zoo.add_commands(sub)
    try:
        from . import cmd_bench, cmd_embed, cmd_generate, cmd_heads, cmd_loadtest, cmd_onnx, cmd_patch, cmd_serve
    except ImportError as e:  # ONNX tooling missing: the zoo commands still work
        missing = str(e)

        def _no_onnx(args: argparse.Namespace) -> int:
            raise CliError(f"this command needs the ONNX packages ({missing}); pip install attnzoo[...]")

        commands = ("export", "run", "parity", "bench", "heads", "importance", "ablate", "patch", "serve")
        for cmd in (*commands, "triton", "loadtest", "generate", "embed"):
            sub.add_parser(cmd, help=f"(unavailable: {missing})").set_defaults(func=_no_onnx)
    else:
        cmd_onnx.add_commands(sub)
        cmd_bench.add_commands(sub)
        cmd_heads.add_commands(sub)  # analysis, with ONNX latency in ablate
        cmd_patch.add_commands(sub)  # activation patching (analysis)
        cmd_serve.add_commands(sub)  # Ray/Triton are imported only when run
        cmd_loadtest.add_commands(sub)
        cmd_generate.add_commands(sub)  # whole models: greedy tokens under ONNX Runtime
        cmd_embed.add_commands(sub)  # whole encoders: sentence embeddings
    return p


def command_parsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Each command's parser by name, from a parser `build_parser` made (argparse itself keeps
    them in private attributes)."""
    return dict(parser.commands)


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line on stderr (exit 2) like every other mistake."""

    commands: dict[str, argparse.ArgumentParser]

    def error(self, message: str):  # type: ignore[override]
        m = _INVALID_COMMAND.match(message)
        if m and getattr(self, "commands", None):  # a mistyped command: the closest ones, not the whole list
            import difflib

            close = difflib.get_close_matches(m.group(1), list(self.commands), n=3, cutoff=0.6)
            if close:
                message = f"no command {m.group(1)!r}; did you mean {' or '.join(close)}?"
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


_INVALID_COMMAND = re.compile(r"argument COMMAND: invalid choice: '([^']*)'")


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


_PY_THEN_CLI = re.compile(r"\b\w+=(?:'[^']*'|[^\s']+) \(CLI: ([^)]+)\)")  # overwrite=True (CLI: --force)
_NAME_THEN_FLAG = re.compile(r"\b(\w+) \((--[\w-]+)\)")  # max_len (--max-len)
# lowering='decomposed', provider='cpu' or 'auto', decode=True, max_len=56: a setting and its values
_SETTING = re.compile(r"(?<![\w.])(\w+)=('[^']*'(?:(?:,? or |, )'[^']*')*|True|False|None|\d+(?:\.\d+)?\b)")


def cli_spelling(message: str, flags: frozenset[str] = frozenset()) -> str:
    """The library's words as the command line spells them: "pass overwrite=True (CLI: --force)" reads
    "pass --force", "drop max_len (--max-len)" reads "drop --max-len", and a setting the command has a flag
    for reads as that flag (`flags`): "lowering='ort-mha' cannot ..." reads "--lowering ort-mha cannot ...",
    "use provider='cpu' or 'auto'" reads "use --provider cpu or auto". False and None stay as said."""

    def setting(m: re.Match) -> str:
        flag, value = "--" + m.group(1).replace("_", "-"), m.group(2)
        if flag not in flags or value in ("False", "None"):  # no flag spells those
            return m.group(0)
        return flag if value == "True" else f"{flag} {value.replace(chr(39), '')}"

    message = _PY_THEN_CLI.sub(r"\1", message)
    message = _NAME_THEN_FLAG.sub(
        lambda m: m.group(2) if m.group(1).replace("_", "-") == m.group(2)[2:] else m.group(0), message
    )
    return _SETTING.sub(setting, message)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command. Exit status: 0 done, 1 a check failed, 2 a mistake (one line on stderr;
    the library's AttnzooError or an OSError), 130 interrupted, 141 the reader closed the pipe.
    Anything else is a bug in attnzoo and keeps its traceback."""
    prog = "attnzoo"
    verbose = False
    flags: frozenset[str] = frozenset()
    old_term = _sigterm_as_interrupt()
    try:
        parser = build_parser()  # the command modules: their heavy imports wait until a command runs
        if interrupt.seen():  # a Ctrl-C that some import swallowed
            raise KeyboardInterrupt
        args, extra = parser.parse_known_args(argv)
        prog = f"attnzoo {args.command}"
        flags = frozenset(o for a in parser.commands[args.command]._actions for o in a.option_strings)
        while "--verbose" in extra:  # after the command as well as before it
            extra.remove("--verbose")
            args.verbose = True
        if extra:  # argparse would name the top-level parser: the command's own says `attnzoo families: error:`
            given = list(sys.argv[1:] if argv is None else argv)
            before = args.command in given and extra[0] in given[: given.index(args.command)]
            owner = parser if before else parser.commands[args.command]  # `attnzoo --bogus list`: the top level's
            owner.error(f"unrecognized arguments: {' '.join(extra)}")
        verbose = bool(getattr(args, "verbose", False))
        import numpy  # noqa: F401  # before any torch, whose C init would swallow a Ctrl-C in its numpy import

        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        interrupt.handled()
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        _silence_stdout()
        return 141
    except (zoo.AttnzooError, OSError) as e:
        said = _one_line(e)
        if isinstance(e, (zoo.AttnzooError, FileExistsError)):  # the library's words (an OSError's are the OS's)
            said = cli_spelling(said, flags)
        print(f"{prog}: error: {said}", file=sys.stderr)
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
