"""T5's relative position buckets: a learned per-head bias on the scores, looked up by the bucket of
each key - query distance (Raffel et al.; transformers' `T5Attention._relative_position_bucket`)."""

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
from .graph import GraphLimit


def relative_bucket(rel: Tensor, *, bidirectional: bool, buckets: int, max_distance: int) -> Tensor:
    """The bucket (int64, rel's shape) of each key - query distance `rel` (integers), as T5 numbers them.

    Bidirectional: half the buckets for keys after the query, half for the rest. Within a half, n
    buckets: distances 0..n/2-1 one bucket each, then n/2 buckets of logarithmically wider ranges up to
    max_distance; farther distances share the last one. Unidirectional (causal): all buckets for keys at
    or before the query; later keys fall in bucket 0. The log is taken in fp32, as transformers does, so
    that a distance on a range's edge lands where T5's own code puts it.
    """
    n = buckets
    if bidirectional:
        n //= 2
        base = (rel > 0).long() * n
        dist = rel.abs()
    else:
        base = torch.zeros_like(rel)
        dist = (-rel).clamp_min(0)
    exact = n // 2
    # Distances under `exact` take the other branch of the where: clamping them keeps log(0) out of the graph.
    far = dist.clamp_min(exact).float()
    wide = exact + (torch.log(far / exact) / math.log(max_distance / exact) * (n - exact)).long()
    return base + torch.where(dist < exact, dist, wide.clamp_max(n - 1))


class RelativeBuckets(Modifier):
    """scores[r, i, j] += table[bucket(j - i), r]: a learned table (buckets x heads), T5's position bias.

    Non-causal blocks bucket both directions (T5's encoder); causal blocks only the past (T5's decoder).
    The table is a parameter, so it follows its heads through permute_heads / prune_heads; a fresh
    block draws it from a unit normal (nn.Embedding's default), since a zero table would bias nothing.
    """

    name = "rel_buckets"
    label = "T5 relative buckets"
    fields = ("rel_buckets", "rel_max_distance")
    shapes_scores = True

    def __init__(self, spec: SpecFields) -> None:
        super().__init__(spec)
        self.table = nn.Parameter(torch.randn(spec.rel_buckets, spec.heads))

    @classmethod
    def active(cls, spec: SpecFields) -> bool:
        return spec.rel_buckets is not None

    @staticmethod
    def exact(spec: SpecFields) -> int:
        """The distances below this get a bucket each (per direction)."""
        n = spec.rel_buckets if spec.causal else spec.rel_buckets // 2
        return n // 2

    @classmethod
    def check(cls, spec: SpecFields) -> None:
        nb, md = spec.rel_buckets, spec.rel_max_distance
        if isinstance(md, bool) or not isinstance(md, int) or not 0 < md < 2**31:
            raise SpecError(f"rel_max_distance={md!r} must be an integer in 1..2**31-1 (T5 uses 128)")
        if nb is None:
            if md != 128:
                raise SpecError(f"rel_max_distance={md} needs relative position buckets: set rel_buckets (T5 uses 32)")
            return
        least = 2 if spec.causal else 4  # one exact bucket per direction at least
        if isinstance(nb, bool) or not isinstance(nb, int) or not least <= nb <= 65536:
            raise SpecError(
                f"rel_buckets={nb!r} must be an integer in {least}..65536 "
                f"({'causal' if spec.causal else 'bidirectional: half per direction'}; T5 uses 32) or None"
            )
        if spec.is_cross:
            raise SpecError(
                f"rel_buckets={nb} with d_context={spec.d_context}: the buckets are of query-key distances, which "
                f"cross-attention keys do not have. Drop rel_buckets or d_context"
            )
        if md <= cls.exact(spec):
            raise SpecError(
                f"rel_max_distance={md} must exceed the {cls.exact(spec)} exact distances that rel_buckets={nb} "
                f"gives (the log-spaced buckets span exact..max_distance); raise rel_max_distance"
            )

    @classmethod
    def parameters_added(cls, spec: SpecFields) -> int:
        return spec.rel_buckets * spec.heads if cls.active(spec) else 0

    @classmethod
    def parameters_label(cls, spec: SpecFields) -> str:
        return f"relative bias table ({spec.rel_buckets} buckets x {spec.heads} heads)"

    @classmethod
    def describe(cls, spec: SpecFields) -> str:
        way = "causal" if spec.causal else "bidirectional"
        return f"rel-buckets({spec.rel_buckets}, max_distance={spec.rel_max_distance}, {way})"

    gqa_limit = GraphLimit(
        "the hand-built GroupQueryAttention graph (export/gqa.py) does not build T5's bucketed bias; "
        "use a traced lowering",
        always=True,
    )

    @classmethod
    def gqa_refusal(cls, spec: SpecFields) -> str | None:
        return (
            f"the hand-built GroupQueryAttention graph has no T5 relative-bucket bias "
            f"(rel_buckets={spec.rel_buckets}): T5's bucketed bias needs a traced lowering"
        )

    def buckets(self, rel: Tensor) -> Tensor:
        s = self.spec
        return relative_bucket(rel, bidirectional=not s.causal, buckets=s.rel_buckets, max_distance=s.rel_max_distance)

    def score_bias(self, q_pos: Tensor, k_pos: Tensor, dtype: torch.dtype) -> Tensor | None:
        rel = -relative_distance(q_pos, k_pos)  # j - i: (b|1, 1, t, s)
        values = self.table[self.buckets(rel)]  # (b|1, 1, t, s, h)
        return rearrange(values, "b 1 t s h -> b h t s").to(dtype)

    state_fields = ("rel_bias",)

    def head_state(self) -> dict[str, Tensor]:
        return {"rel_bias": self.table.detach().clone()}

    def load_head_state(self, state: dict[str, Any]) -> None:
        self.table.copy_(state["rel_bias"])

    @classmethod
    def select_heads(
        cls, spec: SpecFields, state: dict[str, Any], q_heads: Sequence[int], kv_heads: Sequence[int]
    ) -> dict[str, Any]:
        return {"rel_bias": take_blocks(state["rel_bias"], q_heads, spec.heads, dim=1)}  # a column per head

    @classmethod
    def audit(cls, m: nn.Module, x: Tensor) -> tuple[str, bool, str]:
        """The module's buckets against the plain reference over distances -3 max_distance..3 max_distance,
        then only distances matter (the relative-positions audit)."""
        spec = m.spec
        reach = 3 * spec.rel_max_distance
        rel = torch.arange(-reach, reach + 1)
        have = m.mods["rel_buckets"].buckets(rel).tolist()
        want = [cls.reference(spec, j) for j in range(-reach, reach + 1)]
        wrong = [j for j, a, b in zip(range(-reach, reach + 1), have, want) if a != b]
        used = len(set(want))
        title, ok, detail = relative_positions_audit(m, x, "rel_buckets")
        return (
            "rel_buckets: T5's buckets and relative positions",
            ok and not wrong,
            f"buckets of distances {-reach}..{reach} vs the plain reference: {len(wrong)} differ"
            + (f" (first at {wrong[0]})" if wrong else "")
            + f", {used} of {spec.rel_buckets} buckets used; {detail}",
        )

    @classmethod
    def reference_bias(cls, spec: SpecFields, head: int, p: Any, t: int, s: int) -> Tensor | None:
        table = p.rel_bias
        return torch.tensor([[float(table[cls.reference(spec, j - i), head]) for j in range(s)] for i in range(t)])

    @staticmethod
    def reference(spec: SpecFields, rel: int) -> int:
        """T5's bucket of one distance rel = j - i, written out with Python ints; the one log in fp32 (numpy
        scalars) as T5 computes it, so that edge distances agree with T5's code."""
        import numpy as np

        n = spec.rel_buckets
        bucket = 0
        if not spec.causal:
            n //= 2
            bucket = n if rel > 0 else 0
            dist = abs(rel)
        else:
            dist = max(-rel, 0)
        exact = n // 2
        if dist < exact:
            return bucket + dist
        f32 = np.float32
        ratio = np.log(f32(dist) / f32(exact)) / f32(math.log(spec.rel_max_distance / exact))
        return bucket + min(exact + int(ratio * f32(n - exact)), n - 1)
