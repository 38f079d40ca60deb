"""Small random transformers decoder models, one per whole-model family (config model_type), saved with
save_pretrained: the cases tests/peers/test_lm.py checks the zoo's DecoderLM against, and the export
room's tests reuse.

    model = lm_cases.hf_model("llama")             # a random transformers model, eval mode, fp32
    folder = lm_cases.saved("llama", tmp_folder)   # the same model, saved (config.json + model.safetensors)

Every config is tiny (2 layers, hidden 64, vocab 100) with the family's distinguishing options turned on
(windows shorter than the generated length, softcaps, multipliers, biases), and every parameter is random
(transformers initializes biases to 0 and norms to 1, which would hide a mix-up of them).
"""

from __future__ import annotations

from pathlib import Path

import torch

transformers = __import__("pytest").importorskip("transformers")

VOCAB = 100
WINDOW = 6  # shorter than prompt + new tokens, so the windows slide
IDS = dict(vocab_size=VOCAB, bos_token_id=1, eos_token_id=2, pad_token_id=0)
BASE = dict(
    IDS, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=128
)
GPT = dict(IDS, n_embd=64, n_layer=2, n_head=4)

# model_type -> (config class, model class, config fields)
CASES: dict[str, tuple[str, str, dict]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(BASE, num_key_value_heads=2, tie_word_embeddings=False)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(BASE, num_key_value_heads=2, sliding_window=WINDOW)),
    "qwen2": (
        "Qwen2Config",
        "Qwen2ForCausalLM",
        dict(BASE, num_key_value_heads=2, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1),
    ),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(BASE, num_key_value_heads=2, head_dim=16)),
    "smollm3": (
        "SmolLM3Config",
        "SmolLM3ForCausalLM",
        dict(
            BASE,
            num_key_value_heads=2,
            no_rope_layers=[1, 0],
            use_sliding_window=True,
            sliding_window=WINDOW,
            layer_types=["sliding_attention", "full_attention"],
        ),
    ),
    "helium": (
        "HeliumConfig",
        "HeliumForCausalLM",
        dict(BASE, num_key_value_heads=2, head_dim=16, attention_bias=True, mlp_bias=True),
    ),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", dict(BASE, num_key_value_heads=1, head_dim=16)),
    "gemma2": (
        "Gemma2Config",
        "Gemma2ForCausalLM",
        dict(
            BASE,
            num_key_value_heads=2,
            head_dim=16,
            sliding_window=WINDOW,
            query_pre_attn_scalar=16,
            final_logit_softcapping=3.0,
            attn_logit_softcapping=5.0,
        ),
    ),
    "gemma3_text": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        dict(
            BASE,
            num_key_value_heads=2,
            head_dim=16,
            sliding_window=WINDOW,
            query_pre_attn_scalar=16,
            sliding_window_pattern=2,
        ),
    ),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(BASE, num_key_value_heads=2)),
    "phi": ("PhiConfig", "PhiForCausalLM", dict(BASE, partial_rotary_factor=0.5)),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(GPT, n_positions=128)),
    "gpt_neo": (
        "GPTNeoConfig",
        "GPTNeoForCausalLM",
        dict(
            IDS,
            hidden_size=64,
            num_layers=2,
            num_heads=4,
            intermediate_size=128,
            attention_types=[[["global", "local"], 1]],
            window_size=WINDOW,
            max_position_embeddings=128,
        ),
    ),
    "gpt_bigcode": ("GPTBigCodeConfig", "GPTBigCodeForCausalLM", dict(GPT, n_positions=128, n_inner=128)),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", dict(BASE, rotary_pct=0.5)),
    "gptj": ("GPTJConfig", "GPTJForCausalLM", dict(GPT, n_positions=128, rotary_dim=8)),
    "opt": (
        "OPTConfig",
        "OPTForCausalLM",
        dict(
            IDS,
            hidden_size=64,
            ffn_dim=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            word_embed_proj_dim=64,
            max_position_embeddings=128,
        ),
    ),
    "bloom": ("BloomConfig", "BloomForCausalLM", dict(IDS, hidden_size=64, n_layer=2, n_head=4)),
    "falcon": (
        "FalconConfig",
        "FalconForCausalLM",
        dict(IDS, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, alibi=False),
    ),
    "olmo": ("OlmoConfig", "OlmoForCausalLM", dict(BASE, num_key_value_heads=2, clip_qkv=0.5)),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", dict(BASE, num_key_value_heads=2)),
    "starcoder2": (
        "Starcoder2Config",
        "Starcoder2ForCausalLM",
        dict(BASE, num_key_value_heads=2, sliding_window=WINDOW),
    ),
    "mixtral": (
        "MixtralConfig",
        "MixtralForCausalLM",
        dict(BASE, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, sliding_window=None),
    ),
    "qwen2_moe": (
        "Qwen2MoeConfig",
        "Qwen2MoeForCausalLM",
        dict(
            BASE,
            num_key_value_heads=2,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=48,
        ),
    ),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        dict(
            BASE,
            num_key_value_heads=2,
            head_dim=16,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            norm_topk_prob=True,
            use_sliding_window=True,
            sliding_window=WINDOW,
        ),
    ),
    "olmoe": (
        "OlmoeConfig",
        "OlmoeForCausalLM",
        dict(BASE, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2),
    ),
    "granite": (
        "GraniteConfig",
        "GraniteForCausalLM",
        dict(
            BASE,
            num_key_value_heads=2,
            embedding_multiplier=3.0,
            residual_multiplier=0.5,
            logits_scaling=4.0,
            attention_multiplier=0.2,
        ),
    ),
    "cohere": (
        "CohereConfig",
        "CohereForCausalLM",
        dict(BASE, num_key_value_heads=2, use_qk_norm=True, logit_scale=0.25),
    ),
    "stablelm": (
        "StableLmConfig",
        "StableLmForCausalLM",
        dict(BASE, num_key_value_heads=2, partial_rotary_factor=0.25),
    ),
}


def longrope_phi3(original_max: int = 32, positions: int = 256, layers: int = 2) -> torch.nn.Module:
    """A random Phi-3 with longrope (short and long factors far apart): its generate re-runs the whole
    sequence at the first step past original_max (transformers' Phi3ForCausalLM.prepare_inputs_for_generation)."""
    pairs = BASE["hidden_size"] // BASE["num_attention_heads"] // 2
    rope = dict(
        rope_type="longrope",
        rope_theta=10000.0,
        short_factor=[1.0 + 0.1 * i for i in range(pairs)],
        long_factor=[1.5 + 0.75 * i for i in range(pairs)],
    )
    config = transformers.Phi3Config(
        **{**BASE, "max_position_embeddings": positions, "num_hidden_layers": layers},
        num_key_value_heads=2,
        original_max_position_embeddings=original_max,
        rope_parameters=rope,
    )
    torch.manual_seed(0)
    return randomize(transformers.Phi3ForCausalLM(config))


def randomize(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Every parameter random: norm weights near 1, everything else N(0, 0.1) (biases included)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            is_norm = p.dim() == 1 and any(k in name.lower() for k in ("norm", "ln_", "ln_f", "layernorm"))
            centre = 1.0 if is_norm and name.endswith("weight") else 0.0
            p.copy_(centre + 0.1 * torch.randn(p.shape, generator=g))
    return model.eval()


def hf_config(kind: str):  # noqa: ANN201 - a transformers config
    config_cls, _, fields = CASES[kind]
    config = getattr(transformers, config_cls)(**fields)
    config._attn_implementation = "eager"
    return config


def hf_model(kind: str, seed: int = 0) -> torch.nn.Module:
    """A random transformers causal LM of family `kind` (eval mode, fp32, eager attention)."""
    _, model_cls, _ = CASES[kind]
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(hf_config(kind))
    return randomize(model, seed)


def saved(kind: str, folder: Path, seed: int = 0) -> Path:
    """hf_model(kind, seed) saved with save_pretrained into folder / kind (made once; reused after)."""
    out = Path(folder) / kind
    if not (out / "config.json").is_file():
        hf_model(kind, seed).save_pretrained(out)
    return out


def prompt(batch: int = 2, t: int = 7, seed: int = 1) -> torch.Tensor:
    """(batch t) int64 token ids in 3..VOCAB-1 (clear of bos, eos and pad)."""
    return torch.randint(3, VOCAB, (batch, t), generator=torch.Generator().manual_seed(seed))
