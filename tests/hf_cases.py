"""Parity cases for the further transformers families (Qwen2, Mixtral, Gemma, ...), merged into
tests/peers/test_hf.py's CASES.

Each case is a tiny model from a config with random weights (no download): make() -> (model,
attention module, model kwargs). Text models right-pad their second row; decoder self-attention
cases of encoder-decoders run without padding (their mask is the causal one). Also REFUSALS: for
each configuration a row refuses, the case whose module to copy and how to change the copy so that
from_hf must refuse it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

transformers = __import__("pytest").importorskip("transformers")

B, T, VOCAB = 2, 10, 50
WINDOW = 4
SMALL = dict(hidden_size=64, num_attention_heads=4, intermediate_size=64, vocab_size=VOCAB)
LLAMA = dict(SMALL, num_hidden_layers=1, num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0)
TWO = dict(LLAMA, num_hidden_layers=2)
ROPE = {"rope_type": "default", "rope_theta": 10000.0}


def ids(keep: Tensor | None = None, **extra: object) -> dict:
    g = torch.Generator().manual_seed(1)
    # use_cache=False: the captured call is replayed in the round trip, and a cache would grow
    out = {"input_ids": torch.randint(2, VOCAB, (B, T), generator=g), "use_cache": False, **extra}
    if keep is not None:
        out["attention_mask"] = keep.long()
    return out


def keep() -> Tensor:
    k = torch.ones(B, T, dtype=torch.bool)
    k[1, T - 3 :] = False  # right padding: the last three keys of row 1
    return k


def randomize(model: nn.Module, seed: int = 0) -> nn.Module:
    """Every parameter random (HF initializes biases to 0 and norms to 1, which would hide their bugs)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            centre = 1.0 if "norm" in name.lower() else 0.0
            p.copy_(centre + 0.15 * torch.randn(p.shape, generator=g))
    return model.eval()


def model_of(model_cls: str, config_cls: str, layer: Callable[[nn.Module], nn.Module], pad: bool = True, **cfg):
    """make() for a text model: a random `model_cls` from `config_cls(**cfg)`, its attention `layer(model)`."""

    def make():
        config = getattr(transformers, config_cls)(**cfg)
        config._attn_implementation = "eager"
        model = randomize(getattr(transformers, model_cls)(config))
        return model, layer(model), ids(keep() if pad else None)

    return make


def _encdec(model_cls: str, config_cls: str, part: str = "encoder", **cfg):
    """part: "encoder" (self-attention, padded), "decoder" (causal self-attention, no padding) or
    "cross" (the decoder's encoder_attn: keys from the encoder output, the encoder's padding hides keys)."""

    def make():
        config = getattr(transformers, config_cls)(
            vocab_size=VOCAB,
            d_model=64,
            encoder_layers=1,
            decoder_layers=1,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=64,
            decoder_ffn_dim=64,
            max_position_embeddings=64,
            pad_token_id=1,
            decoder_start_token_id=0,
            **cfg,
        )
        config._attn_implementation = "eager"
        model = randomize(getattr(transformers, model_cls)(config))
        tokens = ids()["input_ids"]
        if part == "decoder":
            return model, model.decoder.layers[0].self_attn, ids(decoder_input_ids=tokens)
        if part == "cross":  # decoder queries over T - 3 positions, encoder keys over T
            return model, model.decoder.layers[0].encoder_attn, ids(keep(), decoder_input_ids=tokens[:, : T - 3])
        return model, model.encoder.layers[0].self_attn, ids(keep(), decoder_input_ids=tokens)

    return make


def _whisper(part: str):
    def make():
        config = transformers.WhisperConfig(
            vocab_size=VOCAB,
            num_mel_bins=8,
            d_model=64,
            encoder_layers=1,
            decoder_layers=1,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=64,
            decoder_ffn_dim=64,
            max_source_positions=T,
            max_target_positions=32,
            pad_token_id=1,
            decoder_start_token_id=0,
        )
        config._attn_implementation = "eager"
        model = randomize(transformers.WhisperModel(config))
        features = torch.randn(B, 8, 2 * T, generator=torch.Generator().manual_seed(2))
        tokens = ids()["input_ids"]
        if part == "cross":  # decoder queries over T - 3 positions, keys from the T encoder frames
            tokens = tokens[:, : T - 3]
        inputs = {"input_features": features, "decoder_input_ids": tokens, "use_cache": False}
        layer = model.encoder.layers[0] if part == "encoder" else model.decoder.layers[0]
        module = layer.encoder_attn if part == "cross" else layer.self_attn
        return model, module, inputs

    return make


def _t5(model_cls: str, config_cls: str, part: str = "encoder", layer: int = 0):
    """A tiny T5-style encoder-decoder. part: "encoder" (self-attention, bidirectional buckets, padded),
    "decoder" (causal self-attention, buckets of the past, no padding) or "cross" (EncDecAttention: decoder
    queries over T - 3 positions, keys from the padded encoder output). Layer `layer` of that stack: T5 and
    MT5 keep the bias table in layer 0 only; 8 buckets up to distance 12, so that T = 10 reaches the
    log-spaced ones."""

    def make():
        config = getattr(transformers, config_cls)(
            vocab_size=VOCAB,
            d_model=64,
            d_kv=16,
            d_ff=64,
            num_layers=2,
            num_heads=4,
            relative_attention_num_buckets=8,
            relative_attention_max_distance=12,
            pad_token_id=0,
            decoder_start_token_id=0,
        )
        config._attn_implementation = "eager"
        model = randomize(getattr(transformers, model_cls)(config))
        tokens = ids()["input_ids"]
        if part == "decoder":
            return model, model.decoder.block[layer].layer[0].SelfAttention, ids(decoder_input_ids=tokens)
        if part == "cross":
            module = model.decoder.block[layer].layer[1].EncDecAttention
            return model, module, ids(keep(), decoder_input_ids=tokens[:, : T - 3])
        return model, model.encoder.block[layer].layer[0].SelfAttention, ids(keep(), decoder_input_ids=tokens)

    return make


def _vision(model_cls: str, config_cls: str, layer: Callable[[nn.Module], nn.Module], **cfg):
    def make():
        config = getattr(transformers, config_cls)(
            hidden_size=64, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64, image_size=16, **cfg
        )
        config._attn_implementation = "eager"
        model = randomize(getattr(transformers, model_cls)(config))
        pixels = torch.randn(B, 3, 16, 16, generator=torch.Generator().manual_seed(2))
        return model, layer(model), {"pixel_values": pixels}

    return make


def _self_attn(m: nn.Module) -> nn.Module:
    return m.layers[0].self_attn


def _second(m: nn.Module) -> nn.Module:
    return m.layers[1].self_attn


def _bert_like(model_cls: str, config_cls: str, **cfg):
    return model_of(
        model_cls,
        config_cls,
        lambda m: m.encoder.layer[0].attention,
        **SMALL,
        num_hidden_layers=1,
        max_position_embeddings=40,
        **cfg,
    )


GEMMA3_ROPE = {"sliding_attention": ROPE, "full_attention": {"rope_type": "default", "rope_theta": 1e6}}
GEMMA3 = dict(
    TWO,
    head_dim=16,
    query_pre_attn_scalar=24,
    attn_logit_softcapping=1.5,
    sliding_window=WINDOW,
    layer_types=["sliding_attention", "full_attention"],
    rope_parameters=GEMMA3_ROPE,
)
# the 4B+ configs: global layers scale their rotary linearly (positions / 8)
GEMMA3_LINEAR = dict(
    GEMMA3, rope_parameters=dict(GEMMA3_ROPE, full_attention={"rope_type": "linear", "rope_theta": 1e6, "factor": 8.0})
)
SLIDING_THEN_FULL = dict(TWO, sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"])
CROSS = {"causal": False, "d_context": 64}
T5_SPEC = {"scale": 1.0, "rel_buckets": 8, "rel_max_distance": 12, "bias": False}
BERT_OUT = dict(output_is_dense_of=lambda m: m.output.dense, spec_checks={"causal": False})

# latent attention (DeepSeek-V2/V3, MiniCPM3): a query low rank, the KV latent, a decoupled rotary key of 8 dims,
# d_v != d_k; the first layer dense (first_k_dense_replace=1: its MLP is no MoE, which is outside the block anyway)
MLA = dict(
    LLAMA,
    num_key_value_heads=4,
    q_lora_rank=24,
    kv_lora_rank=32,
    qk_rope_head_dim=8,
    qk_nope_head_dim=16,
    v_head_dim=12,
    max_position_embeddings=512,
)
DEEPSEEK = dict(MLA, first_k_dense_replace=1, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
LATENT = {"kv_lora_rank": 32, "rope_dim": 8, "d_k": 24, "d_v": 12}

# name -> Case fields (test_hf.Case)
CASES: dict[str, dict] = {
    # -- latent attention
    "deepseek-v3-lora": dict(
        make=model_of("DeepseekV3Model", "DeepseekV3Config", _self_attn, **DEEPSEEK),
        spec_checks=dict(LATENT, q_lora_rank=24, rope_interleaved=True),
    ),
    "deepseek-v3-halves": dict(
        make=model_of(
            "DeepseekV3Model", "DeepseekV3Config", _self_attn, **dict(DEEPSEEK, q_lora_rank=None, rope_interleave=False)
        ),
        spec_checks=dict(LATENT, q_lora_rank=None, rope_interleaved=False),
        variant=True,
    ),
    "deepseek-v3-yarn": dict(  # the released config's yarn: scaled frequencies and mscale on the score scale
        make=model_of(
            "DeepseekV3Model",
            "DeepseekV3Config",
            _self_attn,
            **dict(
                DEEPSEEK,
                max_position_embeddings=2560,
                rope_scaling={
                    "rope_type": "yarn",
                    "factor": 40.0,
                    "beta_fast": 32,
                    "beta_slow": 1,
                    "mscale": 1.0,
                    "mscale_all_dim": 1.0,
                    "original_max_position_embeddings": 64,
                },
            ),
        ),
        spec_checks=dict(LATENT, q_lora_rank=24, rope_scaling="yarn", rope_factor=40.0),
        variant=True,
    ),
    "deepseek-v2": dict(
        make=model_of("DeepseekV2Model", "DeepseekV2Config", _self_attn, **dict(DEEPSEEK, q_lora_rank=None)),
        spec_checks=dict(LATENT, q_lora_rank=None, rope_interleaved=True),
    ),
    "minicpm3": dict(
        make=model_of("MiniCPM3Model", "MiniCPM3Config", _self_attn, **MLA),
        spec_checks=dict(LATENT, q_lora_rank=24, rope_interleaved=False),
    ),
    # -- decoders
    "qwen2": dict(make=model_of("Qwen2Model", "Qwen2Config", _self_attn, **LLAMA), spec_checks={"bias": True}),
    "qwen2-sliding": dict(
        make=model_of(
            "Qwen2Model",
            "Qwen2Config",
            _self_attn,
            **LLAMA,
            use_sliding_window=True,
            sliding_window=WINDOW,
            max_window_layers=0,
        ),
        spec_checks={"window": WINDOW},
        variant=True,
    ),
    "qwen2-moe": dict(
        make=model_of(
            "Qwen2MoeModel",
            "Qwen2MoeConfig",
            _self_attn,
            **LLAMA,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
        ),
        spec_checks={"kv_heads": 2},
    ),
    "mixtral": dict(
        make=model_of(
            "MixtralModel",
            "MixtralConfig",
            _self_attn,
            **LLAMA,
            num_local_experts=4,
            num_experts_per_tok=2,
            sliding_window=WINDOW,
        ),
        spec_checks={"window": WINDOW},
    ),
    "gemma": dict(make=model_of("GemmaModel", "GemmaConfig", _self_attn, **LLAMA, head_dim=16)),
    "gemma3-sliding": dict(
        make=model_of("Gemma3TextModel", "Gemma3TextConfig", _self_attn, **GEMMA3),
        spec_checks={"window": WINDOW, "qk_norm": "head", "rope_theta": 10000.0, "softcap": None},
    ),
    "gemma3-global": dict(
        make=model_of("Gemma3TextModel", "Gemma3TextConfig", _second, **GEMMA3),
        spec_checks={"window": None, "rope_theta": 1e6},
        variant=True,
    ),
    "gemma3-global-linear": dict(
        make=model_of("Gemma3TextModel", "Gemma3TextConfig", _second, **GEMMA3_LINEAR),
        spec_checks={"window": None, "rope_theta": 1e6, "rope_scale": 8.0},
    ),
    "cohere": dict(
        make=model_of("CohereModel", "CohereConfig", _self_attn, **LLAMA), spec_checks={"rope_interleaved": True}
    ),
    "cohere2-sliding": dict(
        make=model_of("Cohere2Model", "Cohere2Config", _self_attn, **SLIDING_THEN_FULL),
        spec_checks={"window": WINDOW, "rope_interleaved": True},
    ),
    "cohere2-global": dict(
        make=model_of("Cohere2Model", "Cohere2Config", _second, **SLIDING_THEN_FULL),
        spec_checks={"window": None, "rope_theta": None},
        variant=True,
    ),
    "phi3": dict(
        make=model_of(
            "Phi3Model",
            "Phi3Config",
            _self_attn,
            **LLAMA,
            rope_parameters=dict(ROPE, partial_rotary_factor=0.5),
            sliding_window=WINDOW,
        ),
        spec_checks={"layout": "combined", "rope_dim": 8, "window": WINDOW},
    ),
    "stablelm": dict(
        make=model_of("StableLmModel", "StableLmConfig", _self_attn, **LLAMA, use_qkv_bias=True),
        spec_checks={"rope_dim": 4, "bias": True},
    ),
    "starcoder2": dict(
        make=model_of("Starcoder2Model", "Starcoder2Config", _self_attn, **LLAMA, sliding_window=WINDOW),
        spec_checks={"window": WINDOW, "bias": True},
    ),
    "granite": dict(
        make=model_of("GraniteModel", "GraniteConfig", _self_attn, **LLAMA, attention_multiplier=0.1),
        spec_checks={"scale": 0.1},
    ),
    "olmo": dict(make=model_of("OlmoModel", "OlmoConfig", _self_attn, **LLAMA)),
    # OLMo-7B's clip_qkv is 8.0; 0.5 bites at these sizes (projections of ~1)
    "olmo-clip": dict(
        make=model_of("OlmoModel", "OlmoConfig", _self_attn, **LLAMA, clip_qkv=0.5),
        spec_checks={"clip_qkv": 0.5},
        variant=True,
    ),
    "persimmon": dict(
        make=model_of(
            "PersimmonModel",
            "PersimmonConfig",
            _self_attn,
            **SMALL,
            num_hidden_layers=1,
            max_position_embeddings=64,
            qk_layernorm=False,
        ),
        spec_checks={"layout": "combined", "rope_dim": 8},
    ),
    "helium": dict(
        make=model_of("HeliumModel", "HeliumConfig", _self_attn, **LLAMA, head_dim=16),
        spec_checks={"rope_interleaved": True},
    ),
    "nemotron": dict(
        make=model_of("NemotronModel", "NemotronConfig", _self_attn, **LLAMA, head_dim=16),
        spec_checks={"rope_dim": 8},
    ),
    "smollm3": dict(make=model_of("SmolLM3Model", "SmolLM3Config", _self_attn, **TWO, no_rope_layers=[1, 0])),
    "smollm3-nope": dict(
        make=model_of("SmolLM3Model", "SmolLM3Config", _second, **TWO, no_rope_layers=[1, 0]),
        spec_checks={"rope_theta": None},
        variant=True,
    ),
    "exaone4-sliding": dict(
        make=model_of("Exaone4Model", "Exaone4Config", _self_attn, **SLIDING_THEN_FULL),
        spec_checks={"window": WINDOW, "qk_norm": "head"},
    ),
    "exaone4-global": dict(
        make=model_of("Exaone4Model", "Exaone4Config", _second, **SLIDING_THEN_FULL),
        spec_checks={"window": None, "rope_theta": None},
        variant=True,
    ),
    "glm": dict(
        make=model_of("GlmModel", "GlmConfig", _self_attn, **LLAMA, head_dim=16),
        spec_checks={"rope_dim": 8, "rope_interleaved": True},
    ),
    "gptj": dict(
        make=model_of(
            "GPTJModel",
            "GPTJConfig",
            lambda m: m.h[0].attn,
            vocab_size=VOCAB,
            n_embd=64,
            n_layer=1,
            n_head=4,
            rotary_dim=8,
            n_positions=64,
        ),
        spec_checks={"rope_dim": 8, "rope_interleaved": True},
    ),
    "codegen": dict(
        make=model_of(
            "CodeGenModel",
            "CodeGenConfig",
            lambda m: m.h[0].attn,
            vocab_size=VOCAB,
            n_embd=64,
            n_layer=1,
            n_head=4,
            rotary_dim=8,
            n_positions=64,
        ),
        spec_checks={"rope_dim": 8, "layout": "combined"},
    ),
    "gpt-neo-local": dict(
        make=model_of(
            "GPTNeoModel",
            "GPTNeoConfig",
            lambda m: m.h[1].attn.attention,
            vocab_size=VOCAB,
            hidden_size=64,
            num_layers=2,
            num_heads=4,
            attention_types=[[["global", "local"], 1]],
            window_size=WINDOW,
            max_position_embeddings=32,
        ),
        spec_checks={"window": WINDOW, "scale": 1.0},
    ),
    "gpt-neo-global": dict(
        make=model_of(
            "GPTNeoModel",
            "GPTNeoConfig",
            lambda m: m.h[0].attn.attention,
            vocab_size=VOCAB,
            hidden_size=64,
            num_layers=2,
            num_heads=4,
            attention_types=[[["global", "local"], 1]],
            window_size=WINDOW,
            max_position_embeddings=32,
        ),
        spec_checks={"window": None, "scale": 1.0},
        variant=True,
    ),
    "gpt-bigcode": dict(
        make=model_of(
            "GPTBigCodeModel",
            "GPTBigCodeConfig",
            lambda m: m.h[0].attn,
            vocab_size=VOCAB,
            n_embd=64,
            n_layer=1,
            n_head=4,
            n_positions=32,
            multi_query=True,
        ),
        spec_checks={"kv_heads": 1, "layout": "combined"},
    ),
    "gpt-bigcode-mha": dict(
        make=model_of(
            "GPTBigCodeModel",
            "GPTBigCodeConfig",
            lambda m: m.h[0].attn,
            vocab_size=VOCAB,
            n_embd=64,
            n_layer=1,
            n_head=4,
            n_positions=32,
            multi_query=False,
        ),
        spec_checks={"kv_heads": None},
        variant=True,
    ),
    "opt": dict(
        make=model_of(
            "OPTModel",
            "OPTConfig",
            lambda m: m.decoder.layers[0].self_attn,
            vocab_size=VOCAB,
            hidden_size=64,
            num_hidden_layers=1,
            ffn_dim=64,
            num_attention_heads=4,
            max_position_embeddings=64,
            word_embed_proj_dim=64,
            pad_token_id=1,
        ),
        spec_checks={"causal": True, "bias": True},
    ),
    "mpt": dict(
        make=model_of(
            "MptModel",
            "MptConfig",
            lambda m: m.blocks[0].attn,
            vocab_size=VOCAB,
            d_model=64,
            n_heads=4,
            n_layers=1,
            max_seq_len=64,
            expansion_ratio=1,
        ),
        spec_checks={"alibi": True, "layout": "combined"},
    ),
    "mpt-clip": dict(
        make=model_of(
            "MptModel",
            "MptConfig",
            lambda m: m.blocks[0].attn,
            vocab_size=VOCAB,
            d_model=64,
            n_heads=4,
            n_layers=1,
            max_seq_len=64,
            expansion_ratio=1,
            attn_config={"clip_qkv": 0.5},
        ),
        spec_checks={"alibi": True, "clip_qkv": 0.5},
        variant=True,
    ),
    "mpt-6-heads": dict(
        make=model_of(
            "MptModel",
            "MptConfig",
            lambda m: m.blocks[0].attn,
            vocab_size=VOCAB,
            d_model=48,
            n_heads=6,
            n_layers=1,
            max_seq_len=64,
            expansion_ratio=1,
        ),
        spec_checks={"alibi": True},
        variant=True,
    ),
    # -- encoders: the BERT copies compare at output.dense, as BERT does
    "roberta": dict(make=_bert_like("RobertaModel", "RobertaConfig", pad_token_id=1), **BERT_OUT),
    "xlm-roberta": dict(make=_bert_like("XLMRobertaModel", "XLMRobertaConfig", pad_token_id=1), **BERT_OUT),
    "electra": dict(make=_bert_like("ElectraModel", "ElectraConfig", embedding_size=64), **BERT_OUT),
    "camembert": dict(make=_bert_like("CamembertModel", "CamembertConfig", pad_token_id=1), **BERT_OUT),
    "distilbert": dict(
        make=model_of(
            "DistilBertModel",
            "DistilBertConfig",
            lambda m: m.transformer.layer[0].attention,
            vocab_size=VOCAB,
            dim=64,
            n_layers=1,
            n_heads=4,
            hidden_dim=64,
            max_position_embeddings=32,
        ),
        spec_checks={"causal": False},
    ),
    "albert": dict(
        make=model_of(
            "AlbertModel",
            "AlbertConfig",
            lambda m: m.encoder.albert_layer_groups[0].albert_layers[0].attention,
            **SMALL,
            embedding_size=32,
            num_hidden_layers=1,
            max_position_embeddings=32,
        ),
        output_is_dense_of=lambda m: m.dense,
        layernorm="LayerNorm",
        spec_checks={"causal": False},
    ),
    "modernbert": dict(
        make=model_of(
            "ModernBertModel",
            "ModernBertConfig",
            lambda m: m.layers[0].attn,
            **dict(SMALL, num_hidden_layers=2),
            max_position_embeddings=64,
            layer_types=["full_attention", "sliding_attention"],
            pad_token_id=1,
        ),
        spec_checks={"causal": False, "rope_theta": 160000.0, "layout": "combined"},
    ),
    # layer 1 is local: |i - j| <= local_attention // 2 = WINDOW, the zoo's window WINDOW + 1 (symmetric),
    # with the local rope base
    "modernbert-local": dict(
        make=model_of(
            "ModernBertModel",
            "ModernBertConfig",
            lambda m: m.layers[1].attn,
            **dict(SMALL, num_hidden_layers=2),
            max_position_embeddings=64,
            layer_types=["full_attention", "sliding_attention"],
            local_attention=2 * WINDOW,
            local_rope_theta=5000.0,
            pad_token_id=1,
        ),
        spec_checks={"causal": False, "window": WINDOW + 1, "rope_theta": 5000.0, "layout": "combined"},
    ),
    # -- encoder-decoders and speech
    "bart": dict(make=_encdec("BartModel", "BartConfig"), spec_checks={"causal": False}),
    "bart-decoder": dict(make=_encdec("BartModel", "BartConfig", "decoder"), spec_checks={"causal": True}),
    "mbart": dict(make=_encdec("MBartModel", "MBartConfig"), spec_checks={"causal": False}),
    "marian": dict(make=_encdec("MarianModel", "MarianConfig"), spec_checks={"causal": False}),
    "pegasus": dict(make=_encdec("PegasusModel", "PegasusConfig"), spec_checks={"causal": False}),
    "whisper": dict(make=_whisper("encoder"), spec_checks={"causal": False, "bias": True}),
    "whisper-decoder": dict(make=_whisper("decoder"), spec_checks={"causal": True}, variant=True),
    # the decoders' cross-attention (encoder_attn): block(x, context); BART's one torch-exported
    # lowering runs by default, its copies' (same code) under -m slow
    "bart-cross": dict(make=_encdec("BartModel", "BartConfig", "cross"), spec_checks=CROSS),
    "mbart-cross": dict(make=_encdec("MBartModel", "MBartConfig", "cross"), spec_checks=CROSS, variant=True),
    "marian-cross": dict(make=_encdec("MarianModel", "MarianConfig", "cross"), spec_checks=CROSS, variant=True),
    "pegasus-cross": dict(make=_encdec("PegasusModel", "PegasusConfig", "cross"), spec_checks=CROSS, variant=True),
    # Whisper's k_proj has no bias: the block holds zeros there
    "whisper-cross": dict(make=_whisper("cross"), spec_checks=dict(CROSS, bias=True)),
    # T5: relative position buckets; layer 1 reads layer 0's table (from_hf(module, model=model));
    # MT5 is T5's code, UMT5 gives every layer its own table and names the context encoder_hidden_states
    "t5": dict(make=_t5("T5Model", "T5Config"), spec_checks=dict(T5_SPEC, causal=False)),
    "t5-decoder": dict(make=_t5("T5Model", "T5Config", "decoder"), spec_checks=dict(T5_SPEC, causal=True)),
    "t5-layer1": dict(make=_t5("T5Model", "T5Config", layer=1), spec_checks=dict(T5_SPEC, causal=False), variant=True),
    "t5-decoder-layer1": dict(
        make=_t5("T5Model", "T5Config", "decoder", layer=1), spec_checks=dict(T5_SPEC, causal=True), variant=True
    ),
    "t5-cross": dict(
        make=_t5("T5Model", "T5Config", "cross"), spec_checks=dict(CROSS, scale=1.0, rel_buckets=None), variant=True
    ),
    "mt5-layer1": dict(make=_t5("MT5Model", "MT5Config", layer=1), spec_checks=T5_SPEC),
    "umt5-layer1": dict(make=_t5("UMT5Model", "UMT5Config", "decoder", layer=1), spec_checks=T5_SPEC),
    "umt5-cross": dict(make=_t5("UMT5Model", "UMT5Config", "cross"), spec_checks=CROSS, variant=True),
    # -- vision
    "deit": dict(make=_vision("DeiTModel", "DeiTConfig", lambda m: m.layers[0].attention, patch_size=4)),
    "dinov2": dict(make=_vision("Dinov2Model", "Dinov2Config", lambda m: m.encoder.layer[0].attention, patch_size=4)),
    "beit": dict(make=_vision("BeitModel", "BeitConfig", lambda m: m.layers[0].attention, patch_size=4)),
    "clip-vision": dict(
        make=_vision("CLIPVisionModel", "CLIPVisionConfig", lambda m: m.encoder.layers[0].self_attn, patch_size=4),
        spec_checks={"causal": False},
    ),
    "clip-text": dict(
        make=model_of(
            "CLIPTextModel",
            "CLIPTextConfig",
            lambda m: m.encoder.layers[0].self_attn,
            **SMALL,
            num_hidden_layers=1,
            max_position_embeddings=32,
        ),
        spec_checks={"causal": True},
    ),
    "siglip": dict(
        make=_vision("SiglipVisionModel", "SiglipVisionConfig", lambda m: m.encoder.layers[0].self_attn, patch_size=4),
        spec_checks={"causal": False},
    ),
}


# Cases whose block is the same kind as an earlier case of their family (the BERT, BART, T5 and ViT
# copies): eager exactness runs by default, their exports under -m slow, since the family's first
# case exports that kind of block already.
SAME_KIND = ("roberta", "xlm-roberta", "electra", "camembert", "distilbert", "albert", "mbart", "marian", "pegasus")
SAME_KIND += ("mt5-layer1", "deit", "dinov2", "siglip")
for _name in SAME_KIND:
    CASES[_name]["variant"] = True


def _set(path: str, value: object) -> Callable[[nn.Module], None]:
    """Mutation for a copied module: set the dotted attribute `path` to `value`."""

    def fn(m: nn.Module) -> None:
        *parents, last = path.split(".")
        obj = m
        for p in parents:
            obj = getattr(obj, p)
        setattr(obj, last, value)

    return fn


BIDI = _set("config.use_bidirectional_attention", True)

# (class, check name) -> (case whose module is copied, how the copy is changed so that it must be refused)
REFUSALS: dict[tuple[str, str], tuple[str, Callable[[nn.Module], None]]] = {
    ("FalconAttention", "alibi=True"): ("falcon-mq", _set("config.alibi", True)),
    ("CodeGenAttention", "mp_num != 4"): ("codegen", _set("mp_num", 8)),
    ("CLIPAttention", "config neither CLIP text nor vision"): (
        "clip-text",
        lambda m: m.__setattr__("config", transformers.PretrainedConfig()),
    ),
    ("BeitAttention", "relative position bias"): ("beit", _set("config.use_relative_position_bias", True)),
    ("GPT2Attention", "cross-attention"): ("gpt2", _set("is_cross_attention", True)),
    ("GPTBigCodeAttention", "cross-attention"): ("gpt-bigcode", _set("is_cross_attention", True)),
    ("BertAttention", "cross-attention"): ("bert", lambda m: m.__setattr__("self", _cross_like(m.self))),
}
for _cls, _case in (
    ("RobertaAttention", "roberta"),
    ("XLMRobertaAttention", "xlm-roberta"),
    ("ElectraAttention", "electra"),
    ("CamembertAttention", "camembert"),
):
    REFUSALS[(_cls, "cross-attention")] = (_case, lambda m: m.__setattr__("self", _cross_like(m.self)))


def _cross_like(inner: nn.Module) -> nn.Module:
    """The same self-attention module, reclassed as the family's CrossAttention class (what a
    cross-attention layer of BERT and its copies holds)."""
    module = __import__(type(inner).__module__, fromlist=["x"])
    cross_cls = getattr(module, type(inner).__name__.replace("SelfAttention", "CrossAttention"))
    inner.__class__ = cross_cls
    return inner


# Classes refused as a whole: class -> a module of it
def _qwen3_next_linear() -> nn.Module:
    """Qwen3-Next's gated delta-rule layer (layer 0 of tests/hf_cases_gated.py's model)."""
    from hf_cases_gated import QWEN3_NEXT

    return model_of("Qwen3NextModel", "Qwen3NextConfig", lambda m: m.layers[0].linear_attn, **QWEN3_NEXT)()[1]


REFUSED_CLASSES: dict[str, Callable[[], nn.Module]] = {
    "DiffLlamaAttention": lambda: model_of("DiffLlamaModel", "DiffLlamaConfig", _self_attn, **LLAMA)()[1],
    "Qwen3NextGatedDeltaNet": _qwen3_next_linear,
}
# Every causal LLaMA-style row refuses bidirectional configs; these cases hold one module of each
BIDIRECTIONAL_CASES = {
    "LlamaAttention": "llama",
    "Llama4TextAttention": "llama4-chunked",  # tests/hf_cases_llama4.py
    "Qwen3NextAttention": "qwen3-next",  # tests/hf_cases_gated.py
    "GraniteSWAAttention": "granite-swa",  # tests/hf_cases_copies.py
    "GraniteMoeSWAAttention": "granitemoe-swa",
    "MistralAttention": "mistral",
    "Gemma2Attention": "gemma2-sliding",
    "Qwen3Attention": "qwen3",
    "Olmo2Attention": "olmo2",
    "PhiAttention": "phi",
    "Qwen2Attention": "qwen2",
    "Qwen2MoeAttention": "qwen2-moe",
    "MixtralAttention": "mixtral",
    "GemmaAttention": "gemma",
    "Gemma3Attention": "gemma3-sliding",
    "CohereAttention": "cohere",
    "Cohere2Attention": "cohere2-sliding",
    "Phi3Attention": "phi3",
    "StableLmAttention": "stablelm",
    "Starcoder2Attention": "starcoder2",
    "GraniteAttention": "granite",
    "OlmoAttention": "olmo",
    "PersimmonAttention": "persimmon",
    "HeliumAttention": "helium",
    "NemotronAttention": "nemotron",
    "SmolLM3Attention": "smollm3",
    "Exaone4Attention": "exaone4-sliding",
    "GlmAttention": "glm",
    # the copies (tests/hf_cases_copies.py)
    "ArceeAttention": "arcee",
    "SeedOssAttention": "seed-oss",
    "PhimoeAttention": "phimoe",
    "GraniteMoeAttention": "granitemoe",
    "GraniteMoeSharedAttention": "granitemoeshared",
    "Glm4Attention": "glm4",
    "Qwen3MoeAttention": "qwen3-moe",
    "Dots1Attention": "dots1",
    "ApertusAttention": "apertus",
    "OlmoeAttention": "olmoe",
    "Olmo3Attention": "olmo3-sliding",
    "VaultGemmaAttention": "vaultgemma-sliding",
    "Ernie4_5Attention": "ernie4.5",
    "Ernie4_5_MoeAttention": "ernie4.5-moe",
    "FlexOlmoAttention": "flex-olmo",
    "Glm4MoeAttention": "glm4-moe",
    "Jais2Attention": "jais2",
    "CwmAttention": "cwm",
    "ExaoneMoeAttention": "exaone-moe-sliding",
    # the copies and hybrids' attention of peers/copies.py (tests/hf_cases_copies.py)
    "MinistralAttention": "ministral-sliding",
    "Cohere2MoeAttention": "cohere2-moe-sliding",
    "MellumAttention": "mellum-sliding",
    "SolarOpenAttention": "solar-open",
    "HyperCLOVAXAttention": "hyperclovax",
    "Emu3Attention": "emu3",
    "MiniMaxM2Attention": "minimax-m2",
    "LaraMiniAttention": "lara-mini-sliding",
    "Kolibri1Attention": "kolibri1-sliding",
    "HYV3Attention": "hy-v3",
    "JambaAttention": "jamba",
    "NemotronHAttention": "nemotron-h",
    "BambaAttention": "bamba",
    "FalconH1Attention": "falcon-h1",
    "Lfm2Attention": "lfm2",
    "Lfm2MoeAttention": "lfm2-moe",
    "GraniteMoeHybridAttention": "granitemoehybrid",
    "OlmoHybridAttention": "olmo-hybrid",
    "MiniMaxAttention": "minimax",
    "AriaTextAttention": "aria-text",
    "Apertus1p5TextAttention": "apertus1p5-text",
    "MllamaTextSelfAttention": "mllama-text",
    "CohereCompassAttention": "cohere-compass-sliding",
    "Phi4MultimodalAttention": "phi4-multimodal",
}
for _cls, _case in (
    ("ErnieAttention", "ernie-decoder"),
    ("Data2VecTextAttention", "data2vec-text-decoder"),
    ("RoCBertAttention", "roc-bert-decoder"),
    ("BertGenerationAttention", "bert-generation-decoder"),
    ("XmodAttention", "xmod-decoder"),
    ("RobertaPreLayerNormAttention", "roberta-prelayernorm-decoder"),
    ("XLMRobertaXLAttention", "xlm-roberta-xl-decoder"),
):
    REFUSALS[(_cls, "cross-attention")] = (_case, lambda m: m.__setattr__("self", _cross_like(m.self)))
_FSMT = "transformers.models.fsmt.modeling_fsmt"  # FSMT's own class named Attention
REFUSALS[("Attention", "another model's Attention")] = (
    "openai-gpt",
    lambda m: m.__setattr__("__class__", __import__(_FSMT, fromlist=["x"]).Attention),
)
REFUSALS[("XmodAttention", "pre_norm set")] = ("xmod-decoder", _set("pre_norm", True))
REFUSALS[("OlmoeAttention", "clip_qkv set")] = ("olmoe", _set("config.clip_qkv", 0.5))
# PhiMoE's rotary takes short_mscale below original_max and long_mscale past it (tests/hf_cases_long.py)
REFUSALS[("PhimoeAttention", "short_mscale != long_mscale")] = (
    "phimoe-longrope-mscale",
    lambda m: m.config.rope_parameters.__setitem__("long_mscale", 1.5),
)
for _cls, _case in BIDIRECTIONAL_CASES.items():
    REFUSALS[(_cls, "use_bidirectional_attention=True")] = (_case, BIDI)
