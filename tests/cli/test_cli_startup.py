"""The command line starts light: its help, each command's help, a mistyped command and the one-line
refusals that need no model import none of torch, transformers, onnx or ray (they wait until a command
runs), and say the same as a parser built in a process that has them all loaded.

One child process runs every case in turn through the console script's entry point (cli.entry.main),
recording its output and the modules loaded after it; each test reads its case."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from cli.main import build_parser, command_parsers
from helpers import REPO

HEAVY = ("torch", "transformers", "onnx", "ray")
COLUMNS = "100"  # argparse wraps help to the terminal's width: the same in the child and here
COMMANDS = sorted(command_parsers(build_parser()))

# A mistake caught before any model is read: one line on stderr, exit 2.
REFUSALS = {
    "typo": ["lsit"],
    "unknown flag": ["list", "--bogus"],
    "show without a name": ["show"],
    "heads without a model": ["heads"],
    "patch without a model": ["patch"],
    "generate from a missing folder": ["generate", "no/such/folder", "--prompt", "hi"],
    "bench with contradictory counts": ["bench", "--min-repeats", "9", "--repeats", "3"],
}
CASES = {"--help": ["--help"], **{f"{c} --help": [c, "--help"] for c in COMMANDS}, **REFUSALS}

CHILD = textwrap.dedent(
    """
    import contextlib, io, json, sys
    from cli.entry import main

    results = {}
    for name, argv in json.loads(sys.argv[1]).items():
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(argv)
            except SystemExit as e:
                rc = e.code
        heavy = sorted(m for m in json.loads(sys.argv[2]) if m in sys.modules)
        results[name] = {"rc": rc, "out": out.getvalue(), "err": err.getvalue(), "heavy": heavy}
    print(json.dumps(results))
    """
)


@pytest.fixture(scope="module")
def runs() -> dict:
    env = {**os.environ, "COLUMNS": COLUMNS, "PYTHONPATH": str(REPO)}
    p = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(CASES), json.dumps(HEAVY)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.splitlines()[-1])


def _help(monkeypatch, command: str | None) -> str:
    monkeypatch.setenv("COLUMNS", COLUMNS)
    parser = build_parser()
    return (command_parsers(parser)[command] if command else parser).format_help()


@pytest.mark.parametrize("case", list(CASES))
def test_help_typos_and_refusals_import_no_heavy_package(runs, case):
    run = runs[case]
    assert run["heavy"] == [], f"`attnzoo {' '.join(CASES[case])}` imported {run['heavy']}"


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help_is_what_a_fully_loaded_parser_says(runs, monkeypatch, command):
    import torch  # noqa: F401  # this process has the heavy packages; the child had none

    run = runs["--help" if command is None else f"{command} --help"]
    assert run["rc"] == 0 and run["err"] == ""
    assert run["out"] == _help(monkeypatch, command)


@pytest.mark.parametrize("case", list(REFUSALS))
def test_refusals_are_one_line_and_exit_2(runs, case):
    run = runs[case]
    lines = run["err"].strip().splitlines()
    assert run["rc"] == 2 and len(lines) == 1 and lines[0].startswith("attnzoo"), run
    assert "error:" in lines[0] and run["out"] == ""
