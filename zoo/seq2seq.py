"""A whole encoder-decoder model of zoo blocks: `Seq2SeqSpec` (the model as data) and `Seq2SeqLM` (the module).

    e = encode(input_ids, attention_mask)              (b s) -> (b s c): embed, encoder layers, final norm
    cross = cross_cache(e)                             per decoder layer: K (b g s dk), V (b g s dv), made once
    logits, keys, values = step(ids, keys, values, past_len, cross, encoder_mask, in_place=...)

A layer is pre-norm (T5, mBART: h += f(norm(h))) or post-norm (BART, Marian: h = norm(h + f(h))); an
encoder layer holds self-attention and the MLP, a decoder layer causal self-attention, cross-attention on
the encoder output and the MLP. Every attention is a zoo.MultiHeadAttention: T5's relative buckets are its
`rel_buckets` modifier (bidirectional in the encoder, causal in the decoder), T5 does not scale scores
(scale 1.0). The decoder's self-attention keeps a static cache exactly as zoo.lm.DecoderLM's layers do
(zoo.attention.static_step); cross-attention reads keys and values computed once from the encoder output
(`cross_cache`), so a step projects only its queries.

    logits = model(input_ids, decoder_input_ids, attention_mask=None)    (b t vocab), = transformers' logits

The head: T5 multiplies the decoder output by d_model**-0.5 before its tied head (`head_scale`); BART adds
final_logits_bias. Positions: none (T5's buckets), a learned table (BART) or Marian's fixed sinusoidal table
(`sinusoidal`: sin in the first half of the channels, cos in the second). The decoder may have a token table
and vocabulary of its own (Marian's share_encoder_decoder_embeddings=False: `shared_tokens`, `decoder_vocab`).
Padding of the encoder input is on the right (the seq2seq norm); attention_mask (b s) hides the padded keys
from the encoder's self-attention and from every cross-attention.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from einops import rearrange
from torch import Tensor, nn

from .attend import MERGE_HEADS, SPLIT_HEADS
from .attention import MultiHeadAttention, static_step
from .attention_spec import AttentionSpec
from .errors import InputError, InputTypeError, SpecError
from .lm_parts import ACTIVATIONS, MLP, MLPS, NORMS, Norm


@dataclass(frozen=True)
class Seq2SeqSpec:
    """An encoder-decoder model as data; every field is checked when made."""

    vocab: int
    d_model: int
    encoder: tuple[AttentionSpec, ...]  # each encoder layer's self-attention (not causal)
    decoder: tuple[AttentionSpec, ...]  # each decoder layer's self-attention (causal)
    cross: tuple[AttentionSpec, ...]  # each decoder layer's cross-attention (d_context = d_model)
    d_ff: int
    norm: str = "layer"  # NORMS: T5's is "rms", BART's "layer"
    norm_eps: float = 1e-5
    norm_bias: bool = True
    mlp: str = "plain"  # MLPS: T5 v1.1 / Flan is "gated"
    act: str = "gelu"
    mlp_bias: bool = True
    pre_norm: bool = False  # T5, mBART: h += f(norm(h)); BART, Marian: h = norm(h + f(h))
    max_positions: int | None = None  # absolute positions (BART learned, Marian sinusoidal); None: none (T5)
    sinusoidal: bool = False  # Marian: the max_positions rows are a fixed sin|cos table, not learned
    position_offset: int = 0  # BART's tables start 2 rows in
    embed_scale: float = 1.0  # sqrt(d_model) with scale_embedding
    embed_norm: bool = False  # BART's layernorm_embedding, in the encoder and the decoder
    final_norm: bool = False  # a norm after the last layer of each stack (T5, mBART)
    head_scale: float = 1.0  # T5: d_model ** -0.5 on the decoder output before the tied head
    logits_bias: bool = False  # BART's final_logits_bias
    tied: bool = True  # the head reads the decoder's token embedding
    shared_tokens: bool = True  # one token table for the encoder and the decoder (Marian may keep two)
    decoder_vocab: int | None = None  # the decoder's vocabulary when it has a table of its own; None: vocab

    def __post_init__(self) -> None:
        for name in ("vocab", "d_model", "d_ff"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise SpecError(f"{name}={v!r} must be a positive integer")
        stacks = (("encoder", False, False), ("decoder", True, False), ("cross", False, True))
        for name, causal, cross in stacks:
            specs = getattr(self, name)
            if not isinstance(specs, tuple) or not specs or not all(isinstance(a, AttentionSpec) for a in specs):
                raise SpecError(f"{name} must be a non-empty tuple of AttentionSpec (one per layer), got {specs!r}")
            for i, a in enumerate(specs):
                ok = a.d_model == self.d_model and a.causal == causal and a.is_cross == cross
                if not ok or (cross and a.d_context != self.d_model):
                    kind = "cross-attention on d_model" if cross else "causal self" if causal else "self-attention"
                    raise SpecError(f"{name}[{i}] ({a.describe()}) must be {kind} of d_model={self.d_model}")
        if len(self.cross) != len(self.decoder):
            raise SpecError(f"cross has {len(self.cross)} layers, decoder {len(self.decoder)}: one of each per layer")
        choices = (("norm", NORMS), ("mlp", MLPS), ("act", tuple(ACTIVATIONS)))
        for name, allowed in choices:
            if getattr(self, name) not in allowed:
                raise SpecError(f"{name}={getattr(self, name)!r} is not one of {', '.join(map(repr, allowed))}")
        for name in ("norm_eps", "embed_scale", "head_scale"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise SpecError(f"{name}={v!r} must be a positive finite number")
        if self.max_positions is not None and (isinstance(self.max_positions, bool) or self.max_positions < 1):
            raise SpecError(f"max_positions={self.max_positions!r} must be a positive integer or None")
        if self.sinusoidal and self.max_positions is None:
            raise SpecError("sinusoidal=True needs max_positions (the rows of the fixed table)")
        dv = self.decoder_vocab
        if dv is not None and (isinstance(dv, bool) or not isinstance(dv, int) or dv < 1):
            raise SpecError(f"decoder_vocab={dv!r} must be a positive integer or None")
        if self.shared_tokens and self.decoder_vocab_ != self.vocab:
            raise SpecError(
                f"decoder_vocab={dv} differs from vocab={self.vocab}: one shared token table cannot hold both; "
                "set shared_tokens=False"
            )

    @property
    def decoder_vocab_(self) -> int:
        """The decoder's vocabulary (the logits' width): decoder_vocab, or vocab where it is None."""
        return self.vocab if self.decoder_vocab is None else self.decoder_vocab

    def describe(self) -> str:
        """One line, e.g. 'vocab=100 d_model=32 encoder=2 decoder=2 d_ff=64 rms gated/gelu_tanh pre-norm tied'."""
        parts = [f"vocab={self.vocab}", f"d_model={self.d_model}", f"encoder={len(self.encoder)}"]
        parts += [f"decoder={len(self.decoder)}", f"d_ff={self.d_ff}", self.norm, f"{self.mlp}/{self.act}"]
        parts += ["pre-norm" if self.pre_norm else "post-norm", "tied" if self.tied else "untied"]
        if self.max_positions:
            parts.append(f"{'sinusoidal' if self.sinusoidal else 'max'}_positions={self.max_positions}")
        if not self.shared_tokens:
            parts.append(f"decoder_vocab={self.decoder_vocab_}")
        return " ".join(parts)


class SinusoidalPositions(nn.Module):
    """Marian's fixed position table (transformers' MarianSinusoidalPositionalEmbedding), `weight` (n c): row p
    holds sin(p * w_k) in its first ceil(c/2) channels and cos(p * w_k) in the rest, w_k = 10000**(-2k/c);
    made in float64, kept in the model's dtype. Called as an nn.Embedding: positions (b t) -> (b t c)."""

    def __init__(self, num_embeddings: int, dim: int) -> None:
        super().__init__()
        self.num_embeddings = num_embeddings
        pos = torch.arange(num_embeddings, dtype=torch.float64)[:, None]
        k = torch.arange(dim, dtype=torch.float64) // 2
        angle = pos / torch.pow(torch.tensor(10000.0, dtype=torch.float64), 2 * k / dim)  # (n c), pairs share w
        table = torch.cat([torch.sin(angle[:, 0::2]), torch.cos(angle[:, 1::2])], dim=1)
        self.register_buffer("weight", table.to(torch.float32), persistent=False)

    def forward(self, positions: Tensor) -> Tensor:
        return nn.functional.embedding(positions, self.weight)


class Seq2SeqLayer(nn.Module):
    """One layer of either stack: `attn` (self), `cross` (decoder only, else None), `mlp`, a norm for each."""

    def __init__(self, spec: Seq2SeqSpec, attn: AttentionSpec, cross: AttentionSpec | None) -> None:
        super().__init__()
        s = spec
        self.attn = MultiHeadAttention(attn)
        self.cross = MultiHeadAttention(cross) if cross is not None else None
        self.mlp = MLP(s.mlp, s.d_model, s.d_ff, s.act, s.mlp_bias)
        self.attn_norm = Norm(s.norm, s.d_model, s.norm_eps, s.norm_bias)
        self.cross_norm = Norm(s.norm, s.d_model, s.norm_eps, s.norm_bias) if cross is not None else None
        self.mlp_norm = Norm(s.norm, s.d_model, s.norm_eps, s.norm_bias)
        self.pre_norm = s.pre_norm

    def _sub(self, h: Tensor, norm: Norm, f) -> Tensor:  # noqa: ANN001 - f(x) -> y, one sublayer
        if self.pre_norm:
            return h + f(norm(h))
        return norm(h + f(h))

    def forward(self, h: Tensor, attend, cross=None) -> Tensor:  # noqa: ANN001 - attend(x), cross(x) -> y
        h = self._sub(h, self.attn_norm, attend)
        if self.cross is not None:
            h = self._sub(h, self.cross_norm, cross)
        return self._sub(h, self.mlp_norm, self.mlp)


def cross_kv(block: MultiHeadAttention, e: Tensor) -> tuple[Tensor, Tensor]:
    """A cross-attention block's keys (b g s dk) and values (b g s dv) of the encoder output e (b s c)."""
    g = block.spec.kv_heads_
    return rearrange(block.k_proj(e), SPLIT_HEADS, h=g), rearrange(block.v_proj(e), SPLIT_HEADS, h=g)


def cross_attend(block: MultiHeadAttention, x: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None) -> Tensor:
    """x (b t c) attending to the precomputed k (b g s dk), v (b g s dv); allowed (b 1 1 s) bool or None."""
    q = rearrange(block.q_proj(x), SPLIT_HEADS, h=block.spec.heads)
    z, _ = block.attend(q, k, v, allowed, None)
    return block.out_proj(rearrange(z, MERGE_HEADS))


class Seq2SeqLM(nn.Module):
    """An encoder-decoder model of zoo blocks for one `Seq2SeqSpec` (see the module docstring)."""

    def __init__(self, spec: Seq2SeqSpec) -> None:
        super().__init__()
        if not isinstance(spec, Seq2SeqSpec):
            raise InputTypeError(f"spec must be a Seq2SeqSpec, got {type(spec).__name__}")
        self.spec = s = spec
        self.tokens = nn.Embedding(s.vocab, s.d_model)  # the encoder's, and the decoder's when shared
        self.dec_tokens = None if s.shared_tokens else nn.Embedding(s.decoder_vocab_, s.d_model)

        def table() -> nn.Module | None:
            if not s.max_positions:
                return None
            if s.sinusoidal:
                return SinusoidalPositions(s.max_positions + s.position_offset, s.d_model)
            return nn.Embedding(s.max_positions + s.position_offset, s.d_model)

        def norm(flag: bool) -> Norm | None:
            return Norm(s.norm, s.d_model, s.norm_eps, s.norm_bias) if flag else None

        self.enc_positions, self.dec_positions = table(), table()
        self.enc_embed_norm, self.dec_embed_norm = norm(s.embed_norm), norm(s.embed_norm)
        self.encoder = nn.ModuleList(Seq2SeqLayer(s, a, None) for a in s.encoder)
        self.decoder = nn.ModuleList(Seq2SeqLayer(s, a, c) for a, c in zip(s.decoder, s.cross))
        self.enc_norm, self.dec_norm = norm(s.final_norm), norm(s.final_norm)
        self.head = nn.Linear(s.d_model, s.decoder_vocab_, bias=False)
        if s.tied:
            self.head.weight = self.decoder_tokens.weight
        self.logits_bias = nn.Parameter(torch.zeros(s.decoder_vocab_)) if s.logits_bias else None

    @property
    def decoder_tokens(self) -> nn.Embedding:
        """The decoder's token table: its own (dec_tokens) or the shared one."""
        return self.tokens if self.dec_tokens is None else self.dec_tokens

    def extra_repr(self) -> str:
        return self.spec.describe()

    @property
    def dtype(self) -> torch.dtype:
        return self.tokens.weight.dtype

    def _embed(
        self, tokens: nn.Embedding, ids: Tensor, positions: Tensor, table: nn.Module | None, norm: Norm | None
    ) -> Tensor:
        h = tokens(ids)
        if self.spec.embed_scale != 1.0:
            h = h * self.spec.embed_scale
        if table is not None:
            at = (positions + self.spec.position_offset).clamp(max=table.num_embeddings - 1)
            h = h + table(at)
        return norm(h) if norm is not None else h

    def encode(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """input_ids (b s) int64, attention_mask (b s) (1/True: a real token; padding on the right) ->
        the encoder output (b s c)."""
        _check_ids(input_ids, self.spec.vocab, "input_ids")
        return self.encoder_output(input_ids, encoder_keys(attention_mask, input_ids.shape))

    def encoder_output(self, input_ids: Tensor, allowed: Tensor | None) -> Tensor:
        """encode() without its checks (what the export traces): allowed (b 1 1 s) bool or None."""
        s = input_ids.shape[1]
        pos = torch.arange(s, device=input_ids.device)[None]
        h = self._embed(self.tokens, input_ids, pos, self.enc_positions, self.enc_embed_norm)
        for layer in self.encoder:
            h = layer(h, lambda x, blk=layer.attn: blk(x, mask=allowed))
        return self.enc_norm(h) if self.enc_norm is not None else h

    def cross_cache(self, e: Tensor) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...]]:
        """The encoder output e (b s c) -> each decoder layer's cross keys (b g s dk) and values (b g s dv)."""
        pairs = [cross_kv(layer.cross, e) for layer in self.decoder]
        return tuple(k for k, _ in pairs), tuple(v for _, v in pairs)

    def new_cache(self, batch: int, capacity: int) -> tuple[list[Tensor], list[Tensor]]:
        """Zeroed self-attention buffers of the decoder, (b g n dk) and (b g n dv) per layer."""
        keys, values = [], []
        for a in self.spec.decoder:
            g, dk, dv = a.cache_widths_
            keys.append(torch.zeros(batch, g, capacity, dk, dtype=self.dtype, device=self.tokens.weight.device))
            values.append(torch.zeros(batch, g, capacity, dv, dtype=self.dtype, device=self.tokens.weight.device))
        return keys, values

    def step(
        self,
        input_ids: Tensor,
        keys: list[Tensor] | tuple[Tensor, ...],
        values: list[Tensor] | tuple[Tensor, ...],
        past_len: Tensor,
        cross_keys: tuple[Tensor, ...] | list[Tensor],
        cross_values: tuple[Tensor, ...] | list[Tensor],
        encoder_mask: Tensor | None = None,
        *,
        in_place: bool,
    ) -> tuple[Tensor, tuple[Tensor, ...], tuple[Tensor, ...]]:
        """Decoder tokens input_ids (b t) at positions past_len..past_len+t-1 -> (logits (b t vocab), the
        self-attention buffers written: the same tensors when in_place). encoder_mask (b s) bool, True = a
        real encoder token. Traced as it runs (export/seq2seq_export.py): no branch on a tensor value."""
        n = len(self.decoder)
        if not (len(keys) == len(values) == len(cross_keys) == len(cross_values) == n):
            raise InputError(f"keys, values, cross_keys and cross_values need one tensor per decoder layer ({n})")
        t = input_ids.shape[1]
        pos = (past_len + torch.arange(t, device=input_ids.device))[None]
        h = self._embed(self.decoder_tokens, input_ids, pos, self.dec_positions, self.dec_embed_norm)
        allowed = None if encoder_mask is None else rearrange(encoder_mask.to(torch.bool), "b s -> b 1 1 s")
        out_k, out_v = [], []
        for i, layer in enumerate(self.decoder):
            written = []

            def attend(x: Tensor, blk=layer.attn, i=i, written=written) -> Tensor:
                y, k, v = static_step(blk, x, keys[i], values[i], past_len, None, in_place=in_place)
                written += [k, v]
                return y

            def cross(x: Tensor, blk=layer.cross, i=i) -> Tensor:
                return cross_attend(blk, x, cross_keys[i], cross_values[i], allowed)

            h = layer(h, attend, cross)
            out_k.append(written[0])
            out_v.append(written[1])
        return self.logits(h), tuple(out_k), tuple(out_v)

    def logits(self, h: Tensor) -> Tensor:
        """The decoder's last hidden state h (b t c) -> logits (b t vocab): final norm, T5's scale, head, bias."""
        if self.dec_norm is not None:
            h = self.dec_norm(h)
        if self.spec.head_scale != 1.0:
            h = h * self.spec.head_scale
        x = self.head(h)
        return x + self.logits_bias if self.logits_bias is not None else x

    def forward(self, input_ids: Tensor, decoder_input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """input_ids (b s), decoder_input_ids (b t) int64 -> logits (b t vocab), as transformers' model(...)
        gives them; attention_mask (b s) marks the real encoder tokens."""
        _check_ids(decoder_input_ids, self.spec.decoder_vocab_, "decoder_input_ids")
        if decoder_input_ids.shape[0] != input_ids.shape[0]:
            raise InputError(
                f"decoder_input_ids has {decoder_input_ids.shape[0]} rows, input_ids {input_ids.shape[0]}: one each"
            )
        e = self.encode(input_ids, attention_mask)
        b, t = decoder_input_ids.shape
        keys, values = self.new_cache(b, t)
        mask = None if attention_mask is None else attention_mask.to(torch.bool)
        past = torch.tensor(0, device=input_ids.device)
        logits, _, _ = self.step(decoder_input_ids, keys, values, past, *self.cross_cache(e), mask, in_place=True)
        return logits


def encoder_keys(attention_mask: Tensor | None, shape: torch.Size) -> Tensor | None:
    """attention_mask (b s) -> the keys each encoder query may read, (b 1 1 s) bool; None for no mask."""
    if attention_mask is None:
        return None
    if tuple(attention_mask.shape) != tuple(shape):
        raise InputError(f"attention_mask has shape {tuple(attention_mask.shape)}; input_ids has {tuple(shape)}")
    return rearrange(attention_mask.to(torch.bool), "b s -> b 1 1 s")


def _check_ids(ids: Tensor, vocab: int, name: str) -> None:
    if not isinstance(ids, Tensor) or ids.dim() != 2 or ids.dtype not in (torch.int64, torch.int32):
        what = f"{ids.dtype} {tuple(ids.shape)}" if isinstance(ids, Tensor) else type(ids).__name__
        raise InputTypeError(f"{name} must be a (batch, tokens) int64 tensor, got {what}")
    if ids.numel() == 0:
        raise InputError(f"{name} of shape {tuple(ids.shape)} is empty; give at least one token per row")
    bad = (ids < 0) | (ids >= vocab)
    if bool(bad.any()):
        raise InputError(f"{name}: token id {int(ids[bad][0])} is outside the vocabulary of {vocab} (0..{vocab - 1})")


__all__ = [
    "Seq2SeqLM",
    "Seq2SeqLayer",
    "Seq2SeqSpec",
    "SinusoidalPositions",
    "cross_attend",
    "cross_kv",
    "encoder_keys",
]
