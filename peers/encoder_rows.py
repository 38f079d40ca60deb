"""The whole-encoder rows: per config `model_type`, what an encoder holds and where its tensors sit, beside
the decoder rows (peers/lm_rows.py) and the attention rows (peers/classes.py, which hold the same attention
modules live: BertAttention, RobertaAttention, DistilBertSelfAttention, ModernBertAttention).

A row is data: tensor names relative to the model's base (`bert.`, `roberta.`, `model.`, or none: found in
the checkpoint by the token embedding), `fields(cfg)` (the zoo.encoder.EncoderSpec values the config
implies), `attention(cfg, layer)` (the layer's AttentionSpec fields), and `refuse(cfg)`: a configuration
the zoo does not model, in one line. peers/encoder.py reads every row the same way; a new family is a row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .lm_rows import act
from .model_types import ConfigView


@dataclass(frozen=True)
class EncoderRow:
    fields: Callable[[ConfigView], dict]  # config -> EncoderSpec fields (all but vocab, d_model, attention)
    attention: Callable[[ConfigView, int], dict]  # config, layer -> AttentionSpec fields (all but d_model)
    covers: str  # in words, for `attnzoo families`
    tokens: str
    positions: str | None
    token_types: str | None
    embed_norm: str
    layer: str  # "...{layer}"
    attn: tuple[str, ...]  # (q, k, v, out) or (qkv, out): [Q | K | V] along the rows
    norms: tuple[str | None, str]  # (attn_norm, mlp_norm), relative to the layer
    mlp: tuple[str, str]  # (up, down); a gated row's up holds [act input | gate] (ModernBERT's Wi)
    final_norm: str | None = None
    unread: tuple[str, ...] = ()  # base-relative prefixes of parts the encoder does not compute (BERT's pooler)
    refuse: Callable[[ConfigView], str | None] = lambda cfg: None


def _bert_refuse(cfg: ConfigView) -> str | None:
    kind = cfg.get("position_embedding_type", "absolute")
    if kind not in (None, "absolute"):
        return f"position_embedding_type={kind!r} (relative positions) is not modelled"
    if cfg.get("is_decoder", False) or cfg.get("add_cross_attention", False):
        return "is_decoder / add_cross_attention (a causal or cross-attending BERT) is not an encoder"
    return None


def _bert(cfg: ConfigView, *, positions: str) -> dict:
    return dict(
        d_ff=int(cfg.intermediate_size),
        norm_eps=float(cfg.get("layer_norm_eps", 1e-12)),
        act=act(cfg.get("hidden_act", "gelu")),
        positions=positions,
        max_positions=int(cfg.max_position_embeddings),
        pad_id=int(cfg.get("pad_token_id", 1) or 0) if positions == "from_pad" else 0,
        type_vocab=int(cfg.get("type_vocab_size", 2)),
    )


def _bert_attention(cfg: ConfigView, i: int) -> dict:
    return dict(heads=int(cfg.num_attention_heads), bias=True, causal=False)


def _bert_row(fields: Callable[[ConfigView], dict], covers: str) -> EncoderRow:
    return EncoderRow(
        fields,
        _bert_attention,
        covers,
        tokens="embeddings.word_embeddings",
        positions="embeddings.position_embeddings",
        token_types="embeddings.token_type_embeddings",
        embed_norm="embeddings.LayerNorm",
        layer="encoder.layer.{layer}",
        attn=("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"),
        norms=("attention.output.LayerNorm", "output.LayerNorm"),
        mlp=("intermediate.dense", "output.dense"),
        unread=("pooler.",),
        refuse=_bert_refuse,
    )


def _roberta_row(covers: str) -> EncoderRow:
    return _bert_row(lambda cfg: _bert(cfg, positions="from_pad"), covers)


def _modernbert_kind(cfg: ConfigView, i: int) -> str:
    types = cfg.get("layer_types")
    if types:
        return types[i]
    return "full_attention" if i % int(cfg.get("global_attn_every_n_layers", 3)) == 0 else "sliding_attention"


def _modernbert_attention(cfg: ConfigView, i: int) -> dict:
    kind = _modernbert_kind(cfg, i)
    rope = (cfg.get("rope_parameters") or {}).get(kind) or {}
    default = cfg.get("global_rope_theta", 160000.0) if kind == "full_attention" else cfg.get("local_rope_theta", 1e4)
    # a local layer sees |i - j| <= local_attention // 2: the zoo's symmetric window is |i - j| < window
    window = int(cfg.get("local_attention", 128)) // 2 + 1 if kind == "sliding_attention" else None
    return dict(
        heads=int(cfg.num_attention_heads),
        bias=bool(cfg.get("attention_bias", False)),
        causal=False,
        rope_theta=float(rope.get("rope_theta", default)),
        window=window,
    )


def _modernbert_refuse(cfg: ConfigView) -> str | None:
    for kind, rope in (cfg.get("rope_parameters") or {}).items():
        if isinstance(rope, dict) and rope.get("rope_type", "default") != "default":
            return f"rope_parameters[{kind!r}].rope_type={rope['rope_type']!r} (scaled rotary) is not modelled"
    return None


def _modernbert(cfg: ConfigView) -> dict:
    bias = bool(cfg.get("norm_bias", False))
    return dict(
        d_ff=int(cfg.intermediate_size),
        norm_eps=float(cfg.get("norm_eps", 1e-5)),
        norm_bias=bias,
        mlp="gated",
        act=act(cfg.get("hidden_activation", "gelu")),
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        arrangement="pre",
        positions="none",
        final_norm=True,
    )


ENCODER_FAMILIES: dict[str, EncoderRow] = {
    "bert": _bert_row(
        lambda cfg: _bert(cfg, positions="absolute"),
        "learned positions and token types, LayerNorm after attention and MLP (GELU) (post-norm)",
    ),
    "roberta": _roberta_row("as BERT, positions counted from the pad token (pad_token_id + 1)"),
    "xlm-roberta": _roberta_row("as RoBERTa"),
    "distilbert": EncoderRow(
        lambda cfg: dict(
            d_ff=int(cfg.hidden_dim),
            norm_eps=1e-12,
            act=act(cfg.get("activation", "gelu")),
            max_positions=int(cfg.max_position_embeddings),
        ),
        lambda cfg, i: dict(heads=int(cfg.n_heads), bias=True, causal=False),
        "learned positions (no token types), LayerNorm after attention and MLP (GELU) (post-norm)",
        tokens="embeddings.word_embeddings",
        positions="embeddings.position_embeddings",
        token_types=None,
        embed_norm="embeddings.LayerNorm",
        layer="transformer.layer.{layer}",
        attn=("attention.q_lin", "attention.k_lin", "attention.v_lin", "attention.out_lin"),
        norms=("sa_layer_norm", "output_layer_norm"),
        mlp=("ffn.lin1", "ffn.lin2"),
    ),
    "modernbert": EncoderRow(
        _modernbert,
        _modernbert_attention,
        "rotary, global and local (symmetric window) layers, pre-norm LayerNorm without bias, gated MLP (GELU), "
        "final norm",
        tokens="embeddings.tok_embeddings",
        positions=None,
        token_types=None,
        embed_norm="embeddings.norm",
        layer="layers.{layer}",
        attn=("attn.Wqkv", "attn.Wo"),
        norms=("attn_norm", "mlp_norm"),
        mlp=("mlp.Wi", "mlp.Wo"),
        final_norm="final_norm",
        refuse=_modernbert_refuse,
    ),
}

# config keys for the layer count and width, where a family names them otherwise (DistilBERT)
SIZE_KEYS = {"distilbert": ("n_layers", "dim")}

__all__ = ["ENCODER_FAMILIES", "SIZE_KEYS", "EncoderRow"]
