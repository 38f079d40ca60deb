"""The whole-model side-by-side benchmarks (scripts/bench_encoder.py, scripts/bench_seq2seq.py) and the
encoder precision script (scripts/encoder_precision_error.py): their inputs are what the tables say (texts
of exactly T tokens), their statistics and tables, a peer without its environment as a row saying why, and
(slow) each command end to end at its smoke size. Nothing here looks at a timing."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

from bench.encoder_bench import SMOKE, benchmark_encoder, make_folder, texts_of
from bench.encoder_bench import format_table as encoder_table
from bench.seq2seq_bench import _agreement as seq2seq_agreement
from bench.seq2seq_bench import format_table as seq2seq_table
from bench.side_by_side import stats, write
from helpers import REPO


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def smoke_folder(tmp_path_factory):
    return make_folder(tmp_path_factory.mktemp("encoder-bench") / "st", SMOKE)


@pytest.mark.parametrize("t", [3, 8, 32])
def test_each_text_is_exactly_t_tokens_through_the_folders_tokenizer(smoke_folder, t):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(smoke_folder / "tokenizer.json"))
    texts = texts_of(t, 8, SMOKE["vocab"])
    assert len(texts) == 8 and len(set(texts)) > 1
    assert [len(tok.encode(x).ids) for x in texts] == [t] * 8
    assert all(1 not in tok.encode(x).ids for x in texts)  # no [UNK]


def test_stats_are_the_median_and_quartiles():
    s = stats([4.0, 1.0, 3.0, 2.0, 5.0])
    assert (s["median"], s["q1"], s["q3"], s["min"], s["max"], s["n"]) == (3.0, 2.0, 4.0, 1.0, 5.0, 5)
    assert stats([2.0])["q1"] == stats([2.0])["q3"] == 2.0


def test_the_onnx_backend_without_its_environment_is_a_row_saying_why(smoke_folder):
    report = benchmark_encoder(
        batches=[1], lengths=[8], shape=SMOKE, paths=["sentence-transformers-onnx"], progress=False
    )
    assert report["rows"] == []
    assert report["skipped"] == [
        {"path": "sentence-transformers-onnx", "why": "no --st-onnx-python given (optimum-onnx's environment)"}
    ]
    table = encoder_table(report, "python scripts/bench_encoder.py")
    assert "| | | sentence-transformers-onnx | skipped: no --st-onnx-python given" in table
    assert "CPU: " in table and "load average" in table and "`python scripts/bench_encoder.py`" in table


def _machine():
    return {"machine": {"cpu": "X", "avx512": True, "usable_cpus": 2, "load_avg": [1.0, 2.0, 3.0]}, "versions": {}}


def test_the_encoder_table_has_a_row_per_path_and_shape_with_its_speed_against_sentence_transformers():
    row = dict(q1=0.1, q3=0.3, min=0.1, max=0.3, n=3)
    rows = [
        {"path": "sentence-transformers", "b": 8, "t": 32, "median": 0.4, "sentences_per_s": 20.0, **row},
        {"path": "attnzoo", "b": 8, "t": 32, "median": 0.1, "sentences_per_s": 80.0, "max_abs_diff": 3e-8, **row},
    ]
    report = {**_machine(), "threads": 2, "shape": SMOKE, "warmup": 1, "repeats": 3, "rows": rows, "skipped": []}
    report.update(paths={"attnzoo": {"build_s": 1.25, "lowering": "onnx-attention"}}, load_avg_end=[4.0, 5.0, 6.0])
    table = encoder_table(report, "CMD")
    assert "| 32 | 8 | attnzoo | 80.0 | 100.0 | [100.0, 300.0] | 4.00x | 3.0e-08 |" in table
    assert table.index("| attnzoo |") < table.index("| sentence-transformers |")  # the PATHS order
    assert "X (AVX-512)" in table and "1.00, 2.00, 3.00" in table and "4.00, 5.00, 6.00 when it ended" in table
    assert "- attnzoo: build_s 1.2, lowering onnx-attention" in table


def test_seq2seq_agreement_counts_equal_rows_and_tokens_against_transformers():
    rows = [
        {"model": "t5", "path": "transformers", "b": 2, "tokens": [[5, 6, 7], [8, 9, 10]]},
        {"model": "t5", "path": "attnzoo", "b": 2, "tokens": [[5, 6, 7], [8, 0, 10]]},
        {"model": "bart", "path": "attnzoo", "b": 2, "tokens": [[1, 2, 3], [4, 5, 6]]},  # no reference: no count
    ]
    seq2seq_agreement(rows)
    assert (rows[1]["rows_equal"], rows[1]["tokens_equal"], rows[1]["tokens_total"]) == (1, 5, 6)
    assert (rows[0]["rows_equal"], rows[0]["tokens_equal"]) == (2, 6)
    assert "tokens_equal" not in rows[2]
    row = dict(q1=0.1, q3=0.3, min=0.1, max=0.3, n=3, median=0.2, tokens_per_s=30.0)
    report = {**_machine(), "threads": 2, "shape": dict(layers=1, d_model=32, heads=4, d_ff=64, vocab=64)}
    report.update(prompt=8, new=3, warmup=0, repeats=1, rows=[{**r, **row} for r in rows[:2]], skipped=[], paths={})
    assert "| t5 | 2 | attnzoo | 30.0 | 200.0 | [100.0, 300.0] | 1.00x | 5 of 6 |" in seq2seq_table(report, "CMD")


def test_write_puts_the_table_and_the_json_beside_each_other(tmp_path):
    md, js = write({"kind": "x", "rows": []}, "| table |", tmp_path / "sub" / "encoder-x")
    assert (md.name, js.name) == ("encoder-x.md", "encoder-x.json")
    assert md.read_text() == "| table |\n" and json.loads(js.read_text()) == {"kind": "x", "rows": []}
    assert sorted(p.name for p in md.parent.iterdir()) == ["encoder-x.json", "encoder-x.md"]  # no temp file left


def test_the_precision_tables_format_is_the_documented_one():
    """The script's table header is the one docs/embeddings.md shows; compare() of a copy is exact."""
    mod = _script("encoder_precision_error")
    rng = np.random.default_rng(0)
    ref = rng.normal(size=(16, 8)).astype(np.float32)
    same = mod.compare(ref, ref * 3)
    assert same["mean_cos"] == pytest.approx(1.0) and same["min_cos"] == pytest.approx(1.0)
    assert same["top1_agreement"] == 1.0
    noisy = mod.compare(ref, ref + rng.normal(size=ref.shape).astype(np.float32))
    assert noisy["min_cos"] <= noisy["p1_cos"] <= noisy["mean_cos"] < 1.0
    report = dict(shape=mod.SMOKE, vocab=256, loss_first=5.5, loss_last=5.0, texts=16, held_out=["a.py"])
    report.update(precisions={"int8": same, "int4": noisy}, fp32_mean_pair_cos=0.5, fp32_vs_st_max_abs=1e-7)
    table = mod.format_table(report)
    header = "| " + " | ".join(mod.COLUMNS) + " |"
    assert header in table.splitlines()
    assert header in (REPO / "docs" / "embeddings.md").read_text().splitlines()
    assert "| int8 | 1.000000 | 1.000000 | 1.000000 | 100.0% |" in table


@pytest.mark.slow
def test_the_encoder_benchmark_runs_end_to_end_at_its_smoke_size(tmp_path, capsys):
    out = tmp_path / "encoder-smoke"
    paths = "attnzoo,sentence-transformers,transformers"
    assert _script("bench_encoder").main(["--smoke", "--paths", paths, "--batch", "1,2", "--out", str(out)]) == 0
    report = json.loads(out.with_suffix(".json").read_text())
    assert {(r["path"], r["b"], r["t"]) for r in report["rows"]} == {
        (p, b, 8) for p in paths.split(",") for b in (1, 2)
    }
    assert all(r["max_abs_diff"] < 1e-5 for r in report["rows"])
    assert "| 8 | 2 | attnzoo |" in out.with_suffix(".md").read_text()


@pytest.mark.slow
def test_the_seq2seq_benchmark_runs_end_to_end_and_its_tokens_agree(tmp_path):
    out = tmp_path / "seq2seq-smoke"
    assert _script("bench_seq2seq").main(["--smoke", "--batch", "1,2", "--out", str(out)]) == 0
    report = json.loads(out.with_suffix(".json").read_text())
    assert report["skipped"] == []
    attnzoo = [r for r in report["rows"] if r["path"] == "attnzoo"]
    assert {(r["model"], r["b"]) for r in attnzoo} == {(m, b) for m in ("t5", "bart") for b in (1, 2)}
    assert all(r["tokens_equal"] == r["tokens_total"] == r["b"] * 4 for r in attnzoo)


@pytest.mark.slow
def test_the_precision_script_runs_end_to_end_at_its_smoke_size(tmp_path, capsys):
    js = tmp_path / "precision.json"
    assert _script("encoder_precision_error").main(["--smoke", "--json", str(js)]) == 0
    report = json.loads(js.read_text())
    assert set(report["precisions"]) == {"int8", "int4"} and report["texts"] == 16
    assert report["fp32_vs_st_max_abs"] < 1e-5
    assert all(0.9 < r["min_cos"] <= r["mean_cos"] <= 1.0 + 1e-6 for r in report["precisions"].values())
    assert "| int4 |" in capsys.readouterr().out
