"""Parity cases at long positions, merged into tests/peers/test_hf.py's CASES: the scaled rotary kinds
(llama3, yarn, longrope on both sides of its switch), at 1,100 positions, where the pretraining length
(original_max_position_embeddings = 256 or 512) is passed and every frequency band turns.

make() -> (model, attention module, model kwargs), as in tests/hf_cases.py; the second row is right-padded.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from hf_cases import SMALL, VOCAB, randomize
from torch import nn

transformers = __import__("pytest").importorskip("transformers")

B, LONG = 2, 1100
LONG_LLAMA = dict(
    SMALL, num_hidden_layers=1, num_key_value_heads=2, max_position_embeddings=4096, pad_token_id=0, eos_token_id=1
)
LLAMA3 = dict(
    rope_type="llama3",
    rope_theta=500000.0,
    factor=8.0,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    original_max_position_embeddings=256,
)
YARN = dict(rope_type="yarn", rope_theta=10000.0, factor=16.0, original_max_position_embeddings=256)
# DeepSeek-style: mscale / mscale_all_dim set the attention factor; gpt-oss-style: truncate off
YARN_MSCALE = dict(YARN, mscale=1.0, mscale_all_dim=0.5, beta_fast=16, truncate=False)
PAIRS = 8  # head_dim 16: 8 rotated pairs
LONGROPE = dict(
    rope_type="longrope",
    rope_theta=10000.0,
    short_factor=[1.0 + 0.1 * i for i in range(PAIRS)],
    long_factor=[1.5 + 0.75 * i for i in range(PAIRS)],
)


def long_model(
    model_cls: str, config_cls: str, t: int = LONG, layer: Callable[[nn.Module], nn.Module] | None = None, **cfg
):
    """make() for a text model run over `t` positions, the second row's last 3 right-padded."""

    def make():
        config = getattr(transformers, config_cls)(**cfg)
        config._attn_implementation = "eager"
        model = randomize(getattr(transformers, model_cls)(config))
        g = torch.Generator().manual_seed(1)
        keep = torch.ones(B, t, dtype=torch.long)
        keep[1, t - 3 :] = 0
        inputs = {"input_ids": torch.randint(2, VOCAB, (B, t), generator=g), "attention_mask": keep, "use_cache": False}
        return model, (layer or (lambda m: m.layers[0].self_attn))(model), inputs

    return make


CASES: dict[str, dict] = {
    "llama-rope-llama3": dict(
        make=long_model("LlamaModel", "LlamaConfig", **LONG_LLAMA, rope_parameters=LLAMA3),
        spec_checks={"rope_scaling": "llama3", "rope_factor": 8.0, "rope_original_max": 256},
    ),
    "qwen2-rope-yarn": dict(
        make=long_model("Qwen2Model", "Qwen2Config", **LONG_LLAMA, rope_parameters=YARN),
        spec_checks={"rope_scaling": "yarn", "rope_factor": 16.0, "rope_attention": None},
    ),
    "llama-rope-yarn-mscale": dict(
        make=long_model("LlamaModel", "LlamaConfig", **LONG_LLAMA, rope_parameters=YARN_MSCALE),
        spec_checks={"rope_scaling": "yarn", "rope_truncate": False, "rope_beta_fast": 16.0},
        variant=True,
    ),
    # Phi-3's original_max_position_embeddings sits at the top of its config: 512 here; 4096 / 512 = 8
    "phi3-longrope": dict(
        make=long_model(
            "Phi3Model", "Phi3Config", **LONG_LLAMA, original_max_position_embeddings=512, rope_parameters=LONGROPE
        ),
        spec_checks={"rope_scaling": "longrope", "rope_original_max": 512, "rope_factor": 8.0},
    ),
    # PhiMoE's rotary multiplies cos and sin by short_mscale / long_mscale (equal in Phi-3.5-MoE's config) in
    # place of longrope's own attention factor
    "phimoe-longrope-mscale": dict(
        make=long_model(
            "PhimoeModel",
            "PhimoeConfig",
            **LONG_LLAMA,
            original_max_position_embeddings=512,
            rope_parameters=dict(LONGROPE, short_mscale=1.3, long_mscale=1.3),
            num_local_experts=4,
            num_experts_per_tok=2,
        ),
        spec_checks={"rope_scaling": "longrope", "rope_attention": 1.3},
        variant=True,
    ),
    # 300 positions: under 512, the short factors
    "phi3-longrope-short": dict(
        make=long_model(
            "Phi3Model", "Phi3Config", 300, **LONG_LLAMA, original_max_position_embeddings=512, rope_parameters=LONGROPE
        ),
        spec_checks={"rope_scaling": "longrope"},
        variant=True,
    ),
}
