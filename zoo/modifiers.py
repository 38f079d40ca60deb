"""Position and score modifiers: rotary positions, ALiBi, sliding window, logit softcap, QK-norm.

Each modifier is one class that says everything about itself:

    fields          the spec fields it owns (all off by default)
    active(spec)    whether a spec turns it on
    check(spec)     SpecError for an invalid value or combination (called by AttentionSpec)
    parameters      learned entries it adds to the block (RoPE and ALiBi add none)
    describe        its words in `AttentionSpec.describe()`
    head state      what follows a head under permute_heads / prune_heads (zoo/heads.py):
                      state_fields         the zoo.heads.Projections fields that hold it
                      head_state()         read it from the block; load_head_state(state) writes it back
                      select_heads(...)    the state for a subset or reordering of the heads
                      prune_refusal(spec)  why pruning cannot apply (None: it can)
    the eager op    as an nn.Module built into the block, at one of three stages:
                      qk_merged(q, k)                  Q (b t (h dk)), K (b s (g dk)), before the split
                      qk_heads(q, k, q_pos, k_pos)     Q (b h t dk), K (b g s dk), after the split
                      score_allowed / score_bias / score_map   on the (b h t s) scores
    reference_*     the same math written independently (plain loops, float64) for the audit:
                      reference_qk, reference_map, reference_bias, reference_allowed
    audit           its own property check, as an audit step

What a lowering cannot express for a modifier lives on the export side, in each lowering's
record (export/lowerings/), keyed by the modifier's `name`: zoo knows nothing of ONNX.

Positions are integers, q_pos (b|1, t) and k_pos (b|1, s); for self-attention they are the
same tensor (0..t-1 unless the caller gives `positions`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from einops import rearrange
from torch import Tensor, nn

from .errors import SpecError

if TYPE_CHECKING:
    from .spec import AttentionSpec

QK_NORMS = ("head", "full")


def take_blocks(w: Tensor | None, order: Sequence[int], n: int, dim: int = 0) -> Tensor | None:
    """Reorder the n head blocks of w along `dim` (rows for W_Q/K/V and biases, columns for W_O)."""
    if w is None:
        return None
    idx = torch.as_tensor(list(order), device=w.device)
    if dim == 0:
        blocks = rearrange(w, "(n d) ... -> n d ...", n=n)
        return rearrange(blocks[idx], "n d ... -> (n d) ...")
    blocks = rearrange(w, "o (n d) -> n o d", n=n)
    return rearrange(blocks[idx], "n o d -> o (n d)")


@dataclass(frozen=True)
class PruneRefusal:
    """Why prune_heads cannot remove heads under a modifier's setting (zeroing still applies)."""

    setting: str  # the spec's value, as the user wrote it: "qk_norm='full'"
    why: str  # the reason in full, for prune_heads' error
    short: str  # the reason in a few words, for the audit's line


class Modifier(nn.Module):
    """Base: every hook is the identity, every check passes."""

    name: ClassVar[str] = ""
    fields: ClassVar[tuple[str, ...]] = ()
    # A modifier SDPA cannot express (a nonlinear map of the scores) forces the explicit path.
    needs_explicit: ClassVar[bool] = False
    # A modifier that adds a mask or bias from positions: SDPA's plain is_causal cannot stand in.
    shapes_scores: ClassVar[bool] = False

    def __init__(self, spec: AttentionSpec) -> None:
        super().__init__()
        self.spec = spec

    # -- the spec side (class-level: no module needed) ---------------------------------------

    @classmethod
    def active(cls, spec: AttentionSpec) -> bool:
        raise NotImplementedError

    @classmethod
    def check(cls, spec: AttentionSpec) -> None:
        """Raise SpecError naming the fields when the spec's values for this modifier are invalid."""

    @classmethod
    def parameters_added(cls, spec: AttentionSpec) -> int:
        return 0

    @classmethod
    def describe(cls, spec: AttentionSpec) -> str:
        return cls.name

    # -- the eager op (identity unless overridden) ----------------------------------------------

    def qk_merged(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        return q, k

    def qk_heads(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        return q, k

    def score_allowed(self, q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
        """bool (b|1, 1, t, s), True = may attend; None = no opinion."""
        return None

    def score_bias(self, q_pos: Tensor, k_pos: Tensor, dtype: torch.dtype) -> Tensor | None:
        """float (b|1, h, t, s) added to the scaled scores; None = nothing."""
        return None

    def score_map(self, scores: Tensor) -> Tensor:
        """A pointwise map of the scaled scores, before any bias or mask."""
        return scores

    # -- head state (zoo/heads.py) ------------------------------------------------------------------

    # The zoo.heads.Projections fields holding this modifier's learned or per-head state; none by
    # default (its behaviour follows from the spec alone, the same for every head).
    state_fields: ClassVar[tuple[str, ...]] = ()

    def head_state(self) -> dict[str, Tensor]:
        """This block's state, keyed by `state_fields` (detached copies)."""
        return {}

    def load_head_state(self, state: dict[str, Any]) -> None:
        """Write `state` (keyed by `state_fields`) into this block, under torch.no_grad()."""

    @classmethod
    def select_heads(
        cls, spec: AttentionSpec, state: dict[str, Any], q_heads: Sequence[int], kv_heads: Sequence[int]
    ) -> dict[str, Any]:
        """The state of query heads `q_heads` and kv heads `kv_heads` of a block of `spec`, in that
        order (a permutation or a subset); by default nothing is per head."""
        return dict(state)

    @classmethod
    def prune_refusal(cls, spec: AttentionSpec) -> PruneRefusal | None:
        """Why removing heads would change the remaining heads' function under `spec`; None: it would not."""
        return None

    # -- the audit ------------------------------------------------------------------------------

    # The audit's independent reference (zoo/audit.py, "inside each head"), written out without
    # the module's code, stage by stage as the forward applies them: Q and K per head, a map of
    # the scaled scores, a bias on them, the cells a query may see. p holds the block's weights
    # (zoo.heads.Projections); the defaults change nothing.
    @classmethod
    def reference_qk(cls, spec: AttentionSpec, q: Tensor, k: Tensor, p: Any, pos: Tensor) -> tuple[Tensor, Tensor]:
        """q (b h t dk), k (b g s dk) -> the same after this modifier; pos (1 t) positions."""
        return q, k

    @classmethod
    def reference_map(cls, spec: AttentionSpec, scores: Tensor) -> Tensor:
        """One head's scaled scores (b t s), before any bias or mask."""
        return scores

    @classmethod
    def reference_bias(cls, spec: AttentionSpec, head: int, p: Any, t: int, s: int) -> Tensor | None:
        """An additive bias (t s) on head `head`'s scores, or None."""
        return None

    @classmethod
    def reference_allowed(cls, spec: AttentionSpec, t: int, s: int) -> Tensor | None:
        """A bool (t s) of the cells a query may see, or None for all."""
        return None

    @classmethod
    def audit(cls, m: nn.Module, x: Tensor) -> tuple[str, bool, str]:
        """(title, ok, detail): a property of this modifier checked on block m (float64) at x (b t c)."""
        raise NotImplementedError


def _is_number(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)


def _relative(q_pos: Tensor, k_pos: Tensor) -> Tensor:
    """i - j for every (query, key) pair: (b|1, 1, t, s)."""
    return rearrange(q_pos, "b t -> b 1 t 1") - rearrange(k_pos, "b s -> b 1 1 s")


def relative_positions_audit(m: nn.Module, x: Tensor, what: str) -> tuple[str, bool, str]:
    """Only distances matter: every position + 13 gives the same y; reversed positions do not."""
    t = x.shape[1]
    pos = torch.arange(t)
    y = m(x)
    e_shift = (m(x, positions=pos + 13) - y).abs().max().item()
    e_given = (m(x, positions=pos) - y).abs().max().item()
    # Rotary angles are fp32 (as transformers computes them), so a shift moves y by fp32 rounding.
    tol = 1e-6 if "rope" in m.mods else 1e-10
    ok = e_shift < tol and e_given < 1e-12
    return (
        f"{what}: relative positions",
        ok,
        f"positions 0..{t - 1} given vs default {e_given:.1e}; shifted by 13: y moves {e_shift:.1e} (< {tol:g})",
    )


# -- QK-norm ----------------------------------------------------------------------------------


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """x / sqrt(mean(x^2) + eps) * weight over the last axis, in fp32 for half inputs (as HF does)."""
    xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    # Written as a division, not rsqrt: torch's ONNX optimizer fuses the rsqrt form into an opset-23
    # RMSNormalization node whose fp16 output type fails onnx's checker.
    y = xf / torch.sqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight.to(y.dtype)).to(x.dtype)


class QKNorm(Modifier):
    """RMSNorm with a learned weight on Q and K, before RoPE.

    "head": over each head's d_k, one weight (d_k) shared by all heads (Qwen3, Gemma-3).
    "full": over all heads' h*d_k (K: g*d_k) before the split, weights (h dk) and (g dk) (OLMo-2).
    """

    name = "qk_norm"
    fields = ("qk_norm", "qk_norm_eps")

    def __init__(self, spec: AttentionSpec) -> None:
        super().__init__(spec)
        wq, wk = self.widths(spec)
        self.q_norm = nn.Parameter(torch.ones(wq))
        self.k_norm = nn.Parameter(torch.ones(wk))

    @staticmethod
    def widths(spec: AttentionSpec) -> tuple[int, int]:
        if spec.qk_norm == "head":
            return spec.d_k_, spec.d_k_
        return spec.heads * spec.d_k_, spec.kv_heads_ * spec.d_k_

    @classmethod
    def active(cls, spec: AttentionSpec) -> bool:
        return spec.qk_norm is not None

    @classmethod
    def check(cls, spec: AttentionSpec) -> None:
        if spec.qk_norm is not None and spec.qk_norm not in QK_NORMS:
            raise SpecError(f"qk_norm={spec.qk_norm!r} is not one of None, 'head' (per head over d_k), 'full' (h*d_k)")
        eps = spec.qk_norm_eps
        if not _is_number(eps) or not 0 < eps <= 1:
            raise SpecError(f"qk_norm_eps={eps!r} must be a number in (0, 1] (e.g. 1e-6)")

    @classmethod
    def parameters_added(cls, spec: AttentionSpec) -> int:
        return sum(cls.widths(spec)) if cls.active(spec) else 0

    @classmethod
    def describe(cls, spec: AttentionSpec) -> str:
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

    state_fields = ("q_norm", "k_norm")

    def head_state(self) -> dict[str, Tensor]:
        return {"q_norm": self.q_norm.detach().clone(), "k_norm": self.k_norm.detach().clone()}

    def load_head_state(self, state: dict[str, Any]) -> None:
        self.q_norm.copy_(state["q_norm"])
        self.k_norm.copy_(state["k_norm"])

    @classmethod
    def select_heads(
        cls, spec: AttentionSpec, state: dict[str, Any], q_heads: Sequence[int], kv_heads: Sequence[int]
    ) -> dict[str, Any]:
        if spec.qk_norm != "full":  # "head": one weight (d_k) shared by every head
            return dict(state)
        return {
            "q_norm": take_blocks(state["q_norm"], q_heads, spec.heads),
            "k_norm": take_blocks(state["k_norm"], kv_heads, spec.kv_heads_),
        }

    @classmethod
    def prune_refusal(cls, spec: AttentionSpec) -> PruneRefusal | None:
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
    def reference_qk(cls, spec: AttentionSpec, q: Tensor, k: Tensor, p: Any, pos: Tensor) -> tuple[Tensor, Tensor]:
        return cls.reference(spec, q, k, p.q_norm, p.k_norm)

    @staticmethod
    def reference(spec: AttentionSpec, q: Tensor, k: Tensor, wq: Tensor, wk: Tensor) -> tuple[Tensor, Tensor]:
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


# -- rotary positions ---------------------------------------------------------------------------


class Rotary(Modifier):
    """Rotary position embedding on the first `rope_dim` dims of each Q and K head.

    Pair i of a head rotates by angle pos * theta^(-2i/rope_dim). Halves (NeoX/LLaMA):
    pair i is (x[i], x[i + rope_dim/2]); interleaved (GPT-J): pair i is (x[2i], x[2i+1]).
    """

    name = "rope"
    fields = ("rope_theta", "rope_dim", "rope_interleaved")
    HALVES = "... (r n) -> ... n r"  # r = 2: first half, second half
    PAIRS = "... (n r) -> ... n r"  # r = 2: adjacent pairs

    def __init__(self, spec: AttentionSpec) -> None:
        super().__init__(spec)
        self.dim = self.rotated(spec)
        # fp32 always, as transformers computes the angles: a plain attribute, not a buffer, so that
        # block.half() does not round the frequencies (fp16 angles are wrong by ~1 rad at position
        # 40000). It follows from the spec alone, so it is not saved with the weights either.
        self.inv_freq = self.frequencies(spec)

    @staticmethod
    def rotated(spec: AttentionSpec) -> int:
        return spec.rope_dim if spec.rope_dim is not None else spec.d_k_

    @staticmethod
    def frequencies(spec: AttentionSpec) -> Tensor:
        """theta^(-2i/rope_dim) for i < rope_dim/2, in fp32 (the rounding every reference uses)."""
        rd = Rotary.rotated(spec)
        return 1.0 / (spec.rope_theta ** (torch.arange(0, rd, 2, dtype=torch.float32) / rd))

    @classmethod
    def active(cls, spec: AttentionSpec) -> bool:
        return spec.rope_theta is not None

    @classmethod
    def check(cls, spec: AttentionSpec) -> None:
        if not isinstance(spec.rope_interleaved, bool):
            raise SpecError(f"rope_interleaved={spec.rope_interleaved!r} must be True or False")
        if spec.rope_theta is None:
            if spec.rope_dim is not None or spec.rope_interleaved:
                raise SpecError(
                    f"rope_dim={spec.rope_dim} / rope_interleaved={spec.rope_interleaved} need rotary "
                    f"positions: set rope_theta (e.g. 10000.0)"
                )
            return
        if not _is_number(spec.rope_theta) or not 1 < spec.rope_theta <= 1e12:
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

    @classmethod
    def describe(cls, spec: AttentionSpec) -> str:
        rd = cls.rotated(spec)
        part = f"/{spec.d_k_}" if rd != spec.d_k_ else ""
        return f"rope(theta={spec.rope_theta:g}, dim={rd}{part}{', interleaved' if spec.rope_interleaved else ''})"

    def cos_sin(self, pos: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos, sin (b 1 t n) for positions (b t), n = rope_dim / 2, computed in fp32."""
        angles = rearrange(pos.float(), "b t -> b 1 t 1") * self.inv_freq.to(pos.device)
        return angles.cos().to(dtype), angles.sin().to(dtype)

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

    @classmethod
    def audit(cls, m: nn.Module, x: Tensor) -> tuple[str, bool, str]:
        return relative_positions_audit(m, x, "rope")

    @classmethod
    def reference_qk(cls, spec: AttentionSpec, q: Tensor, k: Tensor, p: Any, pos: Tensor) -> tuple[Tensor, Tensor]:
        return cls.reference(spec, q, pos), cls.reference(spec, k, pos)

    @staticmethod
    def reference(spec: AttentionSpec, x: Tensor, pos: Tensor) -> Tensor:
        """x (b n t d) rotated pair by pair, written out (no einops); angles, cos and sin in fp32
        as transformers computes them, the rotation itself in x's dtype."""
        rd = Rotary.rotated(spec)
        freqs = Rotary.frequencies(spec)
        out = x.clone()
        for i in range(rd // 2):
            a, b = (2 * i, 2 * i + 1) if spec.rope_interleaved else (i, i + rd // 2)
            ang = pos.to(torch.float32)[:, None, :] * freqs[i]  # (b 1 t)
            c, s = torch.cos(ang).to(x.dtype), torch.sin(ang).to(x.dtype)
            out[..., a] = x[..., a] * c - x[..., b] * s
            out[..., b] = x[..., a] * s + x[..., b] * c
        return out


# -- ALiBi ----------------------------------------------------------------------------------------


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
    fields = ("alibi",)
    shapes_scores = True

    def __init__(self, spec: AttentionSpec) -> None:
        super().__init__(spec)
        self.register_buffer("slopes", torch.tensor(alibi_slopes(spec.heads), dtype=torch.float32))

    @classmethod
    def active(cls, spec: AttentionSpec) -> bool:
        return bool(spec.alibi)

    @classmethod
    def check(cls, spec: AttentionSpec) -> None:
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
        cls, spec: AttentionSpec, state: dict[str, Any], q_heads: Sequence[int], kv_heads: Sequence[int]
    ) -> dict[str, Any]:
        return {"alibi_slopes": take_blocks(state["alibi_slopes"], q_heads, spec.heads)}

    def score_bias(self, q_pos: Tensor, k_pos: Tensor, dtype: torch.dtype) -> Tensor | None:
        rel = (-_relative(q_pos, k_pos)).to(torch.float32)  # j - i
        dist = rel if self.spec.causal else -rel.abs()
        return (rearrange(self.slopes, "h -> 1 h 1 1") * dist).to(dtype)

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
    def reference_bias(cls, spec: AttentionSpec, head: int, p: Any, t: int, s: int) -> Tensor | None:
        slope = float(p.alibi_slopes[head])
        return torch.tensor([[cls.reference(spec, slope, i, j) for j in range(s)] for i in range(t)])

    @staticmethod
    def reference(spec: AttentionSpec, slope: float, i: int, j: int) -> float:
        return slope * (j - i) if spec.causal else -slope * abs(i - j)


# -- sliding window -------------------------------------------------------------------------------


class Window(Modifier):
    """Query i sees key j iff i - window < j <= i: `window` keys, itself included (HF's convention)."""

    name = "window"
    fields = ("window",)
    shapes_scores = True

    @classmethod
    def active(cls, spec: AttentionSpec) -> bool:
        return spec.window is not None

    @classmethod
    def check(cls, spec: AttentionSpec) -> None:
        w = spec.window
        if w is None:
            return
        if isinstance(w, bool) or not isinstance(w, int) or not 0 < w < 2**31:
            raise SpecError(f"window={w!r} must be an integer in 1..2**31-1 (keys seen, itself included) or None")
        if not spec.causal:
            raise SpecError(f"window={w} needs causal=True (a sliding window looks back only); set causal=true")

    @classmethod
    def describe(cls, spec: AttentionSpec) -> str:
        return f"window={spec.window}"

    @classmethod
    def reference_allowed(cls, spec: AttentionSpec, t: int, s: int) -> Tensor | None:
        return torch.ones(t, s, dtype=torch.bool).triu(-(spec.window - 1))

    def score_allowed(self, q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
        return _relative(q_pos, k_pos) < self.spec.window

    @classmethod
    def audit(cls, m: nn.Module, x: Tensor) -> tuple[str, bool, str]:
        """Changing a token outside the last query's window leaves its output alone; inside, it does not."""
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


# -- softcap --------------------------------------------------------------------------------------


class Softcap(Modifier):
    """scores -> cap * tanh(scores / cap), after scaling and before any bias or mask (Gemma-2)."""

    name = "softcap"
    fields = ("softcap",)
    needs_explicit = True  # SDPA has no hook for a nonlinear map of the scores

    @classmethod
    def active(cls, spec: AttentionSpec) -> bool:
        return spec.softcap is not None

    @classmethod
    def check(cls, spec: AttentionSpec) -> None:
        c = spec.softcap
        if c is not None and (not _is_number(c) or not 0 < c <= 1e4):
            raise SpecError(f"softcap={c!r} must be a number in (0, 1e4] (Gemma-2 uses 50.0) or None")

    @classmethod
    def describe(cls, spec: AttentionSpec) -> str:
        return f"softcap={spec.softcap:g}"

    def score_map(self, scores: Tensor) -> Tensor:
        cap = self.spec.softcap
        return torch.tanh(scores / cap) * cap

    @classmethod
    def reference_map(cls, spec: AttentionSpec, scores: Tensor) -> Tensor:
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
MODIFIERS: tuple[type[Modifier], ...] = (QKNorm, Rotary, ALiBi, Window, Softcap)


def check_spec(spec: AttentionSpec) -> None:
    for mod in MODIFIERS:
        mod.check(spec)


def active(spec: AttentionSpec) -> list[type[Modifier]]:
    return [mod for mod in MODIFIERS if mod.active(spec)]


def parameters_added(spec: AttentionSpec) -> int:
    return sum(mod.parameters_added(spec) for mod in MODIFIERS)


def prune_refusal(spec: AttentionSpec) -> PruneRefusal | None:
    """The first active modifier's reason why prune_heads cannot apply to `spec`, or None."""
    for mod in active(spec):
        refusal = mod.prune_refusal(spec)
        if refusal is not None:
            return refusal
    return None


def build(spec: AttentionSpec) -> nn.ModuleDict:
    """The block's modifier modules, keyed by name, in order of application."""
    return nn.ModuleDict({mod.name: mod(spec) for mod in active(spec)})
