"""The whole-model generation benchmark (`attnzoo bench --generate`): its flags, its peers' skips,
its tokenizer and random checkpoint, and (slow) one run end to end. Nothing here looks at a timing."""

from __future__ import annotations

import json
import sys

import pytest

import zoo
from bench.checkpoints import BOS, EOS, PAD, byte_tokenizer, prompt_ids
from bench.generate import PATHS, benchmark_generate, format_generate_table, memory_floor
from cli.main import main
from helpers import one_line_error
from runtime.providers import cuda_graph_refusal, dtype_refusal


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
        (["bench", "--generate", "--checkpoint", "random", "--rounds", "0"], "--rounds"),
        (["bench", "--rounds", "2"], "--generate"),
        (["bench", "--cuda-graph"], "--generate"),
        (
            ["bench", "--generate", "--checkpoint", "random", "--dtype", "float16"],
            dtype_refusal("cpu", "float16"),
        ),
        # --cuda-graph's rule is generate's own words (runtime.providers.cuda_graph_refusal)
        (["bench", "--generate", "--checkpoint", "random", "--cuda-graph"], cuda_graph_refusal("cpu")),
        (
            ["bench", "--generate", "--checkpoint", "random", "--provider", "cuda", "--cuda-graph"],
            cuda_graph_refusal("cuda", "float32"),
        ),
    ],
)
def test_bad_generate_flags_are_one_line(capsys, argv, needle):
    assert needle in one_line_error(capsys, argv)


def test_rounds_time_every_path_in_turn_and_keep_each_rows_best(tiny_checkpoint, monkeypatch):
    """The workers are scripted here: the order of the calls and the merge of the rounds are the subject."""
    import bench.generate as generate

    calls, times = [], {"attnzoo": [0.3, None, 0.2], "transformers-dynamic": [None, 0.5, 0.4]}

    def spawn(python, job, timeout):
        if job["stage"] == "build":
            return {"ok": True}
        calls.append(job["path"])
        took = times[job["path"]].pop(0)
        if took is None:
            return {"ok": False, "error": "a failed round"}
        return {
            "ok": True,
            "end_to_end_s": took,
            "tokens": [1, 2],
            "tokens_per_s": 2 / took,
            "prefill_s": took / 2,
            "decode_ms_per_token": took / 2 * 1e3,
            "peak_rss_mb": 100.0,
        }

    monkeypatch.setattr(generate, "_spawn", spawn)
    report = benchmark_generate(
        str(tiny_checkpoint),
        prompts=[8],
        new=2,
        precisions=["fp32"],
        paths=["attnzoo", "transformers-dynamic"],
        rounds=3,
        progress=False,
    )
    assert calls == ["attnzoo", "transformers-dynamic"] * 3  # path after path, round after round
    rows = {r["path"]: r for r in report["rows"]}
    assert rows["attnzoo"]["end_to_end_s"] == 0.2 and rows["attnzoo"]["rounds_end_to_end_s"] == [0.3, None, 0.2]
    assert rows["transformers-dynamic"]["end_to_end_s"] == 0.4  # a failed first round loses to any that ran
    assert rows["transformers-dynamic"]["rounds_end_to_end_s"] == [None, 0.5, 0.4]
    assert report["rounds"] == 3 and "the best of 3 rounds" in format_generate_table(report)


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


# ---- llama.cpp: the GGUF the bench writes ----
def _rotate_half(x, positions, theta=10000.0):
    """HF LLaMA's rotary on rows (heads, d): row i with row i + d/2, frequency i."""
    import numpy as np

    d = x.shape[-1]
    angle = positions[:, None] * theta ** (-np.arange(0, d, 2) / d)[None, :]  # (positions, d/2)
    cos, sin = np.concatenate([np.cos(angle)] * 2, -1), np.concatenate([np.sin(angle)] * 2, -1)
    rotated = np.concatenate([-x[..., d // 2 :], x[..., : d // 2]], -1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


def _rotate_pairs(x, positions, theta=10000.0):
    """llama.cpp's LLAMA rope (type NORM) on rows (heads, d): rows 2j and 2j+1, frequency j."""
    import numpy as np

    d = x.shape[-1]
    angle = positions[:, None, None] * theta ** (-np.arange(0, d, 2) / d)[None, None, :]
    even, odd = x[..., 0::2], x[..., 1::2]
    out = np.empty(np.broadcast_shapes(x.shape, (len(positions), 1, d)))
    out[..., 0::2] = even * np.cos(angle) - odd * np.sin(angle)
    out[..., 1::2] = even * np.sin(angle) + odd * np.cos(angle)
    return out


@pytest.mark.parametrize("heads, head_dim", [(1, 2), (2, 8), (8, 64), (3, 128)])
def test_the_gguf_row_order_turns_rotate_half_into_interleaved_pairs(heads, head_dim):
    """Interleaved-pair rotary of the permuted rows = the permuted rows of HF's rotate-half rotary,
    at every position; and q.k per head, what attention reads, is the same both ways."""
    import numpy as np

    from bench.gguf_llama import rope_interleave_order

    rng = np.random.default_rng(heads * 1000 + head_dim)
    order = rope_interleave_order(heads, head_dim)
    assert sorted(order.tolist()) == list(range(heads * head_dim))  # a permutation, head by head
    assert (order // head_dim == np.repeat(np.arange(heads), head_dim)).all()
    hidden = 16
    wq, wk = rng.standard_normal((2, heads * head_dim, hidden))
    h = rng.standard_normal(hidden)
    positions = np.array([0.0, 1.0, 7.0, 130.0, 4095.0])
    q_hf = _rotate_half((wq @ h).reshape(heads, head_dim), positions)  # (positions, heads, d)
    q_cpp = _rotate_pairs((wq[order] @ h).reshape(heads, head_dim), positions)
    np.testing.assert_allclose(q_cpp.reshape(len(positions), -1), q_hf.reshape(len(positions), -1)[:, order])
    k_hf = _rotate_half((wk @ h).reshape(heads, head_dim), positions)
    k_cpp = _rotate_pairs((wk[order] @ h).reshape(heads, head_dim), positions)
    np.testing.assert_allclose(
        np.einsum("phd,qhd->pqh", q_cpp, k_cpp), np.einsum("phd,qhd->pqh", q_hf, k_hf), rtol=1e-9, atol=1e-9
    )
    if head_dim > 2:  # without the permutation the two rotaries differ: the test can fail
        assert not np.allclose(_rotate_pairs((wq @ h).reshape(heads, head_dim), positions), q_hf)


def test_an_odd_head_dim_has_no_rotary_pairs():
    from bench.gguf_llama import rope_interleave_order

    with pytest.raises(zoo.AttnzooError, match="odd"):
        rope_interleave_order(2, 5)


@pytest.mark.parametrize(
    "change, needle",
    [
        ({"model_type": "mistral"}, "only 'llama'"),
        ({"hidden_act": "gelu"}, "silu"),
        ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5}}, "llama3"),
        ({"attention_bias": True}, "biases"),
    ],
)
def test_the_gguf_builder_refuses_what_it_would_not_write_exactly(tmp_path, change, needle):
    from bench.gguf_llama import build_llama

    config = {"model_type": "llama", "hidden_act": "silu", **change}
    (tmp_path / "config.json").write_text(json.dumps(config))
    result = build_llama({"checkpoint": str(tmp_path), "model": str(tmp_path / "m.gguf"), "precision": "fp32"})
    assert result["ok"] is False and needle in result["error"] and "\n" not in result["error"]
    assert not (tmp_path / "m.gguf").exists()


def test_the_gguf_names_are_llama_cpps():
    from bench.gguf_llama import _gguf_name

    assert _gguf_name("model.embed_tokens.weight") == "token_embd.weight"
    assert _gguf_name("lm_head.weight") == "output.weight"
    assert _gguf_name("model.layers.3.self_attn.k_proj.weight") == "blk.3.attn_k.weight"
    assert _gguf_name("model.layers.0.mlp.down_proj.weight") == "blk.0.ffn_down.weight"
    assert _gguf_name("model.layers.0.post_attention_layernorm.weight") == "blk.0.ffn_norm.weight"
    assert _gguf_name("model.layers.0.self_attn.rotary_emb.inv_freq") is None
    with pytest.raises(zoo.AttnzooError, match="no llama.cpp name"):
        _gguf_name("model.layers.0.self_attn.q_norm.weight")


def test_bf16_safetensors_widen_to_their_float32_values(tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("safetensors")
    from safetensors.torch import save_file

    from bench.gguf_llama import _bf16_tensor

    weights = {"a": torch.randn(3, 5).to(torch.bfloat16), "b": torch.randn(7).to(torch.bfloat16)}
    save_file(weights, str(tmp_path / "w.safetensors"))
    for key, value in weights.items():
        assert (_bf16_tensor(str(tmp_path / "w.safetensors"), key) == value.float().numpy()).all()


def test_the_gguf_is_written_with_llama_cpps_names_and_vocabulary(tiny_checkpoint, tmp_path):
    gguf = pytest.importorskip("gguf", reason="gguf-py (pip install gguf) writes and reads the GGUF")
    pytest.importorskip("safetensors")
    from bench.gguf_llama import write_llama_gguf

    out = tmp_path / "m.gguf"
    info = write_llama_gguf(str(tiny_checkpoint), str(out))
    reader = gguf.GGUFReader(str(out))
    names = {t.name for t in reader.tensors}
    assert info["tensors"] == len(names) == 3 + 9  # embeddings, final norm, output; 9 per block
    assert {"token_embd.weight", "output.weight", "blk.0.attn_q.weight", "blk.0.ffn_gate.weight"} <= names
    fields = reader.fields
    assert fields["general.architecture"].contents() == "llama"
    assert fields["llama.vocab_size"].contents() == 300 and len(fields["tokenizer.ggml.tokens"].contents()) == 300
    assert fields["llama.attention.head_count_kv"].contents() == 2
    assert fields["tokenizer.ggml.bos_token_id"].contents() == BOS


@pytest.mark.slow
def test_llama_cpp_from_its_environment_generates_transformers_tokens(tiny_checkpoint):
    """The bench writes the GGUFs in llama-cpp-python's environment (ATTNZOO_LLAMA_PYTHON names its
    python); fp32 gives transformers' greedy tokens, int8 and int4 run from their quantized files."""
    import os

    python = os.environ.get("ATTNZOO_LLAMA_PYTHON")
    if not python:
        pytest.skip("set ATTNZOO_LLAMA_PYTHON to the python of an environment with llama-cpp-python, gguf, safetensors")
    report = benchmark_generate(
        str(tiny_checkpoint),
        prompts=[12],
        new=6,
        precisions=["fp32", "int8", "int4"],
        threads=1,
        warmup=0,
        repeats=1,
        llama_python=python,
        paths=["transformers-dynamic", "llama.cpp"],
        progress=False,
    )
    rows = {(r["path"], r["precision"]): r for r in report["rows"]}
    assert all(r["ok"] for r in rows.values()), rows
    assert rows[("llama.cpp", "fp32")]["agree_count"] == 6
    types = {p: report["builds"][f"llama.cpp {p}"]["tensor_types"] for p in ("fp32", "int8", "int4")}
    assert types["fp32"] == {"F32": 12} and "Q8_0" in types["int8"] and "Q4_0" in types["int4"]


def test_generate_on_cuda_is_refused_in_one_line_where_cuda_cannot_run(capsys):
    """--provider cuda asks ONNX Runtime first: here (no working CUDA provider) the refusal names why, before any
    checkpoint is made or worker started."""
    from runtime.providers import cuda_status

    ok, why = cuda_status()
    if ok:
        pytest.skip("this machine has a working CUDA provider")
    msg = one_line_error(capsys, ["bench", "--generate", "--checkpoint", "random", "--provider", "cuda"])
    assert f"--provider cuda: {why}" in msg


def test_cuda_settings_reach_both_workers_and_the_table(tiny_checkpoint, monkeypatch):
    """On CUDA every build and time job carries the provider, dtype, CUDA graphs and TF32 (the workers export for
    CUDA and run transformers on the GPU in that dtype), the CPU-only peers are rows saying why, and the table's
    head says where it ran. The workers are scripted: the jobs are the subject (CUDA is not here)."""
    import bench.generate as generate
    import runtime.providers

    jobs = []

    def spawn(python, job, timeout):
        jobs.append(job)
        if job["stage"] == "build":
            return {"ok": True}
        return {"ok": True, "end_to_end_s": 0.1, "tokens": [1, 2], "tokens_per_s": 20.0, "prefill_s": 0.05}

    monkeypatch.setattr(generate, "_spawn", spawn)
    monkeypatch.setattr(runtime.providers, "cuda_status", lambda: (True, "test"))
    report = benchmark_generate(
        str(tiny_checkpoint),
        prompts=[8],
        new=2,
        precisions=["fp32"],
        genai_python=sys.executable,
        progress=False,
        device={"provider": "cuda", "dtype": "float16", "cuda_graph": True},
    )
    want = {"provider": "cuda", "dtype": "float16", "cuda_graph": True, "tf32": False}
    assert jobs and all({k: j[k] for k in want} == want for j in jobs)
    assert {j["path"] for j in jobs} == {"attnzoo", "transformers-dynamic", "transformers-static"}
    assert {s["path"] for s in report["skipped"]} == {"onnxruntime-genai", "llama.cpp"}
    assert all("measured on the CPU here" in s["why"] for s in report["skipped"])
    assert report["device"] == want
    assert ", CUDA float16, CUDA graphs, B 1," in format_generate_table({**report, "rows": []})
