"""Multi-head latent attention (zoo/modifiers/latent.py): its count, checks, audit, heads, and a decode that
caches the latent and attends in the absorbed form, exactly the forward's rows."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import zoo
import zoo.heads  # zoo loads its modules on first use; this file reads zoo.heads directly
from strategies import fuzz_settings, latent_specs
from zoo.audit import run_audit
from zoo.cache import static_cache_bytes

LATENT = dict(d_model=64, heads=4, d_k=24, d_v=12, causal=True, bias=False, rope_theta=1e4, rope_dim=8, kv_lora_rank=32)


def _block(**changes) -> zoo.MultiHeadAttention:
    torch.manual_seed(0)
    return zoo.MultiHeadAttention(zoo.AttentionSpec(**dict(LATENT, **changes))).double()


@pytest.mark.parametrize("q_lora_rank", [None, 24])
def test_parameters_are_the_formula(q_lora_rank):
    m = _block(q_lora_rank=q_lora_rank)
    c, h, dk, dv, r, dr = 64, 4, 24, 12, 32, 8
    query = c * h * dk if q_lora_rank is None else c * 24 + 24 + 24 * h * dk
    want = query + c * (r + dr) + r + r * h * (dk - dr + dv) + h * dv * c
    assert zoo.count_parameters(m.spec) == zoo.count_parameters(m) == want
    assert not hasattr(m, "k_proj") and not hasattr(m, "v_proj")


@pytest.mark.parametrize("q_lora_rank", [pytest.param(None, marks=pytest.mark.slow), 24])
def test_audit_passes_with_the_absorbed_decode_step(q_lora_rank):
    steps = run_audit(_block(q_lora_rank=q_lora_rank), seq=6)
    assert all(s.ok for s in steps), [(s.title, s.detail) for s in steps if not s.ok]
    assert any(s.title.startswith("latent: the absorbed decode") for s in steps)


def test_decode_caches_the_latent_and_matches_the_forward():
    m = _block(q_lora_rank=24, rope_interleaved=True, window=5)
    x = torch.randn(2, 11, 64, dtype=torch.float64)
    y = m(x)
    y1, k, v = m.decode(x[:, :4])
    y2, k, v = m.decode(x[:, 4:], k, v)
    assert tuple(k.shape) == (2, 1, 11, 8) and tuple(v.shape) == (2, 1, 11, 32)  # rotary key, latent
    assert (torch.cat([y1, y2], 1) - y).abs().max() < 1e-12
    cache = zoo.StaticCache.empty(m.spec, batch=2, max_len=16, dtype=torch.float64)
    assert tuple(cache.key.shape) == (2, 1, 16, 8) and tuple(cache.value.shape) == (2, 1, 16, 32)
    ys = [m.decode(x[:, i : i + 1], cache=cache) for i in range(11)]
    assert (torch.cat(ys, 1) - y).abs().max() < 1e-12
    assert (cache.value[:, :, :11] - v).abs().max() < 1e-12  # the static buffer holds what the growing cache held
    # left padding: a padded row computes what it computes alone
    keep = torch.ones(2, 11, dtype=torch.bool)
    keep[1, :3] = False
    yp, _, _ = m.decode(x, key_mask=keep)
    alone = m(x[1:, 3:])
    assert (yp[1:, 3:] - alone).abs().max() < 1e-12


def test_cache_bytes_per_token_against_gqa():
    """DeepSeek-V3's sizes: (512 + 64) entries per position and layer, against 128 heads x (192 + 128) for the
    same heads with per-head keys and values (GQA with g = h)."""
    v3 = zoo.spec("deepseek-v3")
    assert static_cache_bytes(v3, 1, 1, 2) == (512 + 64) * 2
    mha = v3.replace(kv_lora_rank=None, q_lora_rank=None)
    assert static_cache_bytes(mha, 1, 1, 2) == 128 * (192 + 128) * 2


def test_heads_follow_their_rows_under_permutation_and_pruning():
    m = _block(q_lora_rank=24)
    x = torch.randn(1, 7, 64, dtype=torch.float64)
    perm = zoo.heads.permute_heads(m, [3, 1, 0, 2])
    assert (perm(x) - m(x)).abs().max() < 1e-12
    pruned = zoo.heads.prune_heads(m, [2])
    mask = torch.tensor([1.0, 1.0, 0.0, 1.0], dtype=torch.float64)
    assert (pruned(x) - m(x, head_mask=mask)).abs().max() < 1e-12
    assert pruned.spec.heads == 3 and pruned.spec.kv_lora_rank == 32


@pytest.mark.parametrize(
    "changes, match",
    [
        (dict(kv_heads=2), "kv_heads=2"),
        (dict(layout="combined"), "layout='combined'"),
        (dict(bias=True), "bias=True"),
        (dict(rope_dim=None), "decoupled rotary"),
        (dict(alibi=True), "alibi=True"),
        (dict(kv_lora_rank=0), "kv_lora_rank=0"),
        (dict(kv_lora_rank=None, q_lora_rank=8), "q_lora_rank=8"),
    ],
)
def test_what_a_latent_block_refuses_is_named(changes, match):
    with pytest.raises(zoo.SpecError, match=match):
        zoo.AttentionSpec(**dict(LATENT, **changes))


def test_the_hand_built_graph_refuses_it_by_name():
    from export.choice import why_not

    reason = why_not("ort-gqa", zoo.AttentionSpec(**dict(LATENT, d_v=24)))
    assert "kv_lora_rank=32" in reason and "latent" in reason


@given(spec=latent_specs(), t=st.integers(1, 7), split=st.integers(0, 7))
@fuzz_settings(15)
def test_fuzz_absorbed_decode_is_the_forward(spec, t, split):
    torch.manual_seed(0)
    m = zoo.MultiHeadAttention(spec).double()
    x = torch.randn(2, t, spec.d_model, dtype=torch.float64)
    y = m(x)
    split = min(split, t)
    past = (None, None)
    rows = []
    for chunk in (x[:, :split], x[:, split:]):
        if chunk.shape[1]:
            out, *past = m.decode(chunk, *past)
            rows.append(out)
    assert (torch.cat(rows, 1) - y).abs().max() < 1e-10
