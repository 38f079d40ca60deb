"""The house's layers, read from every module's imports (AST): each package imports only the
packages below it, nothing imports the command line, and no module imports itself round a
circle, inside a package or across packages. A failure names the file and the import."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from helpers import REPO

ROOT = REPO
# package -> the packages of ours it may import (besides itself)
ALLOWED = {
    "zoo": set(),
    "analysis": {"zoo"},
    "export": {"zoo"},
    "bench": {"zoo", "export"},
    "serve": {"zoo", "export"},
    "cli": {"zoo", "analysis", "export", "bench", "serve"},
}
OURS = set(ALLOWED)


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


def _resolve(target: str) -> str:
    while target and target not in MODULES:
        target = target.rpartition(".")[0]
    return target


def test_packages_import_only_the_layers_below():
    wrong = []
    for name, path in MODULES.items():
        pkg = name.split(".")[0]
        for line, target in _imports(name, path):
            other = target.split(".")[0]
            if other != pkg and other not in ALLOWED[pkg]:
                wrong.append(
                    f"{path.relative_to(ROOT)}:{line} imports {target} ({pkg} may import {sorted(ALLOWED[pkg])})"
                )
    assert not wrong, "\n".join(wrong)


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
