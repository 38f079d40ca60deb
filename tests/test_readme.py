"""The README's code runs: every Python block in order, in one namespace (as a reader would paste
them into one session), and every `attnzoo ...` command line of its shell blocks parses. A
documented call that goes missing (`analysis.head_scores` once did) fails here."""

from __future__ import annotations

import re
import shlex

import pytest

from cli.main import build_parser
from helpers import REPO

README = REPO / "README.md"
TEXT = README.read_text()
# Blocks that talk to a running server: their imports run, their calls need `attnzoo serve`
# (tests/serve/test_serve.py drives the same Client against a real one).
NEEDS_SERVER = re.compile(r"Client\(")


def _blocks(lang: str) -> list[tuple[int, str]]:
    return [(TEXT[: m.start()].count("\n") + 1, m.group(1)) for m in re.finditer(rf"```{lang}\n(.*?)```", TEXT, re.S)]


def test_every_python_block_runs_in_order(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the blocks write out.onnx and dec.onnx
    namespace: dict = {}
    ran = 0
    for line, code in _blocks("python"):
        if NEEDS_SERVER.search(code):
            code = "\n".join(ln for ln in code.splitlines() if ln.startswith(("import ", "from ")))
        try:
            exec(compile(code, f"README.md:{line}", "exec"), namespace)
        except Exception as e:  # noqa: BLE001 - name the block
            pytest.fail(f"README.md block at line {line} fails: {type(e).__name__}: {e}")
        ran += 1
    assert ran >= 5


OPERATORS = {"&&", "||", "|", ";", "&"}


def _command_lines() -> list[list[str]]:
    """Each `attnzoo` command of the shell blocks, as its argv (quotes and comments as the shell reads them)."""
    found = []
    for _, code in _blocks("bash") + _blocks("console"):
        for raw in code.replace("\\\n", " ").splitlines():
            raw = re.sub(r"\$\([^)]*\)", "X", raw.strip().removeprefix("$ "))
            words, command = shlex.split(raw, comments=True), []
            for w in [*words, ";"]:
                if w in OPERATORS:
                    if command[:1] == ["attnzoo"]:
                        found.append(command)
                    command = []
                else:
                    command.append(w)
    return found


@pytest.mark.parametrize("argv", _command_lines(), ids=" ".join)
def test_every_attnzoo_command_line_parses(argv):
    try:
        build_parser().parse_args(argv[1:])
    except SystemExit as e:
        pytest.fail(f"`{' '.join(argv)}` does not parse (exit {e.code})")


def test_families_table_is_the_commands():
    from cli.cmd_zoo import families_markdown

    assert families_markdown() in TEXT, "README's families table differs from `attnzoo families`"
