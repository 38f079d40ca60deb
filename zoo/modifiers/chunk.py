"""Chunked local attention (Llama 4's `attention_chunk_size`): the positions are cut into fixed chunks
of `chunk`, and a query sees only the keys of its own chunk (and, causal, at or before it)."""

from __future__ import annotations

import torch
from einops import rearrange
from torch import Tensor, nn

from ..errors import SpecError
from ..spec_fields import SpecFields
from .base import Modifier
from .graph import GraphBuilder


def same_chunk(q_pos: Tensor, k_pos: Tensor, chunk: int) -> Tensor:
    """The chunk rule, written once: q_pos (b|1, t), k_pos (b|1, s) -> bool (b|1, 1, t, s), True where
    floor(i / chunk) == floor(j / chunk)."""
    return rearrange(torch.div(q_pos, chunk, rounding_mode="floor"), "b t -> b 1 t 1") == rearrange(
        torch.div(k_pos, chunk, rounding_mode="floor"), "b s -> b 1 1 s"
    )


class Chunk(Modifier):
    """Query i sees key j iff i // chunk == j // chunk (a causal block also needs j <= i): positions
    0..chunk-1 are one chunk, chunk..2*chunk-1 the next. Unlike a sliding window, the first query of a
    chunk sees only itself. Positions are absolute (a decode step's, a row's real-key count under a
    key_mask), so decode gives the forward's rows."""

    name = "chunk"
    label = "chunked attention"
    fields = ("chunk",)
    shapes_scores = True

    @classmethod
    def active(cls, spec: SpecFields) -> bool:
        return spec.chunk is not None

    @classmethod
    def check(cls, spec: SpecFields) -> None:
        c = spec.chunk
        if c is None:
            return
        if isinstance(c, bool) or not isinstance(c, int) or not 0 < c < 2**31:
            raise SpecError(
                f"chunk={c!r} must be an integer in 1..2**31-1 (positions per chunk; Llama 4: 8192) or None"
            )
        if spec.window is not None:
            raise SpecError(
                f"chunk={c} with window={spec.window}: a layer has chunks or a sliding window (Llama 4's layers "
                f"have one or none), not both; drop one"
            )
        if spec.is_cross:
            raise SpecError(
                f"chunk={c} with d_context={spec.d_context}: chunks compare query and key positions of one "
                f"sequence (self-attention only); drop chunk or d_context"
            )

    @classmethod
    def describe(cls, spec: SpecFields) -> str:
        return f"chunk={spec.chunk}"

    def score_allowed(self, q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
        return same_chunk(q_pos, k_pos, self.spec.chunk)

    @classmethod
    def reference_allowed(cls, spec: SpecFields, t: int, s: int) -> Tensor | None:
        c = spec.chunk
        return torch.tensor([[i // c == j // c for j in range(s)] for i in range(t)], dtype=torch.bool)

    # GroupQueryAttention has no chunk attribute (local_window_size slides): the rule goes in as a
    # term of its attention_bias (0 / -inf) and of the allowed-keys rule after it.
    def _same(self, g: GraphBuilder) -> str:
        q_pos, k_pos = g.pair_positions()
        c = g.const(self.spec.chunk, "chunk", "int64")
        return g.op("Equal", g.op("Div", q_pos, c), g.op("Div", k_pos, c))

    def gqa_bias(self, g: GraphBuilder) -> str | None:
        zero, neg = g.const(0.0, "zero", "float32"), g.const(-float("inf"), "neg_inf", "float32")
        return g.op("Unsqueeze", g.op("Where", self._same(g), zero, neg), g.const([1], "i", "int64"))

    def gqa_allowed(self, g: GraphBuilder) -> str | None:
        return self._same(g)

    @classmethod
    def audit(cls, m: nn.Module, x: Tensor) -> tuple[str, bool, str]:
        """The last query's row: keys of earlier chunks changed leave it alone; its chunk's first key moves it."""
        c, t = m.spec.chunk, x.shape[1]
        last = t - 1
        start = last // c * c  # the first position of the last query's chunk
        y = m(x)[:, -1]
        detail, ok = [], True
        if start > 0:
            x2 = x.clone()
            x2[:, :start] += 1.0
            e_out = (m(x2)[:, -1] - y).abs().max().item()
            ok = e_out < 1e-10
            detail.append(f"keys 0..{start - 1} (earlier chunks) changed: last row moves {e_out:.1e} (must be 0)")
        x3 = x.clone()
        x3[:, start] += 1.0
        e_in = (m(x3)[:, -1] - y).abs().max().item()
        ok = ok and e_in > 1e-6
        detail.append(f"key {start} (its chunk's first) changed: moves {e_in:.1e} (must not be 0)")
        return f"chunk={c}: query i sees keys of chunk i // {c} only", ok, "; ".join(detail)
