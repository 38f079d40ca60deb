"""The config keys each model_type's transformers modeling code reads, and what the zoo does with each.

Every model_type a config reader accepts (`peers.model_types.FAMILIES`: spec_from_config, from_checkpoint and,
with a row in `peers.lm_rows`, lm_from_checkpoint; `peers.encoder_rows`; `peers.seq2seq_rows`) has each key its
`modeling_<type>.py` reads (`config.x`, `getattr(config, "x")`) classified here, so none that changes the
math is dropped silently:

    GENERIC / KEYS  honoured: the reader applies it (the text says where)
    IRRELEVANT      no effect on the outputs in eval mode (dropout, init, ids, task heads, cache flags,
                    half-precision numerics, kernels), or a part the zoo's reader never builds (an MoE router
                    of a model read only as attention blocks: `outside`)
    REFUSED         not applied: a config that sets it to anything but its no-op value is refused with one
                    HFConversionError line naming the key, its value and what to do (`refuse`)

DEFAULTS are the transformers config class's values for honoured keys whose absence is not a no-op (Gemma-2's
softcaps, Mistral's sliding_window): `peers.config.normalized` fills them in, so a config.json that leaves one
out reads as transformers reads it. tests/peers/test_config_keys.py greps the installed transformers and holds
this table to it: a key a new release reads that is not classified here fails there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from zoo.errors import HFConversionError


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


# key -> why it does not change what the model computes in eval mode
IRRELEVANT: dict[str, str] = {
    **dict.fromkeys(
        _words(
            "attention_dropout attention_probs_dropout_prob hidden_dropout hidden_dropout_prob classifier_dropout "
            "dropout activation_dropout attn_pdrop embd_pdrop resid_pdrop embed_dropout resid_dropout "
            "embedding_dropout residual_dropout dropout_rate layerdrop encoder_layerdrop decoder_layerdrop "
            "qa_dropout seq_classif_dropout projector_dropout mlp_dropout attn_config.attn_pdrop"
        ),
        "dropout (training only)",
    ),
    **dict.fromkeys(
        _words("initializer_range initializer_factor initializer_cutoff_factor sinusoidal_pos_embds"),
        "initialization (the checkpoint's weights win)",
    ),
    **dict.fromkeys(
        _words("output_router_logits router_aux_loss_coef router_jitter_noise gradient_checkpointing"),
        "training only",
    ),
    **dict.fromkeys(
        _words("pad_token_id eos_token_id decoder_start_token_id image_token_id mm_tokens_per_image"),
        "token ids (generation reads its own: peers.seq2seq.generation_settings)",
    ),
    **dict.fromkeys(
        _words(
            "num_labels problem_type classifier_bias classifier_activation classifier_pooling sparse_prediction "
            "sparse_pred_ignore_index decoder_bias summary_type summary_use_proj summary_activation "
            "summary_proj_to_labels summary_first_dropout summary_last_dropout num_logits_to_keep"
        ),
        "a task head or its loss, not the model read",
    ),
    **dict.fromkeys(
        _words(
            "_attn_implementation use_cache output_attentions output_hidden_states return_dict dtype "
            "chunk_size_feed_forward deterministic_flash_attn use_mamba_kernels use_mambapy use_associative_scan "
            "is_encoder_decoder is_decoder get_text_config text_config vision_config max_seq_len"
        ),
        "a kernel, output or bookkeeping choice: the same math",
    ),
    **dict.fromkeys(
        _words(
            "reorder_and_upcast_attn attention_softmax_in_fp32 scale_attention_softmax_in_fp32 pretraining_tp "
            "slow_but_exact"
        ),
        "half-precision numerics or a sliced matmul: the same math in float32",
    ),
}

# honoured by every reader of a family that reads it
GENERIC: dict[str, str] = {
    "hidden_size": "d_model",
    "num_attention_heads": "heads",
    "num_key_value_heads": "kv_heads",
    "head_dim": "d_k",
    "num_hidden_layers": "the layers read",
    "rope_parameters": "peers.config.rope_parameters -> rope_theta / rope_dim / scaling (peers.rope; others refused)",
    "max_position_embeddings": "a scaled rotary's length, learned positions",
    "vocab_size": "the token table",
    "intermediate_size": "d_ff",
    "hidden_act": "act (peers.lm_rows.act; others refused)",
    "tie_word_embeddings": "tied (peers.lm._untied where the file's head differs)",
}

# what a reader that builds only attention blocks never builds: a key of those parts has no effect on them
OUTSIDE = "outside: a part of the model the zoo reads no whole-model row for (its attention blocks do not use it)"
ATTN = "honoured: the attention block (peers.model_types.FAMILIES, the row in peers.classes / peers.copies)"
BIAS = "honoured: the projection biases (Family.bias)"
NORM = "honoured: the norms (eps) of the whole model, or the QK-norm's"
LM = "honoured: the whole model (peers.lm_rows)"
LM_REFUSED = "refused by the whole-model row where not its default (peers.lm_rows refuse)"
ROW_CHECK = "refused by the attention row's check where set (peers.checks)"
WINDOW = "honoured: the sliding window of the sliding layers"
SEQ = "honoured: peers.seq2seq_rows"
ENC = "honoured: peers.encoder_rows"


def _keys(group: str, text: str) -> dict[str, str]:
    return dict.fromkeys(_words(text), group)


_LLAMA = {**_keys(BIAS, "attention_bias"), **_keys(LM, "mlp_bias"), **_keys(NORM, "rms_norm_eps")}
_MOE_LM = _keys(
    LM,
    "num_experts num_local_experts num_experts_per_tok norm_topk_prob moe_intermediate_size "
    "shared_expert_intermediate_size",
)
_GPT = (
    _keys(ATTN, "n_embd n_layer n_head") | _keys(LM, "n_inner activation_function") | _keys(NORM, "layer_norm_epsilon")
)
_MOE_OUT = "num_experts num_local_experts num_experts_per_tok norm_topk_prob moe_intermediate_size n_group topk_group "
_MOE_OUT += "n_shared_experts routed_scaling_factor first_k_dense_replace topk_method shared_expert_intermediate_size "
_MOE_OUT += "decoder_sparse_step mlp_only_layers moe_layers intermediate_size_mlp"
_LATENT = _keys(ATTN, "kv_lora_rank q_lora_rank qk_nope_head_dim qk_rope_head_dim v_head_dim rope_interleave")
_BART = _keys(
    SEQ,
    "d_model encoder_layers decoder_layers encoder_attention_heads decoder_attention_heads encoder_ffn_dim "
    "decoder_ffn_dim activation_function scale_embedding",
)
_T5 = _keys(
    SEQ,
    "d_model d_kv d_ff num_heads num_layers num_decoder_layers dense_act_fn is_gated_act layer_norm_epsilon "
    "relative_attention_num_buckets relative_attention_max_distance",
)
_BERT = _keys(ENC, "type_vocab_size layer_norm_eps") | _keys(
    "refused by the encoder row where set (peers.encoder_rows)", "add_cross_attention"
)

# model_type -> the keys its modeling file reads beyond IRRELEVANT and GENERIC
KEYS: dict[str, dict[str, str]] = {
    "llama": _LLAMA,
    "mistral": _keys(NORM, "rms_norm_eps") | _keys(WINDOW, "sliding_window"),
    "mixtral": _keys(NORM, "rms_norm_eps") | _keys(WINDOW, "sliding_window") | _MOE_LM,
    "gemma": _LLAMA | _keys(ROW_CHECK, "use_bidirectional_attention"),
    "gemma2": _LLAMA
    | _keys(ROW_CHECK, "use_bidirectional_attention")
    | _keys(WINDOW, "sliding_window layer_types")
    | _keys(ATTN, "attn_logit_softcapping query_pre_attn_scalar")
    | _keys(LM, "final_logit_softcapping hidden_activation"),
    "gemma3_text": _LLAMA
    | _keys(ROW_CHECK, "use_bidirectional_attention")
    | _keys(WINDOW, "sliding_window layer_types")
    | _keys(ATTN, "query_pre_attn_scalar")
    | _keys(LM, "final_logit_softcapping hidden_activation")
    | _keys("irrelevant: read into Gemma3Attention but never applied by transformers", "attn_logit_softcapping"),
    "qwen2": _LLAMA | _keys(WINDOW, "sliding_window layer_types"),
    "qwen2_moe": _LLAMA
    | _keys(WINDOW, "sliding_window layer_types")
    | _keys(BIAS, "qkv_bias")
    | _MOE_LM
    | _keys(LM_REFUSED, "decoder_sparse_step mlp_only_layers"),
    "qwen3": _LLAMA | _keys(WINDOW, "sliding_window layer_types"),
    "qwen3_moe": _LLAMA
    | _keys(WINDOW, "sliding_window")
    | _MOE_LM
    | _keys(LM_REFUSED, "decoder_sparse_step mlp_only_layers"),
    "llama4_text": _LLAMA
    | _keys(ATTN, "attn_scale attn_temperature_tuning floor_scale no_rope_layers use_qk_norm layer_types")
    | _keys(OUTSIDE, _MOE_OUT + " image_size num_channels patch_size pixel_shuffle_ratio projector_input_dim")
    | _keys(OUTSIDE, "projector_output_dim"),
    "qwen3_next": _LLAMA
    | _keys(ATTN, "layer_types")
    | _keys(OUTSIDE, _MOE_OUT + " linear_conv_kernel_dim linear_key_head_dim linear_num_key_heads")
    | _keys(OUTSIDE, "linear_num_value_heads linear_value_head_dim"),
    "olmo": _LLAMA | _keys(ATTN, "clip_qkv"),
    "olmo2": _LLAMA,
    "olmoe": _LLAMA | _MOE_LM | _keys(ROW_CHECK, "clip_qkv"),
    "phi": _keys(NORM, "layer_norm_eps") | _keys(ATTN, "partial_rotary_factor qk_layernorm"),
    "phi3": _LLAMA | _keys(WINDOW, "sliding_window") | _keys(ATTN, "original_max_position_embeddings"),
    "cohere": _keys(BIAS, "attention_bias")
    | _keys(NORM, "layer_norm_eps")
    | _keys(LM, "logit_scale")
    | _keys(ATTN, "use_qk_norm"),
    "cohere2": _keys(BIAS, "attention_bias")
    | _keys(NORM, "layer_norm_eps")
    | _keys(OUTSIDE, "logit_scale")
    | _keys(WINDOW, "sliding_window layer_types"),
    "stablelm": _keys(NORM, "layer_norm_eps")
    | _keys(ATTN, "partial_rotary_factor qk_layernorm")
    | _keys(BIAS, "use_qkv_bias")
    | _keys(LM, "use_parallel_residual"),
    "starcoder2": _keys(NORM, "norm_epsilon") | _keys(WINDOW, "sliding_window") | _keys(BIAS, "use_bias"),
    "granite": _LLAMA
    | _keys(ATTN, "attention_multiplier")
    | _keys(LM, "embedding_multiplier logits_scaling residual_multiplier"),
    "persimmon": _keys(NORM, "layer_norm_eps") | _keys(ATTN, "partial_rotary_factor qk_layernorm"),
    "helium": _LLAMA,
    "nemotron": _keys(BIAS, "attention_bias") | _keys(OUTSIDE, "mlp_bias norm_eps"),
    "smollm3": _LLAMA | _keys(WINDOW, "sliding_window layer_types use_sliding_window") | _keys(ATTN, "no_rope_layers"),
    "exaone4": _keys(NORM, "rms_norm_eps") | _keys(WINDOW, "sliding_window layer_types sliding_window_pattern"),
    "glm": _keys(BIAS, "attention_bias") | _keys(OUTSIDE, "rms_norm_eps"),
    "gpt_neox": _keys(BIAS, "attention_bias") | _keys(NORM, "layer_norm_eps") | _keys(LM, "use_parallel_residual"),
    "gpt_oss": _keys(BIAS, "attention_bias")
    | _keys(WINDOW, "sliding_window layer_types")
    | _keys(OUTSIDE, "rms_norm_eps num_experts_per_tok num_local_experts swiglu_alpha swiglu_limit"),
    "deepseek_v3": _LATENT | _keys(BIAS, "attention_bias") | _keys(OUTSIDE, _MOE_OUT + " rms_norm_eps"),
    "deepseek_v2": _LATENT | _keys(BIAS, "attention_bias") | _keys(OUTSIDE, _MOE_OUT + " rms_norm_eps mlp_bias"),
    "minicpm3": _LATENT
    | _keys(BIAS, "attention_bias")
    | _keys(OUTSIDE, "rms_norm_eps mlp_bias scale_depth scale_emb logits_scaling"),
    "gpt2": _GPT
    | _keys(ATTN, "scale_attn_weights scale_attn_by_inverse_layer_idx")
    | _keys(LM_REFUSED, "add_cross_attention"),
    "bloom": _keys(ATTN, "n_head")
    | _keys(NORM, "layer_norm_epsilon")
    | _keys(LM_REFUSED, "apply_residual_connection_post_layernorm"),
    "falcon": _keys(ATTN, "multi_query new_decoder_architecture num_kv_heads")
    | _keys(ROW_CHECK, "alibi")
    | _keys(BIAS, "bias")
    | _keys(NORM, "layer_norm_epsilon")
    | _keys(LM, "parallel_attn num_ln_in_parallel_attn ffn_hidden_size activation"),
    "gptj": _GPT | _keys(ATTN, "rotary_dim"),
    "codegen": _keys(ATTN, "n_embd n_layer rotary_dim")
    | _keys(OUTSIDE, "n_inner activation_function layer_norm_epsilon"),
    "gpt_neo": _keys(ATTN, "num_heads num_layers attention_layers window_size")
    | _keys(LM, "activation_function")
    | _keys(NORM, "layer_norm_epsilon"),
    "gpt_bigcode": _GPT | _keys(ATTN, "multi_query scale_attn_weights") | _keys(LM_REFUSED, "add_cross_attention"),
    "opt": _keys(BIAS, "enable_bias")
    | _keys(LM, "ffn_dim activation_function")
    | _keys(
        LM_REFUSED, "do_layer_norm_before word_embed_proj_dim layer_norm_elementwise_affine _remove_final_layer_norm"
    ),
    "mpt": _keys(ATTN, "n_heads n_layers attn_config attn_config.softmax_scale attn_config.clip_qkv")
    | _keys(OUTSIDE, "layer_norm_epsilon"),
    # copies and hybrids: their attention layers only
    "solar_open": _LLAMA | _keys(OUTSIDE, _MOE_OUT),
    "hyperclovax": _LLAMA
    | _keys(ATTN, "attention_multiplier")
    | _keys(OUTSIDE, "embedding_multiplier logits_scaling residual_multiplier use_post_norm"),
    "minimax": _keys(WINDOW, "sliding_window layer_types")
    | _keys(
        OUTSIDE,
        "rms_norm_eps num_experts_per_tok num_local_experts block_size full_attn_alpha_factor full_attn_beta_factor "
        "linear_attn_alpha_factor linear_attn_beta_factor mlp_alpha_factor mlp_beta_factor",
    ),
    "jamba": _keys(ATTN, "layer_types")
    | _keys(
        OUTSIDE,
        "rms_norm_eps layers_block_type layers_num_experts mamba_conv_bias mamba_d_conv mamba_d_state mamba_dt_rank "
        "mamba_expand mamba_proj_bias num_experts num_experts_per_tok num_local_experts",
    ),
    "falcon_h1": _LLAMA
    | _keys(ATTN, "key_multiplier layer_types")
    | _keys(
        OUTSIDE,
        "attention_in_multiplier attention_out_multiplier embedding_multiplier lm_head_multiplier mamba_chunk_size "
        "mamba_conv_bias mamba_d_conv mamba_d_head mamba_d_ssm mamba_d_state mamba_expand mamba_n_groups "
        "mamba_n_heads mamba_norm_before_gate mamba_proj_bias mamba_rms_norm mlp_multipliers projectors_bias "
        "ssm_in_multiplier ssm_multipliers ssm_out_multiplier time_step_limit",
    ),
    "lfm2": _keys(NORM, "norm_eps")
    | _keys(ATTN, "layer_types")
    | _keys(OUTSIDE, "block_auto_adjust_ff_dim block_ffn_dim_multiplier block_multiple_of conv_L_cache conv_bias"),
    # whole encoders and encoder-decoders (their own readers)
    "bert": _BERT,
    "roberta": _BERT,
    "xlm-roberta": _BERT,
    "distilbert": _keys(ENC, "dim hidden_dim n_heads n_layers activation"),
    "modernbert": _keys(ENC, "attention_bias mlp_bias norm_bias norm_eps hidden_activation layer_types sliding_window"),
    "bart": _BART,
    "mbart": _BART,
    "marian": _BART | _keys(SEQ, "decoder_vocab_size share_encoder_decoder_embeddings"),
    "t5": _T5 | _keys(SEQ, "scale_decoder_outputs"),
    "mt5": _T5,
}


@dataclass(frozen=True)
class Refusal:
    """A key the zoo does not apply: `noop(value, cfg)` says whether a value changes nothing."""

    noop: Callable[[Any, Any], bool]
    what: str  # what the key does, for the message
    fix: str  # what to do instead
    example: Any  # a value that changes the math (refused; tests and docs)
    noops: tuple = (None,)  # values that change nothing on a model of 512 positions (read; tests)


def _window_noop(v: Any, cfg: Any) -> bool:
    return v is None or (isinstance(v, int) and v >= int(cfg.get("max_position_embeddings") or 0) > 0)


REFUSED: dict[str, dict[str, Refusal]] = {
    "olmoe": {
        "sliding_window": Refusal(
            _window_noop,
            "OlmoeAttention hands it to the attention kernel, which applies it under flash attention only "
            "(its mask is causal); the zoo's OLMoE block has no window",
            "remove it or set it to null (no window)",
            example=4,
            noops=(None, 1 << 20),
        ),
    },
}
for _kind, _refused in REFUSED.items():
    KEYS.setdefault(_kind, {}).update(dict.fromkeys(_refused, "refused: REFUSED"))


# the transformers config class's value (5.25) for honoured keys whose absence is not a no-op
DEFAULTS: dict[str, dict[str, Any]] = {
    "mt5": {"feed_forward_proj": "gated-gelu"},  # T5's is relu: an mT5 config.json of sizes read as T5 v1.0
    "mistral": {"sliding_window": 4096},
    "gemma": {"head_dim": 256},
    "gemma2": {
        "head_dim": 256,
        "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0,
        "query_pre_attn_scalar": 256,
        "sliding_window": 4096,
    },
    "gemma3_text": {"head_dim": 256, "query_pre_attn_scalar": 256, "sliding_window": 4096},
    "cohere2": {"sliding_window": 4096},
    "exaone4": {"sliding_window": 4096, "sliding_window_pattern": 4, "rms_norm_eps": 1e-5},
    "gpt_oss": {"head_dim": 64, "sliding_window": 128},
    "glm": {"head_dim": 128, "attention_bias": True},
    "helium": {"head_dim": 128},
    "llama4_text": {"head_dim": 128},
    "qwen3": {"head_dim": 128},
    "qwen3_next": {"head_dim": 256},
    "solar_open": {"head_dim": 128},
    "persimmon": {"qk_layernorm": True},
    "starcoder2": {"use_bias": True},
    "qwen2_moe": {"qkv_bias": True},
    "olmo2": {"rms_norm_eps": 1e-5},
    "olmoe": {"rms_norm_eps": 1e-5},
    "lfm2": {"norm_eps": 1e-5},
    "gptj": {"rotary_dim": 64},
    "codegen": {"rotary_dim": 64},
    "gpt_neo": {"window_size": 256},
    "granite": {"attention_multiplier": 1.0},
}


# The accepted types whose attention has as many key/value heads as query heads, reading no num_key_value_heads:
# a stray one in their config.json is dropped, as transformers ignores it (read, it split the heads wrongly).
KV_HEADS_UNREAD = frozenset({"bloom", "codegen", "gpt2", "gpt_neo", "gpt_neox", "gptj", "mpt", "opt", "persimmon"})


def with_defaults(kind: str, data: dict) -> dict:
    """A config dict with the config class's DEFAULTS where it leaves a key out (the encoder-decoder readers';
    the decoders' peers.config.normalized does the same)."""
    return {**DEFAULTS.get(kind, {}), **data}


def refuse(kind: str, data: dict, cfg: Any) -> None:
    """HFConversionError naming the first REFUSED key of `kind` the config sets to a value that is not a no-op;
    `cfg` (a ConfigView) gives the sizes a no-op is judged against (max_position_embeddings)."""
    for key, r in REFUSED.get(kind, {}).items():
        v = data.get(key)
        if not r.noop(v, cfg):
            raise HFConversionError(
                f"{kind} config: {key}={v!r} is not applied by the zoo ({r.what}); {r.fix}, or read the model "
                f"with transformers"
            )


__all__ = [
    "DEFAULTS",
    "GENERIC",
    "IRRELEVANT",
    "KEYS",
    "KV_HEADS_UNREAD",
    "REFUSED",
    "Refusal",
    "refuse",
    "with_defaults",
]
