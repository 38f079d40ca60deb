"""Parity cases for LayerNorm QK-norm (qk_norm_kind="layer"), merged into tests/peers/test_hf.py's CASES:
Cohere's use_qk_norm (a weight per head, no bias), StableLM's qk_layernorm (a LayerNorm per head, no
bias), Persimmon's and Phi's qk_layernorm (one LayerNorm with a bias, shared by the heads); and GLM-4-MoE's
use_qk_norm (RMSNorm, read under the same per-config flag). Each a tiny random model run over 160
positions, the second row right-padded; randomize() makes every norm weight and bias nonzero and
unequal across heads. Persimmon and Phi rotate all of head_dim here (their partial
rotary has cases of its own), so that their default export is the GroupQueryAttention graph with its
LayerNormalization nodes; StableLM's keeps its partial rotary and exports through a traced lowering.
"""

from __future__ import annotations

from hf_cases_copies import BASE, T
from hf_cases_long import long_model

PER_HEAD = {"qk_norm": "per_head", "qk_norm_kind": "layer", "qk_norm_bias": False}
SHARED = {"qk_norm": "head", "qk_norm_kind": "layer", "qk_norm_bias": True}


def _case(model: str, config: str, checks: dict, **cfg) -> dict:
    return dict(make=long_model(model, config, T, **{**BASE, **cfg}), spec_checks=checks)


CASES: dict[str, dict] = {
    "cohere-qk-norm": _case("CohereModel", "CohereConfig", PER_HEAD, use_qk_norm=True),
    "stablelm-qk-layernorm": _case("StableLmModel", "StableLmConfig", PER_HEAD, qk_layernorm=True, use_qkv_bias=True),
    "persimmon-qk-layernorm": _case(
        "PersimmonModel",
        "PersimmonConfig",
        SHARED,
        qk_layernorm=True,
        num_key_value_heads=None,
        partial_rotary_factor=1.0,
    ),  # fmt: skip
    # GLM-4-MoE's use_qk_norm is RMSNorm (one weight over head_dim), read since its row reads the flag
    "glm4-moe-qk-norm": _case(
        "Glm4MoeModel",
        "Glm4MoeConfig",
        {"qk_norm": "head", "qk_norm_kind": "rms", "rope_dim": 16},
        head_dim=32,
        n_routed_experts=2,
        num_experts_per_tok=1,
        moe_intermediate_size=32,
        first_k_dense_replace=2,
        use_qk_norm=True,
    ),  # fmt: skip
    "phi-qk-layernorm": _case("PhiModel", "PhiConfig", SHARED, qk_layernorm=True, partial_rotary_factor=1.0),
}
