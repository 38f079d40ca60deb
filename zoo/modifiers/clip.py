"""clip_qkv: Q, K and V clamped to [-c, c] right after their projection (OLMo, MPT)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..errors import SpecError
from ..spec_fields import SpecFields
from .base import Modifier, is_number
from .graph import GraphBuilder


class ClipQKV(Modifier):
    """q, k, v -> clamp(., -c, c), elementwise on the projections (bias included), before the head
    split and before any QK-norm or rotary: where OLMo (`clip_qkv`, on q/k/v_proj's outputs) and MPT
    (`attn_config.clip_qkv`, on Wqkv's output) clamp."""

    name = "clip_qkv"
    label = "clip_qkv"
    fields = ("clip_qkv",)

    @classmethod
    def active(cls, spec: SpecFields) -> bool:
        return spec.clip_qkv is not None

    @classmethod
    def check(cls, spec: SpecFields) -> None:
        c = spec.clip_qkv
        if c is not None and (not is_number(c) or not 0 < c <= 1e30):
            raise SpecError(f"clip_qkv={c!r} must be a positive finite number (OLMo-7B uses 8.0) or None")

    @classmethod
    def describe(cls, spec: SpecFields) -> str:
        return f"clip_qkv={spec.clip_qkv:g}"

    def qkv_projected(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        c = float(self.spec.clip_qkv)
        return q.clamp(-c, c), k.clamp(-c, c), v.clamp(-c, c)

    def gqa_qkv(self, g: GraphBuilder, q: str, k: str, v: str) -> tuple[str, str, str]:
        c = float(self.spec.clip_qkv)
        lo, hi = g.const(-c, "clip_lo"), g.const(c, "clip_hi")
        return g.op("Clip", q, lo, hi), g.op("Clip", k, lo, hi), g.op("Clip", v, lo, hi)

    @classmethod
    def reference_qkv(cls, spec: SpecFields, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        c = spec.clip_qkv
        return tuple(t.where(t.abs() <= c, t.sign() * c) for t in (q, k, v))  # type: ignore[return-value]

    @classmethod
    def audit(cls, m: nn.Module, x: Tensor) -> tuple[str, bool, str]:
        """At x * 1000 every projected entry lies in [-c, c] and some sit on the bound; at x / 1000
        (projections well inside) the clamp changes nothing."""
        c, d_ctx = m.spec.clip_qkv, m.spec.d_context
        ctx = None
        if d_ctx is not None:  # cross-attention: K and V come from a context
            gen = torch.Generator().manual_seed(0)
            ctx = torch.randn(*x.shape[:2], d_ctx, generator=gen, dtype=x.dtype).to(x.device)
        big = m.project(x * 1e3, None if ctx is None else ctx * 1e3)
        top = max(t.abs().max().item() for t in big)
        on_bound = sum(int((t.abs() == c).sum()) for t in big)
        small, small_ctx = x * 1e-3, None if ctx is None else ctx * 1e-3
        lin = m._project(small, small_ctx)  # the projections before any modifier
        e_small = max((a - b).abs().max().item() for a, b in zip(m.project(small, small_ctx), lin))
        inside = max(t.abs().max().item() for t in lin) < c
        ok = top <= c and on_bound > 0 and (e_small < 1e-12 or not inside)
        return (
            f"clip_qkv={c:g}: Q, K, V in [-c, c]",
            ok,
            f"at x*1000 max |q|,|k|,|v| {top:.4g} <= {c:g}, {on_bound} entries on the bound; "
            f"at x/1000 the clamp moves them {e_small:.1e}",
        )
