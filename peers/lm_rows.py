"""The whole-model rows: per config `model_type`, what a decoder layer holds besides its attention and
where its tensors sit, beside the attention rows (`peers.model_types.FAMILIES`, which place each layer's
attention and read it).

A row is data: tensor names (relative to the model's base, `model.` / `transformer.` / `gpt_neox.`, found
in the checkpoint), the norm slots of a layer (zoo.lm.RESIDUALS), the MLP's parts, and `fields(cfg)`: the
LMSpec values the config implies. `refuse(cfg)` names a configuration the zoo does not model, in one line.
peers/lm.py reads every row the same way; a new family is a new row.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from zoo.errors import HFConversionError
from zoo.lm_parts import ACT_ALIASES, ACTIVATIONS

from .model_types import ConfigView

GATED = (("gate", "mlp.gate_proj"), ("up", "mlp.up_proj"), ("down", "mlp.down_proj"))
PRE = (("attn_norm", "input_layernorm"), ("mlp_norm", "post_attention_layernorm"))
SANDWICH = (
    ("attn_norm", "input_layernorm"),
    ("attn_post", "post_attention_layernorm"),
    ("mlp_norm", "pre_feedforward_layernorm"),
    ("mlp_post", "post_feedforward_layernorm"),
)


@dataclass(frozen=True)
class LMRow:
    """One model_type's whole model (names relative to the model's base; `head` at the top)."""

    fields: Callable[[ConfigView], dict]  # config -> LMSpec fields (all but vocab, d_model, attention)
    covers: str  # what the row models besides attention, in words (`attnzoo families`' whole-model table)
    embed: str = "embed_tokens"
    layer: str = "layers.{layer}"
    norms: tuple[tuple[str, str], ...] | Callable[[ConfigView], tuple[tuple[str, str], ...]] = PRE  # (slot, name)
    # (part, name): gate/up/down, or gate_up (fused) and down, or experts (a mixture: its saved name; a live
    # model holds it as mlp.gate and mlp.experts' fused 3-D tensors)
    mlp: tuple[tuple[str, str], ...] = GATED
    expert_names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")  # a saved expert's gate, up, down
    final_norm: str = "norm"
    head: tuple[str, ...] = ("lm_head",)  # its names, saved (GPT-NeoX saves embed_out) and live
    positions: str | None = None  # learned absolute positions
    embed_norm: str | None = None
    conv1d: bool = False  # the MLP's weights stored (in, out) (GPT-2's Conv1D)
    refuse: Callable[[ConfigView], str | None] = lambda cfg: None

    def norm_names(self, cfg: ConfigView) -> tuple[tuple[str, str], ...]:
        return self.norms(cfg) if callable(self.norms) else self.norms


def act(name: object) -> str:
    """transformers' activation name -> the zoo's (lm_parts.ACTIVATIONS); refused when it has none."""
    key = ACT_ALIASES.get(name, name)
    if key not in ACTIVATIONS:
        known = sorted({*ACTIVATIONS, *ACT_ALIASES})
        raise HFConversionError(f"the MLP's activation {name!r} is not modelled (known: {', '.join(known)})")
    return key


def _tied(cfg: ConfigView, default: bool) -> bool:
    return bool(cfg.get("tie_word_embeddings", default))


def _llama(cfg: ConfigView, *, tied: bool = False, eps: float = 1e-6, **extra) -> dict:
    """LLaMA's parts; `tied` and `eps`: the config class's defaults where config.json leaves them out."""
    out = dict(
        d_ff=cfg.intermediate_size,
        norm="rms",
        norm_eps=float(cfg.get("rms_norm_eps", eps)),
        mlp="gated",
        act=act(cfg.get("hidden_act", "silu")),
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        tied=_tied(cfg, tied),
    )
    return dict(out, **extra)


def _gemma(cfg: ConfigView, *, act_key: str, residual: str) -> dict:
    softcap = cfg.get("final_logit_softcapping")
    return _llama(
        cfg,
        tied=True,
        norm="rms_plus1",
        act=act(cfg.get(act_key, "gelu_pytorch_tanh")),
        residual=residual,
        embed_scale=math.sqrt(cfg.hidden_size),
        embed_scale_in_dtype=True,
        logit_softcap=float(softcap) if softcap else None,
    )


def _layer_norm(cfg: ConfigView, eps_key: str, **extra) -> dict:
    return dict(norm="layer", norm_eps=float(cfg.get(eps_key, 1e-5)), norm_bias=True, mlp="plain", **extra)


def _stablelm_refuse(cfg: ConfigView) -> str | None:
    if cfg.get("qk_layernorm", False):
        return "qk_layernorm=true (a per-head LayerNorm on Q and K) is not modelled"
    return None


def _opt_refuse(cfg: ConfigView) -> str | None:
    if not cfg.get("do_layer_norm_before", True):
        return "do_layer_norm_before=false (post-norm OPT, e.g. opt-350m) is not modelled"
    if cfg.get("word_embed_proj_dim", cfg.hidden_size) != cfg.hidden_size:
        return "word_embed_proj_dim != hidden_size (OPT's project_in/project_out) is not modelled"
    if not cfg.get("layer_norm_elementwise_affine", True) or cfg.get("_remove_final_layer_norm", False):
        return "OPT without affine or final layer norms is not modelled"
    return None


def _bloom_refuse(cfg: ConfigView) -> str | None:
    if cfg.get("apply_residual_connection_post_layernorm", False):
        return "apply_residual_connection_post_layernorm=true is not modelled"
    return None


def _cross_refuse(cfg: ConfigView) -> str | None:
    if cfg.get("add_cross_attention", False):
        return "add_cross_attention=true (cross-attention layers) is not modelled"
    return None


def _falcon_norms(cfg: ConfigView) -> tuple[tuple[str, str], ...]:
    if cfg.get("new_decoder_architecture", False):
        if cfg.get("num_ln_in_parallel_attn") == 2 or cfg.get("num_ln_in_parallel_attn") is None:
            return (("attn_norm", "ln_attn"), ("mlp_norm", "ln_mlp"))
        return (("attn_norm", "input_layernorm"),)
    if cfg.get("parallel_attn", True):
        return (("attn_norm", "input_layernorm"),)
    return PRE


def _falcon(cfg: ConfigView) -> dict:
    names = [name for _, name in _falcon_norms(cfg)]
    residual = "parallel" if len(names) == 1 else "parallel_two_norms" if "ln_mlp" in names else "sequential"
    d_ff = cfg.get("ffn_hidden_size") or 4 * cfg.hidden_size
    return _layer_norm(
        cfg,
        "layer_norm_epsilon",
        d_ff=d_ff,
        act=act(cfg.get("activation", "gelu")),
        mlp_bias=bool(cfg.get("bias", False)),
        residual=residual,
        tied=_tied(cfg, True),
    )


def _neox_residual(cfg: ConfigView) -> str:
    return "parallel_two_norms" if cfg.get("use_parallel_residual", True) else "sequential"


def _num_experts(cfg: ConfigView) -> int:
    """num_experts, or num_local_experts as transformers 5 saves Qwen3-MoE's (its attribute_map)."""
    n = cfg.get("num_experts", cfg.get("num_local_experts"))
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise HFConversionError(f"num_experts={n!r}: give the number of experts (an int)")
    return n


def _top_k_experts(cfg: ConfigView) -> dict:
    """The mixture's LMSpec fields of Qwen2-MoE, Qwen3-MoE and OLMoE: experts, top k, renormalized or not."""
    return dict(
        experts=_num_experts(cfg),
        experts_per_token=int(cfg.num_experts_per_tok),
        expert_renorm=bool(cfg.get("norm_topk_prob", False)),
    )


def _sparse_refuse(cfg: ConfigView) -> str | None:
    """Qwen2-MoE, Qwen3-MoE: every layer must hold the mixture."""
    if not _num_experts(cfg):
        return "num_experts=0 (every layer a dense MLP) is not modelled"
    if cfg.get("mlp_only_layers") or cfg.get("decoder_sparse_step", 1) != 1:
        return "dense layers among the sparse ones (mlp_only_layers, decoder_sparse_step != 1) are not modelled"
    return None


def _granite(cfg: ConfigView) -> dict:
    return _llama(
        cfg,
        embed_scale=float(cfg.get("embedding_multiplier", 1.0)),
        residual_multiplier=float(cfg.get("residual_multiplier", 1.0)),
        logit_scale=1.0 / float(cfg.get("logits_scaling", 1.0)),
    )


def _gpt2(cfg: ConfigView, *, d_ff: int | None, positions: int, act_default: str) -> dict:
    """GPT-2's parts (GPT-Neo's and GPT-BigCode's too): LayerNorm, a plain MLP of d_ff (default 4 x hidden),
    learned positions, a tied head."""
    return _layer_norm(
        cfg,
        "layer_norm_epsilon",
        d_ff=d_ff or 4 * cfg.hidden_size,
        act=act(cfg.get("activation_function", act_default)),
        mlp_bias=True,
        max_positions=positions,
        tied=_tied(cfg, True),
    )


def _gpt2_layout(fields: Callable[[ConfigView], dict], covers: str, **row) -> LMRow:
    """A row with GPT-2's tensor names: wte, wpe, h.N.ln_1 / ln_2, mlp.c_fc / c_proj, ln_f."""
    return LMRow(
        fields,
        covers,
        embed="wte",
        positions="wpe",
        layer="h.{layer}",
        norms=(("attn_norm", "ln_1"), ("mlp_norm", "ln_2")),
        mlp=(("up", "mlp.c_fc"), ("down", "mlp.c_proj")),
        final_norm="ln_f",
        **row,
    )


LM_FAMILIES: dict[str, LMRow] = {
    "llama": LMRow(_llama, "RMSNorm, gated MLP (SiLU), pre-norm; tied or untied head"),
    "mistral": LMRow(_llama, "as LLaMA (sliding windows in the attention)"),
    "qwen2": LMRow(_llama, "as LLaMA (windows from max_window_layers)"),
    "qwen3": LMRow(_llama, "as LLaMA (QK-norm in the attention)"),
    "smollm3": LMRow(
        lambda cfg: _llama(cfg, tied=True), "as LLaMA (layers without rotary from no_rope_layers in the attention)"
    ),
    "helium": LMRow(lambda cfg: _llama(cfg, eps=1e-8), "as LLaMA (interleaved rotary in the attention)"),
    "gemma": LMRow(
        lambda cfg: _gemma(cfg, act_key="hidden_act", residual="sequential"),
        "RMSNorm (1 + w), gated MLP (GELU tanh), embeddings * sqrt(d), pre-norm, tied",
    ),
    "gemma2": LMRow(
        lambda cfg: _gemma(cfg, act_key="hidden_activation", residual="sandwich"),
        "as Gemma, sandwich norms, final logit softcap",
        norms=SANDWICH,
    ),
    "gemma3_text": LMRow(
        lambda cfg: _gemma(cfg, act_key="hidden_activation", residual="sandwich"),
        "as Gemma, sandwich norms",
        norms=SANDWICH,
    ),
    "phi3": LMRow(
        lambda cfg: _llama(cfg, eps=1e-5, longrope_recompute=True),
        "as LLaMA, fused gate_up",
        mlp=(("gate_up", "mlp.gate_up_proj"), ("down", "mlp.down_proj")),
    ),
    "phi": LMRow(
        lambda cfg: _layer_norm(
            cfg,
            "layer_norm_eps",
            d_ff=cfg.intermediate_size,
            act=act(cfg.hidden_act),
            mlp_bias=True,
            residual="parallel",
            head_bias=True,
            tied=_tied(cfg, False),
        ),
        "LayerNorm, parallel attention + MLP (GELU) on one norm, head with bias",
        norms=(("attn_norm", "input_layernorm"),),
        mlp=(("up", "mlp.fc1"), ("down", "mlp.fc2")),
        final_norm="final_layernorm",
    ),
    "gpt2": _gpt2_layout(
        lambda cfg: _gpt2(cfg, d_ff=cfg.get("n_inner"), positions=cfg.n_positions, act_default="gelu_new"),
        "learned positions, LayerNorm, MLP (GELU) of Conv1D weights, pre-norm, tied",
        conv1d=True,
        refuse=_cross_refuse,
    ),
    "gpt_neo": _gpt2_layout(
        lambda cfg: _gpt2(
            cfg, d_ff=cfg.get("intermediate_size"), positions=cfg.max_position_embeddings, act_default="gelu_new"
        ),
        "learned positions, LayerNorm, MLP (GELU), pre-norm, tied (global and local layers in the attention)",
    ),
    "gpt_bigcode": _gpt2_layout(
        lambda cfg: _gpt2(cfg, d_ff=cfg.get("n_inner"), positions=cfg.n_positions, act_default="gelu_pytorch_tanh"),
        "learned positions, LayerNorm, MLP (GELU tanh), pre-norm, tied (multi-query attention)",
        refuse=_cross_refuse,
    ),
    "gpt_neox": LMRow(
        lambda cfg: _layer_norm(
            cfg,
            "layer_norm_eps",
            d_ff=cfg.intermediate_size,
            act=act(cfg.hidden_act),
            mlp_bias=True,
            tied=_tied(cfg, False),
            residual=_neox_residual(cfg),
        ),
        "LayerNorm, parallel residual with two norms (or sequential), MLP (GELU), untied",
        embed="embed_in",
        head=("embed_out", "lm_head"),
        mlp=(("up", "mlp.dense_h_to_4h"), ("down", "mlp.dense_4h_to_h")),
        final_norm="final_layer_norm",
    ),
    "gptj": LMRow(
        lambda cfg: _layer_norm(
            cfg,
            "layer_norm_epsilon",
            d_ff=cfg.get("n_inner") or 4 * cfg.hidden_size,
            act=act(cfg.get("activation_function", "gelu_new")),
            mlp_bias=True,
            residual="parallel",
            head_bias=True,
            tied=_tied(cfg, False),
        ),
        "LayerNorm, parallel attention + MLP (GELU) on one norm, head with bias",
        embed="wte",
        layer="h.{layer}",
        norms=(("attn_norm", "ln_1"),),
        mlp=(("up", "mlp.fc_in"), ("down", "mlp.fc_out")),
        final_norm="ln_f",
    ),
    "opt": LMRow(
        lambda cfg: dict(
            _layer_norm(
                cfg,
                "layer_norm_eps",
                d_ff=cfg.ffn_dim,
                act=act(cfg.activation_function),
                mlp_bias=bool(cfg.get("enable_bias", True)),
                tied=_tied(cfg, True),
                max_positions=cfg.max_position_embeddings,
                position_offset=2,
            ),
            norm_bias=bool(cfg.get("enable_bias", True)),
        ),
        "learned positions (offset 2), LayerNorm, MLP (ReLU), pre-norm, tied",
        embed="decoder.embed_tokens",
        positions="decoder.embed_positions",
        layer="decoder.layers.{layer}",
        norms=(("attn_norm", "self_attn_layer_norm"), ("mlp_norm", "final_layer_norm")),
        mlp=(("up", "fc1"), ("down", "fc2")),
        final_norm="decoder.final_layer_norm",
        refuse=_opt_refuse,
    ),
    "bloom": LMRow(
        lambda cfg: _layer_norm(
            cfg,
            "layer_norm_epsilon",
            d_ff=4 * cfg.hidden_size,
            act="gelu_tanh",
            mlp_bias=True,
            embed_norm=True,
            tied=_tied(cfg, True),
        ),
        "LayerNorm on the embeddings, LayerNorm, MLP (GELU tanh), pre-norm, tied",
        embed="word_embeddings",
        embed_norm="word_embeddings_layernorm",
        layer="h.{layer}",
        mlp=(("up", "mlp.dense_h_to_4h"), ("down", "mlp.dense_4h_to_h")),
        final_norm="ln_f",
        refuse=_bloom_refuse,
    ),
    "falcon": LMRow(
        _falcon,
        "LayerNorm, parallel attention + MLP (GELU) on one or two norms (or sequential)",
        embed="word_embeddings",
        layer="h.{layer}",
        norms=_falcon_norms,
        mlp=(("up", "mlp.dense_h_to_4h"), ("down", "mlp.dense_4h_to_h")),
        final_norm="ln_f",
    ),
    "olmo": LMRow(
        lambda cfg: _llama(cfg, norm="layer_plain", norm_eps=1e-5),
        "LayerNorm without weight or bias (eps 1e-5), gated MLP (SiLU), pre-norm (clip_qkv in the attention)",
    ),
    "olmo2": LMRow(
        lambda cfg: _llama(cfg, eps=1e-5, residual="post_norms"),
        "RMSNorm after attention and MLP (no pre-norms), gated MLP (SiLU)",
        norms=(("attn_post", "post_attention_layernorm"), ("mlp_post", "post_feedforward_layernorm")),
    ),
    "starcoder2": LMRow(
        lambda cfg: _layer_norm(
            cfg,
            "norm_epsilon",
            d_ff=cfg.intermediate_size,
            act=act(cfg.hidden_act),
            mlp_bias=bool(cfg.get("use_bias", True)),
            tied=_tied(cfg, True),
        ),
        "LayerNorm, MLP (GELU tanh) with biases, pre-norm, tied",
        mlp=(("up", "mlp.c_fc"), ("down", "mlp.c_proj")),
    ),
    "mixtral": LMRow(
        lambda cfg: _llama(
            cfg, eps=1e-5, experts=int(cfg.num_local_experts), experts_per_token=int(cfg.num_experts_per_tok)
        ),
        "as LLaMA, a sparse mixture of gated experts (top k, renormalized) in place of the MLP",
        mlp=(("experts", "block_sparse_moe"),),
        expert_names=("w1", "w3", "w2"),
    ),
    "qwen2_moe": LMRow(
        lambda cfg: _llama(
            cfg,
            d_ff=int(cfg.moe_intermediate_size),
            shared_expert_d_ff=int(cfg.get("shared_expert_intermediate_size") or 0),
            **_top_k_experts(cfg),
        ),
        "as Qwen2, a mixture of gated experts (top k) plus a sigmoid-gated shared expert",
        mlp=(("experts", "mlp"),),
        refuse=_sparse_refuse,
    ),
    "qwen3_moe": LMRow(
        lambda cfg: _llama(cfg, d_ff=int(cfg.moe_intermediate_size), **_top_k_experts(cfg)),
        "as Qwen3 (every layer windowed with use_sliding_window), a mixture of gated experts (top k, renormalized "
        "with norm_topk_prob) in place of the MLP",
        mlp=(("experts", "mlp"),),
        refuse=_sparse_refuse,
    ),
    "olmoe": LMRow(
        lambda cfg: _llama(cfg, eps=1e-5, **_top_k_experts(cfg)),
        "as LLaMA (QK-norm over all heads in the attention), a mixture of gated experts (top k, renormalized "
        "with norm_topk_prob) in place of the MLP",
        mlp=(("experts", "mlp"),),
    ),
    "granite": LMRow(_granite, "as LLaMA, embedding, residual and logit multipliers"),
    "cohere": LMRow(
        lambda cfg: _llama(
            cfg,
            tied=True,
            norm="layer",
            norm_eps=float(cfg.get("layer_norm_eps", 1e-5)),
            residual="parallel",
            logit_scale=float(cfg.get("logit_scale", 0.0625)),
        ),
        "LayerNorm without bias, parallel attention + gated MLP (SiLU) on one norm, logit scale, tied (QK-norm "
        "with use_qk_norm in the attention)",
        norms=PRE[:1],
    ),
    "stablelm": LMRow(
        lambda cfg: dict(
            _llama(cfg),
            norm="layer",
            norm_eps=float(cfg.get("layer_norm_eps", 1e-5)),
            norm_bias=True,
            residual="parallel" if cfg.get("use_parallel_residual", False) else "sequential",
        ),
        "LayerNorm, gated MLP (SiLU), pre-norm or parallel residual",
        norms=lambda cfg: PRE[:1] if cfg.get("use_parallel_residual", False) else PRE,
        refuse=_stablelm_refuse,
    ),
}

__all__ = ["LMRow", "LM_FAMILIES", "act"]
