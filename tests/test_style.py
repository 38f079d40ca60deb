"""The tree is as ruff lints and formats it (the version the test extra pins, with pyproject.toml's rules), so
drift is caught by the commit that writes it, not found later in a pile."""

import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=["lint", "format"])
def test_the_tree_is_as_ruff_writes_it(command):
    if find_spec("ruff") is None:
        pytest.skip("ruff is not installed: pip install -e '.[test]' brings the pinned version")
    run = subprocess.run([sys.executable, "-m", "ruff", *command, "."], cwd=REPO, capture_output=True, text=True)
    assert run.returncode == 0, f"ruff {' '.join(command)} . (fix: ruff check --fix . / ruff format .)\n{run.stdout}"


PACKAGES = ("zoo", "peers", "analysis", "runtime", "export", "parity", "bench", "serve", "cli", "scripts")
MOST_LINES = 450  # the house's mark: a module past it is split by job


def test_no_module_of_the_packages_passes_the_houses_mark():
    long = {
        str(p.relative_to(REPO)): n
        for package in PACKAGES
        for p in sorted((REPO / package).rglob("*.py"))
        if (n := len(p.read_text().splitlines())) > MOST_LINES
    }
    assert long == {}, f"past {MOST_LINES} lines (split each by job): {long}"
