"""Llama 4's query temperature (zoo/modifiers/temperature.py) and weightless QK-norm after the rotary
(zoo/modifiers/l2_norm.py): the math written out, checks, audit, decode with both caches at absolute
positions, and the GroupQueryAttention graph's pieces."""

from __future__ import annotations

import math

import pytest
import torch

import zoo
import zoo.heads  # zoo loads its modules on first use; this file reads zoo.heads directly
from parity.decode import check_decode
from zoo.modifiers import l2_normalize, temperature

BASE = dict(causal=True, d_k=16, d_model=32, heads=4, kv_heads=2)
NOPE = dict(BASE, temperature_floor=3, temperature_scale=0.25)  # a NoPE layer: temperature only
ROPE = dict(BASE, rope_theta=1e4, rope_interleaved=True, qk_l2=1e-5, chunk=4)  # a chunked rope layer


def test_temperature_is_the_formula():
    pos = torch.arange(20)
    want = [1 + 0.1 * math.log1p(math.floor((i + 1) / 8)) for i in range(20)]
    torch.testing.assert_close(temperature(pos, 8, 0.1), torch.tensor(want, dtype=torch.float32))


def test_l2_norm_after_the_rotary_is_the_written_out_rows():
    m = zoo.create("gqa", **ROPE).double()
    x = torch.randn(2, 9, 32, dtype=torch.float64)
    q = m.run_with_cache(x)[1]["q"]
    plain = zoo.heads.build(m.spec.replace(qk_l2=None), zoo.get_projections(m))
    q0 = plain.run_with_cache(x)[1]["q"]
    torch.testing.assert_close(q, q0 / torch.sqrt((q0 * q0).mean(-1, keepdim=True) + 1e-5), rtol=0, atol=1e-12)
    torch.testing.assert_close(l2_normalize(q0.half(), 1e-5), l2_normalize(q0, 1e-5).half())


@pytest.mark.parametrize(
    "fields, word",
    [(dict(qk_l2=0.0), "qk_l2=0.0"), (dict(temperature_floor=0), "temperature_floor=0"),
     (dict(temperature_scale=0.5), "without temperature_floor"),
     (dict(temperature_floor=8, temperature_scale=-1.0), "temperature_scale=-1.0")],
)  # fmt: skip
def test_bad_values_are_refused_by_name(fields, word):
    with pytest.raises(zoo.SpecError, match=word):
        zoo.spec("gqa", **fields)


@pytest.mark.parametrize("fields", [NOPE, ROPE], ids=["nope-temperature", "rope-l2-chunk"])
def test_audit_and_decode_with_both_caches(fields):
    from zoo.audit import run_audit

    m = zoo.create("gqa", **fields).double()
    assert zoo.count_parameters(m.spec) == sum(p.numel() for p in m.parameters())  # no weights of their own
    steps = run_audit(m, seq=9)
    assert all(st.ok for st in steps), [(st.title, st.detail) for st in steps if not st.ok]
    x = torch.randn(2, 13, 32, dtype=torch.float64)
    full = m(x)
    _, pk, pv = m.decode(x[:, :5])
    torch.testing.assert_close(m.decode(x[:, 5:], pk, pv)[0], full[:, 5:], rtol=0, atol=1e-12)
    cache = zoo.StaticCache.empty(m.spec, batch=2, max_len=16, dtype=torch.float64)
    ys = [m.decode(x[:, a:b], cache=cache) for a, b in ((0, 3), (3, 4), (4, 13))]
    torch.testing.assert_close(torch.cat(ys, 1), full, rtol=0, atol=1e-12)


@pytest.mark.parametrize("fields", [NOPE, ROPE], ids=["nope-temperature", "rope-l2-chunk"])
def test_group_query_attention_graph_decodes_them(fields, tmp_path):
    m = zoo.create("gqa", **fields)
    for cache in ("grow", "static"):
        row = check_decode(m, "ort-gqa", cache=cache, workdir=tmp_path)
        assert row.status == "PASS", (cache, row.reason, row.max_abs)


def test_l2_norm_after_a_partial_rotary_decodes_in_the_graph(tmp_path):
    # The graph rotates Q and K before the op, then the weightless norm, in the eager order: a partial
    # rotation (the norm after it is not the norm before it) is followed exactly.
    m = zoo.create("gqa", **dict(ROPE, d_k=32, rope_dim=16))
    for cache in ("grow", "static"):
        row = check_decode(m, "ort-gqa", cache=cache, workdir=tmp_path)
        assert row.status == "PASS", (cache, row.reason, row.max_abs)
