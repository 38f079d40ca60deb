"""The house's layers, read from every module's imports (AST): each package imports only the
packages below it, nothing imports the command line, and no module imports itself round a
circle, inside a package or across packages. A failure names the file and the import.

Imports by name at run time (`importlib.import_module`) obey the same table. Two reach up, on
purpose: zoo hands on the names of `peers` (which imports zoo), importing a peers module on first
use in zoo/__init__.py's `__getattr__`, the only import of peers zoo may make; and export hands on
`run_parity` (which moved to `parity`, above it) the same way, so `from export import run_parity` works."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from helpers import REPO

ROOT = REPO
# package -> the packages of ours it may import (besides itself)
ALLOWED = {
    "zoo": set(),
    "peers": {"zoo"},
    "analysis": {"zoo"},
    "runtime": {"zoo"},  # what a deployment needs: onnxruntime and numpy, no torch (zoo for its errors)
    "export": {"zoo", "runtime"},  # writes graphs to the run time's interface (runtime/io.py)
    "parity": {"zoo", "export", "runtime"},  # eager against the graph: above both
    "bench": {"zoo", "export", "runtime"},
    "serve": {"zoo", "export", "runtime"},
    "cli": {"zoo", "peers", "analysis", "export", "runtime", "parity", "bench", "serve"},
}
OURS = set(ALLOWED)
# (module, enclosing def's qualname) -> the package it may import by name there, though ALLOWED does not list it
LAZY_UP = {("zoo", "__getattr__"): "peers", ("export", "__getattr__"): "parity"}
IMPORT_BY_NAME = {"import_module", "__import__"}  # importlib.import_module(name), __import__(name)


def _modules() -> dict[str, Path]:
    found = {}
    for pkg in ALLOWED:
        for f in sorted((ROOT / pkg).rglob("*.py")) if (ROOT / pkg).is_dir() else ():
            if "__pycache__" in f.parts:
                continue
            parts = list(f.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = f
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> list[tuple[int, str]]:
    """(line, module) for every import of ours in the file, relative ones resolved."""
    is_pkg = path.name == "__init__.py"
    here = name.split(".") if is_pkg else name.split(".")[:-1]
    out = []
    tree = ast.parse(path.read_text(), str(path))
    typing_only = {  # `if TYPE_CHECKING:` imports never run: annotations, not dependencies
        id(n)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for n in ast.walk(block)
    }
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - node.level + 1]
                mod = ".".join([*base, node.module] if node.module else base)
            else:
                mod = node.module or ""
            # `from pkg import sub` imports the submodule when there is one
            targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in MODULES else mod for a in node.names]
        else:
            continue
        out += [(node.lineno, t) for t in targets if t.split(".")[0] in OURS]
    return out


def _constants(tree: ast.Module) -> dict[str, set[str]]:
    """Module-level names bound to a string, or to a dict / tuple / list of strings: name -> those strings."""
    out: dict[str, set[str]] = {}
    for node in tree.body:
        target, value = None, None
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            target, value = node.targets[0].id, node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            target, value = node.target.id, node.value
        if target is None:
            continue
        items = value.values if isinstance(value, ast.Dict) else getattr(value, "elts", [value])
        if all(isinstance(v, ast.Constant) and isinstance(v.value, str) for v in items):
            out[target] = {v.value for v in items}
    return out


def _imports_by_name(path: Path) -> list[tuple[int, str, set[str] | None]]:
    """(line, enclosing def's qualname or <module>, the module names it may import, None when the argument
    cannot be read) for every importlib.import_module / __import__ call in the file."""
    tree = ast.parse(path.read_text(), str(path))
    consts, out = _constants(tree), []

    def names(arg: ast.expr) -> set[str] | None:
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            return {arg.value}
        if isinstance(arg, ast.Subscript) and isinstance(arg.value, ast.Name):  # TABLE[key]
            return consts.get(arg.value.id)
        if isinstance(arg, ast.Name):
            return consts.get(arg.id)
        return None

    def visit(node: ast.AST, scope: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, child.name if scope == "<module>" else f"{scope}.{child.name}")
                continue
            if isinstance(child, ast.Call) and child.args:
                func = child.func
                called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
                if called in IMPORT_BY_NAME:
                    out.append((child.lineno, scope, names(child.args[0])))
            visit(child, scope)

    visit(tree, "<module>")
    return out


def _resolve(target: str) -> str:
    while target and target not in MODULES:
        target = target.rpartition(".")[0]
    return target


def test_packages_import_only_the_layers_below():
    wrong = []
    for name, path in MODULES.items():
        pkg = name.split(".")[0]
        by_name = [
            (line, target, LAZY_UP.get((name, scope)))
            for line, scope, targets in _imports_by_name(path)
            for target in sorted(targets or ())
        ]
        for line, target, up in [(line, target, None) for line, target in _imports(name, path)] + by_name:
            other = target.split(".")[0]
            if other in OURS and other != pkg and other not in ALLOWED[pkg] and other != up:
                wrong.append(
                    f"{path.relative_to(ROOT)}:{line} imports {target} ({pkg} may import {sorted(ALLOWED[pkg])})"
                )
    assert not wrong, "\n".join(wrong)


def test_zoo_imports_peers_only_by_name_in_its_getattr():
    """zoo hands on peers' names lazily: importlib.import_module of a module of peers, named in a table,
    inside zoo/__init__.py's __getattr__, and nowhere else; an import by a name the test cannot read fails.
    The same __getattr__ loads zoo's own names on first use (import zoo imports no torch)."""
    found, wrong = [], []
    for name, path in MODULES.items():
        if name.split(".")[0] != "zoo":
            continue
        for line, scope, targets in _imports_by_name(path):
            where = f"{path.relative_to(ROOT)}:{line} ({scope})"
            if (name, scope) not in LAZY_UP:
                wrong.append(f"{where} imports {sorted(targets or ['a computed name'])} by name")
            elif targets is None or any(_resolve(t) != t or t.split(".")[0] not in ("peers", "zoo") for t in targets):
                got = sorted(targets or ["?"])
                wrong.append(f"{where} may import only modules of zoo and peers by name, got {got}")
            else:
                found += sorted(targets)
    assert not wrong, "\n".join(wrong)
    assert found, "zoo/__init__.py's __getattr__ no longer hands on peers' names (LAZY_UP is stale)"


def test_the_layer_check_sees_an_import_by_name(tmp_path):
    """The checks above read importlib.import_module calls: a literal name, and a name from a table."""
    f = tmp_path / "m.py"
    f.write_text(
        "import importlib\n"
        "TABLE = {'a': 'peers.config', 'b': 'peers.checkpoint'}\n"
        "def __getattr__(name):\n"
        "    return importlib.import_module(TABLE[name])\n"
        "def other(x):\n"
        "    importlib.import_module('peers.transformers')\n"
        "    __import__(x)\n"
    )
    assert _imports_by_name(f) == [
        (4, "__getattr__", {"peers.config", "peers.checkpoint"}),
        (6, "other", {"peers.transformers"}),
        (7, "other", None),
    ]


def test_no_import_circle():
    graph = {name: {_resolve(t) for _, t in _imports(name, path)} - {"", name} for name, path in MODULES.items()}
    # a package's __init__ importing its own submodules is how packages work, not a circle
    for name in graph:
        graph[name] = {t for t in graph[name] if not (t.startswith(name + ".") and MODULES[name].name == "__init__.py")}
    circles, state = [], {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                circles.append(" -> ".join([*stack[stack.index(nxt) :], nxt]))
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not circles, "import circles:\n" + "\n".join(circles)


@pytest.mark.parametrize("pkg", sorted(ALLOWED))
def test_every_layer_exists(pkg):
    assert (ROOT / pkg / "__init__.py").is_file()
