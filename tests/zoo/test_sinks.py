"""Attention sinks (gpt-oss): a learned logit per head in each row's softmax denominator. Its math against
transformers' way of writing it (a column appended to the scores, dropped after the softmax), on every
kernel, its checks, its parameters, and its logits following their heads."""

import pytest
import torch
from einops import rearrange

import zoo
from zoo.audit import run_audit

D = dict(d_model=32, heads=4, d_k=8)


def _block(**kw):
    torch.manual_seed(0)
    m = zoo.MultiHeadAttention(zoo.AttentionSpec(**{**D, "sinks": True, **kw})).double().eval()
    with torch.no_grad():
        m.mods["sinks"].logits.mul_(2.0)  # shares far from 0 and 1
    return m


def _gpt_oss_reference(m, x, allowed):
    """transformers' eager_attention_forward for GptOssAttention, written out: scores, the sink as one more
    column, max subtracted, softmax, the column dropped, A V, W_O (allowed: (t s) bool or None)."""
    p, s = zoo.get_projections(m), m.spec
    q = rearrange(x @ p.w_q.T + (0 if p.b_q is None else p.b_q), "b t (h d) -> b h t d", h=s.heads)
    k = rearrange(x @ p.w_k.T + (0 if p.b_k is None else p.b_k), "b t (g d) -> b g t d", g=s.kv_heads_)
    v = rearrange(x @ p.w_v.T + (0 if p.b_v is None else p.b_v), "b t (g d) -> b g t d", g=s.kv_heads_)
    k, v = k.repeat_interleave(s.group_size, 1), v.repeat_interleave(s.group_size, 1)
    scores = q @ k.transpose(-1, -2) * s.scale_
    if allowed is not None:
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)  # transformers' mask value
    sinks = p.sinks.reshape(1, -1, 1, 1).expand(x.shape[0], -1, x.shape[1], -1)
    logits = torch.cat([scores, sinks], -1)
    probs = torch.softmax(logits - logits.max(-1, keepdim=True).values, -1)[..., :-1]
    z = rearrange(probs @ v, "b h t d -> b t (h d)")
    return z @ p.w_o.T + (0 if p.b_o is None else p.b_o), probs


KINDS = [dict(causal=True), dict(causal=True, kv_heads=2, bias=False), dict(causal=False), dict(causal=True, window=3)]


@pytest.mark.parametrize("kw", KINDS)
def test_sinks_are_gpt_oss_softmax_on_every_kernel(kw):
    m = _block(**kw)
    x = torch.randn(2, 9, 32, dtype=torch.float64)
    allowed = torch.ones(9, 9, dtype=torch.bool)
    if m.spec.causal:
        allowed = allowed.tril()
    if m.spec.window:
        allowed = allowed.triu(-(m.spec.window - 1))
    want, probs = _gpt_oss_reference(m, x, allowed)
    y, a = m(x, need_weights=True)
    torch.testing.assert_close(y, want, rtol=0, atol=1e-12)
    torch.testing.assert_close(a, probs, rtol=0, atol=1e-12)
    assert bool((a.sum(-1) < 1).all())  # the sink takes a share of every row
    m.fused = True
    torch.testing.assert_close(m(x), want, rtol=0, atol=1e-12)  # the fused flag takes the explicit path
    if m.spec.causal:  # decode: the growing cache, then the static one (the folded kernel)
        y1, pk, pv = m.decode(x[:, :4])
        y2, _, _ = m.decode(x[:, 4:], pk, pv)
        torch.testing.assert_close(torch.cat([y1, y2], 1), want, rtol=0, atol=1e-12)
        cache = zoo.StaticCache.empty(m.spec, batch=2, max_len=12, dtype=torch.float64)
        ys = [m.decode(x[:, i : i + 1], cache=cache) for i in range(9)]
        torch.testing.assert_close(torch.cat(ys, 1), want, rtol=0, atol=1e-12)


def test_a_row_with_no_allowed_key_gives_zero_and_huge_scores_stay_finite():
    m = _block(causal=False)
    x = torch.randn(2, 5, 32, dtype=torch.float64) * 1e3
    mask = torch.ones(2, 1, 5, 5, dtype=torch.bool)
    mask[0, 0, 2] = False
    with torch.no_grad():
        y, a = m(x, mask=mask, need_weights=True)
    assert bool(torch.isfinite(y).all()) and float(a[0, :, 2].abs().max()) == 0.0
    b_o = m.out_proj.bias.detach()
    torch.testing.assert_close(y[0, 2], b_o, rtol=0, atol=1e-12)  # Z = 0: y is W_O's bias


def test_fp16_scores_and_sink_in_fp32():
    m = _block(causal=True)
    x = torch.randn(1, 6, 32, dtype=torch.float64)
    want = m(x)
    got = m.half()(x.half()) if torch.cuda.is_available() else m.float()(x.float())
    torch.testing.assert_close(got.double(), want, rtol=0, atol=2e-3)


@pytest.mark.parametrize(
    "fields, match",
    [
        (dict(sinks=1), "sinks=1 must be True"),
        (dict(sinks="yes"), "sinks='yes'"),
        (dict(sinks=True, causal=True, kv_lora_rank=8, rope_theta=1e4, rope_dim=4, bias=False), "kv_lora_rank"),
    ],
)
def test_invalid_sinks_are_spec_errors(fields, match):
    with pytest.raises(zoo.SpecError, match=match):
        zoo.AttentionSpec(**{**D, **fields})


def test_one_parameter_per_head_counted_and_described():
    spec = zoo.AttentionSpec(**D, sinks=True)
    plain = zoo.AttentionSpec(**D)
    assert zoo.count_parameters(spec) == zoo.count_parameters(plain) + 4
    assert zoo.count_parameters(zoo.MultiHeadAttention(spec)) == zoo.count_parameters(spec)
    assert "sinks" in spec.describe()
    assert zoo.modifiers.Sinks.parameters_label(spec) == "sink logits (4 heads)"


def test_the_sink_follows_its_head_under_permutation_and_pruning():
    m = _block(causal=True, kv_heads=2)
    x = torch.randn(2, 7, 32, dtype=torch.float64)
    logits = m.mods["sinks"].logits.detach()
    perm = [2, 3, 0, 1]  # whole GQA groups move
    pm = zoo.permute_heads(m, perm)
    assert torch.equal(pm.mods["sinks"].logits.detach(), logits[perm])
    torch.testing.assert_close(pm(x), m(x), rtol=0, atol=1e-12)
    pr = zoo.prune_heads(m, [2, 3])
    assert torch.equal(pr.mods["sinks"].logits.detach(), logits[:2])
    keep = torch.tensor([1.0, 1.0, 0.0, 0.0], dtype=torch.float64)
    torch.testing.assert_close(pr(x), m(x, head_mask=keep), rtol=0, atol=1e-12)


@pytest.mark.parametrize("kw", [dict(causal=True, kv_heads=2), dict(d_context=12)])
def test_audit_passes_with_the_sink_in_its_reference(kw):
    steps = run_audit(_block(**kw))
    assert not [(s.title, s.detail) for s in steps if not s.ok]
    assert any(s.title.startswith("sinks:") for s in steps)
