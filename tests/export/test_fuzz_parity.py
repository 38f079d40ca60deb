"""Property-based parity: random valid specs x shapes (1s included) x masks x every lowering that
can express the request, eager torch against ONNX Runtime, fp32 and fp16; and, in eager torch
alone (cheap, so many more examples), the fused path against the explicit one with bool and
float masks and fully masked rows.

Derandomized with a fixed budget (tests/strategies.py); ATTNZOO_FUZZ_EXAMPLES=500 for the long
run whoever changes a lowering should do.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

import zoo
from export import OnnxSession, export_onnx
from export.choice import why_not
from export.names import CACHES, LOWERINGS
from parity.matrix import TOLERANCE, check
from strategies import bool_mask, decode_runs, decode_specs, float_mask, fuzz_settings, row_scales, shapes, specs

# Each ONNX example is one export (~2-4 s on 2 cores); the eager ones cost milliseconds.
ONNX_EXAMPLES = 2
QUANTIZED_EXAMPLES = 2  # each also runs a mixed-scale batch (and a scaled future when causal)
EAGER_EXAMPLES = 60


@fuzz_settings(ONNX_EXAMPLES)
@given(
    spec=specs(),
    lowering=st.sampled_from(LOWERINGS),
    dtype=st.sampled_from(["float32", "float16"]),
    case=st.sampled_from(["plain", "masked"]),
    shape_list=st.lists(shapes(), min_size=2, max_size=4),
)
def test_onnx_runtime_matches_eager(spec, lowering, dtype, case, shape_list, tmp_path_factory):
    """At shapes the export never saw, with a fully masked row and an ablated head when masked."""
    need_weights = case == "masked" and lowering == "decomposed"
    assume(why_not(lowering, spec, need_weights=need_weights) is None)  # else draw another
    module = zoo.MultiHeadAttention(spec).eval()
    with torch.no_grad():  # torch zero-initialises no biases, but make every parameter count
        for p in module.parameters():
            p.add_(0.05 * torch.randn_like(p))
    row = check(module, lowering, case=case, dtype=dtype, shapes=shape_list, workdir=tmp_path_factory.getbasetemp())
    if row.status == "SKIP":  # only for a kernel ONNX Runtime's CPU provider lacks (fp16), said in one line
        assert row.reason.startswith("ONNX Runtime cpu has no float16 kernel"), row.reason
        return
    if row.status == "FAIL" and "constant" in row.reason:
        return  # e.g. h = 1 with every key masked: nothing to compare, not a miss
    assert row.status == "PASS", (spec.describe(), lowering, dtype, case, shape_list, row)


@fuzz_settings(QUANTIZED_EXAMPLES)
@given(
    spec=specs(),
    lowering=st.sampled_from(LOWERINGS),
    precision=st.sampled_from(["int8", "int4"]),
    case=st.sampled_from(["plain", "masked"]),
    scales=row_scales(),
    shape=shapes(),
)
def test_quantized_rows_in_mixed_scale_batches_match_eager(
    spec, lowering, precision, case, scales, shape, tmp_path_factory
):
    """A quantized export through parity: its error bound at a random shape, then a batch whose rows
    are scaled differently (each row must equal that row alone; the scale-1 row is held to the bound)
    and, for a causal block, its later positions scaled 20x (the earlier ones must not move)."""
    need_weights = case == "masked" and lowering == "decomposed"
    assume(why_not(lowering, spec, need_weights=need_weights) is None)
    module = zoo.MultiHeadAttention(spec).eval()
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.05 * torch.randn_like(p))
    workdir = tmp_path_factory.getbasetemp()
    row = check(module, lowering, case=case, precision=precision, shapes=[shape], row_scales=scales, workdir=workdir)
    if row.status == "FAIL" and "constant" in row.reason:
        return  # e.g. h = 1 with every key masked: nothing to compare, not a miss
    assert row.status == "PASS", (spec.describe(), lowering, precision, case, scales, shape, row)


@fuzz_settings(ONNX_EXAMPLES)
@given(spec=decode_specs(), lowering=st.sampled_from(LOWERINGS), run=decode_runs(), cache=st.sampled_from(CACHES))
def test_batched_decode_in_chunks_matches_eager(spec, lowering, run, cache, tmp_path_factory):
    """A decode export (growing or static cache) fed b rows in random splits (chunks after a past
    included), rows left-padded through key_mask: each row's y is that row's eager forward alone."""
    assume(why_not(lowering, spec, decode=True, provider="cpu", cache=cache) is None)
    b, cuts, pads = run
    module = zoo.MultiHeadAttention(spec).eval()
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.05 * torch.randn_like(p))
    folder = tmp_path_factory.mktemp("fuzz_decode")
    n = cuts[-1]
    capacity = {"max_len": n} if cache == "static" else {}
    export_onnx(module, folder / "d.onnx", lowering=lowering, decode=True, with_mask=True, cache=cache, **capacity)
    sess = OnnxSession(folder / "d.onnx", provider="cpu", verbose=False)
    x = torch.randn(b, n, spec.d_model)
    key_mask = torch.ones(b, n, dtype=torch.bool)
    for r, pad in enumerate(pads):
        key_mask[r, :pad] = False
    ys, pk, pv, start = [], None, None, 0
    for end in cuts:
        y, pk, pv = sess.decode(x[:, start:end], pk, pv, key_mask=key_mask[:, :end])
        ys.append(y)
        start = end
    got = torch.cat(ys, 1)
    with torch.no_grad():
        for r, pad in enumerate(pads):  # a padded position has no key: y = b_O
            want = torch.zeros(n, spec.d_model)
            want[pad:] = module(x[r : r + 1, pad:])[0]
            want[:pad] = module.out_proj.bias if spec.bias else 0.0
            _close(got[r], want, torch.float32)


def _close(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> None:
    tol = TOLERANCE["float16" if dtype == torch.float16 else "float32"]
    torch.testing.assert_close(a.float(), b.float(), rtol=tol.rtol * 2, atol=tol.atol * 2)


@fuzz_settings(EAGER_EXAMPLES)
@given(spec=specs(), shape=shapes(), kind=st.sampled_from(["none", "bool", "float"]), data=st.data())
def test_eager_fused_matches_explicit(spec, shape, kind, data):
    """SDPA and the written-out softmax agree on every mask; a row with no key gives Z = 0."""
    b, t, s = shape
    s = s if spec.is_cross else t
    module = zoo.MultiHeadAttention(spec).eval()
    x = torch.randn(b, t, spec.d_model)
    ctx = torch.randn(b, s, spec.d_context) if spec.is_cross else None
    if kind == "bool":
        mask = bool_mask(data.draw, b, t, s, empty_row=data.draw(st.booleans()))
    elif kind == "float":
        mask = float_mask(data.draw, b, t, s)
    else:
        mask = None
    with torch.no_grad():
        y_fused = module(x, ctx, mask)
        y_explicit, attn = module(x, ctx, mask, need_weights=True)
    assert torch.isfinite(y_fused).all() and torch.isfinite(attn).all()
    _close(y_fused, y_explicit, torch.float32)
    if mask is not None:
        allowed = mask if mask.dtype == torch.bool else mask > float("-inf")
        if spec.causal:
            allowed = allowed & torch.ones(t, s, dtype=torch.bool).tril()
        empty = ~allowed.any(-1)  # (b, 1, t): rows with no allowed key
        if empty.any():
            assert (attn.masked_select(empty[..., None].expand_as(attn)) == 0).all()
            rows = y_fused[empty[:, 0]]
            want = module.out_proj.bias if spec.bias else torch.zeros(spec.d_model)
            _close(rows, want.expand_as(rows), torch.float32)


@fuzz_settings(EAGER_EXAMPLES // 2)
@given(spec=specs(), shape=shapes(), scale=st.sampled_from([1.0, 30.0, 300.0]))
def test_eager_fp16_is_finite_and_matches_fp32(spec, shape, scale):
    """fp16 blocks stay finite at large activations (scores from fp32 copies of Q and K), and
    match fp32 on the same fp16-rounded weights at unit scale."""
    b, t, s = shape
    s = s if spec.is_cross else t
    ref = zoo.MultiHeadAttention(spec).eval()
    half = zoo.MultiHeadAttention(spec).eval()
    half.load_state_dict(ref.state_dict())
    half = half.half()
    ref = ref.half().float()  # the same fp16-rounded weights, in fp32
    x = (torch.randn(b, t, spec.d_model) * scale).half()
    ctx = (torch.randn(b, s, spec.d_context) * scale).half() if spec.is_cross else None
    with torch.no_grad():
        want = ref(x.float(), None if ctx is None else ctx.float())
        for need_weights in (False, True):
            out = half(x, ctx, need_weights=need_weights)
            y = out[0] if need_weights else out
            assert torch.isfinite(y).all(), (spec.describe(), shape, scale, need_weights)
            if scale == 1.0:  # at 30x+ the logits are so sharp that fp16's own rounding decides
                err = (y.float() - want).abs().max() / want.abs().max().clamp_min(1e-3)
                assert err < 2e-2, (spec.describe(), shape, scale, need_weights, float(err))


@fuzz_settings(EAGER_EXAMPLES // 3)
@given(spec=specs(), shape=shapes(), data=st.data())
def test_nan_in_a_float_mask_is_refused_everywhere(spec, shape, data):
    b, t, s = shape
    s = s if spec.is_cross else t
    module = zoo.MultiHeadAttention(spec).eval()
    mask = float_mask(data.draw, b, t, s)
    i = data.draw(st.integers(0, mask.numel() - 1))
    mask.view(-1)[i] = float("nan")
    ctx = torch.randn(b, s, spec.d_context) if spec.is_cross else None
    for need_weights in (False, True):
        with pytest.raises(zoo.InputError, match="NaN"):
            module(torch.randn(b, t, spec.d_model), ctx, mask, need_weights=need_weights)


@fuzz_settings(ONNX_EXAMPLES)
@given(
    spec=specs(cross=False, causal=True, d_v_equals_d_k=True),
    decode=st.booleans(),
    shape=shapes(),
)
def test_what_auto_picks_runs(spec, decode, shape, tmp_path_factory):
    """`auto` only picks a lowering whose kernel runs the block: causal blocks whose head size
    is not a multiple of 8 once exported to ort-gqa and failed at run time."""
    from export import OnnxSession, export_onnx

    module = zoo.MultiHeadAttention(spec).eval()
    path = tmp_path_factory.mktemp("auto") / "m.onnx"
    r = export_onnx(module, path, lowering="auto", decode=decode)
    sess = OnnxSession(r.path, provider="cpu", verbose=False)
    b, t, _ = shape
    x = torch.randn(b, t, spec.d_model)
    with torch.no_grad():
        if decode:
            y, _, _ = sess.decode(x)
            want, _, _ = module.decode(x)
        else:
            y, want = sess.run(x), module(x)
    tol = TOLERANCE["float32"]
    torch.testing.assert_close(y, want, rtol=tol.rtol, atol=tol.atol)
