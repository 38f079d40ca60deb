"""QK-norm: RMSNorm with a learned weight on Q and K, per head or over all heads."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from einops import rearrange
from torch import Tensor, nn

from ..errors import SpecError
from ..spec_fields import SpecFields
from .base import Modifier, PruneRefusal, is_number, take_blocks
from .graph import GraphBuilder, per_head

QK_NORMS = ("head", "full")


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """x / sqrt(mean(x^2) + eps) * weight over the last axis, in fp32 for half inputs (as HF does)."""
    xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    # Written as a division, not rsqrt: torch's ONNX optimizer fuses the rsqrt form into an opset-23
    # RMSNormalization node whose fp16 output type fails onnx's checker.
    y = xf / torch.sqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight.to(y.dtype)).to(x.dtype)


def graph_rms_norm(g: GraphBuilder, x: str, weight: Tensor, eps: float) -> str:
    """rms_norm as graph nodes over x's last axis, in fp32 for a half-precision graph."""
    xf = g.cast(x, "float32") if g.dtype != "float32" else x
    ms = g.op("ReduceMean", g.op("Mul", xf, xf), g.const([-1], "i", "int64"), keepdims=1)
    inv = g.op("Reciprocal", g.op("Sqrt", g.op("Add", ms, g.const(eps, "eps", "float32"))))
    y = g.op("Mul", g.op("Mul", xf, inv), g.const(weight, "norm_w", "float32"))
    return g.cast(y, g.dtype) if g.dtype != "float32" else y


class QKNorm(Modifier):
    """RMSNorm with a learned weight on Q and K, before RoPE.

    "head": over each head's d_k, one weight (d_k) shared by all heads (Qwen3, Gemma-3).
    "full": over all heads' h*d_k (K: g*d_k) before the split, weights (h dk) and (g dk) (OLMo-2).
    """

    name = "qk_norm"
    label = "QK-norm"
    fields = ("qk_norm", "qk_norm_eps")

    def __init__(self, spec: SpecFields) -> None:
        super().__init__(spec)
        wq, wk = self.widths(spec)
        self.q_norm = nn.Parameter(torch.ones(wq))
        self.k_norm = nn.Parameter(torch.ones(wk))

    @staticmethod
    def widths(spec: SpecFields) -> tuple[int, int]:
        if spec.qk_norm == "head":
            return spec.d_k_, spec.d_k_
        return spec.heads * spec.d_k_, spec.kv_heads_ * spec.d_k_

    @classmethod
    def active(cls, spec: SpecFields) -> bool:
        return spec.qk_norm is not None

    @classmethod
    def check(cls, spec: SpecFields) -> None:
        if spec.qk_norm is not None and spec.qk_norm not in QK_NORMS:
            raise SpecError(f"qk_norm={spec.qk_norm!r} is not one of None, 'head' (per head over d_k), 'full' (h*d_k)")
        eps = spec.qk_norm_eps
        if not is_number(eps) or not 0 < eps <= 1:
            raise SpecError(f"qk_norm_eps={eps!r} must be a number in (0, 1] (e.g. 1e-6)")

    @classmethod
    def parameters_added(cls, spec: SpecFields) -> int:
        return sum(cls.widths(spec)) if cls.active(spec) else 0

    @classmethod
    def parameters_label(cls, spec: SpecFields) -> str:
        wq, wk = cls.widths(spec)
        return f"qk-norm weights ({spec.qk_norm}: {wq} + {wk})"

    @classmethod
    def describe(cls, spec: SpecFields) -> str:
        return f"qk-norm={spec.qk_norm}"

    def qk_merged(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        if self.spec.qk_norm != "full":
            return q, k
        eps = self.spec.qk_norm_eps
        return rms_norm(q, self.q_norm, eps), rms_norm(k, self.k_norm, eps)

    def qk_heads(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        if self.spec.qk_norm != "head":
            return q, k
        eps = self.spec.qk_norm_eps
        return rms_norm(q, self.q_norm, eps), rms_norm(k, self.k_norm, eps)

    def gqa_qkv(self, g: GraphBuilder, q: str, k: str, v: str) -> tuple[str, str, str]:
        spec, eps = self.spec, self.spec.qk_norm_eps
        if spec.qk_norm == "full":
            return graph_rms_norm(g, q, self.q_norm, eps), graph_rms_norm(g, k, self.k_norm, eps), v
        q = per_head(g, q, spec.heads, lambda t: graph_rms_norm(g, t, self.q_norm, eps))
        k = per_head(g, k, spec.kv_heads_, lambda t: graph_rms_norm(g, t, self.k_norm, eps))
        return q, k, v

    state_fields = ("q_norm", "k_norm")

    def head_state(self) -> dict[str, Tensor]:
        return {"q_norm": self.q_norm.detach().clone(), "k_norm": self.k_norm.detach().clone()}

    def load_head_state(self, state: dict[str, Any]) -> None:
        self.q_norm.copy_(state["q_norm"])
        self.k_norm.copy_(state["k_norm"])

    @classmethod
    def select_heads(
        cls, spec: SpecFields, state: dict[str, Any], q_heads: Sequence[int], kv_heads: Sequence[int]
    ) -> dict[str, Any]:
        if spec.qk_norm != "full":  # "head": one weight (d_k) shared by every head
            return dict(state)
        return {
            "q_norm": take_blocks(state["q_norm"], q_heads, spec.heads),
            "k_norm": take_blocks(state["k_norm"], kv_heads, spec.kv_heads_),
        }

    @classmethod
    def prune_refusal(cls, spec: SpecFields) -> PruneRefusal | None:
        if spec.qk_norm != "full":
            return None
        return PruneRefusal(
            "qk_norm='full'",
            "its RMS runs over all heads together, so removing a head changes every other head's normalisation",
            "one RMS over all heads",
        )

    @classmethod
    def audit(cls, m: nn.Module, x: Tensor) -> tuple[str, bool, str]:
        spec, mod = m.spec, m.mods["qk_norm"]
        q, k, _ = m.project(x)
        q, k = mod.qk_merged(q, k)
        q, k = (
            rearrange(q, "b t (h d) -> b h t d", h=spec.heads),
            rearrange(k, "b s (g d) -> b g s d", g=spec.kv_heads_),
        )
        q, k = mod.qk_heads(q, k, torch.zeros(1, 1), torch.zeros(1, 1))
        wq, wk = mod.q_norm.detach(), mod.k_norm.detach()
        if spec.qk_norm == "full":
            wq, wk = (
                rearrange(wq, "(h d) -> 1 h 1 d", h=spec.heads),
                rearrange(wk, "(g d) -> 1 g 1 d", g=spec.kv_heads_),
            )
            axes: tuple[int, ...] = (1, 3)
        else:
            axes = (-1,)
        # Divided by its weight, a normalized row has mean square 1/(1 + eps/ms), i.e. RMS 1 up to eps.
        rms_q = (q / wq).pow(2).mean(dim=axes).sqrt()
        rms_k = (k / wk).pow(2).mean(dim=axes).sqrt()
        err = max((rms_q - 1).abs().max().item(), (rms_k - 1).abs().max().item())
        over = (
            f"each head's d_k={spec.d_k_}" if spec.qk_norm == "head" else f"all heads' h*d_k={spec.heads * spec.d_k_}"
        )
        return (
            f"qk-norm ({spec.qk_norm}): RMS 1 over {over}",
            err < 1e-3,
            f"Q and K after the norm, divided by their weights: max |RMS - 1| = {err:.1e} (eps={spec.qk_norm_eps:g}); "
            f"{cls.parameters_added(spec):,} weights",
        )

    @classmethod
    def reference_qk(cls, spec: SpecFields, q: Tensor, k: Tensor, p: Any, pos: Tensor) -> tuple[Tensor, Tensor]:
        return cls.reference(spec, q, k, p.q_norm, p.k_norm)

    @staticmethod
    def reference(spec: SpecFields, q: Tensor, k: Tensor, wq: Tensor, wk: Tensor) -> tuple[Tensor, Tensor]:
        """Q (b h t dk), K (b g s dk) per head, written out: each row divided by its RMS."""
        eps = spec.qk_norm_eps

        def norm(x: Tensor, w: Tensor, axes: tuple[int, ...]) -> Tensor:
            return x / torch.sqrt((x * x).mean(dim=axes, keepdim=True) + eps) * w

        if spec.qk_norm == "head":
            return norm(q, wq, (-1,)), norm(k, wk, (-1,))
        # full: one RMS over every head of a position (axes h and d together)
        hq, g = q.shape[1], k.shape[1]
        wq4 = wq.reshape(hq, 1, -1).unsqueeze(0)
        wk4 = wk.reshape(g, 1, -1).unsqueeze(0)
        return norm(q, wq4, (1, 3)), norm(k, wk4, (1, 3))
