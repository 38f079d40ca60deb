"""Attention temperature tuning (Llama 4's NoPE layers, attn_temperature_tuning): each query scaled by a
factor that grows with the log of its absolute position.

    q_i <- q_i * (1 + attn_scale * log(1 + floor((i + 1) / floor_scale)))

The factor is computed in fp32 from the position, as transformers computes it; positions are absolute
(a decode step's, a row's real-key count under a key_mask), so decode gives the forward's rows.
"""

from __future__ import annotations

import copy

import torch
from einops import rearrange
from torch import Tensor, nn

from ..errors import SpecError
from ..spec_fields import SpecFields
from .base import Modifier, is_number
from .graph import GraphBuilder


def temperature(pos: Tensor, floor_scale: int, attn_scale: float) -> Tensor:
    """The query factor at integer positions `pos`, fp32: 1 + attn_scale * log1p(floor((pos + 1) / floor_scale))."""
    return torch.log1p(torch.floor((pos.float() + 1.0) / floor_scale)) * attn_scale + 1.0


class Temperature(Modifier):
    """q (b h t dk) times temperature(q_pos) per query position, after QK-norm and rotary (Llama 4 applies
    it on its layers without rotary). K and V are untouched, so a cache holds what it held."""

    name = "temperature"
    label = "temperature tuning"
    fields = ("temperature_floor", "temperature_scale")
    # A shift moves every factor: not a relative-position modifier (its audit checks the factor itself).
    shift_tolerance = float("inf")

    @classmethod
    def active(cls, spec: SpecFields) -> bool:
        return spec.temperature_floor is not None

    @classmethod
    def check(cls, spec: SpecFields) -> None:
        f, a = spec.temperature_floor, spec.temperature_scale
        if f is None:
            if a != 0.1:
                raise SpecError(
                    f"temperature_scale={a!r} without temperature_floor: set temperature_floor (Llama 4: 8192)"
                )
            return
        if isinstance(f, bool) or not isinstance(f, int) or not 0 < f < 2**31:
            raise SpecError(
                f"temperature_floor={f!r} must be an integer in 1..2**31-1 (Llama 4's floor_scale: 8192) or None"
            )
        if not is_number(a) or not 0 <= a <= 100:
            raise SpecError(f"temperature_scale={a!r} must be a number in [0, 100] (Llama 4's attn_scale: 0.1)")
        if spec.is_cross:
            raise SpecError(
                f"temperature_floor={f} with d_context={spec.d_context}: the factor follows query positions in one "
                f"sequence (self-attention only); drop one"
            )

    @classmethod
    def describe(cls, spec: SpecFields) -> str:
        return f"temperature(floor={spec.temperature_floor}, scale={spec.temperature_scale:g})"

    def factor(self, pos: Tensor) -> Tensor:
        return temperature(pos, self.spec.temperature_floor, self.spec.temperature_scale)

    def qk_heads(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        return (q * rearrange(self.factor(q_pos), "b t -> b 1 t 1")).to(q.dtype), k

    def gqa_qkv(self, g: GraphBuilder, q: str, k: str, v: str) -> tuple[str, str, str]:
        """Q (b t (h dk)) times the factor of each query position (b|1, t, 1), before the op (the op's rotary
        is linear in Q, so scaling before it is scaling after it)."""
        q_pos, _ = g.pair_positions()  # int64 (b|1, t, 1)
        one = g.const(1.0, "one", "float32")
        steps = g.op("Floor", g.op("Div", g.op("Add", g.cast(q_pos, "float32"), one), g.const(
            float(self.spec.temperature_floor), "floor_scale", "float32")))  # fmt: skip
        factor = g.op("Add", g.op("Mul", g.op("Log", g.op("Add", steps, one)), g.const(
            float(self.spec.temperature_scale), "attn_scale", "float32")), one)  # fmt: skip
        if g.dtype != "float32":
            return g.op("Mul", q, g.cast(factor, g.dtype)), k, v
        return g.op("Mul", q, factor), k, v

    @classmethod
    def reference_qk(cls, spec: SpecFields, q: Tensor, k: Tensor, p, pos: Tensor) -> tuple[Tensor, Tensor]:
        import math

        a, floor = spec.temperature_scale, spec.temperature_floor
        f = [1 + a * math.log(1 + math.floor((int(i) + 1) / floor)) for i in pos[0]]
        return q * torch.tensor(f, dtype=torch.float32).to(q.dtype)[:, None], k

    @classmethod
    def audit(cls, m: nn.Module, x: Tensor) -> tuple[str, bool, str]:
        """Q with the factor over Q without it (the same block, the modifier taken out), at positions that
        pass several floors, is the formula written out."""
        t = x.shape[1]
        f = m.spec.temperature_floor
        pos = torch.arange(t) * max(1, 3 * f // max(t - 1, 1))  # up to ~3 floors
        q = m.run_with_cache(x, positions=pos)[1]["q"]
        plain = copy.deepcopy(m)
        del plain.mods["temperature"]
        q0 = plain.run_with_cache(x, positions=pos)[1]["q"]
        want = cls.reference_qk(m.spec, q0, q0, None, pos[None])[0]
        err = (q - want).abs().max().item()
        return (
            f"temperature(floor={f}, scale={m.spec.temperature_scale:g}): q scaled by position",
            err < 1e-6,
            f"positions 0..{int(pos[-1])}: Q vs Q without it times the written-out factor: max err {err:.1e} "
            f"(fp32 factor)",
        )
