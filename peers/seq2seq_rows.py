"""Whole encoder-decoder models, one row per config model_type: what zoo.seq2seq.Seq2SeqSpec a config
makes, and which checkpoint tensor fills each parameter of the zoo's Seq2SeqLM.

    t5, mt5      RMSNorm (no mean, no bias), pre-norm, relative buckets of each stack's first layer shared
                 down the stack, no score scaling, no bias; ReLU MLP (v1.0) or gated GELU tanh (v1.1, Flan,
                 mT5); the decoder output times d_model**-0.5 before a tied head (scale_decoder_outputs)
    bart         LayerNorm (eps 1e-5), post-norm, learned positions (offset 2), a LayerNorm on the
                 embeddings, biases everywhere, GELU MLP, final_logits_bias, tied head
    mbart        as BART, pre-norm, a final LayerNorm after each stack
    marian       as BART, but fixed sinusoidal positions (sin in the first half of the channels, cos in the
                 second; not saved in the checkpoint) and no LayerNorm on the embeddings; the encoder and
                 decoder share one token table, or each has its own (share_encoder_decoder_embeddings=False,
                 the decoder's vocabulary decoder_vocab_size); the head is tied to the decoder's table

A row is data: `fields(cfg)` (the spec's non-attention fields), `attention(cfg)` (the three specs of a
layer: encoder self, decoder self, cross) and `names(cfg, model)` (zoo parameter -> checkpoint tensor).
Generic code (peers/seq2seq.py) reads every row the same way.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from zoo import AttentionSpec, SpecError

from .lm_rows import act


@dataclass(frozen=True)
class Seq2SeqRow:
    covers: str
    fields: Callable[[dict], dict]
    attention: Callable[[dict], tuple[AttentionSpec, AttentionSpec, AttentionSpec]]
    layers: Callable[[dict], tuple[int, int]]
    names: Callable[[dict, object], dict[str, str]]
    ignored: tuple[str, ...] = ()  # checkpoint tensors the zoo does not read: copies of a tied table


# -- T5 ----------------------------------------------------------------------------------------------


def _t5_gated(cfg: dict) -> bool:
    return str(cfg.get("feed_forward_proj", "relu")).startswith("gated-")


def _t5_fields(cfg: dict) -> dict:
    proj = str(cfg.get("feed_forward_proj", "relu"))
    name = "gelu_new" if proj == "gated-gelu" else proj.split("-")[-1]
    # transformers 5 reads T5 v1.1's `tie_word_embeddings: false` as scale_decoder_outputs=False
    scaled = cfg.get("scale_decoder_outputs", cfg.get("tie_word_embeddings", True) is not False)
    return dict(
        d_ff=int(cfg["d_ff"]),
        norm="rms",
        norm_eps=float(cfg.get("layer_norm_epsilon", 1e-6)),
        norm_bias=False,
        mlp="gated" if _t5_gated(cfg) else "plain",
        act=act(name),
        mlp_bias=False,
        pre_norm=True,
        final_norm=True,
        head_scale=int(cfg["d_model"]) ** -0.5 if scaled else 1.0,
    )


def _t5_attention(cfg: dict) -> tuple[AttentionSpec, AttentionSpec, AttentionSpec]:
    c, h, d = int(cfg["d_model"]), int(cfg["num_heads"]), int(cfg["d_kv"])
    rel = dict(
        rel_buckets=int(cfg.get("relative_attention_num_buckets", 32)),
        rel_max_distance=int(cfg.get("relative_attention_max_distance", 128)),
    )
    common = dict(d_model=c, heads=h, d_k=d, bias=False, scale=1.0)
    return (
        AttentionSpec(**common, **rel),
        AttentionSpec(**common, **rel, causal=True),
        AttentionSpec(**common, d_context=c),
    )


def _t5_layers(cfg: dict) -> tuple[int, int]:
    n = int(cfg["num_layers"])
    return n, int(cfg.get("num_decoder_layers") or n)


def _t5_names(cfg: dict, model) -> dict[str, str]:  # noqa: ANN001 - a zoo.seq2seq.Seq2SeqLM
    out = {"tokens.weight": "shared.weight"}
    mlp = (("gate", "wi_0"), ("up", "wi_1"), ("down", "wo")) if _t5_gated(cfg) else (("up", "wi"), ("down", "wo"))
    attn = (("q_proj", "q"), ("k_proj", "k"), ("v_proj", "v"), ("out_proj", "o"))
    for stack, layers in (("encoder", model.encoder), ("decoder", model.decoder)):
        for i in range(len(layers)):
            at, zoo_at = f"{stack}.block.{i}.layer.", f"{stack}.{i}."
            subs = [("attn", "0.SelfAttention"), ("cross", "1.EncDecAttention")] if stack == "decoder" else []
            subs = subs or [("attn", "0.SelfAttention")]
            for part, where in subs:
                for ours, theirs in attn:
                    out[f"{zoo_at}{part}.{ours}.weight"] = f"{at}{where}.{theirs}.weight"
                out[f"{zoo_at}{part}_norm.weight"] = f"{at}{where.split('.')[0]}.layer_norm.weight"
            # every layer's self-attention reads the stack's first layer's table (T5 shares it)
            out[f"{zoo_at}attn.mods.rel_buckets.table"] = (
                f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
            )
            ff = len(subs)
            for ours, theirs in mlp:
                out[f"{zoo_at}mlp.{ours}.weight"] = f"{at}{ff}.DenseReluDense.{theirs}.weight"
            out[f"{zoo_at}mlp_norm.weight"] = f"{at}{ff}.layer_norm.weight"
    out["enc_norm.weight"] = "encoder.final_layer_norm.weight"
    out["dec_norm.weight"] = "decoder.final_layer_norm.weight"
    if not model.spec.tied:
        out["head.weight"] = "lm_head.weight"
    return out


# -- BART, mBART -------------------------------------------------------------------------------------


def _ffn(cfg: dict) -> int:
    enc, dec = int(cfg.get("encoder_ffn_dim", 4096)), int(cfg.get("decoder_ffn_dim", 4096))
    if enc != dec:
        raise SpecError(f"encoder_ffn_dim={enc} and decoder_ffn_dim={dec} differ; the zoo's model has one d_ff")
    return enc


def _bart_fields(cfg: dict, *, pre_norm: bool) -> dict:
    return dict(
        d_ff=_ffn(cfg),
        norm="layer",
        norm_eps=1e-5,
        norm_bias=True,
        mlp="plain",
        act=act(str(cfg.get("activation_function", "gelu"))),
        mlp_bias=True,
        pre_norm=pre_norm,
        max_positions=int(cfg.get("max_position_embeddings", 1024)),
        position_offset=2,
        embed_scale=math.sqrt(int(cfg["d_model"])) if cfg.get("scale_embedding", False) else 1.0,
        embed_norm=True,
        final_norm=pre_norm,
        logits_bias=True,
    )


def _bart_attention(cfg: dict) -> tuple[AttentionSpec, AttentionSpec, AttentionSpec]:
    c = int(cfg["d_model"])
    enc, dec = int(cfg.get("encoder_attention_heads", 16)), int(cfg.get("decoder_attention_heads", 16))
    return (
        AttentionSpec(d_model=c, heads=enc, bias=True),
        AttentionSpec(d_model=c, heads=dec, bias=True, causal=True),
        AttentionSpec(d_model=c, heads=dec, bias=True, d_context=c),
    )


def _bart_layers(cfg: dict) -> tuple[int, int]:
    return int(cfg.get("encoder_layers", 12)), int(cfg.get("decoder_layers", 12))


def _bart_names(cfg: dict, model) -> dict[str, str]:  # noqa: ANN001 - a zoo.seq2seq.Seq2SeqLM
    out = {"tokens.weight": "model.shared.weight", "logits_bias": "final_logits_bias"}
    if model.dec_tokens is not None:  # Marian with a table per stack
        out["tokens.weight"] = "model.encoder.embed_tokens.weight"
        out["dec_tokens.weight"] = "model.decoder.embed_tokens.weight"

    def add(ours: str, theirs: str, bias: bool = True) -> None:
        out[f"{ours}.weight"] = f"{theirs}.weight"
        if bias:
            out[f"{ours}.bias"] = f"{theirs}.bias"

    for stack, short in (("encoder", "enc"), ("decoder", "dec")):
        base = f"model.{stack}."
        if not model.spec.sinusoidal:
            add(f"{short}_positions", base + "embed_positions", bias=False)
        if model.spec.embed_norm:
            add(f"{short}_embed_norm", base + "layernorm_embedding")
        if model.spec.final_norm:
            add(f"{short}_norm", base + "layer_norm")
        for i in range(len(getattr(model, stack))):
            at, zoo_at = f"{base}layers.{i}.", f"{stack}.{i}."
            subs = [("attn", "self_attn")] + ([("cross", "encoder_attn")] if stack == "decoder" else [])
            for part, where in subs:
                for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
                    add(f"{zoo_at}{part}.{proj}", f"{at}{where}.{proj}")
                add(f"{zoo_at}{part}_norm", f"{at}{where}_layer_norm")
            add(f"{zoo_at}mlp.up", f"{at}fc1")
            add(f"{zoo_at}mlp.down", f"{at}fc2")
            add(f"{zoo_at}mlp_norm", f"{at}final_layer_norm")
    if not model.spec.tied:
        out["head.weight"] = "lm_head.weight"
    return out


def _bart_row(covers: str, *, pre_norm: bool) -> Seq2SeqRow:
    return Seq2SeqRow(
        covers,
        lambda cfg: _bart_fields(cfg, pre_norm=pre_norm),
        _bart_attention,
        _bart_layers,
        _bart_names,
        ignored=("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight", "lm_head.weight"),
    )


# -- Marian ------------------------------------------------------------------------------------------


def _marian_shared(cfg: dict) -> bool:
    return cfg.get("share_encoder_decoder_embeddings", True) is not False


def _marian_fields(cfg: dict) -> dict:
    out = _bart_fields(cfg, pre_norm=False)
    out.update(position_offset=0, sinusoidal=True, embed_norm=False)
    if not _marian_shared(cfg):
        out.update(shared_tokens=False, decoder_vocab=int(cfg.get("decoder_vocab_size") or cfg["vocab_size"]))
    return out


_MARIAN_ROW = Seq2SeqRow(
    "as BART, but fixed sinusoidal positions (sin, then cos, halves), no LayerNorm on the embeddings; one token table "
    "or one per stack (share_encoder_decoder_embeddings=False, decoder_vocab_size), the head tied to the decoder's",
    _marian_fields,
    _bart_attention,
    _bart_layers,
    _bart_names,
    # copies of tied tables, and the fixed position tables older files saved (the zoo makes them)
    ignored=(
        "model.encoder.embed_tokens.weight",
        "model.decoder.embed_tokens.weight",
        "lm_head.weight",
        "model.encoder.embed_positions.weight",
        "model.decoder.embed_positions.weight",
    ),
)

_T5_ROW = Seq2SeqRow(
    "RMSNorm, pre-norm, relative buckets (bidirectional encoder, causal decoder), no scaling, no bias; ReLU or "
    "gated GELU MLP; decoder output * d_model**-0.5 before the tied head (v1.0)",
    _t5_fields,
    _t5_attention,
    _t5_layers,
    _t5_names,
    ignored=("encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "lm_head.weight"),
)

SEQ2SEQ_FAMILIES: dict[str, Seq2SeqRow] = {
    "t5": _T5_ROW,
    "mt5": _T5_ROW,
    "bart": _bart_row(
        "LayerNorm, post-norm, learned positions (offset 2), LayerNorm on the embeddings, biases, GELU MLP, "
        "final_logits_bias, tied head",
        pre_norm=False,
    ),
    "mbart": _bart_row("as BART, pre-norm, a final LayerNorm after each stack", pre_norm=True),
    "marian": _MARIAN_ROW,
}

__all__ = ["SEQ2SEQ_FAMILIES", "Seq2SeqRow"]
