"""Llama 4's weightless QK-norm (Llama4TextL2Norm): each head's Q and K divided by their RMS over d_k,
after the rotary, with no weight: q / sqrt(mean(q^2) + eps), in fp32 for half inputs."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..errors import SpecError
from ..spec_fields import SpecFields
from .base import Modifier, is_number
from .graph import GraphBuilder, per_head


def l2_normalize(x: Tensor, eps: float) -> Tensor:
    """x / sqrt(mean(x^2) + eps) over the last axis, in fp32 for half inputs (as transformers does)."""
    xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    return (xf / torch.sqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


class L2Norm(Modifier):
    """qk_l2 (the eps; None = off): Q (b h t dk) and K (b g s dk) each divided by its RMS over d_k, after
    the rotary (Llama 4's order; a rotation of all of d_k keeps the RMS, so there the order does not matter)."""

    name = "qk_l2"
    label = "weightless QK-norm (L2)"
    fields = ("qk_l2",)

    @classmethod
    def active(cls, spec: SpecFields) -> bool:
        return spec.qk_l2 is not None

    @classmethod
    def check(cls, spec: SpecFields) -> None:
        eps = spec.qk_l2
        if eps is not None and (not is_number(eps) or not 0 < eps <= 1):
            raise SpecError(f"qk_l2={eps!r} must be the norm's eps, a number in (0, 1] (Llama 4: 1e-5), or None (off)")

    @classmethod
    def describe(cls, spec: SpecFields) -> str:
        return f"qk-l2(eps={spec.qk_l2:g})"

    def qk_heads(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        return l2_normalize(q, self.spec.qk_l2), l2_normalize(k, self.spec.qk_l2)

    def gqa_qkv(self, g: GraphBuilder, q: str, k: str, v: str) -> tuple[str, str, str]:
        s, eps = self.spec, self.spec.qk_l2

        def norm(x: str) -> str:
            xf = g.cast(x, "float32") if g.dtype != "float32" else x
            ms = g.op("ReduceMean", g.op("Mul", xf, xf), g.const([-1], "i", "int64"), keepdims=1)
            y = g.op("Div", xf, g.op("Sqrt", g.op("Add", ms, g.const(eps, "eps", "float32"))))
            return g.cast(y, g.dtype) if g.dtype != "float32" else y

        return per_head(g, q, s.heads, norm), per_head(g, k, s.kv_heads_, norm), v

    @classmethod
    def reference_qk(cls, spec: SpecFields, q: Tensor, k: Tensor, p, pos: Tensor) -> tuple[Tensor, Tensor]:
        eps = spec.qk_l2
        return tuple(x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) for x in (q, k))  # type: ignore[return-value]

    @classmethod
    def audit(cls, m: nn.Module, x: Tensor) -> tuple[str, bool, str]:
        """Every head's K row (and Q row, unless a temperature scales Q after the norm) has RMS 1 (up to eps)."""
        _, cache = m.run_with_cache(x)
        rows = [cache["k"]] if "temperature" in m.mods else [cache["q"], cache["k"]]
        err = max((t.pow(2).mean(-1).sqrt() - 1).abs().max().item() for t in rows)
        what = "K" if len(rows) == 1 else "Q and K"
        return (
            f"qk-l2 (eps={m.spec.qk_l2:g}): RMS 1 over each head's d_k",
            err < 1e-3,
            f"{what} rows after the heads step: max |RMS - 1| {err:.1e}; no parameters",
        )
