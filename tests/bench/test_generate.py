"""The whole-model generation benchmark (`attnzoo bench --generate`): its flags, its peers' skips,
its tokenizer and random checkpoint, and (slow) one run end to end. Nothing here looks at a timing."""

from __future__ import annotations

import json

import pytest

from bench.checkpoints import BOS, EOS, PAD, byte_tokenizer, prompt_ids
from bench.generate import PATHS, benchmark_generate, format_generate_table, memory_floor
from cli.main import main
from helpers import one_line_error


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    """A random LLaMA small enough for a worker to load and generate from in a second."""
    pytest.importorskip("transformers")
    from bench.checkpoints import random_llama

    shape = dict(
        vocab_size=300,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    return random_llama(tmp_path_factory.mktemp("ckpt") / "tiny", seed=0, **shape)


@pytest.mark.parametrize(
    "text", ["", "def f(x):\n    return x ** 2\n", "tabs\tand \r\n crlf", "é ✓ 😀 \x00\x7f", "<s>not special</s> "]
)
def test_byte_tokenizer_round_trips_text_one_token_per_byte(text):
    tok = byte_tokenizer(259)
    ids = tok.encode(text, add_special_tokens=False).ids
    if "<s>" in text:  # the specials are real tokens of their own
        assert BOS in ids and EOS in ids
    else:
        assert ids == list(text.encode("utf-8"))
    assert tok.decode(ids, skip_special_tokens=False) == text
    assert [tok.token_to_id(s) for s in ("<s>", "</s>", "<pad>")] == [BOS, EOS, PAD]


def test_byte_tokenizer_pads_to_the_vocabulary_size():
    assert byte_tokenizer(8000).get_vocab_size() == 8000
    assert byte_tokenizer(8000).encode("abc").ids == [97, 98, 99]


def test_prompt_ids_are_text_through_the_folders_tokenizer(tiny_checkpoint):
    ids = prompt_ids(tiny_checkpoint, 40)
    assert len(ids) == 40 and all(0 <= i < 256 for i in ids)  # bytes of the held-out modules' source
    assert prompt_ids(tiny_checkpoint, 40) == ids


def test_a_peer_without_its_environment_is_skipped_with_the_reason(tiny_checkpoint):
    report = benchmark_generate(
        str(tiny_checkpoint),
        prompts=[8],
        new=2,
        precisions=["fp32", "int8"],
        paths=["onnxruntime-genai", "llama.cpp"],
        progress=False,
    )
    assert report["rows"] == []
    why = {(s["path"], s["precision"]): s["why"] for s in report["skipped"]}
    assert "--genai-python" in why[("onnxruntime-genai", "fp32")]
    assert "--llama-python" in why[("llama.cpp", "int8")]
    report = benchmark_generate(
        str(tiny_checkpoint),
        prompts=[8],
        new=2,
        precisions=["int8"],
        paths=["onnxruntime-genai"],
        genai_python="/nonexistent/python",
        progress=False,
    )
    assert "no int8" in report["skipped"][0]["why"]
    assert "skipped:" in format_generate_table(report)


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["bench", "--generate"], "--checkpoint"),
        (["bench", "--checkpoint", "x"], "--generate"),
        (["bench", "--generate", "--checkpoint", "random", "--decode"], "no zoo name"),
        (["bench", "--generate", "--checkpoint", "random", "--precision", "bf16"], "--generate takes"),
        (["bench", "--generate", "--checkpoint", "random", "--new", "0"], "--new 0"),
        (["bench", "--generate", "--checkpoint", "random", "--gguf", "f32"], "PREC=FILE"),
        (["bench", "--generate", "--checkpoint", "random", "--prompt", "0"], "positive"),
    ],
)
def test_bad_generate_flags_are_one_line(capsys, argv, needle):
    assert needle in one_line_error(capsys, argv)


def test_the_memory_floor_is_the_checkpoints_weights_and_a_cache_of_the_call(tiny_checkpoint):
    floor = memory_floor(str(tiny_checkpoint), [8, 16], new=4)
    weights = sum(f.stat().st_size for f in tiny_checkpoint.glob("*.safetensors"))
    assert floor["weights_mb"] == weights / 1e6
    per_position = 1 * 2 * 2 * (32 // 4) * 4  # layers, K and V, kv heads, head dim, fp32
    assert floor["cache_mb"] == {8: per_position * 12 / 1e6, 16: per_position * 20 / 1e6}


def test_a_folder_without_config_is_refused(capsys, tmp_path):
    assert "config.json" in one_line_error(capsys, ["bench", "--generate", "--checkpoint", str(tmp_path)])


@pytest.mark.slow
def test_bench_generate_runs_end_to_end(tiny_checkpoint, tmp_path, capsys):
    """Every path that runs here, in its own process, on a tiny checkpoint; the report and its agreement."""
    out = tmp_path / "g.json"
    argv = [
        "bench",
        "--generate",
        "--checkpoint",
        str(tiny_checkpoint),
        "--prompt",
        "8",
        "--new",
        "3",
        "--threads",
        "1",
        "--warmup",
        "0",
        "--repeats",
        "1",
        "--no-progress",
        "--json",
        str(out),
        "--paths",
        "transformers-dynamic,transformers-static,attnzoo",
    ]
    code = main(argv)
    report = json.loads(out.read_text())
    rows = {r["path"]: r for r in report["rows"]}
    for path in ("transformers-dynamic", "transformers-static"):
        assert rows[path]["ok"], rows[path]
        assert len(rows[path]["tokens"]) == 3 and 0 < rows[path]["runtime_rss_mb"] < rows[path]["peak_rss_mb"]
        assert rows[path]["agree_count"] == 3  # greedy: the static cache gives the dynamic cache's tokens
    assert set(rows) <= set(PATHS)
    assert code == (0 if all(r["ok"] for r in report["rows"]) else 1)
    assert "tokens/s" in capsys.readouterr().out
