"""Attention sinks (gpt-oss): a learned logit per head that joins each row's softmax denominator.

    A[r, i, j] = exp(S[r, i, j]) / (exp(sink[r]) + sum_j' exp(S[r, i, j']))       (b h t s)

transformers' `GptOssAttention` appends the sink as one more column of the scores, takes the softmax, and
drops that column again; the zoo writes the same in its one softmax rule (zoo/attend.py, `_weights`), so the
explicit, folded and static-cache paths share it. A row's weights then sum to less than 1: the sink takes the
rest, with a value of zero. A row with no allowed key still gets A = 0 (all of it goes to the sink).

SDPA has no input for it, so a block with sinks takes the explicit path. The logits are a parameter (h,),
one per query head, so they follow their heads through permute_heads and prune_heads. A fresh block draws
them from a unit normal (transformers' init draws them from normal(0, initializer_range)): at zero every head
would give the sink the same share.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from einops import rearrange
from torch import Tensor, nn

from ..errors import SpecError
from ..spec_fields import SpecFields
from .base import Modifier
from .graph import GraphBuilder, OpPart


class Sinks(Modifier):
    """One learned softmax logit per query head, `logits` (h,), with a value of zero."""

    name = "sinks"
    label = "attention sinks (`sinks`)"
    fields = ("sinks",)

    def __init__(self, spec: SpecFields) -> None:
        super().__init__(spec)
        self.logits = nn.Parameter(torch.randn(spec.heads))

    @classmethod
    def active(cls, spec: SpecFields) -> bool:
        return spec.sinks is True

    @classmethod
    def check(cls, spec: SpecFields) -> None:
        if not isinstance(spec.sinks, bool):
            raise SpecError(f"sinks={spec.sinks!r} must be True (a learned softmax logit per head, gpt-oss) or False")
        if spec.sinks and spec.kv_lora_rank is not None:
            raise SpecError(
                f"sinks=True with kv_lora_rank={spec.kv_lora_rank}: the latent block's absorbed decode has no sink "
                f"in its softmax, and no model pairs the two; drop sinks or kv_lora_rank"
            )

    @classmethod
    def parameters_added(cls, spec: SpecFields) -> int:
        return spec.heads if cls.active(spec) else 0

    @classmethod
    def parameters_label(cls, spec: SpecFields) -> str:
        return f"sink logits ({spec.heads} heads)"

    # -- the eager op: the shared softmax reads it (zoo/attend.py) ----------------------------------

    def score_sink(self) -> Tensor | None:
        return rearrange(self.logits, "h -> 1 h 1 1")

    # -- the hand-built GroupQueryAttention graph ---------------------------------------------------

    # onnxruntime 1.31's GroupQueryAttention takes `head_sink` (num_heads,): "each head has a smooth factor
    # adding to the denominator of softmax" (its contrib op schema); tests/export/test_gqa.py holds the graph
    # to the eager block, decode included.
    def gqa_op(self, g: GraphBuilder) -> OpPart:
        return OpPart(inputs={"head_sink": g.const(self.logits, "head_sink")})

    # -- head state ---------------------------------------------------------------------------------

    state_fields = ("sinks",)

    def head_state(self) -> dict[str, Tensor]:
        return {"sinks": self.logits.detach().clone()}

    def load_head_state(self, state: dict[str, Any]) -> None:
        self.logits.copy_(state["sinks"])

    @classmethod
    def select_heads(
        cls, spec: SpecFields, state: dict[str, Any], q_heads: Sequence[int], kv_heads: Sequence[int]
    ) -> dict[str, Any]:
        return {"sinks": state["sinks"][torch.as_tensor(list(q_heads), dtype=torch.long)]}  # one per query head

    # -- the audit ----------------------------------------------------------------------------------

    @classmethod
    def reference_sink(cls, spec: SpecFields, head: int, p: Any) -> float | None:
        return float(p.sinks[head])

    @classmethod
    def audit(cls, m: nn.Module, x: Tensor) -> tuple[str, bool, str]:
        """The sink rescales each row of a head by one factor: A = A_plain * (1 - share) with 0 < share < 1,
        where A_plain is the softmax without it (the logits at -1e30: exp underflows to exactly 0); raising
        head r's logit by 3 lowers every row sum of head r and of no other head."""
        logits = m.mods["sinks"].logits
        kept = logits.detach().clone()
        ctx = None
        if m.spec.is_cross:
            rng = torch.Generator().manual_seed(0)
            ctx = torch.randn(x.shape[0], 5, m.spec.d_context, dtype=x.dtype, generator=rng)
        try:
            with torch.no_grad():
                logits.fill_(-1e30)
                _, a_plain = m(x, ctx, need_weights=True)
                logits.copy_(kept)
                _, a = m(x, ctx, need_weights=True)
                logits[0] += 3.0
                _, a_up = m(x, ctx, need_weights=True)
        finally:
            with torch.no_grad():
                logits.copy_(kept)
        has = a_plain.sum(-1) > 0.5  # rows with an allowed key (their plain sums are 1)
        e_plain = (a_plain.sum(-1)[has] - 1).abs().max().item() if has.any() else 0.0
        share = 1 - a.sum(-1)
        e_scale = (a - a_plain * (1 - share)[..., None]).abs().max().item()
        in_range = bool(((share[has] > 0) & (share[has] < 1)).all())
        rows, rows_up = a.sum(-1), a_up.sum(-1)
        lower = bool((rows_up[:, 0][has[:, 0]] < rows[:, 0][has[:, 0]]).all())
        others = (rows_up[:, 1:] - rows[:, 1:]).abs().max().item() if m.spec.heads > 1 else 0.0
        ok = e_plain < 1e-12 and e_scale < 1e-12 and in_range and lower and others < 1e-12
        return (
            "sinks: one share of each row goes to the head's sink",
            ok,
            f"logits at -1e30: row sums - 1 {e_plain:.1e}; A vs A_plain * (1 - share) {e_scale:.1e}, shares in (0, 1): "
            f"{in_range}; head 0's logit + 3: its row sums lower: {lower}, other heads move {others:.1e}",
        )
