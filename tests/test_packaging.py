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


# -- pinned versions: constraints.txt -------------------------------------------------------------------------


def _pins() -> dict[str, str]:
    from packaging.utils import canonicalize_name

    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not NAME==VERSION"
            pins[canonicalize_name(name.split("[")[0])] = version.strip()
    return pins


def _declared() -> list[str]:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return [*project["dependencies"], *(r for extra in project["optional-dependencies"].values() for r in extra)]


def test_the_serve_extra_holds_what_serving_imports_of_the_text_extra():
    """`attnzoo serve` of a whole model or an encoder reads a tokenizer (tokenizers) and a chat template (jinja2,
    through runtime/chat*.py), and constrains decoding (llguidance, runtime/constraints.py): each text-extra
    package that serve/ or the runtime modules it uses import is in the serve extra, so `pip install
    attnzoo[serve]` serves text."""
    import ast

    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib

    from packaging.requirements import Requirement

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    text = {Requirement(r).name for r in extras["text"]}  # the module names are the distributions' here
    imported = set()
    for path in [*(REPO / "serve").rglob("*.py"), *(REPO / "runtime").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                imported.add(node.module.split(".")[0])
    needed = text & imported
    assert needed == {"tokenizers", "jinja2", "llguidance"}, needed  # llguidance: response_format, forced tool calls
    assert needed <= {Requirement(r).name for r in extras["serve"]}


def test_every_declared_dependency_is_pinned_within_its_range():
    """A fresh machine installs what passed: each package the package and its extras name has a pin, and the
    pin lies inside the declared range (a range that excludes what CI proves is a lie)."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    pins = _pins()
    here = {"sys_platform": "linux", "platform_machine": "x86_64", "python_version": "3.11"}
    for text in _declared():
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate(here):
            continue  # the other platforms' onnxruntime
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is declared in pyproject.toml but not pinned in constraints.txt"
        assert req.specifier.contains(pins[name], prereleases=True), f"{req.name}=={pins[name]} is outside {text!r}"


def test_heavy_dependencies_declare_an_upper_bound():
    """The declared ranges end at the newest minor release proven, not at the next major (`>=5,<6`)."""
    from packaging.requirements import Requirement

    heavy = {"torch", "transformers", "onnxruntime", "onnxruntime-gpu", "onnx", "onnxscript", "ray", "tritonclient"}
    for text in _declared():
        req = Requirement(text)
        if req.name in heavy:
            assert any(s.operator == "<" for s in req.specifier), f"{text!r} has no upper bound"


# The ends of a declared range proven other than by the pin (constraints.txt): docs/testing.md says when each ran.
PROVEN_ELSEWHERE = {
    ("transformers", ">=5.24"): "the suite with 5.24 until 2026-12-03, and the drift command",
    ("torch", ">=2.11"): "the CUDA-marked tests on the H200 (docs/gpu.md)",
}


def test_every_declared_bound_is_a_proven_release():
    """A lower bound is the pinned release's minor (the one the suite passed), an upper bound at most the next minor
    after it: `numpy<2.6` with 2.4 pinned, or `tqdm>=4.60` with 4.70 pinned, claims releases no run has seen.
    Another proven end is listed in PROVEN_ELSEWHERE, with where it ran."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    from packaging.version import Version

    pins = _pins()
    for text in _declared():
        req = Requirement(text)
        name = canonicalize_name(req.name)
        if name == "tomli":
            continue  # Python 3.10's tomllib: not installed where the suite runs (3.11)
        pin = Version(pins.get(name) or pins["onnxruntime-gpu"])  # the other platforms' onnxruntime: the same release
        for spec in req.specifier:
            if spec.operator == "==" or (req.name, str(spec)) in PROVEN_ELSEWHERE:
                continue
            bound = Version(spec.version)
            if spec.operator == ">=":
                assert bound.release[:2] == pin.release[:2] and bound <= pin, f"{text!r}: {spec} with {pin} proven"
            else:
                assert spec.operator == "<", f"{text!r}: {spec}"
                assert bound <= Version(f"{pin.major}.{pin.minor + 1}"), f"{text!r}: {spec} with {pin} proven"


def test_ci_and_the_readme_install_with_the_pins():
    ci = (REPO / ".ci" / "run").read_text()
    readme = (REPO / "README.md").read_text()
    for step in ("pip install -q torch==2.13.0 -c constraints.txt", 'pip install -q -c constraints.txt -e ".[test]"'):
        assert step in ci, step
        assert step.replace(" -q", "") in readme, step
