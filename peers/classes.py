"""The transformers family table: one `Row` per attention class (see `peers.rows` for the fields).

A new family is a new row. Rows that share a layout are written as a base row plus the
fields that differ (`_like`). Refused classes are rows too, with the reason.

These are the rows of attention modules. The other parts of a whole model (its norms, MLPs and
embeddings) are not attention classes: their rows belong in tables of their own beside this one,
in `peers/`, each read by a reader of its own kind, as `peers.rows` reads these.
"""

from __future__ import annotations

import dataclasses

from .checks import (
    BIDIRECTIONAL,
    beit_bias,
    bloom_slopes,
    clip_causal,
    clip_config,
    codegen_shards,
    cross,
    encoder_attn_width,
    falcon_alibi,
    falcon_kv,
    falcon_layout,
    fixed_rope,
    llama4_fields,
    mpt_slopes,
    t5_bias,
    t5_context,
)
from .rows import Check, Row


def _like(base: Row, **changes: object) -> Row:
    return dataclasses.replace(base, **changes)


# -- the rows ------------------------------------------------------------------------------------

LLAMA = Row(
    family="LLaMA",
    cls="LlamaAttention",
    covers="the whole module, with the model's rotary embedding and causal/sliding mask",
    rope="full",
    checks=(BIDIRECTIONAL,),
)
# the LLaMA-style classes of models with sliding layers keep the window (None on global layers)
SLIDING = "sliding_window?"

BERT = Row(
    family="BERT",
    cls="BertAttention",
    covers="self-attention + output.dense (before its residual and LayerNorm)",
    q="self.query",
    k="self.key",
    v="self.value",
    out="output.dense",
    c="self.config.hidden_size",
    h="self.num_attention_heads",
    g=None,
    d="self.attention_head_size",
    causal="self.is_causal",
    scale="self.scaling",
    checks=(cross("", child="self"),),
)

VIT = Row(
    family="ViT",
    cls="ViTAttention",
    covers="the whole module (bidirectional)",
    g=None,
    h="num_attention_heads",
    causal=False,
)

BART = Row(
    family="BART",
    cls="BartAttention",
    covers="self-attention (encoder, or the decoder's causal one) and the decoder's cross-attention "
    "(encoder_attn: block(x, context) with the encoder output as context)",
    out="out_proj",
    c="embed_dim",
    h="num_heads",
    g=None,
    causal="is_causal",
    context=encoder_attn_width,
)

ROBERTA = _like(BERT, family="RoBERTa", cls="RobertaAttention")

T5 = Row(
    family="T5",
    cls="T5Attention",
    covers="self-attention (encoder: bidirectional; decoder: causal) with the relative position bias of its "
    "stack's first layer (layers after the first: from_hf(module, model=model)), no score scaling; and the "
    "decoder's cross-attention (EncDecAttention: block(x, context))",
    q="q",
    k="k",
    v="v",
    out="o",
    c="d_model",
    h="n_heads",
    g=None,
    d="key_value_proj_dim",
    causal="is_causal",
    context=t5_context,
    rel_bias=t5_bias,
)

ROWS: tuple[Row, ...] = (
    BERT,
    Row(
        family="GPT-2",
        cls="GPT2Attention",
        covers="the whole module (c_attn, causal attention, c_proj)",
        qkv="c_attn",
        out="c_proj",
        conv1d=True,
        c="embed_dim",
        h="num_heads",
        g=None,
        checks=(cross("is_cross_attention"),),
    ),
    LLAMA,
    _like(LLAMA, family="Mistral", cls="MistralAttention", window="config.sliding_window?"),
    _like(LLAMA, family="Gemma-2", cls="Gemma2Attention", softcap="attn_logit_softcapping", window=SLIDING),
    _like(LLAMA, family="Qwen3", cls="Qwen3Attention", qk_norm="head", window=SLIDING),
    _like(LLAMA, family="OLMo-2", cls="Olmo2Attention", qk_norm="full"),
    _like(
        LLAMA,
        family="Phi",
        cls="PhiAttention",
        out="dense",
        rope="partial",
        rotary_ndims="rotary_ndims",
        # qk_layernorm: one nn.LayerNorm (weight and bias) over head_dim, shared by every head
        qk_norm="head",
        qk_norm_kind="layer",
        qk_norm_if="qk_layernorm?",
        norms=("q_layernorm", "k_layernorm"),
        norm_bias=True,
    ),
    Row(
        family="BLOOM",
        cls="BloomAttention",
        covers="the whole module (without the residual it adds), with ALiBi and the causal mask",
        qkv="query_key_value",
        fused="per_head",
        out="dense",
        c="hidden_size",  # BloomAttention keeps no config: its sizes are attributes
        h="num_heads",
        g=None,
        scale="inv_norm_factor",
        alibi=bloom_slopes,
    ),
    Row(
        family="GPT-NeoX",
        cls="GPTNeoXAttention",
        covers="the whole module, with partial rotary and the causal mask",
        qkv="query_key_value",
        fused="per_head",
        out="dense",
        g=None,
        d="head_size",
        rope="partial",
        rotary_ndims="rotary_ndims",
    ),
    Row(
        family="Falcon",
        cls="FalconAttention",
        covers="the whole module, rotary Falcon (MQA, GQA or MHA)",
        qkv="query_key_value",
        fused=falcon_layout,
        out="dense",
        c="hidden_size",
        h="num_heads",
        g=falcon_kv,
        scale="inv_norm_factor",
        rope="full",
        checks=(Check("alibi=True", falcon_alibi),),
    ),
    VIT,
    # -- further decoder families, built on LLAMA's row (their parity cases: tests/hf_cases.py)
    _like(LLAMA, family="Qwen2", cls="Qwen2Attention", window=SLIDING),
    _like(LLAMA, family="Qwen2-MoE", cls="Qwen2MoeAttention", window=SLIDING),
    _like(LLAMA, family="Mixtral", cls="MixtralAttention", window="config.sliding_window?"),
    _like(LLAMA, family="Gemma", cls="GemmaAttention"),
    _like(
        LLAMA,
        family="Gemma-3",
        cls="Gemma3Attention",
        qk_norm="head",
        window=SLIDING,  # Gemma-3 keeps attn_logit_softcapping in its config but does not apply it
        norm_offset=1.0,
    ),
    _like(
        LLAMA,
        family="Qwen3-Next",
        cls="Qwen3NextAttention",
        covers="its full-attention layers (the linear-attention ones are Qwen3NextGatedDeltaNet, refused)",
        rope="partial",
        qk_norm="head",
        norm_offset=1.0,  # Qwen3NextRMSNorm multiplies by (1 + weight), as Gemma's
        q_gate=True,  # q_proj: each head [query | gate]; Z * sigmoid(gate) before o_proj
    ),
    _like(
        LLAMA,
        family="Llama 4",
        cls="Llama4TextAttention",
        covers="the whole module: its chunked rotary layers (L2 QK-norm after the complex, i.e. interleaved-pair, "
        "rotary) and its NoPE layers (query temperature)",
        rope_interleaved=True,
        rope_if="use_rope",
        fields=llama4_fields,
    ),
    Row(
        family="Qwen3-Next",
        cls="Qwen3NextGatedDeltaNet",
        refused="Qwen3-Next's linear-attention layer: a gated delta rule over a recurrent state with a causal "
        "convolution, not softmax attention, so outside the zoo; its full-attention layers (Qwen3NextAttention) "
        "convert",
    ),
    _like(
        LLAMA,
        family="Cohere",
        cls="CohereAttention",
        rope_interleaved=True,
        # use_qk_norm: CohereLayerNorm over head_dim with a (heads, head_dim) weight, no bias
        qk_norm="per_head",
        qk_norm_kind="layer",
        qk_norm_if="config.use_qk_norm?",
        norm_shape="matrix",
    ),
    _like(
        LLAMA,
        family="Cohere2",
        cls="Cohere2Attention",
        rope_interleaved=True,
        window=SLIDING,
        rope_if=lambda m: m.sliding_window is not None,  # global layers have no rotary
    ),
    _like(LLAMA, family="Phi-3", cls="Phi3Attention", qkv="qkv_proj", rope="partial", window="config.sliding_window?"),
    _like(
        LLAMA,
        family="StableLM",
        cls="StableLmAttention",
        rope="partial",
        rotary_ndims="rotary_ndims",
        # qk_layernorm: a LayerNorm (no bias) per head, StableLmLayerNormPerHead's `norms`
        qk_norm="per_head",
        qk_norm_kind="layer",
        qk_norm_if="config.qk_layernorm?",
        norms=("q_layernorm", "k_layernorm"),
        norm_shape="list",
    ),
    _like(LLAMA, family="Starcoder2", cls="Starcoder2Attention", window="config.sliding_window?"),
    _like(LLAMA, family="Granite", cls="GraniteAttention"),
    # OLMo clamps q/k/v_proj's outputs when config.clip_qkv is not None (0.0 clamps everything to 0)
    _like(LLAMA, family="OLMo", cls="OlmoAttention", clip_qkv="config.clip_qkv?"),
    _like(
        LLAMA,
        family="Persimmon",
        cls="PersimmonAttention",
        qkv="query_key_value",
        fused="per_head",
        out="dense",
        rope="partial",
        rotary_ndims="rotary_ndims",
        # qk_layernorm: one nn.LayerNorm (weight and bias) over head_dim, shared by every head
        qk_norm="head",
        qk_norm_kind="layer",
        qk_norm_if="config.qk_layernorm?",
        norms=("q_layernorm", "k_layernorm"),
        norm_bias=True,
    ),
    _like(LLAMA, family="Helium", cls="HeliumAttention", rope_interleaved=True),
    _like(LLAMA, family="Nemotron", cls="NemotronAttention", rope="partial"),
    _like(LLAMA, family="SmolLM3", cls="SmolLM3Attention", rope_if="use_rope", window=SLIDING),
    _like(
        LLAMA,
        family="EXAONE-4",
        cls="Exaone4Attention",
        qk_norm="head",
        rope_if=lambda m: m.sliding_window is None or m.is_sliding,  # hybrid models: global layers NoPE
        window=lambda m: m.sliding_window if m.is_sliding else None,
    ),
    _like(LLAMA, family="GLM", cls="GlmAttention", rope="partial", rope_interleaved=True),
    Row(
        family="GPT-J",
        cls="GPTJAttention",
        out="out_proj",
        g=None,
        rope=fixed_rope,
        rope_interleaved=True,
    ),
    Row(
        family="CodeGen",
        cls="CodeGenAttention",
        qkv="qkv_proj",
        fused="codegen",
        out="out_proj",
        g=None,
        rope=fixed_rope,
        rope_interleaved=True,
        checks=(Check("mp_num != 4", codegen_shards),),
    ),
    Row(
        family="GPT-Neo",
        cls="GPTNeoSelfAttention",
        covers="the whole module (global layers causal, local layers a causal window); no score scaling",
        out="out_proj",
        c="embed_dim",
        h="num_heads",
        g=None,
        scale=1.0,
        window=lambda m: m.config.window_size if m.attention_type == "local" else None,
    ),
    Row(
        family="GPT-BigCode",
        cls="GPTBigCodeAttention",
        covers="the whole module (multi-query [Q|K|V] or per-head fused rows)",
        qkv="c_attn",
        fused=lambda m: "zoo" if m.multi_query else "per_head",
        out="c_proj",
        c="embed_dim",
        h="num_heads",
        g="kv_heads",
        checks=(cross("is_cross_attention"),),
    ),
    Row(family="OPT", cls="OPTAttention", out="out_proj", c="embed_dim", h="num_heads", g=None),
    Row(
        family="MPT",
        cls="MptAttention",
        covers="the whole module, with MPT's ALiBi and the causal mask",
        qkv="Wqkv",
        out="out_proj",
        c="hidden_size",
        h="n_heads",
        g=None,
        scale="softmax_scale",
        alibi=mpt_slopes,
        clip_qkv=lambda m: m.clip_qkv or None,  # MPT clamps Wqkv's output when clip_qkv is truthy
    ),
    # -- encoders
    ROBERTA,
    _like(ROBERTA, family="XLM-RoBERTa", cls="XLMRobertaAttention"),
    _like(ROBERTA, family="ELECTRA", cls="ElectraAttention"),
    _like(ROBERTA, family="CamemBERT", cls="CamembertAttention"),
    Row(
        family="DistilBERT",
        cls="DistilBertSelfAttention",
        q="q_lin",
        k="k_lin",
        v="v_lin",
        out="out_lin",
        c="dim",
        h="n_heads",
        g=None,
        d="attention_head_size",
        causal=False,
    ),
    Row(
        family="ALBERT",
        cls="AlbertAttention",
        covers="self-attention + dense (before the residual and LayerNorm inside the module)",
        q="query",
        k="key",
        v="value",
        out="dense",
        h="num_attention_heads",
        g=None,
        d="attention_head_size",
        causal=False,
    ),
    Row(
        family="ModernBERT",
        cls="ModernBertAttention",
        covers="the whole module (bidirectional, rotary; local layers: a symmetric window, their own rope base)",
        qkv="Wqkv",
        out="Wo",
        g=None,
        causal=False,
        scale=lambda m: m.head_dim**-0.5,
        rope="full",
        # a local layer sees |i - j| <= config.sliding_window (local_attention // 2); the module keeps
        # sliding_window + 1, which is the zoo's window on a non-causal block (|i - j| < window)
        window=SLIDING,
    ),
    # -- encoder-decoders and speech
    BART,
    _like(BART, family="mBART", cls="MBartAttention"),
    _like(BART, family="Marian", cls="MarianAttention"),
    _like(BART, family="Pegasus", cls="PegasusAttention"),
    _like(BART, family="Whisper", cls="WhisperAttention"),
    T5,
    _like(T5, family="MT5", cls="MT5Attention"),
    _like(T5, family="UMT5", cls="UMT5Attention", covers=T5.covers.replace(" of its stack's first layer", "")),
    # -- vision
    _like(VIT, family="DeiT", cls="DeiTAttention"),
    _like(VIT, family="DINOv2", cls="Dinov2Attention"),
    _like(VIT, family="BEiT", cls="BeitAttention", checks=(Check("relative position bias", beit_bias),)),
    Row(
        family="CLIP",
        cls="CLIPAttention",
        covers="the whole module (vision: bidirectional; text: causal, as the text model masks it)",
        out="out_proj",
        c="embed_dim",
        h="num_heads",
        g=None,
        causal=clip_causal,
        scale="scale",
        checks=(Check("config neither CLIP text nor vision", clip_config),),
    ),
    Row(
        family="SigLIP",
        cls="SiglipAttention",
        covers="the whole module (bidirectional, both towers)",
        out="out_proj",
        c="embed_dim",
        h="num_heads",
        g=None,
        causal=False,
        scale="scale",
    ),
)
BY_CLASS: dict[str, Row] = {row.cls: row for row in ROWS}
