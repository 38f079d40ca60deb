"""Ctrl-C at any moment of the CLI's startup: exit 130 and one line, never a swallowed signal.

Deterministic: instead of sleeping and hoping to land inside an import, the child sends itself
SIGINT at the moment a named module is first looked up (a finder placed first on sys.meta_path),
so each case hits its point of startup every time, on a quiet machine or a loaded one."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from helpers import REPO

ROOT = REPO

CHILD = textwrap.dedent(
    """
    import os, signal, sys
    target, swallow = sys.argv[1], sys.argv[2] == "swallow"
    hits = []

    class Trip:
        def find_spec(self, name, path=None, target_module=None):
            if name == target and not hits:
                hits.append(name)
                if swallow:  # what torch's C init does to an error raised while it imports numpy
                    try:
                        os.kill(os.getpid(), signal.SIGINT)
                        signal.sigtimedwait([], 0) if hasattr(signal, "sigtimedwait") else None
                        for _ in range(10**6):
                            pass
                    except KeyboardInterrupt:
                        pass
                else:
                    os.kill(os.getpid(), signal.SIGINT)
            return None

    sys.meta_path.insert(0, Trip())
    from cli.entry import main
    rc = main(sys.argv[3:])
    if not hits:
        sys.exit(99)  # the point was never reached: the test's premise is wrong, not the CLI
    sys.exit(rc)
    """
)

# Points across startup: the command modules and what they import while the parser is built (a
# Ctrl-C there is the whole program's: `attnzoo: interrupted`), and what `list` imports once it runs
# (numpy first, then torch: the command's own, `attnzoo list: interrupted`).
POINTS = [
    ("zoo", "attnzoo"),
    ("export.choice", "attnzoo"),
    ("cli.cmd_onnx", "attnzoo"),
    ("analysis", "attnzoo"),
    ("cli.cmd_serve", "attnzoo"),
    ("numpy", "attnzoo list"),
    ("torch", "attnzoo list"),
    ("torch.nn", "attnzoo list"),
    ("einops", "attnzoo list"),
]


def _run(target: str, mode: str, argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", CHILD, target, mode, *argv],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize(("target", "prog"), POINTS)
def test_ctrl_c_at_each_point_of_startup_is_130_and_one_line(target, prog):
    p = _run(target, "raise", ["list"])
    assert p.returncode != 99, f"startup of `attnzoo list` never imported {target}"
    err = p.stderr.strip()
    assert p.returncode == 130 and err == f"{prog}: interrupted", (target, p.returncode, err)


@pytest.mark.parametrize("target", ["torch", "torch.nn", "cli.cmd_onnx", "analysis"])
def test_ctrl_c_that_an_import_swallows_still_ends_the_command(target):
    # `audit '*'` takes a minute: a swallowed Ctrl-C used to let it run to the end with exit 0. torch is
    # imported once the command runs (the help needs none): the next import raises the Ctrl-C again.
    p = _run(target, "swallow", ["audit", "*"])
    assert p.returncode != 99, f"startup of `attnzoo audit` never imported {target}"
    err = p.stderr.strip()
    assert p.returncode == 130 and err.endswith("interrupted") and len(err.splitlines()) == 1, (target, err)


# -- a reader that goes away (attnzoo list | head -1) ------------------------------------------


def test_broken_pipe_is_quiet():
    p = subprocess.Popen(
        [sys.executable, "-m", "cli", "list"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    p.stdout.readline()
    p.stdout.close()  # `attnzoo list | head -1`
    err = p.stderr.read().decode()
    p.wait(timeout=120)
    assert "Broken pipe" not in err and "Traceback" not in err, err
    assert p.returncode in (0, 141)
