"""One error root: every exception class attnzoo defines for a user's mistake derives from
`zoo.AttnzooError` and keeps a builtin base (ValueError, TypeError, RuntimeError), so
`except zoo.AttnzooError` catches the library's refusals and `except ValueError` keeps working.
Found by walking the packages, not listed by hand: a new error class is checked the moment it exists."""

from __future__ import annotations

import argparse
import importlib
import inspect
import pkgutil

import pytest

import zoo
from cli.main import command_parsers, main
from helpers import REPO, one_line_error

ROOT = REPO
PACKAGES = [p for p in ("zoo", "analysis", "export", "bench", "serve", "cli") if (ROOT / p / "__init__.py").exists()]
BUILTIN_BASES = (ValueError, TypeError, RuntimeError)
# Optional stacks a module may need (Ray, Triton's client, transformers): skipped where missing.
OPTIONAL = ("ray", "tritonclient", "transformers", "matplotlib")


def _modules():
    for pkg in PACKAGES:
        mod = importlib.import_module(pkg)
        yield mod
        for info in pkgutil.walk_packages(mod.__path__, prefix=f"{pkg}."):
            if info.name.endswith("__main__"):
                continue
            try:
                yield importlib.import_module(info.name)
            except ImportError as e:
                if not any(o in str(e) for o in OPTIONAL):
                    raise


def _our_exception_classes():
    seen = {}
    for mod in _modules():
        for _, cls in inspect.getmembers(mod, inspect.isclass):
            if issubclass(cls, Exception) and cls.__module__.split(".")[0] in PACKAGES:
                seen[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return seen


CLASSES = _our_exception_classes()


def _walk(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _walk(sub)


def test_the_walk_finds_the_known_errors():
    names = {c.__name__ for c in CLASSES.values()}
    assert {"SpecError", "InputError", "ExportError", "SessionError", "BenchError", "CliError"} <= names


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_every_exception_class_derives_from_the_root(name):
    cls = CLASSES[name]
    internal = cls.__name__.startswith("_") or cls.__doc__ and "not a user's mistake" in cls.__doc__
    if internal:
        pytest.skip(f"{name} is internal control flow, never raised to a user")
    assert issubclass(cls, zoo.AttnzooError), f"{name} does not derive from zoo.AttnzooError"


def test_every_subclass_of_the_root_keeps_a_builtin_base():
    missing = [f"{c.__module__}.{c.__qualname__}" for c in _walk(zoo.AttnzooError) if not issubclass(c, BUILTIN_BASES)]
    assert not missing, f"no ValueError/TypeError/RuntimeError base: {missing}"


# -- refusals the size of the machine, and the exit-code rule for our own bugs -----------------


def test_cli_shows_a_real_bug_with_its_traceback(monkeypatch):
    # Only the error root and OSError are a user's mistake; anything else is ours and must show.
    import cli.main as cli

    def boom(args):
        raise KeyError("a bug")

    real = cli.build_parser
    monkeypatch.setattr(cli, "build_parser", lambda: _with_func(real(), boom))
    with pytest.raises(KeyError):
        main(["list"])


def test_show_of_a_huge_spec_allocates_nothing_and_answers(capsys):
    assert main(["show", "transformer-base", "--set", "d_model=1000000000", "--set", "heads=1"]) == 0
    out = capsys.readouterr().out
    assert "too large for torch" in out and "4,000,000,000,000,000,000" in out


@pytest.mark.parametrize(
    "argv",
    [
        ["audit", "transformer-base", "--set", "d_model=1000000", "--set", "heads=1"],
        ["export", "transformer-base", "--set", "d_model=1000000", "--set", "heads=1", "-o", "/tmp/never.onnx"],
    ],
)
def test_huge_width_is_refused_with_the_number(capsys, argv):
    line = one_line_error(capsys, argv)
    assert "needs about" in line and "this machine has" in line


def test_allocation_failure_that_still_happens_is_one_line(monkeypatch, capsys):
    import cli.main as cli

    def oom(args):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory")

    real = cli.build_parser
    monkeypatch.setattr(cli, "build_parser", lambda: _with_func(real(), oom))
    assert "out of memory" in one_line_error(capsys, ["list"])


def _with_func(parser: argparse.ArgumentParser, func):
    parser.set_defaults(func=func)
    for sp in command_parsers(parser).values():
        sp.set_defaults(func=func)
    return parser


def test_check_fits_names_need_and_limit():
    from zoo.limits import check_fits, machine_memory_bytes

    assert machine_memory_bytes() and machine_memory_bytes() > 2**20
    check_fits(10, "a tiny thing", limit=100)
    with pytest.raises(zoo.ResourceError, match=r"needs about 1 kB \(1,000 bytes\).*has 100 B"):
        check_fits(1000, "a request", limit=100)
