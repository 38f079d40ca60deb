"""Smoke test for the benchmark: it runs on a tiny shape and writes a valid report.

Benchmarks are not tests: nothing here looks at a timing.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from cli.common import int_list as _int_list
from cli.main import main as cli_main
from helpers import REPO, one_line_error

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


@pytest.mark.parametrize("shape", [["--seq", "8"], ["--decode", "--past", "8"]], ids=["full", "decode"])
def test_cuda_request_fails_in_one_line_without_cuda(capsys, shape):
    """Refused before any export or worker starts, with or without --decode."""
    from runtime.session import cuda_status

    if cuda_status()[0]:
        pytest.skip("CUDA works here; this checks the message on a machine without it")
    assert cli_main(["bench", "gpt2-small", "--provider", "cuda", *shape, "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("attnzoo bench: error: --provider cuda:") and "\n" not in err


@pytest.mark.slow  # a second tree and its workers: ~16 s of the default run
def test_bench_from_a_plain_copy_of_the_tree_runs_that_copy(tmp_path):
    """`python scripts/bench.py` from a checkout with nothing installed: the workers import
    exactly the tree the parent imported (not an installed copy, not a missing module)."""
    import os
    import shutil
    import subprocess
    import sys

    root = REPO
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


# -- bench: sized to the dtype, every numeric flag checked, clean on every exit ----------------


@pytest.mark.parametrize(
    "flags, match",
    [
        (["--budget", "nan"], "--budget"),
        (["--budget", "inf"], "--budget"),
        (["--roofline-size", "0"], "--roofline-size"),
        (["--min-repeats", "10", "--repeats", "2"], "--min-repeats"),
        (["--timeout", "0"], "--timeout"),
        (["--threads", "0"], "--threads"),
        (["--warmup", "-1"], "--warmup"),
        (["--plot", "x.txt"], "--plot"),
    ],
)
def test_bench_flags_are_checked_before_any_work(capsys, flags, match):
    assert match in one_line_error(capsys, ["bench", "mha-causal", "--seq", "4", *flags])


def test_roofline_is_sized_to_the_dtype_and_machine():
    from bench import jobs as bench
    from bench.measure import _roofline

    job = bench.Job("roofline", "torch", "cpu", "float16", 1, bench.Budget(1, 3, 1, 0.05), seq=0)
    out = _roofline(job)
    n = out["n"]
    assert bench.ROOFLINE_MIN <= n <= bench.ROOFLINE_SIZE["cpu"] and n & (n - 1) == 0
    assert out["gflops"] > 0


def test_sigterm_unwinds_like_ctrl_c():
    from bench.plan import _terminate_as_interrupt

    with pytest.raises(KeyboardInterrupt), _terminate_as_interrupt():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_stale_bench_folders_are_swept(tmp_path, monkeypatch):
    import tempfile

    from bench import plan as bench

    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path))
    old, young = tmp_path / "attnzoo-bench-old", tmp_path / "attnzoo-bench-young"
    old.mkdir()
    young.mkdir()
    hours_ago = time.time() - 2 * 3600
    os.utime(old, (hours_ago, hours_ago))
    bench.sweep_stale_temp()
    assert not old.exists() and young.exists()


def test_the_plot_rings_the_points_the_table_stars(tmp_path, monkeypatch):
    """A figure measured while other processes used the CPUs is starred in the table and ringed in red in the
    picture; the others are not."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from bench.report import plot
    from bench.timing import CONTENDED

    def row(seq, ms, others):
        return dict(
            status="ok", path="eager-sdpa", batch=1, seq=seq, median_ms=ms, peak_added_mb=1.0, others_cpus=others
        )

    report = {
        "rows": [row(16, 39.5, CONTENDED + 1), row(64, 0.9, 0.0)],
        "config": dict(paths=["eager-sdpa"], name="transformer-base", provider="cpu", dtype="float32", threads=2),
        "machine": {"cpu": "test"},
    }
    figures = []
    monkeypatch.setattr(plt, "close", lambda fig=None: figures.append(fig))
    assert plot(report, tmp_path / "bench.png") is None
    ax_t = figures[0].axes[0]
    ringed = [tuple(p) for c in ax_t.collections for p in c.get_offsets() if c.get_edgecolor().size]
    assert ringed == [(16.0, 39.5)], ringed
    assert "measured under load" in [t.get_text() for t in ax_t.get_legend().get_texts()][-1]


def test_a_quantized_rows_share_of_the_fp32_roofline_is_not_given():
    """The roofline is an fp32 MatMul's; an int8 row ran at 110% of it (integer kernels have another peak): its
    share is left out, and the table says what the share is against."""
    import zoo
    from bench.jobs import ort_path
    from bench.plan import Export, _rows
    from bench.report import format_table

    spec = zoo.spec("mha-causal")
    path = ort_path("decomposed")
    exports = {"decomposed": Export("decomposed", "a.onnx"), "decomposed int8": Export("decomposed", "b.onnx")}
    measured = {(1, 8, path, prec): {"ok": True, "median_ms": 0.01, "repeats": 5} for prec in ("fp32", "int8")}
    roofline = {"ort": {"ok": True, "gflops": 1.0, "n": 64, "median_ms": 1.0}}
    rows = _rows(spec, [(1, 8)], [(path, "fp32"), (path, "int8")], exports, measured, roofline, "cpu")
    fraction = {r["precision"]: r["roofline_fraction"] for r in rows}
    assert fraction["int8"] is None and fraction["fp32"] == pytest.approx(rows[0]["gflops"] / 1.0)
    config = {"name": "mha-causal", "spec": spec.to_dict(), "provider": "cpu", "dtype": "float32", "threads": 1}
    report = {"config": {**config, "precisions": ["fp32", "int8"]}, "rows": rows, "roofline": roofline}
    table = format_table({**report, "ort_call_overhead": [], "auto_lowering": "decomposed", "machine": {}})
    assert "% roofline: of the float32 MatMul roofline below, for the float32 rows only" in table
