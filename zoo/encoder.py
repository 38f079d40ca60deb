"""A whole encoder of zoo blocks (`EncoderSpec`, `Encoder`) and a sentence encoder on top of it (`Pooling`,
`SentenceEncoder`): BERT, RoBERTa / XLM-RoBERTa, DistilBERT, ModernBERT.

    h = embed(input_ids, positions, token_type_ids)      tokens + learned positions (+ token types) -> norm
    for each layer:  h = layer(h, key_mask)              bidirectional attention (a zoo block) and an MLP
    h = final_norm(h)                                    (ModernBERT)            -> last hidden state (b t c)
    e = pool(h, attention_mask) (-> h / ||h||)           a sentence embedding (b c), as sentence-transformers

A layer's arrangement (`ARRANGEMENTS`):

  post   h = n1(h + attn(h));  h = n2(h + mlp(h))       (BERT, RoBERTa, DistilBERT)
  pre    h = h + attn(n1(h));  h = h + mlp(n2(h))       (ModernBERT; its first layer has no n1)

Positions (`positions`): "absolute" counts 0..t-1 whatever the padding (BERT, DistilBERT, ModernBERT's
rotary); "from_pad" counts a row's non-pad tokens from pad_id + 1 and gives pad tokens pad_id (RoBERTa's
create_position_ids_from_input_ids). A padded key is never read (attention_mask); padded positions still
get a hidden state, as transformers computes it. No part branches on a tensor value: the forward traces.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from .attention import MultiHeadAttention
from .attention_spec import AttentionSpec
from .errors import InputError, InputTypeError, SpecError
from .lm_parts import ACTIVATIONS, MLP, MLPS, Norm

ARRANGEMENTS = ("post", "pre")
POSITIONS = ("absolute", "from_pad", "none")
# sentence-transformers' pooling modes that are modelled, by its names (1_Pooling/config.json)
POOLING_MODES = ("cls", "mean", "max", "mean_sqrt_len_tokens")


@dataclass(frozen=True)
class EncoderSpec:
    """An encoder as data; checked when made."""

    vocab: int
    d_model: int
    attention: tuple[AttentionSpec, ...]  # one per layer, bidirectional (ModernBERT: windows and rope bases differ)
    d_ff: int
    norm_eps: float = 1e-12
    norm_bias: bool = True  # ModernBERT's LayerNorms have none (norm_bias=false)
    mlp: str = "plain"  # zoo.lm_parts.MLPS: BERT's intermediate/output; ModernBERT's Wi is gated
    act: str = "gelu"  # zoo.lm_parts.ACTIVATIONS
    mlp_bias: bool = True
    arrangement: str = "post"  # ARRANGEMENTS
    positions: str = "absolute"  # POSITIONS
    max_positions: int = 0  # rows of the learned position table; 0: none (rotary in the attention)
    pad_id: int = 0  # positions="from_pad": the pad token, whose position is pad_id
    type_vocab: int = 0  # token type embeddings (BERT's segment ids); 0: none
    final_norm: bool = False  # ModernBERT's final_norm

    def __post_init__(self) -> None:
        for name in ("vocab", "d_model", "d_ff"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise SpecError(f"{name}={v!r} must be a positive integer")
        for name in ("max_positions", "pad_id", "type_vocab"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise SpecError(f"{name}={v!r} must be an integer >= 0")
        if not isinstance(self.attention, tuple) or not self.attention:
            raise SpecError(
                f"attention must be a non-empty tuple of AttentionSpec (one per layer), got {self.attention!r}"
            )
        for i, a in enumerate(self.attention):
            if not isinstance(a, AttentionSpec) or a.d_model != self.d_model or a.causal or a.is_cross:
                what = a.describe() if isinstance(a, AttentionSpec) else type(a).__name__
                raise SpecError(
                    f"attention[{i}] ({what}) must be bidirectional self-attention of d_model={self.d_model}"
                )
        choices = (("mlp", MLPS), ("act", tuple(ACTIVATIONS)), ("arrangement", ARRANGEMENTS), ("positions", POSITIONS))
        for name, allowed in choices:
            if getattr(self, name) not in allowed:
                raise SpecError(f"{name}={getattr(self, name)!r} is not one of {', '.join(map(repr, allowed))}")
        if (self.positions == "none") != (self.max_positions == 0):
            raise SpecError(
                f"positions={self.positions!r} with max_positions={self.max_positions}: a learned position table "
                f"needs positions 'absolute' or 'from_pad' and max_positions > 0; rotary encoders give 'none' and 0"
            )
        if not isinstance(self.norm_eps, (int, float)) or isinstance(self.norm_eps, bool) or not self.norm_eps > 0:
            raise SpecError(f"norm_eps={self.norm_eps!r} must be a positive number")

    @property
    def layers(self) -> int:
        return len(self.attention)

    def describe(self) -> str:
        parts = [f"vocab={self.vocab}", f"d_model={self.d_model}", f"layers={self.layers}", f"d_ff={self.d_ff}"]
        return " ".join([*parts, f"{self.mlp}/{self.act}", self.arrangement, f"positions={self.positions}"])


class EncoderLayer(nn.Module):
    """One layer: `attn` (a zoo block), `mlp`, and its two norms (`attn_norm` None: ModernBERT's first layer)."""

    def __init__(self, spec: EncoderSpec, attn: AttentionSpec, *, attn_norm: bool = True) -> None:
        super().__init__()
        self.pre = spec.arrangement == "pre"
        self.attn = MultiHeadAttention(attn)
        self.mlp = MLP(spec.mlp, spec.d_model, spec.d_ff, spec.act, spec.mlp_bias)
        self.attn_norm = Norm("layer", spec.d_model, spec.norm_eps, spec.norm_bias) if attn_norm else None
        self.mlp_norm = Norm("layer", spec.d_model, spec.norm_eps, spec.norm_bias)

    def forward(self, h: Tensor, mask: Tensor, positions: Tensor) -> Tensor:
        """h (b t c), mask (b 1 t s) bool (True: a real key), positions (t) -> h (b t c)."""
        if self.pre:
            x = self.attn_norm(h) if self.attn_norm is not None else h
            h = h + self.attn(x, mask=mask, positions=positions)
            return h + self.mlp(self.mlp_norm(h))
        h = self.attn_norm(h + self.attn(h, mask=mask, positions=positions))
        return self.mlp_norm(h + self.mlp(h))


class Encoder(nn.Module):
    """An encoder of zoo blocks for one `EncoderSpec`: encoder(input_ids, attention_mask, token_type_ids) -> (b t c)."""

    def __init__(self, spec: EncoderSpec) -> None:
        super().__init__()
        if not isinstance(spec, EncoderSpec):
            raise InputTypeError(f"spec must be an EncoderSpec, got {type(spec).__name__}")
        self.spec = s = spec
        self.tokens = nn.Embedding(s.vocab, s.d_model)
        self.positions = nn.Embedding(s.max_positions, s.d_model) if s.max_positions else None
        self.token_types = nn.Embedding(s.type_vocab, s.d_model) if s.type_vocab else None
        self.embed_norm = Norm("layer", s.d_model, s.norm_eps, s.norm_bias)
        first_norm = s.arrangement == "post"  # ModernBERT's first layer reads the embeddings' norm directly
        self.layers = nn.ModuleList(
            EncoderLayer(s, a, attn_norm=first_norm or i > 0) for i, a in enumerate(s.attention)
        )
        self.final_norm = Norm("layer", s.d_model, s.norm_eps, s.norm_bias) if s.final_norm else None

    def extra_repr(self) -> str:
        return self.spec.describe()

    @property
    def dtype(self) -> torch.dtype:
        return self.tokens.weight.dtype

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None
    ) -> Tensor:
        """input_ids (b t) int64, attention_mask (b t) (1 = a real token, 0 = padding), token_type_ids (b t)
        (default zeros) -> the last hidden state (b t c)."""
        keep = self._mask(input_ids, attention_mask)
        s = self.spec
        t = input_ids.shape[1]
        at = torch.arange(t, device=input_ids.device)
        h = self.tokens(input_ids)
        if self.positions is not None:
            if s.positions == "from_pad":  # RoBERTa: non-pad tokens count from pad_id + 1, pad tokens sit at pad_id
                real = (input_ids != s.pad_id).long()
                pos = real.cumsum(-1) * real + s.pad_id
            else:
                pos = at[None]
            h = h + self.positions(pos.clamp(max=s.max_positions - 1))
        if self.token_types is not None:
            types = torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids
            h = h + self.token_types(types)
        h = self.embed_norm(h)
        # (b 1 t s), not (b 1 1 s): ONNX Runtime's CPU Attention op wants the mask's query axis to be t
        mask = rearrange(keep, "b s -> b 1 1 s").expand(-1, 1, t, -1)
        for layer in self.layers:
            h = layer(h, mask, at)
        return self.final_norm(h) if self.final_norm is not None else h

    def _mask(self, input_ids: Tensor, attention_mask: Tensor | None) -> Tensor:
        """Eager checks; the mask as (b t) bool. While tracing only the dtype is made bool."""
        if not isinstance(input_ids, Tensor) or input_ids.dtype != torch.long or input_ids.dim() != 2:
            got = f"{input_ids.dtype} {tuple(input_ids.shape)}" if isinstance(input_ids, Tensor) else type(input_ids)
            raise InputTypeError(f"input_ids must be an int64 tensor (b t), got {got}")
        if attention_mask is None:
            return torch.ones_like(input_ids, dtype=torch.bool)
        if not isinstance(attention_mask, Tensor) or attention_mask.shape != input_ids.shape:
            got = tuple(attention_mask.shape) if isinstance(attention_mask, Tensor) else type(attention_mask).__name__
            raise InputError(f"attention_mask must have input_ids' shape {tuple(input_ids.shape)}, got {got}")
        if torch.compiler.is_compiling() or torch.jit.is_tracing():
            return attention_mask.bool()
        if input_ids.numel() == 0:
            raise InputError(f"input_ids {tuple(input_ids.shape)} is empty; give at least one token per row")
        lo, hi = int(input_ids.min()), int(input_ids.max())
        if lo < 0 or hi >= self.spec.vocab:
            raise InputError(f"input_ids hold {lo if lo < 0 else hi}, outside the vocabulary 0..{self.spec.vocab - 1}")
        return attention_mask.bool()


@dataclass(frozen=True)
class Pooling:
    """sentence-transformers' Pooling (+ Normalize) as data: the modes' vectors concatenated, in order."""

    modes: tuple[str, ...] = ("mean",)
    normalize: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.modes, tuple) or not self.modes:
            raise SpecError(f"modes={self.modes!r} must be a non-empty tuple of {', '.join(POOLING_MODES)}")
        for m in self.modes:
            if m not in POOLING_MODES:
                raise SpecError(f"pooling mode {m!r} is not modelled; the zoo pools with {', '.join(POOLING_MODES)}")
        if not isinstance(self.normalize, bool):
            raise SpecError(f"normalize={self.normalize!r} must be True or False")

    def __call__(self, h: Tensor, attention_mask: Tensor) -> Tensor:
        """h (b t c), attention_mask (b t) -> (b, c * len(modes)), as sentence-transformers' Pooling pools."""
        keep = attention_mask.to(h.dtype)[..., None]  # (b t 1)
        out = []
        for mode in self.modes:
            if mode == "cls":  # the first real token (sentence-transformers: argmax of the mask)
                first = attention_mask.to(torch.int32).argmax(dim=1)
                out.append(torch.gather(h, 1, first[:, None, None].expand(-1, 1, h.shape[-1]))[:, 0])
            elif mode == "max":
                out.append(h.masked_fill(keep == 0, float("-inf")).max(dim=1).values)
            else:
                total = (h * keep).sum(dim=1)
                count = keep.sum(dim=1).clamp(min=1e-9)
                out.append(total / (count if mode == "mean" else count.sqrt()))
        e = torch.cat(out, dim=-1)
        return F.normalize(e, p=2.0, dim=1) if self.normalize else e


class SentenceEncoder(nn.Module):
    """encoder + pooling: model(input_ids, attention_mask, token_type_ids) -> sentence embeddings (b e).

    `max_seq_length` (tokens, special ones included: longer texts are truncated), `prompts` (name -> text
    put before a text) and `default_prompt_name` are what sentence-transformers reads beside the model."""

    def __init__(
        self,
        encoder: Encoder,
        pooling: Pooling,
        *,
        max_seq_length: int | None = None,
        prompts: dict[str, str] | None = None,
        default_prompt_name: str | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(encoder, Encoder) or not isinstance(pooling, Pooling):
            raise InputTypeError(
                f"SentenceEncoder takes an Encoder and a Pooling, got {type(encoder).__name__}, "
                f"{type(pooling).__name__}"
            )
        self.encoder, self.pooling = encoder, pooling
        self.max_seq_length = max_seq_length
        self.prompts = dict(prompts or {})
        if default_prompt_name is not None and default_prompt_name not in self.prompts:
            raise SpecError(
                f"default_prompt_name={default_prompt_name!r} is not one of the prompts {sorted(self.prompts)}"
            )
        self.default_prompt_name = default_prompt_name

    @property
    def spec(self) -> EncoderSpec:
        return self.encoder.spec

    @property
    def dim(self) -> int:
        return self.spec.d_model * len(self.pooling.modes)

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None
    ) -> Tensor:
        h = self.encoder(input_ids, attention_mask, token_type_ids)
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        return self.pooling(h, mask)

    def prompt(self, prompt_name: str | None) -> str:
        """The text put before each text for `prompt_name` (None: the default prompt, or none)."""
        name = self.default_prompt_name if prompt_name is None else prompt_name
        if name is None:
            return ""
        if name not in self.prompts:
            known = ", ".join(sorted(self.prompts)) or "none"
            raise InputError(f"prompt_name={name!r} is not one of the model's prompts ({known})")
        return self.prompts[name]


__all__ = ["ARRANGEMENTS", "POOLING_MODES", "Encoder", "EncoderLayer", "EncoderSpec", "Pooling", "SentenceEncoder"]
