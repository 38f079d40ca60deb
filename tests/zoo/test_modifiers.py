"""Rotary positions, ALiBi, T5's relative buckets, sliding window, softcap and QK-norm: their math, checks
and head operations."""

import math

import pytest
import torch
from einops import rearrange

import zoo
import zoo.heads  # zoo loads its modules on first use; this file reads zoo.heads directly
from zoo.modifiers import ALiBi, RelativeBuckets, Rotary, alibi_slopes, relative_bucket

D = dict(d_model=64, heads=4)


def close(a, b, tol=1e-6):
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


@pytest.mark.parametrize(
    "fields, match",
    [
        (dict(window=4, d_context=32), "self-attention only"),
        (dict(window=0, causal=True), "integer in 1..2"),
        (dict(window=2**40, causal=True), "integer in 1..2"),
        (dict(rope_theta=1e30), "rope_theta"),
        (dict(softcap=1e30), "softcap"),
        (dict(rope_theta=1e4, rope_dim=7), "even"),
        (dict(rope_theta=1e4, rope_dim=32), "even integer in 2..d_k=16"),
        (dict(rope_theta=1e4, d_context=32), "cross-attention"),
        (dict(rope_dim=8), "set rope_theta"),
        (dict(rope_theta=float("nan")), "rope_theta"),
        (dict(softcap=0.0), "softcap"),
        (dict(softcap=-1.0), "softcap"),
        (dict(qk_norm="layer"), "qk_norm"),
        (dict(qk_norm="head", qk_norm_eps=0), "qk_norm_eps"),
        (dict(qk_norm="head", qk_norm_kind="l2"), "qk_norm_kind"),
        (dict(qk_norm_kind="layer"), "without qk_norm"),
        (dict(qk_norm="head", qk_norm_bias=True), "belongs to LayerNorm"),
        (dict(alibi="yes"), "alibi"),
        (dict(alibi=True, d_context=32), "ALiBi"),
        (dict(rope_theta=1e4, d_k=15), "odd"),
        (dict(clip_qkv=0.0), "clip_qkv"),
        (dict(clip_qkv=-1.0), "clip_qkv"),
        (dict(clip_qkv=float("inf")), "clip_qkv"),
        (dict(clip_qkv=True), "clip_qkv"),
        (dict(rope_scale=8.0), "set rope_theta"),
        (dict(rope_theta=1e4, rope_scale=0.5), "rope_scale"),
        (dict(rope_theta=1e4, rope_scale=float("inf")), "rope_scale"),
        (dict(rel_buckets=32, d_context=32), "cross-attention"),
        (dict(rel_buckets=3), r"rel_buckets=3 must be an integer in 4\.\.65536"),
        (dict(rel_buckets=1, causal=True), r"integer in 2\.\.65536"),
        (dict(rel_buckets=32.0), "rel_buckets"),
        (dict(rel_buckets=True), "rel_buckets"),
        (dict(rel_buckets=32, rel_max_distance=8), "rel_max_distance=8 must exceed the 8 exact"),
        (dict(rel_buckets=32, rel_max_distance=0), "rel_max_distance=0 must be an integer"),
        (dict(rel_max_distance=64), "set rel_buckets"),
    ],
)
def test_invalid_modifier_values_are_spec_errors(fields, match):
    with pytest.raises(zoo.SpecError, match=match):
        zoo.AttentionSpec(**{**D, **fields})


def test_alibi_slopes_press_and_bloom():
    # power of two: 2^(-8/n), 2^(-16/n), ...
    assert alibi_slopes(8) == [2 ** (-(i + 1)) for i in range(8)]
    # not a power of two (BLOOM): the 8 slopes of n=8, then every other slope of n=16
    s12 = alibi_slopes(12)
    assert s12[:8] == alibi_slopes(8) and s12[8:] == alibi_slopes(16)[0:8:2]
    assert len(alibi_slopes(71)) == 71


def test_alibi_bias_values():
    m = zoo.create("mha-separate-bias", alibi=True, causal=True).double()
    pos = torch.arange(4)[None]
    bias = m.mods["alibi"].score_bias(pos, pos, torch.float64)
    slope = alibi_slopes(4)[1]
    assert bias[0, 1, 3, 0].item() == pytest.approx(slope * (0 - 3))  # slope * (j - i)
    m2 = zoo.create("mha-separate-bias", alibi=True).double()
    b2 = m2.mods["alibi"].score_bias(pos, pos, torch.float64)
    assert b2[0, 1, 0, 3].item() == pytest.approx(-slope * 3)  # -slope * |i - j|
    assert ALiBi.reference(m2.spec, slope, 0, 3) == pytest.approx(-slope * 3)


def test_window_keys_seen():
    m = zoo.create("mha-separate-bias", causal=True, window=3).double()
    _, a = m(torch.randn(1, 8, 64, dtype=torch.float64), need_weights=True)
    seen = a[0, 0] > 0
    for i in range(8):
        assert seen[i].nonzero().flatten().tolist() == list(range(max(0, i - 2), i + 1))


def test_symmetric_window_keys_seen():
    """Non-causal: |i - j| < window, i.e. window - 1 keys either side (ModernBERT's local layers)."""
    m = zoo.create("mha-separate-bias", window=3).double()
    assert "window=3 (symmetric)" in m.spec.describe()
    x = torch.randn(1, 8, 64, dtype=torch.float64)
    _, a = m(x, need_weights=True)
    seen = a[0, 0] > 0
    for i in range(8):
        assert seen[i].nonzero().flatten().tolist() == list(range(max(0, i - 2), min(8, i + 3)))
    want = zoo.modifiers.Window.reference_allowed(m.spec, 8, 8)
    assert torch.equal(seen, want)
    m.fused = True  # the SDPA path with the symmetric mask, and shifted positions
    close(m(x), m(x, need_weights=True)[0], 1e-10)
    close(m(x, positions=torch.arange(8) + 50), m(x), 1e-10)
    # the same field on a causal block is the causal half of the same rule
    c = zoo.create("mha-separate-bias", window=3, causal=True).double()
    both = torch.ones(8, 8, dtype=torch.bool).tril() & want
    assert torch.equal(c(x, need_weights=True)[1][0, 0] > 0, both)


def test_symmetric_window_audit_and_lowerings():
    from export.choice import why_not
    from zoo.audit import run_audit

    m = zoo.create("gqa", causal=False, window=2, rope_theta=1e4)
    steps = run_audit(m, seq=7)
    assert all(st.ok for st in steps), [(st.title, st.detail) for st in steps if not st.ok]
    assert any(st.title.startswith("window=2 (symmetric)") for st in steps)
    assert why_not("decomposed", m.spec) is None and why_not("onnx-attention", m.spec) is None
    assert why_not("ort-gqa", m.spec)  # causal only


def test_clip_qkv_clamps_the_projections_before_qk_norm_and_rope():
    """OLMo: clamp q/k/v_proj's outputs (bias included), then QK-norm / rotary; no parameters."""
    from zoo.modifiers import ClipQKV

    kw = dict(d_model=64, heads=4, kv_heads=2, causal=True, rope_theta=1e4, qk_norm="head")
    m = zoo.create("gqa", **kw, clip_qkv=0.25).double()
    assert zoo.count_parameters(m.spec) == zoo.count_parameters(m.spec.replace(clip_qkv=None))
    assert "clip_qkv=0.25" in m.spec.describe()
    x = torch.randn(2, 6, 64, dtype=torch.float64) * 3
    q, k, v = m.project(x)
    raw = m._project(x, None)
    for got, r in zip((q, k, v), raw):
        assert got.abs().max().item() <= 0.25 and torch.equal(got, r.clamp(-0.25, 0.25))
    for ref, got in zip(ClipQKV.reference_qkv(m.spec, *raw), (q, k, v)):
        assert torch.equal(ref, got)
    # by hand: the block without the clip, fed clamped projections, gives the same y
    plain = zoo.heads.build(m.spec.replace(clip_qkv=None), zoo.get_projections(m)).double()
    plain._project = lambda x_, ctx=None: tuple(t.clamp(-0.25, 0.25) for t in m._project(x_, ctx))
    close(m(x), plain(x), 1e-12)
    unclipped = zoo.heads.build(m.spec.replace(clip_qkv=None), zoo.get_projections(m)).double()
    assert (unclipped(x) - m(x)).abs().max().item() > 1e-3  # the clamp bites at these sizes
    # fused and explicit paths, decode (dynamic and static cache) all clamp
    m.fused = True
    close(m(x), m(x, need_weights=True)[0], 1e-12)
    y1, pk, pv = m.decode(x[:, :4])
    y2, _, _ = m.decode(x[:, 4:], pk, pv)
    close(torch.cat([y1, y2], 1), m(x), 1e-10)
    cache = zoo.StaticCache.empty(m.spec, batch=2, max_len=8, dtype=torch.float64)
    ys = [m.decode(x[:, i : i + 1], cache=cache) for i in range(6)]
    close(torch.cat(ys, 1), m(x), 1e-10)


def test_clip_qkv_audit_cross_attention_and_lowerings():
    from export.choice import why_not
    from zoo.audit import run_audit

    for m in (zoo.create("mha-combined-bias", d_context=24, clip_qkv=0.5), zoo.create("gqa", clip_qkv=2.0)):
        steps = run_audit(m, seq=5)
        assert all(st.ok for st in steps), [(st.title, st.detail) for st in steps if not st.ok]
        assert any(st.title.startswith("clip_qkv=") for st in steps)
    spec = zoo.spec("gqa", causal=True, clip_qkv=1.0, d_k=16, d_model=64, heads=4, kv_heads=2)
    assert all(why_not(lw, spec) is None for lw in ("decomposed", "onnx-attention", "ort-mha", "ort-gqa"))
    with pytest.raises(zoo.SpecError, match="clip_qkv"):
        zoo.spec("gqa", clip_qkv=0)


def test_rope_matches_rotate_half_formula():
    """The LLaMA/NeoX form: x*cos + rotate_half(x)*sin with cos = cat(freqs, freqs)."""
    spec = zoo.AttentionSpec(**D, rope_theta=10000.0)
    rot = Rotary(spec)
    x = torch.randn(2, 4, 6, 16)
    pos = torch.arange(6)[None].expand(2, 6)
    inv = 1.0 / (10000.0 ** (torch.arange(0, 16, 2).float() / 16))
    freqs = pos[..., None].float() * inv
    emb = torch.cat([freqs, freqs], -1)[:, None]
    rotate_half = torch.cat([-x[..., 8:], x[..., :8]], -1)
    close(rot.qk_heads(x, x, pos, pos)[0], x * emb.cos() + rotate_half * emb.sin())


def test_rope_interleaved_and_partial():
    spec = zoo.AttentionSpec(**D, rope_theta=100.0, rope_dim=8, rope_interleaved=True)
    rot = Rotary(spec)
    x = torch.randn(1, 1, 5, 16)
    pos = torch.arange(5)[None]
    y = rot.qk_heads(x, x, pos, pos)[0]
    assert torch.equal(y[..., 8:], x[..., 8:])  # the dims past rope_dim pass through
    ang = 3 * 100.0 ** (-2 * 1 / 8)  # position 3, pair 1 = dims (2, 3)
    want = x[0, 0, 3, 2] * math.cos(ang) - x[0, 0, 3, 3] * math.sin(ang)
    assert y[0, 0, 3, 2].item() == pytest.approx(want.item(), abs=1e-5)
    close(Rotary.reference(spec, x.double(), pos).float(), y, 1e-5)


def test_positions_argument():
    m = zoo.create("mha-separate-bias", causal=True, rope_theta=1e4).eval()
    x = torch.randn(2, 6, 64)
    close(m(x, positions=torch.arange(6)), m(x))
    close(m(x, positions=torch.arange(6)[None].expand(2, 6) + 100), m(x), 1e-4)
    with pytest.raises(TypeError, match="integer"):
        m(x, positions=torch.arange(6.0))
    with pytest.raises(ValueError, match="positions has shape"):
        m(x, positions=torch.arange(5))
    # a continuation: the last 2 rows of a 6-token run equal a run whose positions say where they are
    y = m(x)
    assert y.shape == (2, 6, 64)


def test_softcap_bounds_and_fused_path():
    m = zoo.create("mha-separate-bias", softcap=1.0).double()
    x = torch.randn(2, 5, 64, dtype=torch.float64) * 100
    _, a = m(x, need_weights=True)
    assert (a.amax(-1) / a.amin(-1)).max() <= math.exp(2.0) + 1e-9
    m.fused = True
    close(m(x), m(x, need_weights=True)[0])  # softcap always takes the explicit path


@pytest.mark.parametrize(
    "norm, kind",
    [("head", "rms"), ("full", "rms"), ("head", "layer+bias"), ("per_head", "layer"), ("per_head", "layer+bias")],
)
def test_qk_norm_weights_follow_heads(norm, kind):
    extra = {} if kind == "rms" else dict(qk_norm_kind="layer", qk_norm_bias=kind.endswith("bias"))
    m = zoo.create("gqa", qk_norm=norm, rope_theta=1e4, alibi=True, **extra).eval()
    with torch.no_grad():
        for p in m.mods["qk_norm"].parameters():
            p.copy_(torch.rand_like(p) + 0.5)
    x = torch.randn(2, 5, 64)
    perm = [4, 5, 6, 7, 1, 0, 3, 2]  # GQA groups of 4 move whole
    pm = zoo.permute_heads(m, perm)
    close(pm(x), m(x), 1e-5)
    assert torch.equal(pm.mods["alibi"].slopes, m.mods["alibi"].slopes[perm])
    if norm == "per_head":  # kv heads [1, 0] after the permutation: their weights (and biases) swap
        kq = rearrange(m.mods["qk_norm"].k_norm.detach(), "(g d) -> g d", g=2)
        assert torch.equal(rearrange(pm.mods["qk_norm"].k_norm.detach(), "(g d) -> g d", g=2), kq[[1, 0]])
    if norm != "full":
        if norm == "head":
            assert torch.equal(pm.mods["qk_norm"].q_norm, m.mods["qk_norm"].q_norm)
        pr = zoo.prune_heads(m, [3, 7])
        hm = torch.ones(8)
        hm[[3, 7]] = 0
        close(pr(x), m(x, head_mask=hm), 1e-5)
        assert torch.equal(pr.mods["alibi"].slopes, m.mods["alibi"].slopes[[0, 1, 2, 4, 5, 6]])
    else:
        with pytest.raises(ValueError, match="qk_norm='full'"):
            zoo.prune_heads(m, [3, 7])
    rt = zoo.to_separate(zoo.to_combined(m))
    close(rt(x), m(x), 1e-6)
    if kind != "rms":  # LayerNorm applies before the cache, as RMSNorm does: both caches give the full rows
        cm = zoo.heads.build(m.spec.replace(causal=True), zoo.get_projections(m)).eval()  # m's weights, causal
        y = cm(x)
        _, pk, pv = cm.decode(x[:, :3])
        close(cm.decode(x[:, 3:], pk, pv)[0], y[:, 3:], 1e-5)
        cache = zoo.StaticCache.empty(cm.spec, batch=2, max_len=8)
        close(torch.cat([cm.decode(x[:, a:b], cache=cache) for a, b in ((0, 2), (2, 3), (3, 5))], 1), y, 1e-5)


def test_head_state_lives_on_the_modifiers():
    """zoo/heads.py names no modifier: each one's state is a Projections field it declares, read
    from and written to the block by the modifier itself."""
    from dataclasses import fields

    from zoo.heads import Projections
    from zoo.modifiers import MODIFIERS

    known = {f.name for f in fields(Projections)}
    for mod in MODIFIERS:
        assert set(mod.state_fields) <= known, (mod.name, mod.state_fields)
    m = zoo.create("gqa", qk_norm="full", alibi=True, rope_theta=1e4)
    for mod in m.mods.values():
        assert set(mod.head_state()) == set(mod.state_fields)
    assert zoo.modifiers.prune_refusal(m.spec).setting == "qk_norm='full'"
    assert zoo.modifiers.prune_refusal(m.spec.replace(qk_norm="head")) is None


def test_modifier_fields_are_the_specs_and_off_by_default():
    from dataclasses import fields

    from zoo.modifiers import MODIFIERS

    spec_fields = {f.name for f in fields(zoo.AttentionSpec)}
    owned = [f for mod in MODIFIERS for f in mod.fields]
    assert set(owned) <= spec_fields and len(owned) == len(set(owned))  # each field has one owner
    assert zoo.modifiers.active(zoo.spec("mha-causal")) == []


def test_audit_says_why_pruning_does_not_apply():
    from zoo.audit import run_audit

    steps = run_audit(zoo.create("gqa", qk_norm="full"))
    zeroing = next(st for st in steps if st.title.startswith("zeroing a head"))
    assert zeroing.ok and "pruning does not apply with qk_norm='full' (one RMS over all heads)" in zeroing.detail


def test_audit_has_one_step_per_modifier():
    from zoo.audit import run_audit

    m = zoo.create("gqa", causal=True, rope_theta=1e4, alibi=True, window=3, softcap=2.0, qk_norm="head")
    steps = run_audit(m, seq=7)
    titles = [s.title for s in steps]
    assert all(s.ok for s in steps), [(s.title, s.detail) for s in steps if not s.ok]
    for word in ("qk-norm", "rope", "alibi", "window=3", "softcap"):
        assert any(t.startswith(word) for t in titles), titles


def test_audit_catches_a_wrong_rotation():
    from zoo.audit import run_audit

    m = zoo.create("mha-separate-bias", rope_theta=1e4, causal=True)
    with torch.no_grad():
        m.mods["rope"].inv_freq.mul_(1.01)
    bad = {s.title: s.ok for s in run_audit(m)}
    assert not bad["per head: scores Q K^T * scale"]


def test_describe_and_show_name_the_modifiers():
    from zoo.report import show_spec

    s = zoo.spec("gemma-2-9b")
    assert "softcap=50" in s.describe() and "window=4096" in s.describe()
    text = show_spec("qwen3-8b", zoo.spec("qwen3-8b"))
    assert "qk_norm" in text and "256" in text  # 2 * d_k QK-norm weights


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_rotary_angles_stay_fp32_in_any_dtype(dtype):
    """block.half() used to round the rotary frequencies: angles off by ~1 rad at position 40000."""
    rot = zoo.create("llama-3-8b", d_model=64, heads=4, kv_heads=2, d_k=16).to(dtype).mods["rope"]
    pos = torch.tensor([[5000, 40000]])
    cos, _ = rot.cos_sin(pos, torch.float32)
    inv = 1 / (500000.0 ** (torch.arange(0, 16, 2, dtype=torch.float32) / 16))
    assert torch.equal(cos[0, 0], (pos[..., None].float() * inv).cos()[0])


# -- T5's relative position buckets ------------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("buckets, max_distance", [(32, 128), (8, 12), (33, 200), (4, 5)])
def test_relative_buckets_are_t5s(causal, buckets, max_distance):
    """The bucket function against transformers' own, and the plain reference, over +-4 max_distance."""
    t5 = pytest.importorskip("transformers.models.t5.modeling_t5")
    if causal is False and buckets < 4:
        pytest.skip("bidirectional needs 4 buckets")
    rel = torch.arange(-4 * max_distance, 4 * max_distance + 1)
    want = t5.T5Attention._relative_position_bucket(
        rel, bidirectional=not causal, num_buckets=buckets, max_distance=max_distance
    )
    got = relative_bucket(rel, bidirectional=not causal, buckets=buckets, max_distance=max_distance)
    assert torch.equal(got, want), (rel[got != want][:5], got[got != want][:5], want[got != want][:5])
    spec = zoo.spec("mha-separate-nobias", **D, causal=causal, rel_buckets=buckets, rel_max_distance=max_distance)
    plain = torch.tensor([RelativeBuckets.reference(spec, j) for j in rel.tolist()])
    assert torch.equal(plain, want)
    assert int(want.max()) == buckets - 1 - (buckets % 2 if not causal else 0)  # the far bucket is reached


def test_relative_bias_values_count_and_describe():
    m = zoo.create("mha-separate-nobias", **D, rel_buckets=8, rel_max_distance=12, scale=1.0).double()
    table = m.mods["rel_buckets"].table
    assert zoo.count_parameters(m) == zoo.count_parameters(m.spec) == 4 * 64 * 64 + 8 * 4
    assert "rel-buckets(8, max_distance=12, bidirectional)" in m.spec.describe()
    pos = torch.arange(6)[None]
    bias = m.mods["rel_buckets"].score_bias(pos, pos, torch.float64)
    assert bias.shape == (1, 4, 6, 6)
    # i=0, j=3: key after the query, distance 3 -> bucket 4 + (2 + log bucket) = 6 ... read off the function
    b = relative_bucket(torch.tensor(3), bidirectional=True, buckets=8, max_distance=12).item()
    assert b >= 4 and torch.equal(bias[0, :, 0, 3], table[b].double())
    assert torch.equal(
        bias[0, :, 3, 0],
        table[relative_bucket(torch.tensor(-3), bidirectional=True, buckets=8, max_distance=12).item()].double(),
    )


def test_relative_bias_follows_its_heads_and_decodes():
    m = zoo.create("gqa", causal=True, rel_buckets=8, rel_max_distance=12).eval()
    x = torch.randn(2, 20, 64)  # distances up to 19: every bucket
    perm = [4, 5, 6, 7, 1, 0, 3, 2]
    pm = zoo.permute_heads(m, perm)
    close(pm(x), m(x), 1e-5)
    assert torch.equal(pm.mods["rel_buckets"].table, m.mods["rel_buckets"].table[:, perm])
    pr = zoo.prune_heads(m, [3, 7])
    hm = torch.ones(8)
    hm[[3, 7]] = 0
    close(pr(x), m(x, head_mask=hm), 1e-5)
    assert torch.equal(pr.mods["rel_buckets"].table, m.mods["rel_buckets"].table[:, [0, 1, 2, 4, 5, 6]])
    close(zoo.to_separate(zoo.to_combined(m))(x), m(x), 1e-6)
    # the growing cache and the static one give the rows of the full forward
    y = m(x)
    _, pk, pv = m.decode(x[:, :7])
    y2, _, _ = m.decode(x[:, 7:], pk, pv)
    close(y2, y[:, 7:], 1e-5)
    cache = zoo.StaticCache.empty(m.spec, batch=2, max_len=24)
    ys = [m.decode(x[:, a:b], cache=cache) for a, b in ((0, 5), (5, 6), (6, 20))]
    close(torch.cat(ys, 1), y, 1e-5)
    # the bias bites: without it, another function
    plain = zoo.heads.build(m.spec.replace(rel_buckets=None, rel_max_distance=128), zoo.get_projections(m))
    assert (plain(x) - y).abs().max() > 1e-3


def test_relative_buckets_audit_catches_a_wrong_bucket():
    from zoo.audit import run_audit

    m = zoo.create("mha-separate-nobias", **D, rel_buckets=8, rel_max_distance=12)
    steps = run_audit(m, seq=9)
    assert all(s.ok for s in steps), [(s.title, s.detail) for s in steps if not s.ok]
    assert any(s.title.startswith("rel_buckets") and "0 differ" in s.detail for s in steps)
    mod = m.mods["rel_buckets"]
    right = mod.buckets
    mod.buckets = lambda rel: right(rel).clamp_max(6)  # the last bucket never used
    bad = {s.title: s.ok for s in run_audit(m, seq=9)}
    assert not bad["rel_buckets: T5's buckets and relative positions"]
    assert not bad["per head: mask, softmax rows, masked weights"]


# -- linear rope scaling ------------------------------------------------------------------------------


def test_rope_scale_divides_the_positions():
    """rope_scale=k at position p rotates as the unscaled rotary at p / k: at multiples of k, exactly."""
    m = zoo.create("mha-causal", **D, rope_theta=1e4, rope_scale=4.0).double()
    plain = zoo.heads.build(m.spec.replace(rope_scale=None), zoo.get_projections(m)).double()
    x = torch.randn(2, 6, 64, dtype=torch.float64)
    pos = torch.arange(6)
    close(m(x, positions=4 * pos), plain(x, positions=pos), 1e-6)
    assert (m(x) - plain(x)).abs().max() > 1e-3
    assert "positions/4" in m.spec.describe()
    assert torch.equal(Rotary.frequencies(m.spec) * 4, Rotary.frequencies(m.spec.replace(rope_scale=None)))


class _Nodes:
    """A GraphBuilder (zoo.modifiers.GraphBuilder) that only records what a modifier writes, with no onnx."""

    dtype = "float32"

    def __init__(self, max_positions=None):
        self.ops, self.consts = [], []
        self.max_positions = max_positions

    def op(self, op_type, *inputs, **attributes):
        self.ops.append((op_type, inputs, attributes))
        return f"{op_type.lower()}_{len(self.ops)}"

    def const(self, value, hint="c", dtype=None):
        self.consts.append((hint, value, dtype))
        return f"{hint}_{len(self.consts)}"

    def cast(self, x, dtype):
        return self.op("Cast", x, to=dtype)

    def positions(self):
        return "positions"

    def call_positions(self):
        return "call_positions"

    def distance(self):
        return "distance"


def test_a_modifier_adds_nothing_to_the_hand_built_graph_unless_it_says_so():
    from zoo.modifiers import MODIFIERS, Modifier, OpPart

    g = _Nodes()
    base = Modifier(zoo.spec("mha-causal", **D))
    assert base.gqa_qkv(g, "q", "k", "v") == ("q", "k", "v")
    assert base.gqa_op(g) == OpPart() and base.gqa_bias(g) is None and base.gqa_allowed(g) is None
    assert Modifier.gqa_limit is None and Modifier.gqa_refusal(base.spec) is None and g.ops == []
    for mod in MODIFIERS:  # a limit that holds whatever the values refuses every spec that turns the modifier on
        if mod.gqa_limit is not None and mod.gqa_limit.always:
            assert mod.gqa_refusal(zoo.spec("mha-causal", **D, rel_buckets=8, rel_max_distance=12))


def test_modifiers_write_their_graph_pieces_through_the_builder():
    block = zoo.create("mha-causal", **D, clip_qkv=2.0, window=3, softcap=5.0, rope_theta=1e4, alibi=True)
    g = _Nodes()
    q, k, v = block.mods["clip_qkv"].gqa_qkv(g, "q", "k", "v")
    assert [op for op, *_ in g.ops] == ["Clip"] * 3 and (q, k, v) == ("clip_1", "clip_2", "clip_3")
    assert block.mods["window"].gqa_op(g).attributes == {"local_window_size": 3}
    assert block.mods["softcap"].gqa_op(g).attributes == {"softcap": 5.0}
    before = len(g.ops)
    assert block.mods["rope"].gqa_qkv(g, "q", "k", "v")[2] == "v"  # Q and K rotated before the op
    assert [op for op, *_ in g.ops[before:]].count("RotaryEmbedding") == 2
    assert {"Cos", "Sin"} <= {op for op, *_ in g.ops[before:]}  # the tables computed per call
    fixed = _Nodes(max_positions=10)  # a whole model's max_len: the tables are constants, no Cos or Sin
    block.mods["rope"].gqa_qkv(fixed, "q", "k", "v")
    assert not {"Cos", "Sin"} & {op for op, *_ in fixed.ops}
    tables = {hint: value for hint, value, _ in fixed.consts if hint.startswith("rope_")}
    assert {k: tuple(v.shape) for k, v in tables.items()} == {"rope_cos": (10, 8), "rope_sin": (10, 8)}
    angles = torch.arange(10.0)[:, None] * block.mods["rope"].inv_freq
    torch.testing.assert_close(tables["rope_cos"], angles.cos())
    assert block.mods["window"].gqa_allowed(g).startswith("less")
    before = len(g.ops)
    assert block.mods["alibi"].gqa_bias(g).startswith("mul")
    assert [op for op, *_ in g.ops[before:]] == ["Unsqueeze", "Neg", "Mul"]  # slopes * (j - i), causal


@pytest.mark.parametrize("mod", zoo.modifiers.MODIFIERS, ids=lambda m: m.name)
def test_every_modifier_labels_its_row_of_the_lowering_table(mod):
    """The support table has one row per modifier, labelled by the modifier (no list elsewhere)."""
    from export.lowerings import support_table

    assert mod.label and f"\n| {mod.label} | " in support_table()
