"""Incremental decoding with a KV cache: eager block.decode, decode exports, the session loop.

Every causal preset is checked (at the shrunken width of helpers.py): decoding in any split gives
the rows of the full forward, eagerly and under ONNX Runtime for every decode lowering.
"""

import numpy as np
import pytest
import torch

import zoo
from export import OnnxSession, export_onnx
from export.names import LOWERINGS
from helpers import ALL_NAMES, create, matrix, small_overrides
from parity.matrix import check_decode

CAUSAL = [n for n in ALL_NAMES if zoo.spec(n).causal]


def _split_runs(m, x, key_mask=None):
    """Yield y from decode in three splits: prompt + single steps, chunks, all at once."""
    n = x.shape[1]
    for cuts in ([7, *range(8, n + 1)], [3, 11, n], [n]):
        ys, pk, pv, start = [], None, None, 0
        for end in cuts:
            km = None if key_mask is None else key_mask[:, :end]
            y, pk, pv = m.decode(x[:, start:end], pk, pv, key_mask=km)
            ys.append(y)
            start = end
        yield torch.cat(ys, 1), pk, pv


@pytest.mark.parametrize("name", CAUSAL)
def test_decode_in_any_split_is_the_full_forward(name):
    m = create(name).double().eval()
    x = torch.randn(2, 20, m.spec.d_model, dtype=torch.float64)
    full = m(x)
    for y, pk, pv in _split_runs(m, x):
        torch.testing.assert_close(y, full, rtol=0, atol=1e-12)
        g, dk, dv = m.spec.cache_widths_  # (g, d_k, d_v); a latent block's: (1, rope_dim, kv_lora_rank)
        assert pk.shape == (2, g, 20, dk) and pv.shape[-1] == dv


@pytest.mark.parametrize("name", CAUSAL)
def test_left_padded_rows_compute_what_they_would_alone(name):
    m = create(name).double().eval()
    x = torch.randn(3, 16, m.spec.d_model, dtype=torch.float64)
    key_mask = torch.ones(3, 16, dtype=torch.bool)
    key_mask[1, :5] = False
    key_mask[2, :16] = False  # a row with no real key at all: Z = 0 everywhere
    b_o = m.out_proj.bias.detach() if m.spec.bias else torch.zeros(m.spec.d_model, dtype=torch.float64)
    for y, _, _ in _split_runs(m, x, key_mask):
        torch.testing.assert_close(y[0], m(x[:1])[0], rtol=0, atol=1e-12)
        torch.testing.assert_close(y[1, 5:], m(x[1:2, 5:])[0], rtol=0, atol=1e-12)
        torch.testing.assert_close(y[1, :5], b_o.expand(5, -1), rtol=0, atol=1e-12)
        torch.testing.assert_close(y[2], b_o.expand(16, -1), rtol=0, atol=1e-12)


def test_decode_bad_input_is_one_clear_error():
    m = zoo.create("gqa", causal=True)
    x = torch.randn(2, 3, 64)
    pk, pv = torch.randn(2, 2, 4, 8), torch.randn(2, 2, 4, 8)
    with pytest.raises(ValueError, match="causal self-attention"):
        zoo.create("gqa", causal=False).decode(x)
    with pytest.raises(ValueError, match="causal self-attention"):
        zoo.create("cross-attention").decode(x)
    with pytest.raises(ValueError, match="together"):
        m.decode(x, pk)
    with pytest.raises(ValueError, match=r"past_key has shape \(2, 4, 4, 8\)"):
        m.decode(x, torch.randn(2, 4, 4, 8), pv)
    with pytest.raises(ValueError, match="4 positions but past_value 5"):
        m.decode(x, pk, torch.randn(2, 2, 5, 8))
    with pytest.raises(TypeError, match="float64"):
        m.decode(x, pk.double(), pv.double())
    with pytest.raises(ValueError, match=r"key_mask has shape \(2, 3\); expected \(b, p\+t\) = \(2, 7\)"):
        m.decode(x, pk, pv, key_mask=torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(TypeError, match="bool"):
        m.decode(x, key_mask=torch.ones(2, 3))


DECODE_LOWERINGS = list(LOWERINGS)


def _assert_pass(row):
    if row.status == "SKIP":
        assert row.reason and "\n" not in row.reason
        pytest.skip(row.reason)
    assert row.status == "PASS", f"{row.name} {row.lowering} {row.dtype}: {row.reason} (max abs {row.max_abs:.2e})"
    assert row.shapes == 2 * (26 + 4)  # per batch: the prompt, 25 steps, 4 chunks


# Every causal preset x ort-gqa by default, and a third of them (the matrix's share 0) with one traced
# lowering, rotating so that each traced lowering decodes two or three presets; the rest -m slow. The
# traced lowerings also decode in the static-cache matrix (test_static_cache.py) and whole models
# (test_lm_export.py).
@pytest.mark.parametrize("name, lowering", matrix(CAUSAL, rotate=0, families=False, share=0))
def test_decode_parity_fp32(name, lowering, tmp_path):
    _assert_pass(check_decode(name, lowering, dtype="float32", workdir=tmp_path, **small_overrides(name)))


# fp16 decode: ort-gqa for every causal preset by default; the traced lowerings under -m slow.
FP16_DECODE = [
    pytest.param(n, lw, marks=() if lw == "ort-gqa" else (pytest.mark.slow,), id=f"{n}-{lw}")
    for n in CAUSAL
    for lw in DECODE_LOWERINGS
]


@pytest.mark.parametrize("name, lowering", FP16_DECODE)
def test_decode_parity_fp16(name, lowering, tmp_path):
    _assert_pass(check_decode(name, lowering, dtype="float16", workdir=tmp_path, **small_overrides(name)))


@pytest.mark.cuda
@pytest.mark.parametrize("lowering", DECODE_LOWERINGS)
def test_decode_parity_cuda_fp16(lowering, tmp_path, cuda_ok):
    for name in ("llama-3-8b", "gemma-2-9b", "gpt2-small"):
        _assert_pass(
            check_decode(name, lowering, dtype="float16", provider="cuda", workdir=tmp_path, **small_overrides(name))
        )


def test_parity_names_the_step_of_a_miss(monkeypatch, tmp_path):
    """A cache that forgets the past must FAIL, and say at which step."""
    import runtime.decoding as decoding

    real = decoding.generate_steps

    def forgetful(sess, x_steps, past_key=None, past_value=None, key_mask=None):
        return real(sess, x_steps, past_key[:, :, :0], past_value[:, :, :0], key_mask[:, past_key.shape[2] :])

    monkeypatch.setattr(decoding, "generate_steps", forgetful)
    row = check_decode("mha-causal", "ort-gqa", workdir=tmp_path)
    assert row.status == "FAIL" and "step 1" in row.reason


def test_session_decode_api(tmp_path):
    m = zoo.create("mistral-7b", d_model=64, heads=4, kv_heads=2, d_k=16, window=4).eval()
    r = export_onnx(m, tmp_path / "d.onnx", lowering="ort-gqa", decode=True, cache="grow")
    assert [i[0] for i in r.inputs] == ["x", "past_key", "past_value"]
    assert [o[0] for o in r.outputs] == ["y", "present_key", "present_value"]
    assert r.outputs[1][2] == ("b", 2, "s", 16) and r.inputs[1][2] == ("b", 2, "p", 16)
    sess = OnnxSession(r.path, provider="cpu", verbose=False)
    assert sess.is_decode
    x = np.random.randn(1, 12, 64).astype(np.float32)
    y0, pk, pv = sess.decode(x[:, :4])  # numpy in, numpy out; empty past
    ys, pk, pv = sess.generate_steps(x[:, 4:], pk, pv)
    assert isinstance(ys, np.ndarray) and ys.shape == (1, 8, 64) and pk.shape == (1, 2, 12, 16)
    ref = m(torch.from_numpy(x)).detach().numpy()
    np.testing.assert_allclose(np.concatenate([y0, ys], 1), ref, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="token-by-token model"):
        sess.run(x)
    with pytest.raises(ValueError, match="no key_mask input"):
        sess.decode(x, key_mask=np.ones((1, 12), dtype=bool))
    with pytest.raises(ValueError, match="past_key has shape"):
        sess.decode(x, np.zeros((1, 3, 2, 16), np.float32), np.zeros((1, 2, 2, 16), np.float32))
    full = export_onnx("mha-causal", tmp_path / "f.onnx", lowering="ort-gqa")
    with pytest.raises(ValueError, match="full-sequence model"):
        OnnxSession(full.path, provider="cpu", verbose=False).decode(x)


@pytest.mark.parametrize("b", [2, 3])
@pytest.mark.parametrize("padded", [False, True], ids=["no-key-mask", "left-padded"])
def test_ort_gqa_runs_batched_chunks_after_a_past_as_eager_does(b, padded, tmp_path):
    """GroupQueryAttention refuses b > 1 with t > 1 and a past; sess.decode runs such a chunk one
    row at a time, each row with its own key_mask row, and matches eager block.decode."""
    torch.manual_seed(0)
    m = zoo.create("llama-3-8b", d_model=64, heads=4, kv_heads=2, d_k=16).eval()
    r = export_onnx(m, tmp_path / "d.onnx", lowering="ort-gqa", decode=True, with_mask=True)
    sess = OnnxSession(r.path, provider="cpu", verbose=False)
    n = 14
    x = torch.randn(b, n, 64)
    key_mask = torch.ones(b, n, dtype=torch.bool)
    if padded:
        key_mask[1, :4] = False
        key_mask[-1, :2] = False
    for cuts in ([3, 8, n], [1, 2, 9, n]):  # chunks after a past, a single token among them
        got, want, pk, pv, ek, ev, start = [], [], None, None, None, None, 0
        for end in cuts:
            km = key_mask[:, :end] if padded else None
            y, pk, pv = sess.decode(x[:, start:end].numpy(), pk, pv, None if km is None else km.numpy())
            with torch.no_grad():
                ye, ek, ev = m.decode(x[:, start:end], ek, ev, key_mask=km)
            got.append(y)
            want.append(ye.numpy())
            start = end
        np.testing.assert_allclose(np.concatenate(got, 1), np.concatenate(want, 1), rtol=1e-4, atol=1e-5)
        assert pk.shape == (b, 2, n, 16) and pv.shape == (b, 2, n, 16)
        if not padded:  # without padding a key's index is its position: the caches agree too
            np.testing.assert_allclose(pk, ek.numpy(), rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(pv, ev.numpy(), rtol=1e-4, atol=1e-5)
    y, _, _ = sess.decode(x[:, 5:], *(torch.from_numpy(a) for a in sess.decode(x[:, :5].numpy())[1:]))
    assert isinstance(y, torch.Tensor) and y.shape == (b, n - 5, 64)  # torch in, torch out


def test_decode_export_refuses_what_it_cannot_be(tmp_path):
    with pytest.raises(ValueError, match="causal"):
        export_onnx("mha-separate-bias", tmp_path / "a.onnx", decode=True)
    with pytest.raises(ValueError, match="need_weights"):
        export_onnx("mha-causal", tmp_path / "b.onnx", decode=True, need_weights=True)


def test_cli_export_run_parity_decode(tmp_path, capsys):
    from cli.main import main

    path = tmp_path / "m.onnx"
    sets = ["--set", "d_model=64", "--set", "heads=4", "--set", "kv_heads=2", "--set", "d_k=16"]
    assert main(["export", "gemma-2-9b", *sets, "--decode", "--cache", "grow", "-o", str(path)]) == 0
    assert "present_key float32[b, 2, s, 16]" in capsys.readouterr().out
    assert main(["run", str(path), "-b", "2", "-t", "5", "--steps", "6"]) == 0
    out = capsys.readouterr().out
    assert "ms per token" in out and "finite    True" in out
    assert main(["parity", "gemma-2-9b", "--decode", "--lowering", "ort-gqa", "-q", *sets]) == 0
    out = capsys.readouterr().out  # both caches: ort-gqa keeps the growing and the static one
    assert "2 passed, 0 failed" in out and "| decode |" in out and "| decode-static |" in out
    assert main(["export", "mha-separate-bias", "--decode", "-o", str(tmp_path / "x.onnx")]) == 2
    assert "causal self-attention" in capsys.readouterr().err


def test_auto_decode_lowering_follows_the_measurements(tmp_path):
    from export.choice import decode_order

    assert decode_order("cpu", zoo.spec("llama-3-8b"))[0] == "ort-gqa"  # shared kv heads
    assert decode_order("cpu", zoo.spec("gpt2-small"))[0] == "onnx-attention"  # one kv head per head
    # The growing cache: the fused op where it applies (d_k 16: GQA's rotary-free fast path).
    r = export_onnx("gqa", tmp_path / "a.onnx", decode=True, cache="grow", d_model=128)
    assert r.lowering == "ort-gqa"
    # The default on the CPU is the static cache (measured faster), kept by the decomposed graph;
    # a lowering that cannot keep one gets the growing cache; CUDA keeps the growing one (unmeasured).
    assert export_onnx("gqa", tmp_path / "b.onnx", decode=True, d_model=128).lowering == "decomposed"
    assert OnnxSession(tmp_path / "b.onnx", "cpu", verbose=False).cache == "static"
    r = export_onnx("gqa", tmp_path / "c.onnx", decode=True, lowering="onnx-attention", d_model=128)
    assert OnnxSession(r.path, "cpu", verbose=False).cache == "grow"
    r = export_onnx("gqa", tmp_path / "d.onnx", decode=True, lowering="ort-gqa", d_model=128)
    assert OnnxSession(r.path, "cpu", verbose=False).cache == "static"  # its shared buffer
    from export.choice import decode_cache

    assert decode_cache("cuda", "auto", None) == "grow" and decode_cache("cpu", "auto", None) == "static"
