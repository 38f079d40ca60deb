"""Fused projection layouts: the rows of one (out, in) weight (biases as one-column weights) that a
transformers attention class keeps Q, K and V in, split into the zoo's Q ((h d) c), K ((g d) c), V ((g d) c)
and fused back (peers/rows.py's reader and writer).

"zoo": [Q | K | V] (GPT-2's c_attn, Phi-3, MPT, ModernBERT, Falcon-7B's multi-query); "per_head": (h r d),
q/k/v inside each head (BLOOM, GPT-NeoX, Persimmon); "grouped": per kv group its h/g query heads then K then V,
(g (r+2) d) (Falcon-40B); "codegen": 4 shards, each [q | v | k] of (h d)/4 rows, (m r l).

Axes: h heads, g kv heads, d per-head width, c model channels, r the q/k/v slot, m a model-parallel shard.
"""

from __future__ import annotations

import torch
from einops import rearrange
from torch import Tensor

from zoo.errors import HFConversionError


def split_fused(t: Tensor, layout: str, h: int, g: int, d: int) -> tuple[Tensor, Tensor, Tensor]:
    if layout == "zoo":
        q, k, v = t.split([h * d, g * d, g * d])
        return q, k, v
    if layout == "per_head":
        q, k, v = rearrange(t, "(h r d) c -> r (h d) c", r=3, h=h)
        return q, k, v
    if layout == "grouped":
        t4 = rearrange(t, "(g m d) c -> g m d c", g=g, d=d)
        q = rearrange(t4[:, : h // g], "g r d c -> (g r d) c")
        k, v = (rearrange(t4[:, i], "g d c -> (g d) c") for i in (h // g, h // g + 1))
        return q, k, v
    if layout == "codegen":
        q, v, k = rearrange(t, "(m r l) c -> r (m l) c", m=4, r=3)
        return q, k, v
    raise _unknown_layout(layout)


def fuse_fused(q: Tensor, k: Tensor, v: Tensor, layout: str, h: int, g: int) -> Tensor:
    if layout == "zoo":
        return torch.cat([q, k, v])
    if layout == "per_head":
        return rearrange(torch.stack([q, k, v]), "r (h d) c -> (h r d) c", h=h)
    if layout == "grouped":
        q4 = rearrange(q, "(g r d) c -> g r d c", g=g, r=h // g)
        k4, v4 = (rearrange(x, "(g d) c -> g 1 d c", g=g) for x in (k, v))
        return rearrange(torch.cat([q4, k4, v4], dim=1), "g m d c -> (g m d) c")
    if layout == "codegen":
        return rearrange(torch.stack([q, v, k]), "r (m l) c -> (m r l) c", m=4)
    raise _unknown_layout(layout)


FUSED_LAYOUTS = ("zoo", "per_head", "grouped", "codegen")


def _unknown_layout(layout: str) -> HFConversionError:
    return HFConversionError(f"fused row layout {layout!r} is not one of {', '.join(FUSED_LAYOUTS)}")


__all__ = ["FUSED_LAYOUTS", "fuse_fused", "split_fused"]
