"""ALiBi: a per-head linear bias on the scores by query-key distance (Press et al.; BLOOM's slopes)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from einops import rearrange
from torch import Tensor, nn

from ..errors import SpecError
from ..spec_fields import SpecFields
from .base import Modifier, relative_distance, relative_positions_audit, take_blocks
from .graph import GraphBuilder


def alibi_slopes(heads: int) -> list[float]:
    """Press et al.'s geometric slopes; for a head count that is not a power of two, BLOOM's
    rule: the slopes of the nearest lower power of two, then every other slope of the next one."""
    p = 2 ** math.floor(math.log2(heads))
    slopes = [2 ** (-8.0 * (i + 1) / p) for i in range(p)]
    extra = [2 ** (-4.0 * (2 * i + 1) / p) for i in range(heads - p)]
    return slopes + extra


class ALiBi(Modifier):
    """A per-head linear bias on the scores: slope_r * (j - i) causal, -slope_r * |i - j| otherwise.

    The slopes are a buffer (saved with the weights) so that they follow their heads through
    permute_heads / prune_heads; a fresh block holds `alibi_slopes(heads)`.
    """

    name = "alibi"
    label = "ALiBi"
    fields = ("alibi",)
    shapes_scores = True

    def __init__(self, spec: SpecFields) -> None:
        super().__init__(spec)
        self.register_buffer("slopes", torch.tensor(alibi_slopes(spec.heads), dtype=torch.float32))

    @classmethod
    def active(cls, spec: SpecFields) -> bool:
        return bool(spec.alibi)

    @classmethod
    def check(cls, spec: SpecFields) -> None:
        if not isinstance(spec.alibi, bool):
            raise SpecError(f"alibi={spec.alibi!r} must be True or False")
        if spec.alibi and spec.is_cross:
            raise SpecError(
                f"alibi=True with d_context={spec.d_context}: ALiBi biases by query-key distance, which "
                f"cross-attention keys do not have. Drop alibi or d_context"
            )

    state_fields = ("alibi_slopes",)

    def head_state(self) -> dict[str, Tensor]:
        return {"alibi_slopes": self.slopes.detach().clone()}

    def load_head_state(self, state: dict[str, Any]) -> None:
        self.slopes.copy_(state["alibi_slopes"])

    @classmethod
    def select_heads(
        cls, spec: SpecFields, state: dict[str, Any], q_heads: Sequence[int], kv_heads: Sequence[int]
    ) -> dict[str, Any]:
        return {"alibi_slopes": take_blocks(state["alibi_slopes"], q_heads, spec.heads)}

    def score_bias(self, q_pos: Tensor, k_pos: Tensor, dtype: torch.dtype) -> Tensor | None:
        rel = (-relative_distance(q_pos, k_pos)).to(torch.float32)  # j - i
        dist = rel if self.spec.causal else -rel.abs()
        return (rearrange(self.slopes, "h -> 1 h 1 1") * dist).to(dtype)

    def gqa_bias(self, g: GraphBuilder) -> str | None:
        slopes = g.const(rearrange(self.slopes, "h -> 1 h 1 1"), "alibi_slopes", "float32")
        rel = g.op("Unsqueeze", g.distance(), g.const([1], "i", "int64"))  # i - j: (b|1, 1, t, s)
        dist = g.op("Neg", rel if self.spec.causal else g.op("Abs", rel))  # j - i, or -|i - j|
        return g.op("Mul", slopes, dist)

    @classmethod
    def audit(cls, m: nn.Module, x: Tensor) -> tuple[str, bool, str]:
        spec = m.spec
        have = sorted(m.mods["alibi"].slopes.tolist())
        want = sorted(alibi_slopes(spec.heads))
        err = max(abs(a - b) for a, b in zip(have, want))
        title, ok, detail = relative_positions_audit(m, x, "alibi")
        first = ", ".join(f"{v:.4g}" for v in alibi_slopes(spec.heads)[:4])
        return (
            "alibi: slopes and relative positions",
            ok and err < 1e-6,
            f"slopes {first}, ... (as a set, max err vs Press/BLOOM {err:.1e}); {detail}",
        )

    @classmethod
    def reference_bias(cls, spec: SpecFields, head: int, p: Any, t: int, s: int) -> Tensor | None:
        slope = float(p.alibi_slopes[head])
        return torch.tensor([[cls.reference(spec, slope, i, j) for j in range(s)] for i in range(t)])

    @staticmethod
    def reference(spec: SpecFields, slope: float, i: int, j: int) -> float:
        return slope * (j - i) if spec.causal else -slope * abs(i - j)
