"""More copies under new class names, the attention layers of hybrid models, and the whole family table.

`peers.classes` holds the family rows, `peers.special_rows` the latent, sinks and differential ones; this module
holds the copies (the first ones, `COPIES`, then those found since; each module's math checked against
transformers' source and proved by a parity case in tests/hf_cases_copies.py) and assembles the table every
reader uses: `ROWS` and `BY_CLASS`.

Hybrid models (Jamba, Bamba, Falcon-H1, Nemotron-H, LFM2, Granite-MoE-Hybrid, OLMo-Hybrid, MiniMax) interleave
ordinary attention layers with state-space, short-convolution or linear-attention layers. Their attention
classes are rows here and convert exactly; the other layers are outside the zoo. `STATE_SPACE` names those
classes: from_hf refuses them by name, and the coverage table (peers.coverage) marks a hybrid whose attention is
exact as `exact` with a note saying which layers stay outside.
"""

from __future__ import annotations

from torch import nn

from .checks import BIDIRECTIONAL, flag
from .classes import BART, BERT, LLAMA, SLIDING, _like
from .classes import BY_CLASS as FAMILY_BY_CLASS
from .classes import ROWS as FAMILY_ROWS
from .rows import Check, Row
from .special_rows import DEEPSEEK_V3, SPECIAL_ROWS


def _phimoe_mscales(m: nn.Module) -> str | None:
    """PhiMoE's rotary scales cos and sin by short_mscale below original_max and long_mscale past it; the
    zoo's rotary holds one factor (peers/rope.py reads it when the two are equal)."""
    params = getattr(m.config, "rope_parameters", None) or {}
    short, long = params.get("short_mscale"), params.get("long_mscale")
    if params.get("rope_type", "default") != "default" and short is not None and long is not None:
        if float(short) != float(long):
            return f"short_mscale={short} and long_mscale={long} differ: the zoo's rotary holds one attention factor"
    return None


# Copies under new class names: the same module as the row they copy (checked by a parity case each,
# tests/hf_cases_copies.py), and the attention layers of hybrid models beside their state-space layers.
COPIES: tuple[Row, ...] = (
    _like(LLAMA, family="Arcee", cls="ArceeAttention"),
    _like(LLAMA, family="Seed-OSS", cls="SeedOssAttention"),
    _like(
        LLAMA,
        family="PhiMoE",
        cls="PhimoeAttention",
        window="config.sliding_window?",
        checks=(*LLAMA.checks, Check("short_mscale != long_mscale", _phimoe_mscales)),
    ),
    _like(LLAMA, family="Granite-MoE", cls="GraniteMoeAttention"),
    _like(LLAMA, family="Granite-MoE-Shared", cls="GraniteMoeSharedAttention"),
    _like(LLAMA, family="GLM-4", cls="Glm4Attention", rope="partial", rope_interleaved=True),
    _like(LLAMA, family="Qwen3-MoE", cls="Qwen3MoeAttention", qk_norm="head", window=SLIDING),
    _like(LLAMA, family="Dots1", cls="Dots1Attention", qk_norm="head", window=SLIDING),
    _like(LLAMA, family="Apertus", cls="ApertusAttention", qk_norm="head"),
    _like(
        LLAMA,
        family="OLMoE",
        cls="OlmoeAttention",
        qk_norm="full",
        checks=(
            BIDIRECTIONAL,
            flag(
                "clip_qkv",
                "OLMoE clamps Q, K, V after its QK-norm; the zoo clamps before",
                is_set=lambda v: v is not None,  # 0.0 clamps everything to 0
            ),
        ),
    ),
    _like(LLAMA, family="OLMo-3", cls="Olmo3Attention", qk_norm="full", window=SLIDING),
    _like(LLAMA, family="VaultGemma", cls="VaultGemmaAttention", softcap="attn_logit_softcapping", window=SLIDING),
    _like(LLAMA, family="ERNIE-4.5", cls="Ernie4_5Attention", rope_interleaved=True),
    _like(LLAMA, family="ERNIE-4.5-MoE", cls="Ernie4_5_MoeAttention", rope_interleaved=True),
    _like(LLAMA, family="FlexOlmo", cls="FlexOlmoAttention", qk_norm="full"),
    _like(
        LLAMA,
        family="GLM-4-MoE",
        cls="Glm4MoeAttention",
        rope="partial",
        qk_norm="head",  # use_qk_norm: RMSNorm over head_dim, one weight shared by the heads, before the rotary
        qk_norm_if="config.use_qk_norm?",
    ),
    _like(LLAMA, family="Jais-2", cls="Jais2Attention"),
    _like(LLAMA, family="CWM", cls="CwmAttention", window=SLIDING),
    _like(
        LLAMA,
        family="EXAONE-MoE",
        cls="ExaoneMoeAttention",
        qk_norm="head",
        rope_if=lambda m: m.sliding_window is None or m.is_sliding,  # as EXAONE-4: global layers NoPE
        window=lambda m: m.sliding_window if m.is_sliding else None,
    ),
)

# -- LLaMA-style copies ----------------------------------------------------------------------------
_LLAMA_COPIES: tuple[Row, ...] = (
    # Qwen2's module with its q/k/v biases removed; the window on the layers layer_types marks sliding
    _like(LLAMA, family="Ministral", cls="MinistralAttention", window=SLIDING),
    # Cohere2's module; a dense layer of a model with prefix_dense_sliding_window_pattern == 1 keeps its rotary
    _like(
        LLAMA,
        family="Cohere2-MoE",
        cls="Cohere2MoeAttention",
        rope_interleaved=True,
        window=SLIDING,
        rope_if=lambda m: m.sliding_window is not None or m.force_rope,
    ),
    _like(LLAMA, family="Mellum", cls="MellumAttention", qk_norm="head", window=SLIDING),  # Qwen3-MoE's module
    _like(LLAMA, family="Solar-Open", cls="SolarOpenAttention"),
    _like(LLAMA, family="HyperCLOVA X", cls="HyperCLOVAXAttention"),  # Granite's (scale: attention_multiplier)
    _like(LLAMA, family="Emu3", cls="Emu3Attention"),
    # FlexOlmo's module without biases; MiniMax-M2 rotates partial_rotary_factor of head_dim
    _like(LLAMA, family="MiniMax-M2", cls="MiniMaxM2Attention", rope="partial", qk_norm="full"),
    # Qwen3's module; only the sliding layers get the rotary (the model passes None to the full ones)
    _like(
        LLAMA,
        family="Lara-mini",
        cls="LaraMiniAttention",
        qk_norm="head",
        window=SLIDING,
        rope_if=lambda m: m.config.layer_types[m.layer_idx] == "sliding_attention",
    ),
    _like(
        LLAMA,
        family="Kolibri-1",
        cls="Kolibri1Attention",
        qk_norm="head",
        rope_if=lambda m: m.sliding_window is None or m.is_sliding,  # EXAONE-4's module: global layers NoPE
        window=lambda m: m.sliding_window if m.is_sliding else None,
    ),
    _like(LLAMA, family="HY-V3", cls="HYV3Attention", qk_norm="head"),  # Apertus' module
    # DeepSeek-V3's latent attention, line for line (AXK1: always with the query low rank)
    _like(DEEPSEEK_V3, family="Youtu", cls="YoutuAttention"),
    _like(DEEPSEEK_V3, family="GLM-4-MoE-Lite", cls="Glm4MoeLiteAttention"),
    _like(DEEPSEEK_V3, family="A.X K1", cls="AXK1Attention"),
    # the text attention of multimodal models, each a line-for-line copy (their other towers: parts)
    _like(LLAMA, family="Aria", cls="AriaTextAttention"),
    _like(LLAMA, family="Apertus-1.5", cls="Apertus1p5TextAttention", qk_norm="head"),
    _like(LLAMA, family="Mllama", cls="MllamaTextSelfAttention"),  # its cross-attention layers: refused by name
    _like(FAMILY_BY_CLASS["Phi3Attention"], family="Phi-4-multimodal", cls="Phi4MultimodalAttention"),
    # a rope_parameters entry of None for a layer type: that type's layers have no rotary
    _like(
        LLAMA,
        family="Cohere-Compass",
        cls="CohereCompassAttention",
        window=SLIDING,
        rope_if=lambda m: m.config.rope_parameters.get(m.config.layer_types[m.layer_idx]) is not None,
    ),
)

# -- the attention layers of hybrid models -----------------------------------------------------------
_HYBRID_ROWS: tuple[Row, ...] = (
    _like(LLAMA, family="Jamba", cls="JambaAttention", rope=None),  # no positional encoding at all
    _like(LLAMA, family="Nemotron-H", cls="NemotronHAttention", rope=None),  # Jamba's module
    _like(LLAMA, family="Bamba", cls="BambaAttention", rope="partial"),
    # keys times key_multiplier before the rotary: the rotary is linear, so the score scale takes the factor
    _like(LLAMA, family="Falcon-H1", cls="FalconH1Attention", scale=lambda m: m.scaling * m.key_multiplier),
    _like(
        LLAMA, family="LFM2", cls="Lfm2Attention", out="out_proj", qk_norm="head", norms=("q_layernorm", "k_layernorm")
    ),
    _like(
        LLAMA,
        family="LFM2-MoE",
        cls="Lfm2MoeAttention",
        out="out_proj",
        qk_norm="head",
        norms=("q_layernorm", "k_layernorm"),
    ),
    # GraniteMoeShared's module; position_embedding_type other than "rope": no rotary
    _like(
        LLAMA,
        family="Granite-MoE-Hybrid",
        cls="GraniteMoeHybridAttention",
        rope_if=lambda m: m.config.position_embedding_type == "rope",
    ),
    # OLMo-3's module without its window; the released checkpoints set no rope_theta: no rotary
    _like(
        LLAMA,
        family="OLMo-Hybrid",
        cls="OlmoHybridAttention",
        qk_norm="full",
        rope_if=lambda m: (getattr(m.config, "rope_parameters", None) or {}).get("rope_theta") is not None,
    ),
    _like(LLAMA, family="MiniMax", cls="MiniMaxAttention", window="config.sliding_window?"),  # Mixtral's module
)

# the classes of a hybrid's other layers (outside the zoo), with what they are
STATE_SPACE: dict[str, str] = {
    **dict.fromkeys(
        (
            "JambaMambaMixer",
            "BambaMixer",
            "FalconH1Mixer",
            "NemotronHMamba2Mixer",
            "GraniteMoeHybridMambaLayer",
            "ZambaMambaMixer",
            "Zamba2MambaMixer",
        ),
        "a Mamba state-space layer",
    ),
    **dict.fromkeys(("Lfm2ShortConv", "Lfm2MoeShortConv"), "a gated short-convolution layer"),
    "OlmoHybridGatedDeltaNet": "a gated DeltaNet (linear recurrent) layer",
    "MiniMaxLightningAttention": "a lightning (linear, recurrent-state) attention layer",
}

# -- encoder copies with a causal-LM head: BERT's and BART's modules, line for line --------------------
_XMOD_PRE = "Xmod's pre_norm applies output.LayerNorm to the module's input, inside it and before the block"
_PRE_LN = "self-attention + output.dense, from the module's {} of its input (that LayerNorm runs before the block)"
_ENCODER_COPIES: tuple[Row, ...] = (
    _like(BERT, family="ERNIE", cls="ErnieAttention"),
    _like(BERT, family="Data2Vec-Text", cls="Data2VecTextAttention"),
    _like(BERT, family="RoCBert", cls="RoCBertAttention"),
    _like(BERT, family="BertGeneration", cls="BertGenerationAttention"),
    _like(BERT, family="X-MOD", cls="XmodAttention", checks=(*BERT.checks, flag("pre_norm", _XMOD_PRE, "module"))),
    # pre-LayerNorm copies: the module normalizes its input first; the block is what follows (the LayerNorm before
    # it, like the residual after it, stays in the layer)
    _like(BERT, family="RoBERTa-PreLayerNorm", cls="RobertaPreLayerNormAttention", covers=_PRE_LN.format("LayerNorm")),
    _like(BERT, family="XLM-RoBERTa-XL", cls="XLMRobertaXLAttention", covers=_PRE_LN.format("self_attn_layer_norm")),
    _like(BART, family="BioGPT", cls="BioGptAttention"),
    _like(BART, family="Blenderbot", cls="BlenderbotAttention"),
    _like(BART, family="Blenderbot-Small", cls="BlenderbotSmallAttention"),
    _like(BART, family="PLBart", cls="PLBartAttention"),
    _like(BART, family="MusicGen", cls="MusicgenAttention"),
    _like(BART, family="MusicGen-Melody", cls="MusicgenMelodyAttention"),
)


# -- OpenAI GPT: a class named plain `Attention` (FSMT has one too: refused by the check) -----------------------
def _openai_only(m: nn.Module) -> str | None:
    if type(m).__module__ != "transformers.models.openai.modeling_openai":
        return f"{type(m).__module__}.Attention is another model's class named Attention, not OpenAI GPT's"
    return None


_OPENAI = Row(
    family="OpenAI GPT",
    cls="Attention",
    covers="the whole module (c_attn, causal attention, c_proj); its causal mask is -1e4, zero weight in fp32",
    qkv="c_attn",
    out="c_proj",
    conv1d=True,
    c="split_size",
    h="n_head",
    g=None,
    d=lambda m: m.split_size // m.n_head,
    scale=lambda m: (m.split_size // m.n_head) ** -0.5 if m.scale else 1.0,
    checks=(Check("another model's Attention", _openai_only),),
)

# -- wrappers around a covered module --------------------------------------------------------------
_WRAPPERS: tuple[Row, ...] = (
    _OPENAI,
    Row(
        family="GPT-Neo",
        cls="GPTNeoAttention",
        covers="the layer's attn: its GPTNeoSelfAttention (global layers causal, local layers a causal window); "
        "no score scaling",
        q="attention.q_proj",
        k="attention.k_proj",
        v="attention.v_proj",
        out="attention.out_proj",
        c="attention.embed_dim",
        h="attention.num_heads",
        g=None,
        d="attention.head_dim",
        scale=1.0,
        window=lambda m: m.attention.config.window_size if m.attention.attention_type == "local" else None,
    ),
)

# -- Granite with gpt-oss's attention sinks (zoo/modifiers/sinks.py) and a window on its sliding layers
_SINKS: tuple[Row, ...] = (
    _like(LLAMA, family="Granite-SWA", cls="GraniteSWAAttention", window=SLIDING, sinks="sinks"),
    _like(LLAMA, family="Granite-MoE-SWA", cls="GraniteMoeSWAAttention", window=SLIDING, sinks="sinks"),
)

MORE_COPIES: tuple[Row, ...] = _LLAMA_COPIES + _HYBRID_ROWS + _ENCODER_COPIES + _WRAPPERS + _SINKS
ROWS: tuple[Row, ...] = FAMILY_ROWS + SPECIAL_ROWS + COPIES + MORE_COPIES
BY_CLASS: dict[str, Row] = {row.cls: row for row in ROWS}

__all__ = ["BY_CLASS", "MORE_COPIES", "ROWS", "STATE_SPACE"]
