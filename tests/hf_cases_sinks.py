"""Parity cases for attention sinks (gpt-oss), merged into tests/peers/test_hf.py's CASES: a tiny random
GptOssModel run over 200 positions, where its sliding window (24 keys), its yarn-scaled rotary (factor 8 over a
64-token pretraining length, truncate off) and its per-head sinks all matter. Layer 0 slides, layer 1 is full
(layer_types alternate, as transformers' default).

make() -> (model, attention module, model kwargs), as in tests/hf_cases.py; the second row is right-padded.
"""

from __future__ import annotations

from hf_cases import VOCAB
from hf_cases_long import long_model

GPT_OSS = dict(
    hidden_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    intermediate_size=32,
    num_local_experts=4,
    num_experts_per_tok=2,
    vocab_size=VOCAB,
    num_hidden_layers=2,
    sliding_window=24,
    max_position_embeddings=512,
    pad_token_id=0,
    eos_token_id=1,
    rope_parameters=dict(
        rope_type="yarn",
        rope_theta=150000.0,
        factor=8.0,
        beta_fast=32.0,
        beta_slow=1.0,
        truncate=False,
        original_max_position_embeddings=64,
    ),
)
POSITIONS = 200
SPEC = {"sinks": True, "rope_scaling": "yarn", "rope_truncate": False, "bias": True, "kv_heads": 2}

CASES: dict[str, dict] = {
    "gpt-oss-sliding": dict(
        make=long_model("GptOssModel", "GptOssConfig", POSITIONS, **GPT_OSS),
        spec_checks={**SPEC, "window": 24},
    ),
    "gpt-oss-full": dict(
        make=long_model("GptOssModel", "GptOssConfig", POSITIONS, lambda m: m.layers[1].self_attn, **GPT_OSS),
        spec_checks={**SPEC, "window": None},
        variant=True,
    ),
}
