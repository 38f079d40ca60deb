"""The int8 KV cache of whole-model exports (export/kv_int8.py, kv_precision="int8"): its generation against
the fp32 eager model within stated bounds, its buffers (int8 + a scale per position and kv head, a quarter of
the bytes), rows that do not depend on their batch mates, and the one-line refusals (a lowering that cannot
carry it, an unknown precision, the CLI's flag outside --whole and on a made .onnx).

One export of tests/peers/lm_cases.py's tiny random LLaMA, shared (about 30 CPU-seconds)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from export import OnnxSession, export_onnx
from export.kv_int8 import KVPrecisionError
from export.precision import rel_l2
from peers.lm import lm_from_hf
from runtime.kv_buffers import buffer_arrays, buffer_bytes

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "peers"))
import lm_cases  # noqa: E402 - small random transformers models, one per family

NEW = 16
MAX_LEN = 64
PREFIX = "past_key_values."
# The int8 cache against the fp32 eager model on lm_cases' random LLaMA (every weight N(0, 0.1)), measured
# 2026-12-04 on onnxruntime 1.31.1 CPU (AVX2 EPYC): the prompt's next-token logits 0.92% and 0.54% (relative
# L2, rows 0 and 1); greedy tokens equal to fp32's before the first divergence 10 and 16 of 16. Bounds with
# headroom for another CPU's kernels; the shipped checkpoint's figures are in docs/generation.md.
LOGIT_ERROR = 0.03
TOKENS_EQUAL = 0.5  # the share of greedy tokens equal to fp32's before the first divergence, per row


@pytest.fixture(scope="module")
def kv8(tmp_path_factory):
    lm = lm_from_hf(lm_cases.hf_model("llama")).eval()
    path = tmp_path_factory.mktemp("kv8") / "llama-kv8.onnx"
    result = export_onnx(lm, path, kv_precision="int8", max_len=MAX_LEN)
    return lm, result, OnnxSession(result.path, provider="cpu")


def _prompt_logits(sess: OnnxSession, ids: np.ndarray, n: int) -> np.ndarray:
    feeds = {"input_ids": ids, "attention_mask": np.ones((ids.shape[0], n), np.bool_), "past_len": np.array(0)}
    feeds.update(buffer_arrays(sess._sess.get_inputs(), ids.shape[0], n, PREFIX))
    return sess.run_feeds(feeds)[0]


def test_int8_cache_generation_agrees_with_the_fp32_model_within_its_bounds(kv8):
    lm, _, sess = kv8
    ids = lm_cases.prompt(batch=2, t=24)
    with torch.no_grad():
        want = lm(ids)[:, -1:].numpy()
    got = _prompt_logits(sess, ids.numpy(), 32)
    for row in range(2):
        assert rel_l2(got[row], want[row]) < LOGIT_ERROR, (row, rel_l2(got[row], want[row]))
    tokens = sess.generate(ids, NEW, eos_token_id=[])
    ref = lm.generate(ids, NEW)
    assert torch.equal(tokens[:, :24], ids)  # the prompt, exact
    for row in range(2):
        same = int(np.cumprod((tokens[row, 24:] == ref[row, 24:]).numpy()).sum())
        assert same >= TOKENS_EQUAL * NEW, (row, same, tokens[row, 24:], ref[row, 24:])


def test_a_rows_tokens_do_not_depend_on_its_batch_mates(kv8):
    """Every scale is a row's own and the integer products are exact: a row's tokens alone, left-padded
    beside a longer row, are the same."""
    _, _, sess = kv8
    long, short = lm_cases.prompt(batch=1, t=12, seed=2), lm_cases.prompt(batch=1, t=7, seed=3)
    batch = torch.cat([long, torch.cat([torch.zeros(1, 5, dtype=torch.long), short], 1)])
    mask = torch.ones_like(batch)
    mask[1, :5] = 0
    together = sess.generate(batch, NEW, attention_mask=mask, eos_token_id=[])
    assert torch.equal(together[0], sess.generate(long, NEW, eos_token_id=[])[0])
    assert torch.equal(together[1, 12:], sess.generate(short, NEW, eos_token_id=[])[0, 7:])


def test_the_int8_cache_is_int8_with_a_scale_per_position_and_kv_head(kv8):
    lm, result, sess = kv8
    assert sess.metadata["attnzoo.kv_precision"] == "int8" and result.kv_precision == "int8"
    assert result.lowering == "decomposed" and result.op_counts.get("MatMulInteger", 0) == 2 * lm.spec.layers
    spec = lm.spec.attention[0]
    types = {x.name: (x.type, list(x.shape)) for x in sess._sess.get_inputs() if x.name.startswith(PREFIX)}
    g, dk, dv = spec.kv_heads_, spec.d_k_, spec.d_v_
    assert types[f"{PREFIX}0.key"] == ("tensor(int8)", ["b", g, dk, "n"])  # keys stored transposed
    assert types[f"{PREFIX}0.value"] == ("tensor(int8)", ["b", g, "n", dv])
    assert types[f"{PREFIX}0.key_scale"] == types[f"{PREFIX}0.value_scale"] == ("tensor(float)", ["b", g, 1, "n"])
    b, n = 3, 128
    fp32 = lm.spec.layers * b * g * n * (dk + dv) * 4
    # a quarter of fp32's bytes, plus two fp32 scales per position and kv head (d 128: 0.27x; here d is small)
    expected = fp32 * (dk + dv + 8) / (4 * (dk + dv))
    assert buffer_bytes(sess._sess.get_inputs(), b, n, PREFIX) == expected
    assert sum(a.nbytes for a in buffer_arrays(sess._sess.get_inputs(), b, n, PREFIX).values()) == expected


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"lowering": "ort-gqa"}, "lowering='ort-gqa'"),
        ({"lowering": "onnx-attention"}, "lowering='onnx-attention'"),
        ({"kv_precision": "int4"}, "kv_precision='int4' is not one of fp32, int8"),
    ],
)
def test_a_kv_precision_the_export_cannot_carry_is_refused_in_one_line(options, words, tmp_path):
    lm = lm_from_hf(lm_cases.hf_model("llama")).eval()
    with pytest.raises(KVPrecisionError) as e:
        export_onnx(lm, tmp_path / "m.onnx", **{"kv_precision": "int8", **options})
    assert words in str(e.value) and len(str(e.value).splitlines()) == 1, str(e.value)
    assert not (tmp_path / "m.onnx").exists()


def test_the_cli_refuses_kv_precision_outside_a_whole_export_and_on_a_made_onnx(kv8, capsys):
    from cli.main import main

    assert main(["export", "mha-causal", "-o", "x.onnx", "--kv-precision", "int8"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--whole" in err and len(err.splitlines()) == 1, err
    _, result, _ = kv8
    assert main(["generate", str(result.path), "--prompt-ids", "3,4", "--kv-precision", "int8"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--kv-precision int8" in err and "own precision" in err and len(err.splitlines()) == 1, err


def test_which_lowerings_carry_an_int8_cache_is_their_records_field(monkeypatch, tmp_path):
    """kv_precision="int8" goes with the lowerings whose record has int8_cache (export/lowerings/), read by
    kv_int8.why_not and export_lm alike: a record that says no is refused by both, with no list of names kept
    beside the records."""
    import dataclasses

    from export import kv_int8
    from export.lowerings import RECORDS

    assert kv_int8.why_not("int8", "decomposed", "float32") is None
    monkeypatch.setitem(RECORDS, "decomposed", dataclasses.replace(RECORDS["decomposed"], int8_cache=False))
    monkeypatch.setitem(RECORDS, "onnx-attention", dataclasses.replace(RECORDS["onnx-attention"], int8_cache=True))
    assert "lowering='decomposed'" in kv_int8.why_not("int8", "decomposed", "float32")
    assert kv_int8.why_not("int8", "onnx-attention", "float32") is None
    lm = lm_from_hf(lm_cases.hf_model("llama")).eval()
    with pytest.raises(KVPrecisionError, match="no lowering of onnx-attention can express"):
        export_onnx(lm, tmp_path / "m.onnx", kv_precision="int8", lowering="auto", provider="cpu")
