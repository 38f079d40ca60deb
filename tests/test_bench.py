"""Smoke test for the benchmark: it runs on a tiny shape and writes a valid report.

Benchmarks are not tests: nothing here looks at a timing.
"""

from __future__ import annotations

import json

import pytest

from cli.common import int_list as _int_list
from cli.main import main as cli_main

ROW_KEYS = {"batch", "seq", "path", "lowering", "auto", "flops", "status"}
MEASURED_KEYS = {"median_ms", "repeats", "gflops", "roofline_fraction", "peak_added_mb", "speedup_vs_sdpa"}


def test_bench_runs_on_a_tiny_shape(tmp_path, capsys):
    out_json, out_png = tmp_path / "bench.json", tmp_path / "bench.png"
    argv = [
        "mha-causal",  # causal: every path, ort-gqa included, can express it
        "--paths",  # the traced lowerings' exports cost most of this test and are tested elsewhere
        "eager-explicit,eager-sdpa,ort-gqa",
        "--seq",
        "8",
        "--warmup",
        "1",
        "--repeats",
        "2",
        "--min-repeats",
        "1",
        "--budget",
        "0.2",
        "--roofline-size",
        "256",
        "--threads",
        "1",
        "--no-progress",
        "--json",
        str(out_json),
        "--plot",
        str(out_png),
    ]

    assert cli_main(["bench", *argv]) == 0

    report = json.loads(out_json.read_text())
    assert {"machine", "versions", "config", "exports", "auto_lowering", "roofline", "rows"} <= set(report)
    assert report["config"]["threads"] == 1
    assert [r["path"] for r in report["rows"]] == ["eager-explicit", "eager-sdpa", "ort-gqa"]
    for row in report["rows"]:
        assert ROW_KEYS <= set(row), row
        assert row["status"] == "ok", row
        assert MEASURED_KEYS <= set(row), row
        assert row["median_ms"] > 0 and row["repeats"] >= 1
    assert {"torch", "ort"} <= set(report["roofline"])
    assert all(r["ok"] for r in report["roofline"].values())

    table = capsys.readouterr().out
    assert "| B | T | path |" in table and "ort-gqa" in table

    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert not out_png.exists()
    else:
        assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_rejects_an_unknown_path(capsys):
    assert cli_main(["bench", "mha-separate-bias", "--paths", "eager-sdpa,nope", "--no-progress"]) == 2
    assert "unknown path(s) nope" in capsys.readouterr().err


@pytest.mark.parametrize("text, want", [("1,16 512", [1, 16, 512]), ("4", [4])])
def test_int_lists(text, want):
    assert _int_list(text) == want


def test_cuda_request_fails_in_one_line_without_cuda(capsys):
    from export.session import cuda_status

    if cuda_status()[0]:
        pytest.skip("CUDA works here; this checks the message on a machine without it")
    assert cli_main(["bench", "mha-separate-bias", "--provider", "cuda", "--seq", "8", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("attnzoo bench: error: --provider cuda:") and "\n" not in err


def test_bench_from_a_plain_copy_of_the_tree_runs_that_copy(tmp_path):
    """`python scripts/bench.py` from a checkout with nothing installed: the workers import
    exactly the tree the parent imported (not an installed copy, not a missing module)."""
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    copy = tmp_path / "checkout"
    ignore = shutil.ignore_patterns("__pycache__", "*.pt", "*.onnx")
    for name in ("zoo", "export", "analysis", "models", "scripts"):
        shutil.copytree(root / name, copy / name, ignore=ignore)
    for name in ("bench", "serve", "cli"):  # the packages the house redesign adds
        if (root / name).is_dir():
            shutil.copytree(root / name, copy / name, ignore=ignore)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = tmp_path / "b.json"
    argv = ["mha-separate-nobias", "--paths", "eager-sdpa", "--seq", "4", "--warmup", "1", "--repeats", "2"]
    argv += ["--min-repeats", "1", "--budget", "0.1", "--roofline-size", "64", "--no-progress", "--json", str(out)]
    p = subprocess.run(
        [sys.executable, str(copy / "scripts" / "bench.py"), *argv],
        cwd=tmp_path,  # neither the checkout nor the copy
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    rows = json.loads(out.read_text())["rows"]
    assert rows and all(r["status"] == "ok" for r in rows), rows
    assert {r["code_root"] for r in rows} == {str(copy.resolve())}
