"""Parity cases for the gated attention output (Qwen3-Next's Qwen3NextAttention), merged into
tests/peers/test_hf.py's CASES: a tiny random Qwen3-Next (two layers, the second its full-attention
layer; the first a gated delta-rule layer, outside the zoo) run over 160 positions, the second row
right-padded, with projection biases. Its q_proj holds each head's [query | gate] rows, its QK-norm
multiplies by (1 + weight), and it rotates part of each head (half of head_dim 32 here, so that the
16 rotated dims are what GroupQueryAttention's rotary takes; the config's default is a quarter).
"""

from __future__ import annotations

import torch
from hf_cases_copies import BASE, T
from hf_cases_long import long_model

GATED = {"output_gate": True, "qk_norm": "head", "rope_dim": 16, "bias": True}
QWEN3_NEXT = dict(
    BASE,
    head_dim=32,
    partial_rotary_factor=0.5,
    attention_bias=True,
    layer_types=["linear_attention", "full_attention"],
    num_experts=2,
    num_experts_per_tok=1,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=32,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
)


def _full_layer(model):
    """The full-attention layer, its QK-norm weights re-drawn about 0: Qwen3NextRMSNorm multiplies by
    (1 + weight) and initializes the weight to 0 (randomize() centres every norm at 1, which would double
    Q and K and the fp32 rounding with them)."""
    attn = model.layers[1].self_attn
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for norm in (attn.q_norm, attn.k_norm):
            norm.weight.copy_(0.15 * torch.randn(norm.weight.shape, generator=g))
    return attn


CASES: dict[str, dict] = {
    "qwen3-next": dict(
        make=long_model("Qwen3NextModel", "Qwen3NextConfig", T, layer=_full_layer, **QWEN3_NEXT),
        spec_checks=GATED,
    ),
}
