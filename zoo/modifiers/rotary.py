"""Rotary positions on Q and K (halves as NeoX/LLaMA, or interleaved pairs as GPT-J)."""

from __future__ import annotations

from typing import Any

import torch
from einops import rearrange
from torch import Tensor, nn

from ..errors import SpecError
from ..spec_fields import SpecFields
from . import rope_scaling
from .base import Modifier, is_number, relative_positions_audit
from .graph import MS_DOMAIN, GraphBuilder, GraphLimit, OpPart


class Rotary(Modifier):
    """Rotary position embedding on the first `rope_dim` dims of each Q and K head.

    Pair i of a head rotates by angle pos * theta^(-2i/rope_dim) / rope_scale. Halves (NeoX/LLaMA):
    pair i is (x[i], x[i + rope_dim/2]); interleaved (GPT-J): pair i is (x[2i], x[2i+1]).
    rope_scale (transformers' rope_type "linear", Gemma-3's global layers: 8) divides the positions,
    which is dividing the frequencies, as transformers does (inv_freq / factor, in fp32).
    rope_scaling ("llama3", "yarn", "longrope", with the rope_* fields of rope_scaling.py) scales the
    frequencies as transformers' rope types do; yarn and longrope multiply cos and sin by an attention
    factor, and longrope picks its long frequencies for a call whose largest position + 1 passes
    rope_original_max (a cached key keeps the rotation of the call that wrote it, as in transformers).
    """

    name = "rope"
    label = "rotary (any `rope_dim`, `rope_scale`, `rope_scaling` llama3 / yarn / longrope)"
    fields = ("rope_theta", "rope_dim", "rope_interleaved", "rope_scale", "rope_scaling", *rope_scaling.ALL)
    # Rotary angles are fp32 (as transformers computes them), so a shift moves y by fp32 rounding.
    shift_tolerance = 1e-6
    HALVES = "... (r n) -> ... n r"  # r = 2: first half, second half
    PAIRS = "... (n r) -> ... n r"  # r = 2: adjacent pairs

    def __init__(self, spec: SpecFields) -> None:
        super().__init__(spec)
        self.dim = self.rotated(spec)
        # fp32 always, as transformers computes the angles: a plain attribute, not a buffer, so that
        # block.half() does not round the frequencies (fp16 angles are wrong by ~1 rad at position
        # 40000). It follows from the spec alone, so it is not saved with the weights either.
        self.inv_freq, self.long_freq = rope_scaling.frequencies(spec, self.dim)
        self.attention = rope_scaling.attention_factor(spec)

    @staticmethod
    def rotated(spec: SpecFields) -> int:
        return spec.rope_dim if spec.rope_dim is not None else spec.d_k_

    @staticmethod
    def frequencies(spec: SpecFields) -> Tensor:
        """theta^(-2i/rope_dim) / rope_scale for i < rope_dim/2, in fp32 (the rounding every reference uses)."""
        return rope_scaling.frequencies(spec, Rotary.rotated(spec))[0]

    @classmethod
    def active(cls, spec: SpecFields) -> bool:
        return spec.rope_theta is not None

    @classmethod
    def check(cls, spec: SpecFields) -> None:
        if not isinstance(spec.rope_interleaved, bool):
            raise SpecError(f"rope_interleaved={spec.rope_interleaved!r} must be True or False")
        if spec.rope_theta is None:
            rope_scaling.check(spec, 0)
            if spec.rope_dim is not None or spec.rope_interleaved or spec.rope_scale is not None:
                raise SpecError(
                    f"rope_dim={spec.rope_dim} / rope_interleaved={spec.rope_interleaved} / "
                    f"rope_scale={spec.rope_scale} need rotary positions: set rope_theta (e.g. 10000.0)"
                )
            return
        sc = spec.rope_scale
        if sc is not None and (not is_number(sc) or not 1 <= sc <= 1e6):
            raise SpecError(
                f"rope_scale={sc!r} must be a number in [1, 1e6] (positions are divided by it; Gemma-3 uses 8.0) "
                f"or None"
            )
        if not is_number(spec.rope_theta) or not 1 < spec.rope_theta <= 1e12:
            raise SpecError(f"rope_theta={spec.rope_theta!r} must be a number in (1, 1e12] (e.g. 10000.0)")
        if spec.is_cross:
            raise SpecError(
                f"rope_theta={spec.rope_theta} with d_context={spec.d_context}: rotary positions need query and "
                f"key positions on one axis; cross-attention keys have none. Drop rope_theta or d_context"
            )
        rd = spec.rope_dim
        if rd is not None:
            if isinstance(rd, bool) or not isinstance(rd, int) or rd <= 0 or rd % 2 or rd > spec.d_k_:
                raise SpecError(f"rope_dim={rd!r} must be an even integer in 2..d_k={spec.d_k_} (or None for all)")
        elif spec.d_k_ % 2:
            raise SpecError(f"rotary positions rotate pairs: d_k={spec.d_k_} is odd; set rope_dim to an even width")
        rope_scaling.check(spec, cls.rotated(spec))

    @classmethod
    def describe(cls, spec: SpecFields) -> str:
        rd = cls.rotated(spec)
        part = f"/{spec.d_k_}" if rd != spec.d_k_ else ""
        scale = f", positions/{spec.rope_scale:g}" if spec.rope_scale is not None else ""
        pairs = ", interleaved" if spec.rope_interleaved else ""
        return f"rope(theta={spec.rope_theta:g}, dim={rd}{part}{pairs}{scale}{rope_scaling.describe(spec)})"

    def cos_sin(self, pos: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos, sin (b 1 t n) for positions (b t), n = rope_dim / 2, computed in fp32 (times the attention
        factor, in fp32, before the cast: transformers' order)."""
        inv = self.inv_freq.to(pos.device)
        if self.long_freq is not None:  # longrope: one set for the whole call, by its largest position
            longer = pos.max() + 1 > self.spec.rope_original_max
            inv = torch.where(longer, self.long_freq.to(pos.device), inv)
        angles = rearrange(pos.float(), "b t -> b 1 t 1") * inv
        cos, sin = angles.cos(), angles.sin()
        if self.attention != 1.0:
            cos, sin = cos * self.attention, sin * self.attention
        return cos.to(dtype), sin.to(dtype)

    def rotate(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        rot, rest = x[..., : self.dim], x[..., self.dim :]
        pattern = self.PAIRS if self.spec.rope_interleaved else self.HALVES
        pairs = rearrange(rot, pattern, r=2)
        a, b = pairs[..., 0], pairs[..., 1]
        turned = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1)
        back = "... n r -> ... (n r)" if self.spec.rope_interleaved else "... n r -> ... (r n)"
        return torch.cat((rearrange(turned, back), rest), dim=-1)

    def qk_heads(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        cq, sq = self.cos_sin(q_pos, q.dtype)
        ck, sk = (cq, sq) if k_pos is q_pos else self.cos_sin(k_pos, k.dtype)
        return self.rotate(q, cq, sq), self.rotate(k, ck, sk)

    # The hand-built graph rotates Q and K before GroupQueryAttention (com.microsoft RotaryEmbedding, any
    # rope_dim), from one cos/sin table per call; in a whole model the op rotates them itself.
    gqa_limit = GraphLimit("not longrope")
    # GroupQueryAttention's own rotary (do_rotary) takes cos/sin tables of (rope_dim / 2) columns, a
    # multiple of 8, and heads a multiple of 16 (group_query_attention_helper.h, CheckInputs).
    INSIDE_COLUMNS, INSIDE_HEAD = 8, 16

    @classmethod
    def gqa_refusal(cls, spec: SpecFields) -> str | None:
        if spec.rope_scaling == "longrope":
            return (
                "rope_scaling='longrope' picks its frequencies by the call's largest position (of each row's real "
                "keys, under a key mask); the hand-built graph builds one cos/sin table per call from one set of "
                "frequencies; use the traced lowerings"
            )
        return None

    def _tables(self, g: GraphBuilder) -> tuple[str, str]:
        """cos, sin (s, rope_dim / 2) for the key positions 0..s-1, times the attention factor, in the graph's type:
        constants of g.max_positions rows where the builder fixes them (the eager block's own cos_sin, done once
        at export: a Cos and a Sin over every position cost a decode step more than the op's attention at a short
        past), otherwise computed each call. (longrope, whose set depends on the call, never reaches here: the
        hand-built graph refuses it.)"""
        rows = g.max_positions
        if rows is not None:
            cos, sin = self.cos_sin(torch.arange(rows)[None], torch.float32)  # (1 1 rows n)
            return g.const(cos[0, 0], "rope_cos"), g.const(sin[0, 0], "rope_sin")
        angles = g.op(
            "Mul",
            g.op("Unsqueeze", g.positions(), g.const([1], "i", "int64")),
            g.const(self.inv_freq, "inv_freq", "float32"),
        )
        cos, sin = g.op("Cos", angles), g.op("Sin", angles)
        if self.attention != 1.0:  # yarn / longrope: cos and sin times the attention factor, in fp32
            factor = g.const(self.attention, "rope_attention", "float32")
            cos, sin = g.op("Mul", cos, factor), g.op("Mul", sin, factor)
        if g.dtype != "float32":
            cos, sin = g.cast(cos, g.dtype), g.cast(sin, g.dtype)
        return cos, sin

    def gqa_qkv(self, g: GraphBuilder, q: str, k: str, v: str) -> tuple[str, str, str]:
        """Q and K rotated before the op (com.microsoft RotaryEmbedding), each token at its own position: a
        left-padded row counts its real tokens, as the eager block does, so the cache the op writes is the
        eager one (the op's own rotary, do_rotary, takes one position for every row of a first prompt).
        QK-norm before and the weightless norm and temperature after come in the eager order (MODIFIERS)."""
        cos, sin = self._tables(g)
        pos = g.call_positions()
        s = self.spec
        attrs = {"interleaved": int(s.rope_interleaved), "rotary_embedding_dim": self.rotated(s), "domain": MS_DOMAIN}
        q = g.op("RotaryEmbedding", q, pos, cos, sin, num_heads=s.heads, **attrs)
        k = g.op("RotaryEmbedding", k, pos, cos, sin, num_heads=s.kv_heads_, **attrs)
        return q, k, v

    def gqa_inside(self, g: GraphBuilder) -> OpPart | None:
        """In a whole model, the op rotates Q and K itself (do_rotary), each token at its cache slot: no
        Split, no RotaryEmbedding nodes. Attention reads only i - j, so a left-padded row attends as it
        does at its positions (its cache holds its keys rotated at their slots)."""
        if (self.dim // 2) % self.INSIDE_COLUMNS or self.spec.d_k_ % self.INSIDE_HEAD:
            return None
        cos, sin = self._tables(g)
        return OpPart(
            attributes={"do_rotary": 1, "rotary_interleaved": int(self.spec.rope_interleaved)},
            inputs={"cos_cache": cos, "sin_cache": sin},
        )

    @classmethod
    def audit(cls, m: nn.Module, x: Tensor) -> tuple[str, bool, str]:
        title, ok, detail = relative_positions_audit(m, x, "rope")
        if m.spec.rope_scaling is not None:
            return cls.audit_scaling(m, x, ok, detail)
        sc = m.spec.rope_scale
        if sc is None:
            return title, ok, detail
        # Linear scaling: position p rotates as p / scale would without it. Written out in float64:
        # the block's angles at p against theta^(-2i/d) * p / scale.
        rd = cls.rotated(m.spec)
        i = torch.arange(0, rd, 2, dtype=torch.float64)
        pos = torch.arange(x.shape[1], dtype=torch.float64)
        want = pos[:, None] / sc * m.spec.rope_theta ** (-i / rd)
        have = pos[:, None] * m.mods["rope"].inv_freq.double()
        err = (have - want).abs().max().item()
        return (
            f"rope: positions / {sc:g} and relative positions",
            ok and err < 1e-5,
            f"angles at positions 0..{x.shape[1] - 1} vs theta^(-2i/d) * p / {sc:g}: max err {err:.1e} (fp32); "
            + detail,
        )

    @classmethod
    def audit_scaling(cls, m: nn.Module, x: Tensor, ok: bool, detail: str) -> tuple[str, bool, str]:
        """The block's fp32 frequencies against the kind's formula written out pair by pair in float64."""
        spec, mod, t = m.spec, m.mods["rope"], x.shape[1]
        rd, om = cls.rotated(spec), spec.rope_original_max
        sets = [(mod.inv_freq, 1)] + ([(mod.long_freq, om + 1)] if mod.long_freq is not None else [])
        err = 0.0
        for have, longest in sets:
            want = torch.tensor(rope_scaling.reference_frequencies(spec, rd, longest)[0], dtype=torch.float64)
            err = max(err, ((have.double() - want).abs() / want).max().item())
        if mod.long_freq is not None and t <= om < t + 13:  # the shift by 13 crosses the switch: y moves
            ok, detail = True, f"shift not checked (positions 0..{t + 12} cross original_max {om})"
        return (
            f"rope: {spec.rope_scaling} frequencies and relative positions",
            ok and err < 1e-5,
            f"{spec.rope_scaling} inverse frequencies vs the formula in float64: max rel err {err:.1e} (fp32); "
            + detail,
        )

    @classmethod
    def reference_qk(cls, spec: SpecFields, q: Tensor, k: Tensor, p: Any, pos: Tensor) -> tuple[Tensor, Tensor]:
        return cls.reference(spec, q, pos), cls.reference(spec, k, pos)

    @staticmethod
    def reference(spec: SpecFields, x: Tensor, pos: Tensor) -> Tensor:
        """x (b n t d) rotated pair by pair, written out (no einops); angles, cos and sin in fp32
        as transformers computes them, the rotation itself in x's dtype."""
        rd = Rotary.rotated(spec)
        freqs, long = rope_scaling.frequencies(spec, rd)
        if long is not None and int(pos.max()) + 1 > spec.rope_original_max:
            freqs = long
        att = rope_scaling.attention_factor(spec)
        out = x.clone()
        for i in range(rd // 2):
            a, b = (2 * i, 2 * i + 1) if spec.rope_interleaved else (i, i + rd // 2)
            ang = pos.to(torch.float32)[:, None, :] * freqs[i]  # (b 1 t)
            c, s = torch.cos(ang), torch.sin(ang)
            if att != 1.0:
                c, s = c * att, s * att
            c, s = c.to(x.dtype), s.to(x.dtype)
            out[..., a] = x[..., a] * c - x[..., b] * s
            out[..., b] = x[..., a] * s + x[..., b] * c
        return out
