"""One error root: every exception class attnzoo defines for a user's mistake derives from
`zoo.AttnzooError` and keeps a builtin base (ValueError, TypeError, RuntimeError), so
`except zoo.AttnzooError` catches the library's refusals and `except ValueError` keeps working.
Found by walking the packages, not listed by hand: a new error class is checked the moment it exists."""

from __future__ import annotations

import argparse
import ast
import builtins
import fnmatch
import importlib
import inspect
import pkgutil

import pytest

import zoo
from cli.main import command_parsers, main
from helpers import REPO, one_line_error

ROOT = REPO
LAYERS = ("zoo", "peers", "analysis", "runtime", "export", "parity", "bench", "serve", "cli")
PACKAGES = [p for p in LAYERS if (ROOT / p / "__init__.py").exists()]
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


# -- every raise in library code: a subclass of the root, not a bare builtin --------------------

# The raises of a builtin exception class that stay, each for its reason: (file, enclosing def, class).
# Not user mistakes, so not under the root: protocols Python itself asks for, our own bugs, interrupts.
KEPT_BUILTIN_RAISES = {
    ("peers/model_types.py", "ConfigView.__getattr__", "AttributeError"): "getattr(cfg, key, default) needs it; "
    "peers/config.py turns a missing config key into an HFConversionError",
    ("zoo/__init__.py", "__getattr__", "AttributeError"): "a module __getattr__ (PEP 562) raises AttributeError",
    ("export/__init__.py", "__getattr__", "AttributeError"): "a module __getattr__ (PEP 562) raises AttributeError",
    ("runtime/__init__.py", "__getattr__", "AttributeError"): "a module __getattr__ (PEP 562) raises AttributeError",
    ("parity/__init__.py", "__getattr__", "AttributeError"): "a module __getattr__ (PEP 562) raises AttributeError",
    ("analysis/__init__.py", "__getattr__", "AttributeError"): "a module __getattr__ (PEP 562) raises AttributeError",
    ("bench/__init__.py", "__getattr__", "AttributeError"): "a module __getattr__ (PEP 562) raises AttributeError",
    ("analysis/tasks.py", "<module>", "ImportError"): "import-time check of our own tables: a bug of ours",
    ("export/lowerings/__init__.py", "<module>", "ImportError"): "import-time check of our own tables: a bug of ours",
    ("export/precision.py", "<module>", "ImportError"): "import-time check of our own tables: a bug of ours",
    ("zoo/modifiers/base.py", "Modifier.*", "NotImplementedError"): "abstract methods, defined by each modifier",
    ("analysis/tasks.py", "Task.*", "NotImplementedError"): "abstract methods, defined by each task kind",
    ("bench/plan.py", "_terminate_as_interrupt._raise", "KeyboardInterrupt"): "SIGTERM handled as Ctrl-C",
    ("cli/cmd_serve.py", "_interrupt", "KeyboardInterrupt"): "SIGTERM handled as Ctrl-C",
    ("cli/interrupt.py", "_on_sigint", "KeyboardInterrupt"): "SIGINT handler",
    ("cli/main.py", "_raise_interrupt", "KeyboardInterrupt"): "SIGTERM handled as Ctrl-C",
    ("cli/main.py", "main", "KeyboardInterrupt"): "a Ctrl-C that an import swallowed, raised again",
    ("cli/interrupt.py", "_Resurface.find_spec", "KeyboardInterrupt"): "a Ctrl-C that an import swallowed, "
    "raised again at the next import",
}


def _bound_names(tree: ast.Module) -> set[str]:
    """Names a module binds itself (imports, classes, assignments): those are not the builtins."""
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            out |= {(a.asname or a.name).split(".")[0] for a in n.names}
        elif isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            out.add(n.name)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            out.add(n.id)
    return out


def _builtin_raises(path):
    """(line, enclosing def's qualname or <module>, class name) of each raise of a builtin exception class."""
    tree = ast.parse(path.read_text(), str(path))
    bound = _bound_names(tree)

    def visit(node, scope):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                yield from visit(child, [*scope, child.name])
                continue
            if isinstance(child, ast.Raise) and child.exc is not None:
                target = child.exc.func if isinstance(child.exc, ast.Call) else child.exc
                if isinstance(target, ast.Name) and target.id not in bound:
                    cls = getattr(builtins, target.id, None)
                    if isinstance(cls, type) and issubclass(cls, BaseException):
                        yield child.lineno, ".".join(scope) or "<module>", target.id
            yield from visit(child, scope)

    yield from visit(tree, [])


def _kept(rel: str, scope: str, name: str):
    return next((k for k in KEPT_BUILTIN_RAISES if k[0] == rel and k[2] == name and fnmatch.fnmatch(scope, k[1])), None)


def test_library_code_raises_no_bare_builtin_exception():
    """Every exception raised in library code is an AttnzooError subclass (it may keep its builtin
    base), save the few kept on purpose above; a failure names file:line. The kept list stays exact."""
    bad, used = [], set()
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for line, scope, name in _builtin_raises(path):
                kept = _kept(rel, scope, name)
                if kept:
                    used.add(kept)
                else:
                    bad.append(f"{rel}:{line}: raise {name} in {scope}")
    assert not bad, "raise an AttnzooError subclass (keeping the builtin as a second base) instead:\n" + "\n".join(bad)
    assert not set(KEPT_BUILTIN_RAISES) - used, f"kept raises no longer there: {set(KEPT_BUILTIN_RAISES) - used}"


def test_zoo_errors_all_lists_every_error_class():
    import zoo.errors

    defined = {n for n, c in vars(zoo.errors).items() if isinstance(c, type) and issubclass(c, zoo.AttnzooError)}
    assert defined - set(zoo.errors.__all__) == set()


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
