"""Chunked local attention (zoo/modifiers/chunk.py, Llama 4): the rule, its checks, the audit, decode with
both caches at absolute positions, and the GroupQueryAttention graph's bias term."""

from __future__ import annotations

import pytest
import torch

import zoo
from export import OnnxSession, export_onnx
from parity.decode import check_decode
from zoo.modifiers import same_chunk

CHUNKED = dict(d_model=32, heads=4, kv_heads=2, d_k=16, causal=True, rope_theta=1e4, chunk=4)


def test_the_rule_is_floor_division_of_positions():
    pos = torch.arange(10)[None]
    got = same_chunk(pos, pos, 4)[0, 0]
    want = torch.tensor([[i // 4 == j // 4 for j in range(10)] for i in range(10)])
    assert torch.equal(got, want)
    assert not got[4, 3] and got[7, 4]  # the first query of a chunk sees nothing before it


@pytest.mark.parametrize(
    "fields, word",
    [(dict(chunk=0), "chunk=0"), (dict(chunk=2.5), "chunk=2.5"), (dict(chunk=4, window=3), "window=3"),
     (dict(chunk=4, d_context=16), "d_context=16")],
)  # fmt: skip
def test_bad_values_are_refused_by_name(fields, word):
    with pytest.raises(zoo.SpecError, match=word):
        zoo.spec("gqa", **fields)


def test_forward_masks_other_chunks_and_the_audit_passes():
    from zoo.audit import run_audit

    m = zoo.create("gqa", **CHUNKED).double()
    x = torch.randn(2, 10, 32, dtype=torch.float64)
    _, a = m(x, need_weights=True)
    allowed = same_chunk(torch.arange(10)[None], torch.arange(10)[None], 4)[0, 0] & torch.ones(10, 10).tril().bool()
    assert torch.all(a[:, :, ~allowed] == 0) and torch.all(a[:, :, allowed] > 0)
    steps = run_audit(m, seq=9)
    assert all(st.ok for st in steps), [(st.title, st.detail) for st in steps if not st.ok]
    assert any(st.title.startswith("chunk=4") for st in steps)


def test_decode_with_both_caches_uses_absolute_positions():
    m = zoo.create("gqa", **CHUNKED).double()
    x = torch.randn(2, 13, 32, dtype=torch.float64)
    full = m(x)
    _, pk, pv = m.decode(x[:, :5])  # the cut inside a chunk: positions 4 | 5 share one
    torch.testing.assert_close(m.decode(x[:, 5:], pk, pv)[0], full[:, 5:], rtol=0, atol=1e-12)
    cache = zoo.StaticCache.empty(m.spec, batch=2, max_len=16, dtype=torch.float64)
    ys = [m.decode(x[:, a:b], cache=cache) for a, b in ((0, 3), (3, 4), (4, 13))]
    torch.testing.assert_close(torch.cat(ys, 1), full, rtol=0, atol=1e-12)


def test_group_query_attention_graph_takes_the_chunks_as_its_bias(tmp_path):
    m = zoo.create("gqa", **CHUNKED).eval()
    x = torch.randn(2, 11, 32)
    r = export_onnx(m, tmp_path / "c.onnx", lowering="ort-gqa", with_mask=True)
    mask = torch.ones(2, 11, 11, dtype=torch.bool)
    mask[1, :, :2] = False
    y = torch.as_tensor(OnnxSession(r.path, "cpu", verbose=False).run(x, mask=mask))
    torch.testing.assert_close(y, m(x, mask=mask[:, None]), rtol=1e-4, atol=1e-5)
    for cache in ("grow", "static"):
        row = check_decode(m, "ort-gqa", cache=cache, workdir=tmp_path)
        assert row.status == "PASS", (cache, row.reason, row.max_abs)
