"""The gated attention output (Qwen3-Next): each head's Z multiplied, elementwise, by a sigmoid gate
computed from the same x, before W_O.

    G = sigmoid(x W_G (+ b_G))          (b t (h dv)): one gate per output channel of each head
    Z' = Z * G                          (b h t dv), then Z' W_O as usual

transformers' Qwen3NextAttention holds W_G inside its q_proj (each head's rows [q | gate], 2 * head_dim
wide); the zoo keeps it as the block's own projection `gate_proj` (c -> (h dv)), and peers/ splits and
joins the rows when it reads or writes the module.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from ..errors import SpecError
from ..spec_fields import SpecFields
from .base import Modifier, take_blocks
from .graph import GraphBuilder

GATE_HEADS = "b t (h d) -> b h t d"


class OutputGate(Modifier):
    """Z * sigmoid(x W_G + b_G) per head and channel, after attention and before W_O (and before
    head_mask, whose named location "z" sees the gated Z). W_G's rows are head-major (h dv), so a
    head's gate follows it under permute_heads and prune_heads; its bias exists when the spec has biases."""

    name = "gate"
    label = "output gate"
    fields = ("output_gate",)

    def __init__(self, spec: SpecFields) -> None:
        super().__init__(spec)
        self.gate_proj = nn.Linear(spec.d_model, spec.heads * spec.d_v_, bias=spec.bias)

    @classmethod
    def active(cls, spec: SpecFields) -> bool:
        return spec.output_gate is True

    @classmethod
    def check(cls, spec: SpecFields) -> None:
        if not isinstance(spec.output_gate, bool):
            raise SpecError(f"output_gate={spec.output_gate!r} must be True or False")

    @classmethod
    def parameters_added(cls, spec: SpecFields) -> int:
        if not cls.active(spec):
            return 0
        width = spec.heads * spec.d_v_
        return spec.d_model * width + (width if spec.bias else 0)

    @classmethod
    def parameters_label(cls, spec: SpecFields) -> str:
        bias = " + bias" if spec.bias else ""
        return f"output gate W_G ({spec.d_model} x {spec.heads}*{spec.d_v_}{bias})"

    @classmethod
    def describe(cls, spec: SpecFields) -> str:
        return "gate=sigmoid(x W_G) on Z"

    # -- the eager op -----------------------------------------------------------------------------

    def gate(self, x: Tensor) -> Tensor:
        """sigmoid(x W_G + b_G) per head: (b h t dv)."""
        return rearrange(torch.sigmoid(self.gate_proj(x)), GATE_HEADS, h=self.spec.heads)

    def z_heads(self, z: Tensor, x: Tensor) -> Tensor:
        return z * self.gate(x).to(z.dtype)

    def gqa_z(self, g: GraphBuilder, x: str, z: str) -> str:
        w = g.const(self.gate_proj.weight.detach().T, "gate_w")
        logits = g.op("MatMul", x, w)
        if self.gate_proj.bias is not None:
            logits = g.op("Add", logits, g.const(self.gate_proj.bias.detach(), "gate_b"))
        return g.op("Mul", z, g.op("Sigmoid", logits))

    # -- head state -------------------------------------------------------------------------------

    state_fields = ("w_gate", "b_gate")

    def head_state(self) -> dict[str, Tensor]:
        b = self.gate_proj.bias
        return {"w_gate": self.gate_proj.weight.detach().clone(), "b_gate": None if b is None else b.detach().clone()}

    def load_head_state(self, state: dict[str, Any]) -> None:
        self.gate_proj.weight.copy_(state["w_gate"])
        if self.gate_proj.bias is not None:
            self.gate_proj.bias.copy_(state["b_gate"])

    @classmethod
    def select_heads(
        cls, spec: SpecFields, state: dict[str, Any], q_heads: Sequence[int], kv_heads: Sequence[int]
    ) -> dict[str, Any]:
        h = spec.heads
        return {"w_gate": take_blocks(state["w_gate"], q_heads, h), "b_gate": take_blocks(state["b_gate"], q_heads, h)}

    # -- the audit --------------------------------------------------------------------------------

    @classmethod
    def reference_z(cls, spec: SpecFields, z: Tensor, x: Tensor, p: Any) -> Tensor:
        """Z merged (b t (h dv)) times 1 / (1 + exp(-(x W_G^T + b_G))), written out."""
        logits = x @ p.w_gate.T + (0 if p.b_gate is None else p.b_gate)
        return z / (1 + torch.exp(-logits))

    @classmethod
    def audit(cls, m: nn.Module, x: Tensor) -> tuple[str, bool, str]:
        """Z with the gate over Z without it (the same block, the gate taken out) is sigmoid(x W_G + b_G),
        in (0, 1) everywhere; and the gate reads x, not the keys."""
        ctx = None
        if m.spec.d_context is not None:  # cross-attention: K and V come from a context
            gen = torch.Generator().manual_seed(0)
            ctx = torch.randn(*x.shape[:2], m.spec.d_context, generator=gen, dtype=x.dtype).to(x.device)
        from_run = m.run_with_cache(x, ctx)[1]["z"]
        open_block = copy.deepcopy(m)
        del open_block.mods["gate"]
        plain = open_block.run_with_cache(x, ctx)[1]["z"]
        mod = m.mods["gate"]
        logits = F.linear(x, mod.gate_proj.weight, mod.gate_proj.bias)
        want = rearrange(torch.sigmoid(logits), GATE_HEADS, h=m.spec.heads)
        err = (from_run - plain * want).abs().max().item()
        inside = bool(((want > 0) & (want < 1)).all())
        return (
            "output gate: Z * sigmoid(x W_G + b_G) per head and channel",
            err < 1e-10 and inside,
            f"gated Z vs ungated Z times the gate written out: max err {err:.1e}; gate in (0, 1): {inside}; "
            f"{cls.parameters_added(m.spec):,} parameters",
        )
