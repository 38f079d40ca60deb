import pytest
import torch

import zoo
import zoo.accounting  # zoo loads its modules on first use; this file reads zoo.accounting directly
from helpers import ALL_NAMES
from zoo import AttentionSpec


@pytest.mark.parametrize("name", ALL_NAMES)
def test_formula_equals_module_count(name):
    s = zoo.spec(name)
    with torch.device("meta"):  # real widths, no allocation
        module = zoo.create(name)
    assert zoo.count_parameters(s) == zoo.count_parameters(module)


@pytest.mark.parametrize("name", ALL_NAMES)
def test_no_bias_formula_from_the_design(name):
    s = zoo.spec(name).replace(bias=False)
    h, g, dk, dv = s.heads, s.kv_heads_, s.d_k_, s.d_v_
    expected = s.d_model * h * dk + s.d_kv_in * (g * dk + g * dv) + h * dv * s.d_model
    # QK-norm's weights: one d_k vector each for Q and K ("head"), or h*d_k and g*d_k ("per_head", "full"),
    # and as many biases again for a LayerNorm with a bias
    norm = {None: 0, "head": 2 * dk, "per_head": h * dk + g * dk, "full": h * dk + g * dk}[s.qk_norm]
    expected += norm * (2 if s.qk_norm_bias else 1)
    # T5's relative bias table: one learned value per bucket and head
    expected += (s.rel_buckets or 0) * h
    expected += h if s.sinks else 0  # attention sinks: one logit per query head
    if s.kv_lora_rank is not None:  # latent attention: no W_K, W_V; K and V (and a low-rank Q) from the latents
        r, dr, rq = s.kv_lora_rank, s.rope_dim, s.q_lora_rank
        expected -= s.d_kv_in * (g * dk + g * dv) + (s.d_model * h * dk if rq else 0)
        expected += s.d_model * (r + dr) + r + r * h * (dk - dr + dv) + (s.d_model * rq + rq + rq * h * dk if rq else 0)
    assert zoo.count_parameters(s) == expected


def test_seed_figures():
    # seed 003: d=512, h=8 -> 4 d^2
    assert zoo.count_parameters(zoo.spec("transformer-base")) == 1_048_576 == 4 * 512**2
    # seed 004 exercise 1: d=1024, H=16 -> d_k=64, 4 d^2
    s = AttentionSpec(d_model=1024, heads=16, bias=False)
    assert s.d_k_ == 64 and zoo.count_parameters(s) == 4_194_304
    # 4 d^2 whatever the head split (seed 000), once h*dk = h*dv = d
    assert {zoo.count_parameters(AttentionSpec(d_model=768, heads=h, bias=False)) for h in (1, 2, 3, 12, 768)} == {
        4 * 768**2
    }


def test_bias_convention_is_explicit():
    s = AttentionSpec(d_model=512, heads=8, bias=True)
    assert zoo.count_parameters(s) == 4 * 512**2 + 4 * 512
    g = AttentionSpec(d_model=512, heads=8, kv_heads=2, bias=True)
    assert zoo.parameter_breakdown(g).biases == 512 + 128 + 128 + 512


def test_seed_004_flops_exercise():
    # T=2048, d=4096, H=32, B=1: 4 projections of 2*T*d^2 plus 2 attention products of 2*T^2*d
    f = zoo.flops(AttentionSpec(d_model=4096, heads=32, bias=False), batch=1, seq=2048)
    assert f.projections == 4 * 2 * 2048 * 4096**2 == 274_877_906_944
    assert f.attention == 2 * 2 * 2048**2 * 4096 == 68_719_476_736
    assert f.total == 343_597_383_680


def test_score_entries_and_bytes():
    s = zoo.spec("cross-attention")
    assert zoo.score_entries(s, 3, 5, 11) == 3 * 4 * 5 * 11
    b = zoo.bytes_moved(s, 2, 5, 7, itemsize=2)
    assert b.inputs == (2 * 5 * 64 + 2 * 7 * 48) * 2
    assert b.parameters == zoo.count_parameters(s) * 2
    assert b.minimum == b.inputs + b.parameters + b.output


def test_stage_shapes_use_the_axis_vocabulary():
    st = {x.name: x for x in zoo.stage_shapes(zoo.spec("gqa"), 2, 9)}
    assert st["Q"].axes == "b h t dk" and st["Q"].shape == (2, 8, 9, 8)
    assert st["K"].shape == (2, 2, 9, 8) and st["A"].shape == (2, 8, 9, 9)
    assert st["Z"].shape == (2, 9, 64)


def test_count_parameters_type_error():
    with pytest.raises(TypeError, match="AttentionSpec or nn.Module"):
        zoo.count_parameters("transformer-base")


@pytest.mark.parametrize("norm", ["head", "per_head", "full"])
@pytest.mark.parametrize("kind, bias", [("rms", False), ("layer", False), ("layer", True)])
def test_qk_norm_counts_its_weights_and_biases(norm, kind, bias):
    s = zoo.spec("gqa", qk_norm=norm, qk_norm_kind=kind, qk_norm_bias=bias)
    h, g, dk = s.heads, s.kv_heads_, s.d_k_
    per = 2 * dk if norm == "head" else (h + g) * dk  # one d_k vector, or one per head of Q and of K
    assert zoo.accounting.parameter_breakdown(s).modifiers == per * (2 if bias else 1)
    assert zoo.count_parameters(s) == zoo.count_parameters(zoo.MultiHeadAttention(s))
