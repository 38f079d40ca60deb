"""Modifiers of the score matrix alone: the sliding window (a mask) and the logit softcap (a map)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..errors import SpecError
from ..spec_fields import SpecFields
from .base import Modifier, is_number, relative_distance
from .graph import GraphBuilder, GraphLimit, OpPart


class Window(Modifier):
    """Query i sees key j iff |i - j| < window; a causal block also needs j <= i.

    Causal: i - window < j <= i, `window` keys, itself included (HF's sliding_window).
    Non-causal (encoders): i - window < j < i + window, window - 1 keys on either side plus itself,
    2 * window - 1 in all. ModernBERT's local layers (|i - j| <= local_attention // 2) are
    window = local_attention // 2 + 1 (transformers' own `sliding_window + 1`).
    """

    name = "window"
    label = "window"
    fields = ("window",)
    shapes_scores = True

    @classmethod
    def active(cls, spec: SpecFields) -> bool:
        return spec.window is not None

    @classmethod
    def check(cls, spec: SpecFields) -> None:
        w = spec.window
        if w is None:
            return
        if isinstance(w, bool) or not isinstance(w, int) or not 0 < w < 2**31:
            raise SpecError(f"window={w!r} must be an integer in 1..2**31-1 (keys seen, itself included) or None")
        if spec.is_cross:
            raise SpecError(
                f"window={w} with d_context={spec.d_context}: a sliding window compares query and key positions "
                f"of one sequence (self-attention only); drop window or d_context"
            )

    @classmethod
    def describe(cls, spec: SpecFields) -> str:
        return f"window={spec.window}" if spec.causal else f"window={spec.window} (symmetric)"

    @classmethod
    def reference_allowed(cls, spec: SpecFields, t: int, s: int) -> Tensor | None:
        cells = torch.ones(t, s, dtype=torch.bool).triu(-(spec.window - 1))
        return cells if spec.causal else cells.tril(spec.window - 1)

    # GroupQueryAttention's local_window_size = W attends to W keys, itself included (measured): the
    # zoo's window, looking back only.
    gqa_limit = GraphLimit("causal only (local_window_size looks back)")

    @classmethod
    def gqa_refusal(cls, spec: SpecFields) -> str | None:
        if not spec.causal:
            return f"GroupQueryAttention's local_window_size looks back only; window={spec.window} is symmetric here"
        return None

    def gqa_op(self, g: GraphBuilder) -> OpPart:
        return OpPart({"local_window_size": self.spec.window})

    def gqa_allowed(self, g: GraphBuilder) -> str | None:
        return g.op("Less", g.distance(), g.const(float(self.spec.window), "window", "float32"))

    def score_allowed(self, q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
        d = relative_distance(q_pos, k_pos)
        # causal blocks mask j > i anyway: no Abs there, so their graphs stay as they were
        return (d if self.spec.causal else d.abs()) < self.spec.window

    @classmethod
    def audit(cls, m: nn.Module, x: Tensor) -> tuple[str, bool, str]:
        """Changing a token outside a query's window leaves its output alone; inside, it does not."""
        if not m.spec.causal:
            return cls._audit_symmetric(m, x)
        w, t = m.spec.window, x.shape[1]
        y = m(x)[:, -1]
        last = t - 1
        outside = last - w  # the newest key the last query may not see
        detail = []
        ok = True
        if outside >= 0:
            x2 = x.clone()
            x2[:, : outside + 1] += 1.0
            e_out = (m(x2)[:, -1] - y).abs().max().item()
            ok = ok and e_out < 1e-10
            detail.append(f"keys 0..{outside} changed: last row moves {e_out:.1e} (must be 0)")
        x3 = x.clone()
        x3[:, max(0, last - w + 1)] += 1.0
        e_in = (m(x3)[:, -1] - y).abs().max().item()
        ok = ok and e_in > 1e-6
        detail.append(f"key {max(0, last - w + 1)} (oldest inside) changed: moves {e_in:.1e} (must not be 0)")
        return f"window={w}: query i sees keys i-{w - 1}..i", ok, "; ".join(detail)

    @classmethod
    def _audit_symmetric(cls, m: nn.Module, x: Tensor) -> tuple[str, bool, str]:
        """Query 0 looks ahead: keys w-1 away and nearer change its row, keys w or more away do not."""
        w, t = m.spec.window, x.shape[1]
        y = m(x)[:, 0]
        detail = []
        ok = True
        if w < t:
            x2 = x.clone()
            x2[:, w:] += 1.0
            e_out = (m(x2)[:, 0] - y).abs().max().item()
            ok = ok and e_out < 1e-10
            detail.append(f"keys {w}..{t - 1} changed: row 0 moves {e_out:.1e} (must be 0)")
        inside = min(w - 1, t - 1)  # the farthest key ahead that query 0 sees
        x3 = x.clone()
        x3[:, inside] += 1.0
        e_in = (m(x3)[:, 0] - y).abs().max().item()
        ok = ok and e_in > 1e-6
        detail.append(f"key {inside} (farthest ahead inside) changed: moves {e_in:.1e} (must not be 0)")
        return f"window={w} (symmetric): query i sees keys i-{w - 1}..i+{w - 1}", ok, "; ".join(detail)


# -- softcap --------------------------------------------------------------------------------------


class Softcap(Modifier):
    """scores -> cap * tanh(scores / cap), after scaling and before any bias or mask (Gemma-2)."""

    name = "softcap"
    label = "softcap"
    fields = ("softcap",)
    needs_explicit = True  # SDPA has no hook for a nonlinear map of the scores
    gqa_masked_row_zero = False  # the op's tanh makes an all-masked row NaN (onnxruntime 1.31.1 CPU)

    @classmethod
    def active(cls, spec: SpecFields) -> bool:
        return spec.softcap is not None

    @classmethod
    def check(cls, spec: SpecFields) -> None:
        c = spec.softcap
        if c is not None and (not is_number(c) or not 0 < c <= 1e4):
            raise SpecError(f"softcap={c!r} must be a number in (0, 1e4] (Gemma-2 uses 50.0) or None")

    @classmethod
    def describe(cls, spec: SpecFields) -> str:
        return f"softcap={spec.softcap:g}"

    def gqa_op(self, g: GraphBuilder) -> OpPart:
        return OpPart({"softcap": float(self.spec.softcap)})  # applied before attention_bias (measured)

    def score_map(self, scores: Tensor) -> Tensor:
        cap = self.spec.softcap
        return torch.tanh(scores / cap) * cap

    @classmethod
    def reference_map(cls, spec: SpecFields, scores: Tensor) -> Tensor:
        return spec.softcap * torch.tanh(scores / spec.softcap)

    @classmethod
    def audit(cls, m: nn.Module, x: Tensor) -> tuple[str, bool, str]:
        """Capped scores lie in (-cap, cap), so two allowed weights of a row differ by < exp(2 cap)."""
        cap = m.spec.softcap
        _, a = m(x * 1e3, need_weights=True)  # huge scores: without the cap one key would take all
        ok_rows = a.sum(-1) > 0
        smallest = torch.where(a > 0, a, torch.inf).amin(-1)  # over allowed keys only
        ratio = (a.amax(-1) / smallest)[ok_rows]
        log_ratio = torch.log(ratio).max().item() if ratio.numel() else 0.0
        return (
            f"softcap={cap:g}: scores in (-cap, cap)",
            bool(torch.isfinite(a).all()) and log_ratio <= 2 * cap + 1e-9,
            f"at x*1000, max log(weight ratio) within a row {log_ratio:.3g} <= 2*cap = {2 * cap:g}",
        )


# The order is the order of application at each stage (QK-norm before RoPE, as every model does).
