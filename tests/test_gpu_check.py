"""The GPU check's scripts, which CI never runs: scripts/gpu_check.sh runs only on a lent GPU machine and
scripts/gpu_mirror.sh only where its 4.6 GB environment was built (docs/gpu.md). A syntax error in either would
first show on that machine, in its 15 minutes; the versions the rehearsal installs are the ones docs/gpu.md
gives, so the documented command and the script rehearse the same machine."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from helpers import REPO

SCRIPTS = ["scripts/gpu_check.sh", "scripts/gpu_mirror.sh"]
PIN = re.compile(r"\b([a-z][a-z0-9-]*)==(\d[\w.]*)")


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_gpu_scripts_parse_as_bash(script):
    run = subprocess.run(["bash", "-n", REPO / script], capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, f"{script}: {run.stderr}"


def test_the_mirror_installs_the_versions_the_docs_give():
    script = set(PIN.findall((REPO / "scripts/gpu_mirror.sh").read_text()))
    page = (REPO / "docs/gpu.md").read_text()
    section = page.split("### Rehearsing the check under the GPU machine's versions", 1)[1].split("\n#", 1)[0]
    docs = set(PIN.findall(section))
    assert {"torch", "transformers", "onnxruntime", "numpy"} <= {name for name, _ in script}
    assert script == docs, f"only in scripts/gpu_mirror.sh: {script - docs}; only in docs/gpu.md: {docs - script}"


@pytest.mark.slow  # a checkpoint, a whole-model export and a generation in a process of its own: ~20 s
def test_the_generation_script_skips_a_cuda_graph_for_an_export_without_packed_rows(tmp_path):
    """scripts/gpu_lm.py's call-2 row asks for the fp32 export with a CUDA graph; fp32 for CUDA is left-padded and
    OnnxSession(cuda_graph=True) refuses it, so the row is skipped with its reason, not run into that refusal."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OUT": str(tmp_path), "PROVIDER": "cpu", "SHAPE": "small"}
    env |= {"PROMPTS": "8", "NEW": "2", "EXPORTS": "float32:fp32", "GRAPHS": "off,on", "PADDING": "left", "GUARD": "0"}
    run = subprocess.run(
        [sys.executable, REPO / "scripts/gpu_lm.py"], env=env, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-2000:]
    res = json.loads((tmp_path / "lm-cpu.json").read_text())
    assert [r["path"] for r in res["rows"]] == ["attnzoo"]
    assert res["skipped"] == ["attnzoo float32 fp32 graph=True: not run, a CUDA graph needs packed rows (this: left)"]
    assert not [e for e in res["errors"] if e.startswith("attnzoo")]


@pytest.mark.slow  # a checkpoint, a packed export and two batched runs in a process of its own: ~15 s
def test_the_batching_script_serves_each_request_as_alone_on_the_cpu(tmp_path):
    """scripts/gpu_batch.py (call 2's continuous batching step) rehearsed on the CPU: with no export at the path it
    makes a small packed one, and every request through the packed batcher equals the request alone."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OUT": str(tmp_path), "PROVIDER": "cpu"}
    env |= {"EXPORT": str(tmp_path / "none.onnx"), "REQUESTS": "6", "ROWS": "3", "NEW": "8"}
    run = subprocess.run(
        [sys.executable, REPO / "scripts/gpu_batch.py"], env=env, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-2000:]
    res = json.loads((tmp_path / "batch-cpu.json").read_text())
    assert [(r["cuda_graph"], r["equal_to_alone"], r["failed"]) for r in res["runs"]] == [(False, 6, []), (True, 6, [])]
