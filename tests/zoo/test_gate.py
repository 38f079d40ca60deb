"""The gated attention output (zoo/modifiers/gate.py, Qwen3-Next): its count, check, the math written out,
the heads it follows, the audit, decode with both caches, and the GroupQueryAttention graph's piece."""

from __future__ import annotations

import pytest
import torch
from einops import rearrange

import zoo
import zoo.heads  # zoo loads its modules on first use; this file reads zoo.heads directly
from export import OnnxSession, export_onnx
from parity.decode import check_decode

GATED = dict(d_model=32, heads=4, kv_heads=2, d_k=16, causal=True, rope_theta=1e4, qk_norm="head", output_gate=True)


def _block(**kw) -> zoo.MultiHeadAttention:
    torch.manual_seed(0)
    m = zoo.create("gqa", **{**GATED, **kw}).double().eval()
    with torch.no_grad():  # a bias that is not zero, so that it is read
        for p in m.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return m


@pytest.mark.parametrize("bias", [False, True])
def test_count_is_the_formula_and_the_module(bias):
    spec = zoo.spec("gqa", **GATED, bias=bias)
    plain = zoo.count_parameters(spec.replace(output_gate=False))
    gate = 32 * 4 * 16 + (4 * 16 if bias else 0)
    assert zoo.count_parameters(spec) == plain + gate
    assert sum(p.numel() for p in zoo.create("gqa", **GATED, bias=bias).parameters()) == plain + gate
    assert "gate=sigmoid(x W_G) on Z" in spec.describe()


def test_output_gate_must_be_a_bool():
    with pytest.raises(zoo.SpecError, match="output_gate='yes' must be True or False"):
        zoo.spec("gqa", output_gate="yes")


def test_forward_is_z_times_the_sigmoid_gate_written_out():
    m = _block(bias=True)
    x = torch.randn(2, 9, 32, dtype=torch.float64)
    gate = m.mods["gate"].gate_proj
    g = 1 / (1 + torch.exp(-(x @ gate.weight.T + gate.bias)))  # (b t (h dv))
    z = m.run_with_cache(x)[1]["z"]  # the named location "z": after the gate
    ungated = zoo.heads.build(m.spec.replace(output_gate=False), zoo.get_projections(m))
    z_plain = ungated.run_with_cache(x)[1]["z"]
    torch.testing.assert_close(z, z_plain * rearrange(g, "b t (h d) -> b h t d", h=4), rtol=0, atol=1e-12)
    torch.testing.assert_close(m(x), rearrange(z, "b h t d -> b t (h d)") @ m.out_proj.weight.T + m.out_proj.bias)


def test_gate_rows_follow_their_heads_under_permutation_and_pruning():
    m = _block()
    x = torch.randn(2, 7, 32, dtype=torch.float64)
    perm = [2, 3, 0, 1]  # whole GQA groups
    pm = zoo.permute_heads(m, perm)
    torch.testing.assert_close(pm(x), m(x), rtol=0, atol=1e-12)
    w = rearrange(m.mods["gate"].gate_proj.weight, "(h d) c -> h d c", h=4)
    torch.testing.assert_close(rearrange(pm.mods["gate"].gate_proj.weight, "(h d) c -> h d c", h=4), w[perm])
    hm = torch.tensor([1.0, 1.0, 0.0, 0.0], dtype=torch.float64)
    torch.testing.assert_close(zoo.prune_heads(m, [2, 3])(x), m(x, head_mask=hm), rtol=0, atol=1e-12)


def test_audit_passes_with_a_gate_step():
    from zoo.audit import run_audit

    steps = run_audit(_block(bias=True))
    assert all(st.ok for st in steps), [(st.title, st.detail) for st in steps if not st.ok]
    assert any(st.title.startswith("output gate") for st in steps)


def test_decode_with_both_caches_is_the_forward():
    m = _block(bias=True)
    x = torch.randn(2, 12, 32, dtype=torch.float64)
    full = m(x)
    _, pk, pv = m.decode(x[:, :5])
    y, pk, pv = m.decode(x[:, 5:6], pk, pv)
    torch.testing.assert_close(y, full[:, 5:6], rtol=0, atol=1e-12)
    torch.testing.assert_close(m.decode(x[:, 6:], pk, pv)[0], full[:, 6:], rtol=0, atol=1e-12)
    cache = zoo.StaticCache.empty(m.spec, batch=2, max_len=16, dtype=torch.float64)
    ys = [m.decode(x[:, a:b], cache=cache) for a, b in ((0, 4), (4, 5), (5, 12))]
    torch.testing.assert_close(torch.cat(ys, 1), full, rtol=0, atol=1e-12)


def test_group_query_attention_graph_carries_the_gate(tmp_path):
    """ort-gqa: the gate's nodes on the op's output (gqa_z), full sequence and decode (grow and static)."""
    m = _block(bias=True).float()
    x = torch.randn(2, 9, 32)
    r = export_onnx(m, tmp_path / "g.onnx", lowering="ort-gqa")
    y = torch.as_tensor(OnnxSession(r.path, "cpu", verbose=False).run(x))
    torch.testing.assert_close(y, m(x), rtol=1e-4, atol=1e-5)
    for cache in ("grow", "static"):
        row = check_decode(m, "ort-gqa", cache=cache, workdir=tmp_path)
        assert row.status == "PASS", (cache, row.reason, row.max_abs)
