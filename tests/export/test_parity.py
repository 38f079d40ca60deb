"""Every registered variant x every lowering: eager torch vs ONNX Runtime at unseen shapes."""

import copy

import pytest
import torch

import zoo
from export import OnnxSession
from export.names import LOWERINGS
from helpers import ALL_NAMES, BIG_NAMES, matrix, one_line_error, small_overrides
from parity.matrix import SHAPES, TOLERANCE, check, errors, format_matrix

# the export traced (b, t, s) = (2, 5, 7); the parity grid must avoid it and cover t = 1, b = 1
assert all((b, t) != (2, 5) for b, t, _ in SHAPES)
assert {1} <= {b for b, _, _ in SHAPES} and {1} <= {t for _, t, _ in SHAPES}


def _assert_pass(row):
    assert row.status == "PASS", (
        f"{row.name} {row.lowering} {row.dtype} {row.case}: {row.status} "
        f"max abs {row.max_abs:.2e}, max rel {row.max_rel:.2e}: {row.reason}"
    )
    assert row.shapes == len(SHAPES)


# Three matrices over every registered name: masked (a bool mask with an empty row, a head mask, the
# weights from decomposed), plain (no mask input: the default graph, SDPA's is_causal) and fp16. In
# the default run the three split the names (helpers.matrix's share): each name is traced once, in
# one of the three, under one lowering turning with the name, so every (matrix, traced lowering) pair
# meets a few names; ort-gqa (built by hand, milliseconds) takes every name in all three, and a family
# preset (helpers.FAMILY_PRESETS) is traced in the masked matrix. The rest runs under -m slow.
@pytest.mark.parametrize("name, lowering", matrix(ALL_NAMES, rotate=2, share=2))
def test_parity_fp32_masked(name, lowering, tmp_path):
    _assert_pass_or_unexpressible(
        check(name, lowering, case="masked", dtype="float32", workdir=tmp_path, **small_overrides(name))
    )


@pytest.mark.parametrize("name, lowering", matrix(ALL_NAMES, rotate=0, families=False, share=0))
def test_parity_fp32_plain(name, lowering, tmp_path):
    _assert_pass_or_unexpressible(
        check(name, lowering, case="plain", dtype="float32", workdir=tmp_path, **small_overrides(name))
    )


@pytest.mark.slow
@pytest.mark.parametrize("lowering", LOWERINGS)
@pytest.mark.parametrize("name", BIG_NAMES)
def test_parity_fp32_full_width(name, lowering, tmp_path):
    _assert_pass_or_unexpressible(check(name, lowering, case="masked", dtype="float32", workdir=tmp_path))


def _assert_pass_or_unexpressible(row):
    """PASS, or SKIP because the lowering cannot express the spec (why_not says why, in one line)."""
    if row.status == "SKIP":
        assert row.reason and "\n" not in row.reason
        pytest.skip(row.reason)
    _assert_pass(row)


@pytest.mark.parametrize("name, lowering", matrix(ALL_NAMES, rotate=1, families=False, share=1))
def test_parity_fp16(name, lowering, tmp_path):
    row = check(name, lowering, case="masked", dtype="float16", workdir=tmp_path, **small_overrides(name))
    if row.status == "SKIP":
        pytest.skip(row.reason)  # ONNX Runtime's CPU provider lacks an fp16 kernel: said, not hidden
    _assert_pass(row)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("lowering", LOWERINGS)
@pytest.mark.parametrize("name", ALL_NAMES)
def test_parity_cuda(name, lowering, dtype, tmp_path, cuda_ok):
    _assert_pass_or_unexpressible(
        check(name, lowering, case="masked", dtype=dtype, provider="cuda", workdir=tmp_path, **small_overrides(name))
    )


def test_parity_can_fail(monkeypatch, tmp_path):
    """A model whose weights differ from the eager module's must FAIL (the check is not vacuous)."""
    import parity.matrix as parity

    real_export = parity.export_onnx

    def export_other_weights(module, path, **kw):
        other = zoo.MultiHeadAttention(module.spec).eval()
        return real_export(other, path, **kw)

    monkeypatch.setattr(parity, "export_onnx", export_other_weights)
    row = check("mha-separate-bias", "decomposed", workdir=tmp_path)
    assert row.status == "FAIL" and row.max_abs > 1e-3
    assert "FAIL" in format_matrix([row]) and "1 failed" in format_matrix([row])


def test_parity_shows_nan_as_nan(monkeypatch, tmp_path):
    """An ONNX model whose output holds NaN: the row shows NaN (not inf) and says so."""
    import numpy as np

    import parity.matrix as parity

    real_export = parity.export_onnx

    def export_with_a_nan(module, path, **kw):
        other = copy.deepcopy(module)
        with torch.no_grad():
            other.out_proj.weight[0, 0] = float("nan")
        return real_export(other, path, **kw)

    monkeypatch.setattr(parity, "export_onnx", export_with_a_nan)
    row = check("mha-separate-bias", "decomposed", workdir=tmp_path)
    assert row.status == "FAIL" and row.max_abs != row.max_abs and "NaN" in row.reason
    assert "| nan | nan |" in format_matrix([row])
    a = np.array([1.0, 2.0, 3.0])
    assert all(v != v for v in errors(np.array([np.nan, 2, np.inf]), a, TOLERANCE["float32"])[:2])
    assert errors(np.array([np.inf, 2, 3]), a, TOLERANCE["float32"])[:2] == (float("inf"), float("inf"))


def test_errors_helper():
    import numpy as np

    tol = TOLERANCE["float32"]
    a = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    assert errors(a, a, tol) == (0.0, 0.0, True)
    assert errors(a + 1e-3, a, tol)[2] is False
    assert errors(np.array([np.nan, 2, 3]), a, tol)[2] is False
    assert errors(a[:2], a, tol)[2] is False


def test_weights_case_checks_attention_weights(tmp_path):
    """The decomposed masked case exports the weights output; parity covers it too."""
    from export import OnnxSession, export_onnx

    r = export_onnx("mha-causal", tmp_path / "w.onnx", lowering="decomposed", need_weights=True, with_mask=True)
    sess = OnnxSession(r.path, provider="cpu", verbose=False)
    x = torch.randn(3, 9, 64)
    y, a = sess.run(x)
    torch.testing.assert_close(a.sum(-1), torch.ones(3, 4, 9))
    assert (a.triu(1) == 0).all()
    y_ref, a_ref = r.module(x, need_weights=True)
    torch.testing.assert_close(y, y_ref, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(a, a_ref, rtol=1e-4, atol=1e-5)


def test_fp16_decomposed_export_of_large_activations(tmp_path):
    """The explicit path's fp32 softmax carries into the decomposed ONNX graph."""
    import numpy as np

    from export import OnnxSession, export_onnx

    r = export_onnx(
        "mha-separate-nobias", tmp_path / "h.onnx", lowering="decomposed", dtype="float16", d_model=128, heads=1
    )
    sess = OnnxSession(r.path, provider="cpu", verbose=False)
    x = (np.random.randn(1, 8, 128) * 100).astype(np.float16)
    assert np.isfinite(sess.run(x)).all()


def test_check_refuses_overrides_with_a_module():
    with pytest.raises(TypeError, match="overrides"):
        check(zoo.create("mqa"), "decomposed", heads=2)


def test_a_constant_reference_is_not_a_pass(tmp_path):
    """With W_O = 0 and no bias every output is 0 and any model would 'match': that must FAIL."""
    m = zoo.create("mha-separate-nobias").eval()
    with torch.no_grad():
        m.out_proj.weight.zero_()
    row = check(m, "decomposed", workdir=tmp_path)
    assert row.status == "FAIL" and "constant" in row.reason


# -- fp16: where it overflows, and where it no longer does; a provider that cannot run ---------


def _fp16_case(block, scale: float):
    """(x fp16, reference y in fp32 on the fp16-rounded weights) at `scale` x a unit normal."""
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(2, 7, 64, generator=g) * scale).half()
    ref = zoo.create("mha-combined-bias")
    ref.load_state_dict(block.state_dict())
    ref = ref.half().float().eval()
    with torch.no_grad():
        return x, ref(x.float())


def _rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    y = y.float()
    if not torch.isfinite(y).all():
        return float("inf")
    return float((y - ref).abs().max() / ref.abs().max())


@pytest.mark.parametrize("scale", [1.0, 300.0, 15000.0])
def test_eager_fp16_is_finite_on_both_paths(exports, scale):
    m = zoo.create("mha-combined-bias")
    m.load_state_dict(exports["self"].state_dict())
    m = m.half().eval()
    x, ref = _fp16_case(exports["self"], scale)
    with torch.no_grad():
        y_fused = m(x)
        y_explicit, attn = m(x, need_weights=True)  # was inf/NaN at 300x: Q K^T in fp16
    assert _rel(y_fused, ref) < 1e-2 and _rel(y_explicit, ref) < 1e-2
    assert torch.isfinite(attn).all()


# Measured on onnxruntime 1.31 CPU (docs/precision.md, "fp16"), x = k * randn, fixed weights and
# input: (largest k within tolerance, a k past the limit, what happens there).
FP16_LIMITS = {
    "decomposed-fp16": (15000.0, 20000.0, "inf"),  # the fp16 projections overflow: fp16's range
    # ORT's CPU Attention forms Q K^T in fp16 (inf at 300x); the export hands it fp32 Q, K, V
    # (MultiHeadAttention.sdpa_fp32), so only the fp16 projections limit it, as for decomposed.
    "onnx-attention-fp16": (15000.0, 20000.0, "inf"),
    "ort-mha-masked-fp16": (250.0, 300.0, "wrong"),  # finite, but far off
}


CAUSAL = torch.ones(7, 7, dtype=torch.bool).tril()


def _fp16_run(exports, model: str, scale: float) -> float:
    sess = OnnxSession(exports[model], "cpu", verbose=False)
    masked = "masked" in model
    x, _ = _fp16_case(exports["self"], scale)
    ref = zoo.create("mha-combined-bias")
    ref.load_state_dict(exports["self"].state_dict())
    with torch.no_grad():
        want = ref.half().float().eval()(x.float(), mask=CAUSAL if masked else None)
    return _rel(sess.run(x, mask=CAUSAL) if masked else sess.run(x), want)


@pytest.mark.parametrize("model", sorted(FP16_LIMITS))
def test_fp16_exports_hold_up_to_their_documented_limit(exports, model):
    for scale in (1.0, 30.0, FP16_LIMITS[model][0]):
        assert _fp16_run(exports, model, scale) < 1e-2, (model, scale)


@pytest.mark.parametrize("model", sorted(FP16_LIMITS))
def test_fp16_exports_past_their_limit_fail_as_the_readme_says(exports, model):
    # If this starts failing, ONNX Runtime (or the lowering) changed: move FP16_LIMITS and the
    # fp16 table of docs/precision.md with it; don't delete the test.
    _, past, how = FP16_LIMITS[model]
    rel = _fp16_run(exports, model, past)
    if how == "inf":
        assert rel == float("inf"), (model, rel)
    else:
        assert 0.1 < rel < float("inf"), (model, rel)


def test_fp16_projections_overflow_is_the_real_limit(exports):
    # Past ~65504 / (|x| |W|) the fp16 projections themselves are inf: fp16's range, not a bug.
    m = zoo.create("mha-combined-bias")
    m.load_state_dict(exports["self"].state_dict())
    m = m.half().eval()
    x, _ = _fp16_case(exports["self"], 1e5)
    with torch.no_grad():
        assert not torch.isfinite(m.qkv_proj(x)).all()


def test_parity_with_an_unusable_provider_fails(capsys):
    from runtime.session import cuda_status

    ok, why = cuda_status()
    if ok:
        pytest.skip("this machine has a working CUDA provider")
    line = one_line_error(capsys, ["parity", "mha-causal", "--provider", "cuda", "--lowering", "decomposed", "-q"])
    assert why in line


def test_api_checks_skip_an_unusable_provider_alike():
    """Without the CLI's refusal, both parity checks answer SKIP with the same reason."""
    import parity
    from runtime.session import cuda_status

    ok, why = cuda_status()
    if ok:
        pytest.skip("this machine has a working CUDA provider")
    full = parity.check("mha-causal", "decomposed", provider="cuda")
    step = parity.check_decode("mha-causal", "decomposed", provider="cuda")
    for row in (full, step):
        assert row.status == "SKIP" and why in row.reason, row


# T5's relative buckets are computed in the graph from the positions: 8 buckets up to distance 12,
# exported at t = 5 and run up to t = 64 (SHAPES), so a bucket table baked in for the export length, or
# a log bucket missed by ONNX Runtime's Log, would miss. Both directions (bidirectional for two
# lowerings, causal for one); the decode export (static cache, in-graph positions after a past) too.
T5_SMALL = dict(d_model=32, heads=4, scale=1.0, rel_buckets=8, rel_max_distance=12)


@pytest.mark.parametrize("lowering", ["decomposed", "onnx-attention", "ort-mha"])
def test_t5_buckets_at_unseen_lengths(lowering, tmp_path):
    causal = lowering == "onnx-attention"
    row = check("mha-separate-nobias", lowering, case="masked", workdir=tmp_path, causal=causal, **T5_SMALL)
    _assert_pass(row)
    gqa = check("mha-separate-nobias", "ort-gqa", case="masked", workdir=tmp_path, causal=True, **T5_SMALL)
    assert gqa.status == "SKIP" and "T5's bucketed bias" in gqa.reason


def test_t5_buckets_decode_with_the_static_cache(tmp_path):
    from parity.matrix import check_decode

    row = check_decode("mha-separate-nobias", "decomposed", cache="static", workdir=tmp_path, causal=True, **T5_SMALL)
    assert row.status == "PASS", f"{row.reason} (max abs {row.max_abs:.2e})"


def test_t5_bucket_edges_under_onnx_runtime(tmp_path):
    """T5's own 32 buckets up to 128 put range edges on whole distances (16, 32, 64, 128: log ratios of
    exactly 1/4, 1/2, 3/4, 1), where ONNX Runtime's Log rounding one ulp off T5's would move a bucket.
    With W_Q zeroed the scores are the bias alone, so one moved bucket moves y by far more than 1e-5;
    300 positions reach every edge in both directions."""
    from export import OnnxSession, export_onnx

    torch.manual_seed(0)
    m = zoo.create("t5-base-encoder", d_model=64, heads=4).eval()
    with torch.no_grad():
        m.q_proj.weight.zero_()
        m.mods["rel_buckets"].table.mul_(3)
    path = tmp_path / "t5.onnx"
    export_onnx(m, path, lowering="decomposed")
    x = torch.randn(1, 300, 64)
    with torch.no_grad():
        y = m(x)
    err = (torch.as_tensor(OnnxSession(str(path), "cpu").run(x)) - y).abs().max().item()
    assert err <= TOLERANCE["float32"].atol, f"max abs err {err:.2e}"


@pytest.mark.parametrize("kind", ["check", "check_decode"])
def test_parity_refuses_a_dtype_no_session_feeds(kind):
    """bfloat16 exports exist (for CUDA) but numpy has none: parity names the dtypes it runs, before any work."""
    import parity

    with pytest.raises(zoo.ArgumentError, match=r"dtype='bfloat16' .* float32, float16"):
        getattr(parity, kind)("llama-3-8b", "decomposed", dtype="bfloat16")
