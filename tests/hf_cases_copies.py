"""Parity cases for the copies under new class names (peers.classes.COPIES), merged into
tests/peers/test_hf.py's CASES: each a tiny random model of its own (2 layers where the layers differ),
run over 160 positions so that windows of 16 and every rotary band matter; the second row right-padded.
"""

from __future__ import annotations

from hf_cases_long import long_model

T = 160
WINDOW = 16
BASE = dict(
    hidden_size=64,
    num_attention_heads=4,
    intermediate_size=64,
    vocab_size=50,
    num_hidden_layers=2,
    num_key_value_heads=2,
    max_position_embeddings=4096,
    pad_token_id=0,
    eos_token_id=1,
    bos_token_id=1,
)
SLIDE = dict(sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"])


def _case(model: str, config: str, checks: dict | None = None, **cfg) -> dict:
    return dict(make=long_model(model, config, T, **{**BASE, **cfg}), spec_checks=checks or {})


CASES: dict[str, dict] = {
    "arcee": _case("ArceeModel", "ArceeConfig"),
    "seed-oss": _case("SeedOssModel", "SeedOssConfig", {"bias": True}, head_dim=16, attention_bias=True),
    "phimoe": _case(
        "PhimoeModel", "PhimoeConfig", {"window": WINDOW}, sliding_window=WINDOW, num_local_experts=2,
        num_experts_per_tok=1,
    ),  # fmt: skip
    "granitemoe": _case(
        "GraniteMoeModel", "GraniteMoeConfig", {"scale": 0.1}, attention_multiplier=0.1, num_local_experts=2,
        num_experts_per_tok=1,
    ),  # fmt: skip
    "granitemoeshared": _case(
        "GraniteMoeSharedModel", "GraniteMoeSharedConfig", {"scale": 0.1}, attention_multiplier=0.1,
        num_local_experts=2, num_experts_per_tok=1,
    ),  # fmt: skip
    "glm4": _case("Glm4Model", "Glm4Config", {"rope_dim": 16, "rope_interleaved": True}, head_dim=32),
    "qwen3-moe": _case("Qwen3MoeModel", "Qwen3MoeConfig", {"qk_norm": "head"}, head_dim=16, num_experts=2,
                       num_experts_per_tok=1, moe_intermediate_size=32),  # fmt: skip
    "dots1": _case(
        "Dots1Model", "Dots1Config", {"qk_norm": "head"}, head_dim=16, n_routed_experts=2, num_experts_per_tok=1,
        moe_intermediate_size=32, first_k_dense_replace=2,
    ),  # fmt: skip
    # Apertus' config defaults to llama3 rope scaling (factor 8 from 8192)
    "apertus": _case("ApertusModel", "ApertusConfig", {"qk_norm": "head", "rope_scaling": "llama3"}),
    "olmoe": _case("OlmoeModel", "OlmoeConfig", {"qk_norm": "full"}, num_experts=2, num_experts_per_tok=1),
    "olmo3-sliding": _case("Olmo3Model", "Olmo3Config", {"qk_norm": "full", "window": WINDOW}, **SLIDE),
    "vaultgemma-sliding": _case(
        "VaultGemmaModel", "VaultGemmaConfig", {"window": WINDOW, "softcap": 1.5}, head_dim=16,
        query_pre_attn_scalar=24, attn_logit_softcapping=1.5, **SLIDE,
    ),  # fmt: skip
    "ernie4.5": _case("Ernie4_5Model", "Ernie4_5Config", {"rope_interleaved": True}, head_dim=16),
    "ernie4.5-moe": _case(
        "Ernie4_5_MoeModel", "Ernie4_5_MoeConfig", {"rope_interleaved": True}, head_dim=16, moe_num_experts=2,
        moe_k=1, moe_intermediate_size=32,
    ),  # fmt: skip
    "flex-olmo": _case("FlexOlmoModel", "FlexOlmoConfig", {"qk_norm": "full"}, num_experts=2, num_experts_per_tok=1),
    "glm4-moe": _case(
        "Glm4MoeModel", "Glm4MoeConfig", {"rope_dim": 16}, head_dim=32, n_routed_experts=2, num_experts_per_tok=1,
        moe_intermediate_size=32, first_k_dense_replace=2,
    ),  # fmt: skip
    "jais2": _case("Jais2Model", "Jais2Config", {"bias": True}),
    # CWM's config defaults to llama3 rope scaling (factor 16 from 8192); layer 0 of 2 is global here
    "cwm": _case("CwmModel", "CwmConfig", {"rope_scaling": "llama3"}, head_dim=16, sliding_window=WINDOW),
    "exaone-moe-sliding": _case(
        "ExaoneMoeModel", "ExaoneMoeConfig", {"qk_norm": "head", "window": WINDOW}, head_dim=16, num_experts=2,
        num_experts_per_tok=1, moe_intermediate_size=32, **SLIDE,
    ),  # fmt: skip
}
