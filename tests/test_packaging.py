"""The wheel holds every package of the source tree, and an installed (not editable) copy
gives every command: a package listed by hand once went missing (`bench`), and the
installed `attnzoo bench` then said "unrecognized arguments"."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from helpers import REPO

ROOT = REPO
TOP_LEVEL = ["zoo", "peers", "runtime", "export", "parity", "analysis", "bench", "serve", "cli"]
COMMANDS = ["list", "show", "audit", "families", "export", "run", "parity", "bench", "heads", "importance", "ablate"]
COMMANDS += ["serve", "triton", "loadtest", "generate"]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    p = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr
    (whl,) = out.glob("attnzoo-*.whl")
    return whl


def _source_files() -> set[str]:
    found = set()
    for top in TOP_LEVEL:
        for f in (ROOT / top).rglob("*.py") if (ROOT / top).is_dir() else ():
            if "__pycache__" not in f.parts:
                found.add(f.relative_to(ROOT).as_posix())
    found.add("peers/measured.json")
    for f in (ROOT / "models").iterdir():
        if f.suffix in (".toml", ".pt"):
            found.add(f"zoo/presets/{f.name}")
    for f in (ROOT / "models").glob("*/*"):  # a shipped checkpoint folder, whole (config, weights, tokenizer)
        if f.suffix in (".json", ".safetensors") or f.name == "README.md":
            found.add(f"zoo/presets/{f.parent.name}/{f.name}")
    return found


def test_a_shipped_checkpoint_is_in_the_tree_to_check():
    """The wheel check above covers the shipped checkpoint folders only if there is one."""
    folders = [d for d in (ROOT / "models").iterdir() if d.is_dir() and (d / "config.json").exists()]
    assert folders, "models/ holds no checkpoint folder (scripts/train_lm.py writes models/tiny-stdlib-llama)"
    for d in folders:
        assert {"config.json", "model.safetensors", "tokenizer.json"} <= {f.name for f in d.iterdir()}, d


def test_wheel_holds_every_module_and_preset_of_the_tree(wheel):
    names = {n for n in zipfile.ZipFile(wheel).namelist() if ".dist-info/" not in n}
    missing = sorted(_source_files() - names)
    assert not missing, f"the wheel lacks {missing}"


def test_installed_copy_gives_every_command(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
        check=True,
        timeout=600,
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    code = "import sys, zoo; from cli.entry import main; print(zoo.__file__); sys.exit(main(['--help']))"
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[0].startswith(str(target)), "the test imported another copy"
    assert "unavailable" not in p.stdout, p.stdout
    for command in COMMANDS:
        assert f"    {command} " in p.stdout or f"    {command}\n" in p.stdout, (command, p.stdout)
    code = "import sys; from cli.entry import main; sys.exit(main(['bench', '--help']))"
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "--decode" in p.stdout, p.stdout + p.stderr
