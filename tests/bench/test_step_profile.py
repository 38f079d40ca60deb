"""scripts/profile_step.py and its worker (bench/step_profile.py): one decode step under ONNX Runtime's profiler,
read back per op type. Run on a two-layer random LLaMA, attnzoo's path (onnxruntime-genai's needs its own
environment: ATTNZOO_GENAI_PYTHON names its python). Nothing here looks at a timing's size."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

from bench.step_profile import summarize
from helpers import REPO

LAYERS = 2


def _script():
    spec = importlib.util.spec_from_file_location("profile_step", REPO / "scripts" / "profile_step.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """The report of one run of the script over a small random LLaMA: (report, markdown text)."""
    pytest.importorskip("transformers")
    from bench.checkpoints import random_llama

    folder = tmp_path_factory.mktemp("step-profile")
    shape = dict(vocab_size=300, hidden_size=64, num_hidden_layers=LAYERS, num_attention_heads=4)
    shape.update(num_key_value_heads=2, intermediate_size=96, max_position_embeddings=64)
    checkpoint = random_llama(folder / "tiny", seed=0, **shape)
    paths = "attnzoo,onnxruntime-genai" if os.environ.get("ATTNZOO_GENAI_PYTHON") else "attnzoo"
    argv = ["--checkpoint", str(checkpoint), "--prompt", "12", "--new", "6", "--threads", "1", "--repeats", "1"]
    argv += ["--paths", paths, "--work", str(folder / "work"), "--out", str(folder / "report")]
    argv += ["--genai-python", os.environ.get("ATTNZOO_GENAI_PYTHON", "")]
    assert _script().main(argv) == 0
    return json.loads((folder / "report.json").read_text()), (folder / "report.md").read_text()


def test_the_profile_reads_each_decode_step_of_the_last_call(profiled):
    report, _ = profiled
    for path, row in report["rows"].items():
        assert row["ok"], (path, row)
        p = row["profile"]
        assert p["steps"] == 5  # 6 new tokens: the prefill's, then 5 decode runs
        assert p["matmuls_per_layer"] == 5  # Q | K | V, o, gate, up, down
        assert p["ops"]["GroupQueryAttention"]["count"] == LAYERS
        assert 0 < p["nodes_us"] <= p["run_us"] <= p["wall_us"] and p["host_us"] >= 0
    az = report["rows"]["attnzoo"]
    assert az["host_us"] >= 0 and az["run_us"] <= az["wall_us"]


def test_the_report_states_the_floor_and_each_op(profiled):
    report, text = profiled
    assert report["step_bytes"]["weights"] > 0 and report["floor"]["memory_ms"] > 0
    assert "| **GroupQueryAttention** |" in text and "| attnzoo |" in text and "Floor: a step reads" in text


def test_a_run_without_one_token_a_row_is_refused_by_the_summary():
    prefill = {"cat": "Session", "name": "model_run", "ts": 0, "dur": 10}
    gather = {"cat": "Node", "name": "embed_kernel_time", "ts": 1, "dur": 2}
    gather["args"] = {"op_name": "Gather", "input_type_shape": [{"float": [300, 8]}, {"int64": [1, 12]}]}
    with pytest.raises(ValueError, match="0 decode runs"):
        summarize([prefill, gather], vocab=300, layers=1, last=0)


def test_genai_without_its_python_is_refused_in_one_line(capsys):
    with pytest.raises(SystemExit):
        _script().parse_args(["--paths", "onnxruntime-genai"])
    assert "--genai-python" in capsys.readouterr().err
