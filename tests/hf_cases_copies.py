"""Parity cases for the copies under new class names (peers.classes.COPIES), merged into
tests/peers/test_hf.py's CASES: each a tiny random model of its own (2 layers where the layers differ),
run over 160 positions so that windows of 16 and every rotary band matter; the second row right-padded.
"""

from __future__ import annotations

from hf_cases import BERT_OUT, DEEPSEEK, LATENT, _bert_like, _encdec, model_of
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
        "PhimoeModel",
        "PhimoeConfig",
        {"window": WINDOW},
        sliding_window=WINDOW,
        num_local_experts=2,
        num_experts_per_tok=1,
    ),  # fmt: skip
    "granitemoe": _case(
        "GraniteMoeModel",
        "GraniteMoeConfig",
        {"scale": 0.1},
        attention_multiplier=0.1,
        num_local_experts=2,
        num_experts_per_tok=1,
    ),  # fmt: skip
    "granitemoeshared": _case(
        "GraniteMoeSharedModel",
        "GraniteMoeSharedConfig",
        {"scale": 0.1},
        attention_multiplier=0.1,
        num_local_experts=2,
        num_experts_per_tok=1,
    ),  # fmt: skip
    "glm4": _case("Glm4Model", "Glm4Config", {"rope_dim": 16, "rope_interleaved": True}, head_dim=32),
    "qwen3-moe": _case(
        "Qwen3MoeModel",
        "Qwen3MoeConfig",
        {"qk_norm": "head"},
        head_dim=16,
        num_experts=2,
        num_experts_per_tok=1,
        moe_intermediate_size=32,
    ),  # fmt: skip
    "dots1": _case(
        "Dots1Model",
        "Dots1Config",
        {"qk_norm": "head"},
        head_dim=16,
        n_routed_experts=2,
        num_experts_per_tok=1,
        moe_intermediate_size=32,
        first_k_dense_replace=2,
    ),  # fmt: skip
    # Apertus' config defaults to llama3 rope scaling (factor 8 from 8192)
    "apertus": _case("ApertusModel", "ApertusConfig", {"qk_norm": "head", "rope_scaling": "llama3"}),
    "olmoe": _case("OlmoeModel", "OlmoeConfig", {"qk_norm": "full"}, num_experts=2, num_experts_per_tok=1),
    "granite-swa": _case(
        "GraniteSWAModel",
        "GraniteSWAConfig",
        {"window": WINDOW, "sinks": True, "scale": 0.1},
        **SLIDE,
        attention_multiplier=0.1,
    ),
    "granitemoe-swa": _case(
        "GraniteMoeSWAModel",
        "GraniteMoeSWAConfig",
        {"window": WINDOW, "sinks": True, "scale": 0.1},
        **SLIDE,
        attention_multiplier=0.1,
        num_local_experts=2,
        num_experts_per_tok=1,
    ),
    "olmo3-sliding": _case("Olmo3Model", "Olmo3Config", {"qk_norm": "full", "window": WINDOW}, **SLIDE),
    "vaultgemma-sliding": _case(
        "VaultGemmaModel",
        "VaultGemmaConfig",
        {"window": WINDOW, "softcap": 1.5},
        head_dim=16,
        query_pre_attn_scalar=24,
        attn_logit_softcapping=1.5,
        **SLIDE,
    ),  # fmt: skip
    "ernie4.5": _case("Ernie4_5Model", "Ernie4_5Config", {"rope_interleaved": True}, head_dim=16),
    "ernie4.5-moe": _case(
        "Ernie4_5_MoeModel",
        "Ernie4_5_MoeConfig",
        {"rope_interleaved": True},
        head_dim=16,
        moe_num_experts=2,
        moe_k=1,
        moe_intermediate_size=32,
    ),  # fmt: skip
    "flex-olmo": _case("FlexOlmoModel", "FlexOlmoConfig", {"qk_norm": "full"}, num_experts=2, num_experts_per_tok=1),
    "glm4-moe": _case(
        "Glm4MoeModel",
        "Glm4MoeConfig",
        {"rope_dim": 16},
        head_dim=32,
        n_routed_experts=2,
        num_experts_per_tok=1,
        moe_intermediate_size=32,
        first_k_dense_replace=2,
    ),  # fmt: skip
    "jais2": _case("Jais2Model", "Jais2Config", {"bias": True}),
    # CWM's config defaults to llama3 rope scaling (factor 16 from 8192); layer 0 of 2 is global here
    "cwm": _case("CwmModel", "CwmConfig", {"rope_scaling": "llama3"}, head_dim=16, sliding_window=WINDOW),
    "exaone-moe-sliding": _case(
        "ExaoneMoeModel",
        "ExaoneMoeConfig",
        {"qk_norm": "head", "window": WINDOW},
        head_dim=16,
        num_experts=2,
        num_experts_per_tok=1,
        moe_intermediate_size=32,
        **SLIDE,
    ),  # fmt: skip
}


# -- the copies of peers/copies.py: LLaMA-style, then the attention layers of hybrid models (each model's other
# layers, state-space or convolution, run in the model but are not converted), then the encoder copies
def _at(i: int):
    return lambda m: m.layers[i].self_attn


BASE_SMALL = dict(
    hidden_size=64,
    num_attention_heads=4,
    intermediate_size=64,
    vocab_size=50,
    num_hidden_layers=1,
    max_position_embeddings=64,
    pad_token_id=1,
)
MUSICGEN = dict(
    vocab_size=50,
    hidden_size=64,
    num_hidden_layers=1,
    num_attention_heads=4,
    ffn_dim=64,
    num_codebooks=1,
    max_position_embeddings=64,
    pad_token_id=1,
    bos_token_id=0,
)
# Cohere-Compass: the full layers' rope_parameters entry is None (no rotary there)
COMPASS = dict(
    SLIDE,
    head_dim=16,
    rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}, "full_attention": None},
)
MOE = dict(num_experts=2, num_experts_per_tok=1, moe_intermediate_size=32)
CASES.update(
    {
        "ministral-sliding": _case(
            "MinistralModel", "MinistralConfig", {"window": WINDOW, "bias": False}, head_dim=16, **SLIDE
        ),  # fmt: skip
        "cohere2-moe-sliding": _case(
            "Cohere2MoeModel",
            "Cohere2MoeConfig",
            {"window": WINDOW, "rope_interleaved": True},
            head_dim=16,
            **SLIDE,
        ),
        "mellum-sliding": _case(
            "MellumModel", "MellumConfig", {"window": WINDOW, "qk_norm": "head"}, head_dim=16, **MOE, **SLIDE
        ),
        "solar-open": _case(
            "SolarOpenModel",
            "SolarOpenConfig",
            head_dim=16,
            n_routed_experts=2,
            num_experts_per_tok=1,
            moe_intermediate_size=32,
        ),  # fmt: skip
        "hyperclovax": _case("HyperCLOVAXModel", "HyperCLOVAXConfig", {"scale": 0.1}, attention_multiplier=0.1),
        "emu3": _case("Emu3TextModel", "Emu3TextConfig"),
        # the released checkpoints' legacy rotary_dim: half of head_dim rotates
        "minimax-m2": _case(
            "MiniMaxM2Model", "MiniMaxM2Config", {"qk_norm": "full", "rope_dim": 8}, head_dim=16, rotary_dim=8, **MOE
        )
        | {"variant": True},  # partial rotary: a traced export (under -m slow; Phi's and Bamba's run by default)
        "lara-mini-sliding": _case(
            "LaraMiniModel",
            "LaraMiniConfig",
            {"window": WINDOW, "qk_norm": "head"},
            head_dim=16,
            **SLIDE,
            **MOE,
            shared_expert_intermediate_size=32,
        ),
        "kolibri1-sliding": _case(
            "Kolibri1Model",
            "Kolibri1Config",
            {"window": WINDOW, "qk_norm": "head"},
            head_dim=16,
            **SLIDE,
            **MOE,
            shared_expert_intermediate_size=32,
        ),
        "hy-v3": _case("HYV3Model", "HYV3Config", {"qk_norm": "head"}, head_dim=16, **MOE),
        # DeepSeek-V3's latent attention (its own cases at 10 positions, as DeepSeek-V3's; their traced exports,
        # two minutes each here, under -m slow: DeepSeek-V3's own cases export by default)
        "youtu": dict(
            make=model_of("YoutuModel", "YoutuConfig", _at(0), **DEEPSEEK),
            spec_checks=dict(LATENT, q_lora_rank=24),
            variant=True,
        ),
        "glm4-moe-lite": dict(
            make=model_of("Glm4MoeLiteModel", "Glm4MoeLiteConfig", _at(0), **DEEPSEEK),
            spec_checks=dict(LATENT, q_lora_rank=24),
            variant=True,
        ),
        "axk1": dict(
            make=model_of("AXK1Model", "AXK1Config", _at(0), **DEEPSEEK),
            spec_checks=dict(LATENT, q_lora_rank=24),
            variant=True,
        ),
        "aria-text": _case(
            "AriaTextModel", "AriaTextConfig", head_dim=16, moe_num_experts=2, moe_topk=1, moe_intermediate_size=32
        ),  # fmt: skip
        "apertus1p5-text": _case("Apertus1p5TextModel", "Apertus1p5TextConfig", {"qk_norm": "head"}, head_dim=16),
        # layer 1 of 2 is a cross-attention layer (refused by name); layer 0 is self-attention
        "mllama-text": _case("MllamaTextModel", "MllamaTextConfig", cross_attention_layers=[1]),
        "cohere-compass-sliding": _case(
            "CohereCompassTextModel", "CohereCompassTextConfig", {"window": WINDOW}, **COMPASS
        ),
        # Phi-3's module; the vision and audio towers tiny (they hold parts: VisionAttention, AudioAttention)
        "phi4-multimodal": _case(
            "Phi4MultimodalModel",
            "Phi4MultimodalConfig",
            {"layout": "combined"},
            num_hidden_layers=1,
            vision_config=dict(
                hidden_size=32,
                intermediate_size=32,
                num_hidden_layers=1,
                num_attention_heads=2,
                image_size=28,
                patch_size=14,
            ),
            audio_config=dict(
                hidden_size=32,
                intermediate_size=32,
                num_blocks=1,
                num_attention_heads=2,
                num_mel_bins=8,
                nemo_conv_channels=8,
                ext_pw_out_channel=32,
                depthwise_separable_out_channel=32,
                depthwise_multiplier=1,
                kernel_size=3,
            ),
        ),  # fmt: skip
        "cohere-compass-full": dict(
            make=long_model("CohereCompassTextModel", "CohereCompassTextConfig", T, _at(1), **{**BASE, **COMPASS}),
            spec_checks={"window": None, "rope_theta": None},
            variant=True,
        ),
        "jamba": _case(
            "JambaModel",
            "JambaConfig",
            {"rope_theta": None},
            num_hidden_layers=1,
            attn_layer_period=1,
            attn_layer_offset=0,
            num_experts=1,
        ),  # fmt: skip
        "nemotron-h": dict(
            make=long_model(
                "NemotronHModel",
                "NemotronHConfig",
                T,
                lambda m: m.layers[0].mixer,
                **{**BASE, "layers_block_type": ["full_attention"], "head_dim": 16},
            ),
            spec_checks={"rope_theta": None},
        ),  # fmt: skip
        # partial rotary: a traced export, a minute here (under -m slow; Phi's and StableLM's run by default)
        "bamba": _case("BambaModel", "BambaConfig", num_hidden_layers=1, attn_layer_indices=[0]) | {"variant": True},
        "falcon-h1": _case(
            "FalconH1Model", "FalconH1Config", {"scale": 0.5 * 16**-0.5}, num_hidden_layers=1, key_multiplier=0.5
        ),  # fmt: skip
        "lfm2": _case("Lfm2Model", "Lfm2Config", {"qk_norm": "head"}, num_hidden_layers=1, full_attn_idxs=[0]),
        "lfm2-moe": _case(
            "Lfm2MoeModel",
            "Lfm2MoeConfig",
            {"qk_norm": "head"},
            num_hidden_layers=1,
            layer_types=["full_attention"],
            **MOE,
        ),  # fmt: skip
        "granitemoehybrid": _case(
            "GraniteMoeHybridModel",
            "GraniteMoeHybridConfig",
            {"scale": 0.1},
            num_hidden_layers=1,
            layer_types=["attention"],
            attention_multiplier=0.1,
            position_embedding_type="rope",
            num_local_experts=2,
            num_experts_per_tok=1,
        ),  # fmt: skip
        "olmo-hybrid": _case(
            "OlmoHybridModel",
            "OlmoHybridConfig",
            {"qk_norm": "full"},
            layer_types=["full_attention", "linear_attention"],
        ),  # fmt: skip
        "minimax": _case(
            "MiniMaxModel",
            "MiniMaxConfig",
            num_hidden_layers=1,
            layer_types=["full_attention"],
            num_local_experts=2,
            num_experts_per_tok=1,
        ),  # fmt: skip
    }
)

# BERT's module with a causal-LM head (is_decoder: causal), at 10 positions as BERT's cases; BART's module, the
# decoder's causal self-attention. Their exports are torch-traced: under -m slow (variant), BERT's and BART's own
# cases export by default.
_DECODER = dict(output_is_dense_of=BERT_OUT["output_is_dense_of"], spec_checks={"causal": True}, variant=True)
_BART_DECODER = dict(spec_checks={"causal": True}, variant=True)
CASES.update(
    {
        "ernie-decoder": dict(make=_bert_like("ErnieModel", "ErnieConfig", is_decoder=True), **_DECODER),
        "data2vec-text-decoder": dict(
            make=_bert_like("Data2VecTextModel", "Data2VecTextConfig", is_decoder=True, pad_token_id=1), **_DECODER
        ),
        "roc-bert-decoder": dict(make=_bert_like("RoCBertModel", "RoCBertConfig", is_decoder=True), **_DECODER),
        "bert-generation-decoder": dict(
            make=_bert_like("BertGenerationEncoder", "BertGenerationConfig", is_decoder=True), **_DECODER
        ),
        "xmod-decoder": dict(
            make=_bert_like(
                "XmodModel",
                "XmodConfig",
                is_decoder=True,
                pad_token_id=1,
                languages=("en_XX",),
                default_language="en_XX",
            ),  # fmt: skip
            **_DECODER,
        ),
        # pre-LayerNorm: the block takes what the module's LayerNorm gives its self-attention
        "roberta-prelayernorm-decoder": dict(
            make=_bert_like("RobertaPreLayerNormModel", "RobertaPreLayerNormConfig", is_decoder=True, pad_token_id=1),
            **_DECODER,
            input_of=lambda m: m.self,
            layernorm="LayerNorm",
        ),  # fmt: skip
        "xlm-roberta-xl-decoder": dict(
            make=_bert_like("XLMRobertaXLModel", "XLMRobertaXLConfig", is_decoder=True, pad_token_id=1),
            **_DECODER,
            input_of=lambda m: m.self,
            layernorm="self_attn_layer_norm",
        ),  # fmt: skip
        "biogpt": dict(
            make=model_of("BioGptModel", "BioGptConfig", lambda m: m.layers[0].self_attn, **BASE_SMALL),
            **_BART_DECODER,
        ),
        "blenderbot-decoder": dict(make=_encdec("BlenderbotModel", "BlenderbotConfig", "decoder"), **_BART_DECODER),
        "blenderbot-small-decoder": dict(
            make=_encdec("BlenderbotSmallModel", "BlenderbotSmallConfig", "decoder"), **_BART_DECODER
        ),
        "plbart-decoder": dict(make=_encdec("PLBartModel", "PLBartConfig", "decoder"), **_BART_DECODER),
        "musicgen": dict(
            make=model_of(
                "MusicgenModel", "MusicgenDecoderConfig", lambda m: m.decoder.layers[0].self_attn, **MUSICGEN
            ),
            **_BART_DECODER,
        ),  # fmt: skip
        "musicgen-melody": dict(
            make=model_of(
                "MusicgenMelodyModel",
                "MusicgenMelodyDecoderConfig",
                lambda m: m.decoder.layers[0].self_attn,
                **MUSICGEN,
            ),
            **_BART_DECODER,
        ),  # fmt: skip
        "openai-gpt": dict(
            make=model_of(
                "OpenAIGPTModel",
                "OpenAIGPTConfig",
                lambda m: m.h[0].attn,
                vocab_size=50,
                n_embd=64,
                n_layer=1,
                n_head=4,
                n_positions=32,
            ),
            spec_checks={"layout": "combined", "causal": True},
            variant=True,
        ),  # fmt: skip
        # GPTNeoAttention, the layer's attn around GPTNeoSelfAttention (the local layer)
        "gpt-neo-attn": dict(
            make=model_of(
                "GPTNeoModel",
                "GPTNeoConfig",
                lambda m: m.h[1].attn,
                vocab_size=50,
                hidden_size=64,
                num_layers=2,
                num_heads=4,
                attention_types=[[["global", "local"], 1]],
                window_size=4,
                max_position_embeddings=32,
            ),
            spec_checks={"window": 4, "scale": 1.0},
            variant=True,
        ),  # fmt: skip
    }
)

# hybrid cases whose model holds a layer outside the zoo (peers.copies.STATE_SPACE), which from_hf refuses by name
HYBRID_CASES = ("falcon-h1", "olmo-hybrid")
