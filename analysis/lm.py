"""A tiny language model built from zoo attention blocks, for looking at trained heads.

    tokens (b t) --embed--> x (b t c)
    per layer l:  x = x + Attn_l(LN(x))        Attn_l: a zoo block; rotary positions on Q and K
                  x = x + MLP_l(LN(x))         (no MLP by default: attention only)
    logits = W_U LN(x)                         (b t vocab)

Positions never enter the residual stream by default (``positions="rotary"``): the zoo
block rotates its queries and keys (``rope_theta``), so a head can attend "one back" while
the residual stream carries tokens only, as the issue measured for shortformer-style
positions. ``positions="relative"`` gives each head a learned scalar per offset t - s instead,
passed as the block's float ``mask``; ``positions="absolute"`` adds learned position
embeddings to the residual stream (the textbook GPT-2 layout). Both are kept for comparison.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

import zoo
from zoo.hooks import HookedModel, layer_blocks

from .errors import AnalysisError
from .gates import shut
from .head_mask import per_layer

POSITIONS = ("rotary", "relative", "absolute")


@dataclass(frozen=True)
class LMConfig:
    """A tiny LM. Every default says why it is what it is."""

    vocab_size: int = 128  # random-token tasks: few accidental repeats in 64 tokens, ln(128) = 4.85
    context: int = 64  # longest sequence: a 31-token block repeated twice fits
    d_model: int = 64  # the measured size: the induction phase change in ~2,000 steps
    layers: int = 2  # induction needs two layers (a previous-token head, then K-composition)
    heads: tuple[int, ...] = (4, 4)  # per layer, so a pruned model is still an LMConfig
    # Per-head width, wider than d_model / heads (the zoo's own d_k): at 16 every layer-1 head
    # matched tokens too coarsely alone and four heads shared the induction job; fixed so that
    # pruning keeps the surviving heads' width.
    d_head: int = 32
    mlp: bool = False  # attention-only, as in the induction-head papers
    positions: str = "rotary"  # "rotary" (Q and K only), "relative" (score bias per offset) or "absolute"
    rope_theta: float = 10000.0  # with positions="rotary": the zoo block's own rope_theta

    def __post_init__(self) -> None:
        for name in ("vocab_size", "context", "d_model", "layers", "d_head"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise AnalysisError(f"{name}={v!r} must be a positive integer")
        if isinstance(self.heads, int):
            object.__setattr__(self, "heads", (self.heads,) * self.layers)
        object.__setattr__(self, "heads", tuple(int(h) for h in self.heads))
        if len(self.heads) != self.layers or any(h <= 0 for h in self.heads):
            raise AnalysisError(f"heads={self.heads} must give a positive head count for each of {self.layers} layers")
        if self.positions not in POSITIONS:
            raise AnalysisError(f"positions={self.positions!r} is not one of {POSITIONS}")

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["heads"] = list(self.heads)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LMConfig:
        return cls(**{**d, "heads": tuple(d["heads"])})


def check_token_ids(tokens, vocab_size: int, context: int) -> Tensor:
    """tokens as (b, t) int64 ids (a 1-D row gets b = 1): integers, b and t >= 1, t within `context`, every
    id within the vocabulary; anything else is one AnalysisError naming it."""
    if not isinstance(tokens, Tensor):
        tokens = torch.as_tensor(tokens)
    if tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
        raise AnalysisError(f"tokens must be integer ids, got dtype {tokens.dtype}")
    if tokens.dim() == 1:
        tokens = tokens[None]
    if tokens.dim() != 2 or tokens.shape[1] == 0 or tokens.shape[0] == 0:
        raise AnalysisError(f"tokens have shape {tuple(tokens.shape)}; expected (b, t) with b, t >= 1")
    if tokens.shape[1] > context:
        raise AnalysisError(f"{tokens.shape[1]} tokens is longer than this model's context={context}")
    lo, hi = int(tokens.min()), int(tokens.max())
    if lo < 0 or hi >= vocab_size:
        bad = lo if lo < 0 else hi
        raise AnalysisError(f"token {bad} is outside the vocabulary 0..{vocab_size - 1}")
    return tokens.long()


class TinyLM(HookedModel, nn.Module):
    """model(tokens (b t)) -> logits (b t vocab); each layer's attention is a zoo block.

    run_with_cache / run_with_hooks (zoo.hooks.HookedModel) name layer l's block "L{l}" (its
    locations "L1.pattern", "L0.z", ...) and the residual stream before and after the layer
    "L{l}.resid_pre" / "L{l}.resid_post" (b t c).
    """

    kind = "lm"
    punctuation = " .,;:!?'\"-()"  # ASCII ids (the CLI's --text): `punctuation` scores' default

    def __init__(self, config: LMConfig) -> None:
        super().__init__()
        self.config = c = config
        self.embed = nn.Embedding(c.vocab_size, c.d_model)
        self.pos_embed = nn.Embedding(c.context, c.d_model) if c.positions == "absolute" else None
        self.attn = nn.ModuleList(
            zoo.MultiHeadAttention(
                zoo.AttentionSpec(
                    d_model=c.d_model,
                    heads=h,
                    d_k=c.d_head,
                    causal=True,
                    rope_theta=c.rope_theta if c.positions == "rotary" else None,
                )
            )
            for h in c.heads
        )
        # One scalar per (head, offset t - s); zero = no positional preference at the start.
        self.pos_bias = nn.ParameterList(
            nn.Parameter(torch.zeros(h, c.context)) for h in (c.heads if c.positions == "relative" else ())
        )
        self.ln_attn = nn.ModuleList(nn.LayerNorm(c.d_model) for _ in c.heads)
        self.mlps = nn.ModuleList(
            nn.Sequential(
                nn.LayerNorm(c.d_model),
                nn.Linear(c.d_model, 4 * c.d_model),
                nn.GELU(),
                nn.Linear(4 * c.d_model, c.d_model),
            )
            for _ in (c.heads if c.mlp else ())
        )
        self.ln_final = nn.LayerNorm(c.d_model)
        self.unembed = nn.Linear(c.d_model, c.vocab_size)

    # -- the contract ------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def context(self) -> int:
        return self.config.context

    @property
    def layers(self) -> int:
        return self.config.layers

    @property
    def heads(self) -> int:
        """The most heads in any layer: the width of a head_mask row and of attention_maps' h axis."""
        return max(self.config.heads)

    @property
    def heads_per_layer(self) -> tuple[int, ...]:
        return self.config.heads

    def forward(self, tokens: Tensor, head_mask: Tensor | Sequence[Tensor] | None = None) -> Tensor:
        """tokens (b t) int -> logits (b t vocab).

        head_mask (layers h) or (b layers h), or one (h) / (b h) tensor per layer: scales each
        head's output Z^(r) before concatenation, as the zoo block's own head_mask does. With
        fewer heads in a layer than model.heads, that layer reads the first entries of its row.
        """
        return self._run(tokens, head_mask)

    def attention_maps(self, tokens: Tensor, head_mask: Tensor | Sequence[Tensor] | None = None) -> Tensor:
        """tokens (b t) -> A (layers b h t t); rows sum to 1. h = model.heads: a layer with fewer
        heads is padded with NaN maps (no such head), so scores come out NaN there too."""
        maps = self._maps(tokens, head_mask)
        h = self.heads
        return torch.stack(
            [torch.cat([a, a.new_full((a.shape[0], h - a.shape[1], *a.shape[2:]), torch.nan)], 1) for a in maps]
        )

    def attention_map_list(self, tokens: Tensor) -> list[Tensor]:
        """One A (b h t t) per layer (works for pruned models with unequal head counts)."""
        return self._maps(tokens, None)

    def hook_blocks(self) -> dict[str, nn.Module]:
        """{"L0": layer 0's zoo block, ...}: the prefixes of run_with_cache's names."""
        return layer_blocks(self.attn, "L", attr=None)

    def _maps(self, tokens: Tensor, head_mask) -> list[Tensor]:
        names = [f"{p}.pattern" for p in self.hook_blocks()]
        _, cache = self.run_with_cache(tokens, head_mask, names=names)
        return [cache[n] for n in names]

    def shut_heads(self) -> list[list[bool]]:
        """(layers, model.heads): True for a head whose W_O columns are all zero (shut by the
        training's L0 gates); padding entries of a layer with fewer heads are False."""
        return [shut(block) + [False] * (self.heads - block.spec.heads) for block in self.attn]

    # -- internals ---------------------------------------------------------------------------

    def check_tokens(self, tokens: Tensor) -> Tensor:
        return check_token_ids(tokens, self.vocab_size, self.context)

    def position_bias(self, layer: int, t: int) -> Tensor | None:
        """P_l (1 h t t): the learned bias of offset t - s (future cells are masked anyway)."""
        if self.config.positions != "relative":
            return None
        pos = torch.arange(t, device=self.embed.weight.device)
        offset = (pos[:, None] - pos[None, :]).clamp_min(0)
        return self.pos_bias[layer][:, offset][None]

    def residual(self, tokens: Tensor, head_mask=None) -> Tensor:
        """The residual stream after the last layer (b t c), before the final LayerNorm."""
        tokens = self.check_tokens(tokens)
        t = tokens.shape[1]
        x = self.embed(tokens)
        if self.pos_embed is not None:
            x = x + self.pos_embed(torch.arange(t, device=x.device))
        masks = per_layer(head_mask, self.config.heads)
        for layer, (attn, ln, hm) in enumerate(zip(self.attn, self.ln_attn, masks)):
            x = self.resid(f"L{layer}.resid_pre", x)
            x = x + attn(ln(x), mask=self.position_bias(layer, t), head_mask=hm)
            if self.config.mlp:
                x = x + self.mlps[layer](x)
            x = self.resid(f"L{layer}.resid_post", x)
        return x

    def _run(self, tokens: Tensor, head_mask) -> Tensor:
        return self.unembed(self.ln_final(self.residual(tokens, head_mask)))

    final_norm = property(lambda self: self.ln_final)  # what logit attribution reads (analysis.patching)

    # -- head surgery --------------------------------------------------------------------------

    def prune(self, heads: dict[int, Sequence[int]]) -> TinyLM:
        """A smaller model with heads {layer: [head, ...]} physically removed (zoo.prune_heads)."""
        hs = list(self.config.heads)
        for layer, drop in heads.items():
            hs[layer] -= len(set(drop))
        for layer, drop in heads.items():
            if not 0 <= layer < self.layers or any(not 0 <= r < self.config.heads[layer] for r in drop):
                raise AnalysisError(
                    f"cannot prune layer {layer} heads {list(drop)}: this model has heads {self.config.heads}"
                )
        new = TinyLM(dataclasses.replace(self.config, heads=tuple(hs)))
        touched = tuple(f"{part}.{layer}." for layer, drop in heads.items() if drop for part in ("attn", "pos_bias"))
        kept = {k: v for k, v in self.state_dict().items() if not (k + ".").startswith(touched)}
        new.load_state_dict(kept, strict=False)  # everything but the pruned blocks, copied below
        for layer, drop in heads.items():
            if not drop:
                continue
            new.attn[layer] = zoo.prune_heads(self.attn[layer], list(drop))
            if self.config.positions == "relative":
                keep = [r for r in range(self.config.heads[layer]) if r not in set(drop)]
                with torch.no_grad():
                    new.pos_bias[layer].copy_(self.pos_bias[layer][keep])
        return new
