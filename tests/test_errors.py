"""One error root: every exception class attnzoo defines for a user's mistake derives from
`zoo.AttnzooError` and keeps a builtin base (ValueError, TypeError, RuntimeError), so
`except zoo.AttnzooError` catches the library's refusals and `except ValueError` keeps working.
Found by walking the packages, not listed by hand: a new error class is checked the moment it exists."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

import zoo

ROOT = Path(__file__).resolve().parent.parent
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
