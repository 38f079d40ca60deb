"""`attnzoo bench --decode`: a short real run (tiny block, two past lengths), and its refusals."""

import json

import pytest

from bench.decode import format_decode_table
from cli.main import main

TINY = ["--set", "d_model=64", "--set", "heads=4", "--set", "kv_heads=2", "--set", "d_k=16"]
QUICK = ["--budget", "0.05", "--min-repeats", "1", "--warmup", "1", "--retries", "0", "--no-progress"]


@pytest.mark.slow  # the static-paths test below runs the same workers by default
def test_decode_bench_runs(tmp_path, capsys):
    """Eager and the fused lowering, two past lengths: each in its own worker, every row measured."""
    out = tmp_path / "d.json"
    paths = ["--paths", "eager-sdpa,ort-gqa"]
    code = main(["bench", "llama-3-8b", *TINY, "--decode", "--past", "8,32", *paths, *QUICK, "--json", str(out)])
    assert code == 0, capsys.readouterr()
    report = json.loads(out.read_text())
    assert {r["path"] for r in report["rows"]} == {"eager-sdpa", "ort-gqa"}
    assert all(r["ok"] and r["ms_per_token"] > 0 for r in report["rows"])
    assert {r["past"] for r in report["rows"]} == {8, 32}
    assert all(r["speedup_vs_eager"] > 0 for r in report["rows"])
    text = capsys.readouterr().out
    assert "ms/token" in text and "per-token time growth" in text
    assert format_decode_table(report).count("| 1 | 32 |") == 2


def test_decode_bench_static_paths_the_peer_and_the_floor(tmp_path, capsys, monkeypatch):
    """The static caches (eager and ONNX), transformers' StaticCache peer, and each row's floor."""
    pytest.importorskip("transformers")
    # The ONNX static cache is exported with room for the longest past and its steps, not the export's
    # default capacity (made smaller than the past here, as 4096 is against a past of 16384).
    monkeypatch.setattr("export.writer.DEFAULT_MAX_LEN", 8)
    out = tmp_path / "d.json"
    paths = ["--paths", "eager-static,transformers-static,ort-decomposed-static"]
    code = main(["bench", "llama-3-8b", *TINY, "--decode", "--past", "16", *paths, *QUICK, "--json", str(out)])
    assert code == 0, capsys.readouterr()
    report = json.loads(out.read_text())
    rows = report["rows"]
    assert [r["path"] for r in rows] == ["eager-static", "transformers-static", "ort-decomposed-static"]
    for r in rows:
        assert r["ok"] and r["bandwidth_gbs"] > 0.1 and r["floor_ms"] > 0
        assert r["x_floor"] == pytest.approx(r["ms_per_token"] / r["floor_ms"])
        # The floor reads the step's own bytes (weights + cache) with the path's threads, and says
        # what part of them the last-level cache holds between steps.
        assert r["bandwidth_threads"] == report["threads"]
        assert r["floor_gbs"] == r.get("working_set_gbs", r["bandwidth_gbs"])
        assert r["floor_ms"] == pytest.approx((r["weight_mb"] + r["cache_mb"]) / r["floor_gbs"])
        assert r.get("l3_part") is None or 0.0 <= r["l3_part"] <= 1.0
        assert r["cache_mb"] == pytest.approx(2 * 16 * (16 + 16) * 4 / 1e6)  # g=2, p=16, dk+dv, fp32
    assert "x floor" in capsys.readouterr().out
    # A block transformers' LlamaAttention does not have: the peer is skipped with the reason.
    code = main(["bench", "gpt2-small", *TINY, "--decode", "--past", "8", "--paths", "transformers-static", *QUICK])
    assert code == 0
    assert "transformers-static | skipped: measured for LLaMA-shaped blocks" in capsys.readouterr().out
    assert main(["bench", "llama-3-8b", *TINY, "--decode", "--past", "8", "--paths", "ort-static", *QUICK]) == 2
    assert "unknown decode path(s) ['ort-static']" in capsys.readouterr().err


def test_decode_bench_refusals(capsys):
    assert main(["bench", "mha-separate-bias", "--decode", "--past", "8", *QUICK]) == 2
    assert "not causal self-attention" in capsys.readouterr().err
    assert main(["bench", "mha-causal", "--past", "8", *QUICK]) == 2
    assert "--past goes with --decode" in capsys.readouterr().err
    assert main(["bench", "mha-causal", "--decode", "--seq", "8", *QUICK]) == 2
    assert "--decode measures t = 1" in capsys.readouterr().err


@pytest.mark.parametrize("bad", ["0", "-3", "x"])
def test_decode_bench_past_must_be_positive(bad, capsys):
    with pytest.raises(SystemExit) as e:  # argparse's own refusal: one line, exit 2
        main(["bench", "mha-causal", "--decode", "--past", bad, *QUICK])
    assert e.value.code == 2 and "positive integers" in capsys.readouterr().err or bad == "x"
