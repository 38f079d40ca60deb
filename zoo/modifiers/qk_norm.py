"""QK-norm: RMSNorm or LayerNorm on Q and K, per head (one weight shared, or one per head) or over all heads."""

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

QK_NORMS = ("head", "per_head", "full")
QK_NORM_KINDS = ("rms", "layer")


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """x / sqrt(mean(x^2) + eps) * weight over the last axis, in fp32 for half inputs (as HF does)."""
    return qk_normalize(x, weight, None, eps, "rms")


def qk_normalize(x: Tensor, weight: Tensor, bias: Tensor | None, eps: float, kind: str) -> Tensor:
    """RMSNorm ("rms") or LayerNorm ("layer": the mean removed first) over the last axis, times weight
    plus bias, in fp32 for half inputs (as HF does). weight/bias broadcast against x."""
    xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    if kind == "layer":
        xf = xf - xf.mean(-1, keepdim=True)
        # x * x, not pow(2) (the same number): ONNX Runtime's LayerNormFusion matches the Pow form and, in
        # an fp16 graph, builds a LayerNormalization node of mixed fp16/fp32 inputs it then refuses to load.
        square = xf * xf
    else:
        square = xf.pow(2)
    # Written as a division, not rsqrt: torch's ONNX optimizer fuses the rsqrt form into an opset-23
    # RMSNormalization node whose fp16 output type fails onnx's checker.
    y = xf / torch.sqrt(square.mean(-1, keepdim=True) + eps)
    y = y * weight.to(y.dtype)
    if bias is not None:
        y = y + bias.to(y.dtype)
    return y.to(x.dtype)


def graph_rms_norm(g: GraphBuilder, x: str, weight: Tensor, eps: float) -> str:
    """rms_norm as graph nodes over x's last axis, in fp32 for a half-precision graph."""
    xf = g.cast(x, "float32") if g.dtype != "float32" else x
    ms = g.op("ReduceMean", g.op("Mul", xf, xf), g.const([-1], "i", "int64"), keepdims=1)
    inv = g.op("Reciprocal", g.op("Sqrt", g.op("Add", ms, g.const(eps, "eps", "float32"))))
    y = g.op("Mul", g.op("Mul", xf, inv), g.const(weight, "norm_w", "float32"))
    return g.cast(y, g.dtype) if g.dtype != "float32" else y


def graph_layer_norm(g: GraphBuilder, x: str, width: int, weight: Tensor, bias: Tensor | None, eps: float) -> str:
    """A LayerNormalization node over x's last axis (`width` wide), in fp32 for a half-precision graph.
    A weight of that width is its Scale (and the bias its B); a per-head weight (heads, width) is
    multiplied (and added) after a unit Scale."""
    xf = g.cast(x, "float32") if g.dtype != "float32" else x
    if weight.dim() == 1 and weight.numel() == width:
        ins = [g.const(weight, "norm_w", "float32")]
        ins += [g.const(bias, "norm_b", "float32")] if bias is not None else []
        y = g.op("LayerNormalization", xf, *ins, axis=-1, epsilon=float(eps))
    else:
        y = g.op("LayerNormalization", xf, g.const(torch.ones(width), "norm_1", "float32"), axis=-1, epsilon=float(eps))
        y = g.op("Mul", y, g.const(weight, "norm_w", "float32"))
        if bias is not None:
            y = g.op("Add", y, g.const(bias, "norm_b", "float32"))
    return g.cast(y, g.dtype) if g.dtype != "float32" else y


class QKNorm(Modifier):
    """A norm with a learned weight (and, for LayerNorm, an optional bias) on Q and K, before RoPE.

    qk_norm_kind: "rms" (RMSNorm: Qwen3, OLMo-2) or "layer" (LayerNorm, the mean removed: Cohere,
    StableLM, Persimmon, Phi); qk_norm_bias: the LayerNorm's additive bias (Persimmon, Phi).
    qk_norm, where the statistics run and how the weights are shared:
      "head":     over each head's d_k, one weight (d_k) shared by all heads (Qwen3, Gemma-3, Persimmon, Phi).
      "per_head": over each head's d_k, one weight per head: (h dk) and (g dk) (Cohere, StableLM).
      "full":     over all heads' h*d_k (K: g*d_k) before the split, weights (h dk) and (g dk) (OLMo-2).
    """

    name = "qk_norm"
    label = "QK-norm"
    fields = ("qk_norm", "qk_norm_eps", "qk_norm_kind", "qk_norm_bias")

    def __init__(self, spec: SpecFields) -> None:
        super().__init__(spec)
        wq, wk = self.widths(spec)
        self.q_norm = nn.Parameter(torch.ones(wq))
        self.k_norm = nn.Parameter(torch.ones(wk))
        self.q_norm_bias = nn.Parameter(torch.zeros(wq)) if spec.qk_norm_bias else None
        self.k_norm_bias = nn.Parameter(torch.zeros(wk)) if spec.qk_norm_bias else None

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
            raise SpecError(
                f"qk_norm={spec.qk_norm!r} is not one of None, 'head' (per head over d_k, one weight), "
                f"'per_head' (per head over d_k, a weight per head), 'full' (h*d_k)"
            )
        eps = spec.qk_norm_eps
        if not is_number(eps) or not 0 < eps <= 1:
            raise SpecError(f"qk_norm_eps={eps!r} must be a number in (0, 1] (e.g. 1e-6)")
        if spec.qk_norm_kind not in QK_NORM_KINDS:
            raise SpecError(f"qk_norm_kind={spec.qk_norm_kind!r} is not one of 'rms' (RMSNorm), 'layer' (LayerNorm)")
        if not isinstance(spec.qk_norm_bias, bool):
            raise SpecError(f"qk_norm_bias={spec.qk_norm_bias!r} must be True or False")
        if spec.qk_norm is None and (spec.qk_norm_kind != "rms" or spec.qk_norm_bias):
            raise SpecError(
                f"qk_norm_kind={spec.qk_norm_kind!r}, qk_norm_bias={spec.qk_norm_bias} without qk_norm: "
                f"set qk_norm ('head', 'per_head' or 'full') too, or leave them at 'rms' and False"
            )
        if spec.qk_norm_bias and spec.qk_norm_kind != "layer":
            raise SpecError(
                "qk_norm_bias=True with qk_norm_kind='rms': the bias belongs to LayerNorm; set qk_norm_kind='layer'"
            )

    @classmethod
    def parameters_added(cls, spec: SpecFields) -> int:
        return sum(cls.widths(spec)) * (2 if spec.qk_norm_bias else 1) if cls.active(spec) else 0

    @classmethod
    def parameters_label(cls, spec: SpecFields) -> str:
        wq, wk = cls.widths(spec)
        what = "weights and biases" if spec.qk_norm_bias else "weights"
        each = " each" if spec.qk_norm_bias else ""
        return f"qk-norm {what} ({spec.qk_norm_kind}, {spec.qk_norm}: {wq} + {wk}{each})"

    @classmethod
    def describe(cls, spec: SpecFields) -> str:
        kind = "" if spec.qk_norm_kind == "rms" else f" ({'layer+bias' if spec.qk_norm_bias else 'layer'})"
        return f"qk-norm={spec.qk_norm}{kind}"

    def _norm(self, x: Tensor, w: Tensor, b: Tensor | None, n: int) -> Tensor:
        if self.spec.qk_norm == "per_head":  # x (b n t d): each head its own weight
            w = rearrange(w, "(n d) -> n 1 d", n=n)
            b = None if b is None else rearrange(b, "(n d) -> n 1 d", n=n)
        return qk_normalize(x, w, b, self.spec.qk_norm_eps, self.spec.qk_norm_kind)

    def _both(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        s = self.spec
        q = self._norm(q, self.q_norm, self.q_norm_bias, s.heads)
        return q, self._norm(k, self.k_norm, self.k_norm_bias, s.kv_heads_)

    def qk_merged(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        if self.spec.qk_norm != "full":
            return q, k
        return self._both(q, k)

    def qk_heads(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        if self.spec.qk_norm == "full":
            return q, k
        return self._both(q, k)

    def gqa_qkv(self, g: GraphBuilder, q: str, k: str, v: str) -> tuple[str, str, str]:
        spec, eps, d = self.spec, self.spec.qk_norm_eps, self.spec.d_k_

        def norm(x: str, w: Tensor, b: Tensor | None, n: int, width: int) -> str:
            w, b = w.detach(), None if b is None else b.detach()
            if spec.qk_norm == "per_head":  # against x (b t n d)
                w = rearrange(w, "(n d) -> n d", n=n)
                b = None if b is None else rearrange(b, "(n d) -> n d", n=n)
            if spec.qk_norm_kind == "layer":
                return graph_layer_norm(g, x, width, w, b, eps)
            return graph_rms_norm(g, x, w, eps)

        wq, wk, bq, bk = self.q_norm, self.k_norm, self.q_norm_bias, self.k_norm_bias
        if spec.qk_norm == "full":
            hq, hk = spec.heads, spec.kv_heads_
            return norm(q, wq, bq, hq, hq * d), norm(k, wk, bk, hk, hk * d), v
        q = per_head(g, q, spec.heads, lambda t: norm(t, wq, bq, spec.heads, d))
        k = per_head(g, k, spec.kv_heads_, lambda t: norm(t, wk, bk, spec.kv_heads_, d))
        return q, k, v

    state_fields = ("q_norm", "k_norm", "q_norm_bias", "k_norm_bias")

    def head_state(self) -> dict[str, Tensor]:
        params = {key: getattr(self, key) for key in self.state_fields}
        return {key: None if p is None else p.detach().clone() for key, p in params.items()}

    def load_head_state(self, state: dict[str, Any]) -> None:
        for key in self.state_fields:
            param, value = getattr(self, key), state.get(key)
            if param is None:
                continue
            if value is None and key.endswith("_bias"):  # weights read without a bias: the norm has none
                param.zero_()
            else:
                param.copy_(value)

    @classmethod
    def select_heads(
        cls, spec: SpecFields, state: dict[str, Any], q_heads: Sequence[int], kv_heads: Sequence[int]
    ) -> dict[str, Any]:
        if spec.qk_norm == "head":  # one weight (d_k) shared by every head
            return dict(state)
        hq, hk = spec.heads, spec.kv_heads_
        return {
            "q_norm": take_blocks(state["q_norm"], q_heads, hq),
            "k_norm": take_blocks(state["k_norm"], kv_heads, hk),
            "q_norm_bias": take_blocks(state.get("q_norm_bias"), q_heads, hq),
            "k_norm_bias": take_blocks(state.get("k_norm_bias"), kv_heads, hk),
        }

    @classmethod
    def prune_refusal(cls, spec: SpecFields) -> PruneRefusal | None:
        if spec.qk_norm != "full":
            return None
        return PruneRefusal(
            "qk_norm='full'",
            "its norm runs over all heads together, so removing a head changes every other head's normalisation",
            "one RMS over all heads" if spec.qk_norm_kind == "rms" else "one LayerNorm over all heads",
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

        def per_block(w: Tensor | None, n: int) -> Tensor | None:
            if w is None:
                return None
            w = w.detach()
            return w if spec.qk_norm == "head" else rearrange(w, "(n d) -> 1 n 1 d", n=n)

        axes: tuple[int, ...] = (1, 3) if spec.qk_norm == "full" else (-1,)
        err = 0.0
        pairs = ((q, mod.q_norm, mod.q_norm_bias, spec.heads), (k, mod.k_norm, mod.k_norm_bias, spec.kv_heads_))
        for t, w, b, n in pairs:
            bias = per_block(b, n)
            u = (t - bias if bias is not None else t) / per_block(w, n)
            # a normalized row has mean square 1/(1 + eps/ms), i.e. RMS 1 up to eps; LayerNorm's mean 0
            err = max(err, (u.pow(2).mean(dim=axes).sqrt() - 1).abs().max().item())
            if spec.qk_norm_kind == "layer":
                err = max(err, u.mean(dim=axes).abs().max().item())
        over = {
            "head": f"each head's d_k={spec.d_k_}",
            "per_head": f"each head's d_k={spec.d_k_} (a weight per head)",
            "full": f"all heads' h*d_k={spec.heads * spec.d_k_}",
        }[spec.qk_norm]
        what = "RMS 1" if spec.qk_norm_kind == "rms" else "mean 0 and RMS 1"
        return (
            f"qk-norm ({spec.qk_norm}, {spec.qk_norm_kind}): {what} over {over}",
            err < 1e-3,
            f"Q and K after the norm, less their bias and divided by their weights: max error {err:.1e} "
            f"(eps={spec.qk_norm_eps:g}); {cls.parameters_added(spec):,} parameters",
        )

    @classmethod
    def reference_qk(cls, spec: SpecFields, q: Tensor, k: Tensor, p: Any, pos: Tensor) -> tuple[Tensor, Tensor]:
        return cls.reference(spec, q, k, p.q_norm, p.k_norm, p.q_norm_bias, p.k_norm_bias)

    @staticmethod
    def reference(
        spec: SpecFields,
        q: Tensor,
        k: Tensor,
        wq: Tensor,
        wk: Tensor,
        bq: Tensor | None = None,
        bk: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Q (b h t dk), K (b g s dk) per head, written out: each row (less its mean, for LayerNorm)
        divided by its RMS, times its weight, plus its bias."""
        eps, layer = spec.qk_norm_eps, spec.qk_norm_kind == "layer"
        axes = (1, 3) if spec.qk_norm == "full" else (-1,)

        def norm(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
            n = x.shape[1]
            if spec.qk_norm != "head":  # a weight per head (or per head's slice of the full width)
                w = w.reshape(n, 1, -1).unsqueeze(0)
                b = None if b is None else b.reshape(n, 1, -1).unsqueeze(0)
            if layer:
                x = x - x.mean(dim=axes, keepdim=True)
            y = x / torch.sqrt((x * x).mean(dim=axes, keepdim=True) + eps) * w
            return y if b is None else y + b

        return norm(q, wq, bq), norm(k, wk, bk)
