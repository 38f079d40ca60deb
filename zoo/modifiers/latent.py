"""Multi-head latent attention (DeepSeek-V2/V3, MiniCPM3, Kimi-K2): keys and values from one shared latent.

    x (b t c) --kv_a--> [latent (b t r) | k_rot (b t dr)]      r = kv_lora_rank, dr = rope_dim
    latent = RMSNorm(latent)                                    what a decode cache keeps, with rotary(k_rot)
    latent --kv_b--> per head [k_nope (dn) | v (dv)]            dn = d_k - dr
    K_head = [rotary(k_rot) | k_nope_head]                      the rotary key is shared by every head
    Q = x --q_proj--> or x --q_a--> RMSNorm --q_b-->  (b t (h d_k)), each head [q_nope | q_rot] as the model stores it

The zoo puts each head's rotary part first ([q_rot | q_nope], [k_rot | k_nope]: the same dot products), so the
block's own rotary modifier turns the leading rope_dim dims. The full-sequence forward expands K and V per head
(as transformers does); a decode step keeps the latent and the rotary key per position and attends in the
absorbed form: kv_b's key rows folded into the query (q_nope W_UK -> width r), its value rows into the output
(Z W_UV -> width dv, then out_proj), so the step reads (b 1 s dr + r) keys and (b 1 s r) values.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from einops import rearrange, repeat
from torch import Tensor, nn

from ..attend import explicit_attention, folded_attention, fused_attention, repeat_kv
from ..errors import SpecError
from ..spec_fields import SpecFields
from .base import Modifier, is_number, take_blocks
from .graph import GraphLimit
from .qk_norm import rms_norm

HEADS = "b t (h d) -> b t h d"
MERGE = "b t h d -> b t (h d)"
# the modifiers a latent block takes besides its own: rotary (required) and the sliding window
_WITH = ("rope_theta", "rope_dim", "rope_interleaved", "rope_scale", "window")


class Latent(Modifier):
    """K and V up from one RMS-normed latent; the query from x directly or through its own low-rank latent."""

    name = "latent"
    label = "latent attention (`kv_lora_rank`, `q_lora_rank`)"
    fields = ("kv_lora_rank", "q_lora_rank", "latent_eps")
    gqa_limit = GraphLimit("keys and values come up from a latent inside the block", always=True)

    @classmethod
    def gqa_refusal(cls, spec: SpecFields) -> str | None:
        return (
            f"GroupQueryAttention takes per-kv-head keys and values, and its cache holds them; latent attention "
            f"(kv_lora_rank={spec.kv_lora_rank}) makes them inside the block from a latent, and its cache holds the "
            f"latent: use a traced lowering"
        )

    def __init__(self, spec: SpecFields) -> None:
        super().__init__(spec)
        c, h, dk, dv, r, dr = spec.d_model, spec.heads, spec.d_k_, spec.d_v_, spec.kv_lora_rank, spec.rope_dim
        self.nope = dk - dr
        if spec.q_lora_rank is not None:
            self.q_a_proj = nn.Linear(c, spec.q_lora_rank, bias=False)
            self.q_a_norm = nn.Parameter(torch.ones(spec.q_lora_rank))
            self.q_b_proj = nn.Linear(spec.q_lora_rank, h * dk, bias=False)
        self.kv_a_proj = nn.Linear(c, r + dr, bias=False)
        self.kv_a_norm = nn.Parameter(torch.ones(r))
        self.kv_b_proj = nn.Linear(r, h * (self.nope + dv), bias=False)

    # -- the spec side ------------------------------------------------------------------------------

    @classmethod
    def active(cls, spec: SpecFields) -> bool:
        return spec.kv_lora_rank is not None

    @classmethod
    def check(cls, spec: SpecFields) -> None:
        if not is_number(spec.latent_eps) or not 0 < spec.latent_eps <= 1:
            raise SpecError(f"latent_eps={spec.latent_eps!r} must be a number in (0, 1] (e.g. 1e-6)")
        if spec.kv_lora_rank is None:
            if spec.q_lora_rank is not None:
                raise SpecError(
                    f"q_lora_rank={spec.q_lora_rank} is the query's low rank under a KV latent: set kv_lora_rank "
                    f"(e.g. 512) or drop q_lora_rank"
                )
            return
        for name in ("kv_lora_rank", "q_lora_rank"):
            v = getattr(spec, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v <= 0):
                raise SpecError(f"{name}={v!r} must be a positive integer")
        if spec.rope_theta is None or spec.rope_dim is None or spec.rope_dim >= spec.d_k_:
            raise SpecError(
                f"kv_lora_rank={spec.kv_lora_rank} needs the decoupled rotary part: rope_theta set and rope_dim "
                f"(qk_rope_head_dim) below d_k={spec.d_k_} (got rope_theta={spec.rope_theta}, "
                f"rope_dim={spec.rope_dim})"
            )
        bad = {
            "kv_heads": spec.kv_heads not in (None, spec.heads),
            "layout": spec.layout != "separate",
            "bias": spec.bias,
            "d_context": spec.is_cross,
        }
        others = ("alibi", "rel_buckets", "softcap", "qk_norm", "clip_qkv")
        bad.update({name: getattr(spec, name) is not None and getattr(spec, name) is not False for name in others})
        named = [f"{k}={getattr(spec, k)!r}" for k, on in bad.items() if on]
        if named:
            raise SpecError(
                f"kv_lora_rank={spec.kv_lora_rank} (latent attention) with {', '.join(named)}: a latent block is "
                f"self-attention with every head reading the latent (kv_heads None), separate layout, no biases "
                f"(transformers' attention_bias=False), and of the other modifiers only {', '.join(_WITH)}"
            )

    @classmethod
    def parameters_added(cls, spec: SpecFields) -> int:
        if not cls.active(spec):
            return 0
        c, h, dk, dv, r, dr = spec.d_model, spec.heads, spec.d_k_, spec.d_v_, spec.kv_lora_rank, spec.rope_dim
        rq = spec.q_lora_rank
        query = 0 if rq is None else c * rq + rq + rq * h * dk
        return query + c * (r + dr) + r + r * h * (dk - dr + dv)

    @classmethod
    def parameters_label(cls, spec: SpecFields) -> str:
        q = "" if spec.q_lora_rank is None else f"q_a {spec.q_lora_rank} + its norm + q_b; "
        return f"latent weights ({q}kv_a {spec.kv_lora_rank}+{spec.rope_dim} + its norm + kv_b)"

    @classmethod
    def describe(cls, spec: SpecFields) -> str:
        q = "" if spec.q_lora_rank is None else f", q_rank={spec.q_lora_rank}"
        return f"latent(kv_rank={spec.kv_lora_rank}{q})"

    # -- the projections -------------------------------------------------------------------------------

    def query(self, x: Tensor, q_proj: nn.Module | None) -> Tensor:
        """Q (b t (h dk)), each head's rotary part first."""
        if self.spec.q_lora_rank is None:
            q = q_proj(x)
        else:
            q = self.q_b_proj(rms_norm(self.q_a_proj(x), self.q_a_norm, self.spec.latent_eps))
        q = rearrange(q, HEADS, h=self.spec.heads)
        return rearrange(torch.cat((q[..., self.nope :], q[..., : self.nope]), dim=-1), MERGE)

    def latent(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """The normalized latent (b t r) and the rotary key before rotation (b t dr)."""
        kv = self.kv_a_proj(x)
        r = self.spec.kv_lora_rank
        return rms_norm(kv[..., :r], self.kv_a_norm, self.spec.latent_eps), kv[..., r:]

    def project(self, x: Tensor, q_proj: nn.Module | None) -> tuple[Tensor, Tensor, Tensor]:
        """Q (b t (h dk)), K (b t (h dk)), V (b t (h dv)) expanded from the latent, rotary parts first."""
        h = self.spec.heads
        c, k_rot = self.latent(x)
        kv = rearrange(self.kv_b_proj(c), HEADS, h=h)
        k = torch.cat((repeat(k_rot, "b t d -> b t h d", h=h), kv[..., : self.nope]), dim=-1)
        return self.query(x, q_proj), rearrange(k, MERGE), rearrange(kv[..., self.nope :], MERGE)

    def cached_heads(self, x: Tensor, q_proj: nn.Module | None, rope: Modifier, pos: Tensor) -> tuple[Tensor, ...]:
        """A decode step's Q (b h t dk) after rotary, and what the cache keeps of x: the rotary key
        (b 1 t dr), rotated, and the normalized latent (b 1 t r)."""
        q = rearrange(self.query(x, q_proj), "b t (h d) -> b h t d", h=self.spec.heads)
        c, k_rot = self.latent(x)
        q, k_rot = rope.qk_heads(q, rearrange(k_rot, "b t d -> b 1 t d"), pos, pos)
        return q, k_rot, rearrange(c, "b t r -> b 1 t r")

    def absorbed(
        self, q: Tensor, k_rot: Tensor, c: Tensor, allowed: Tensor, bias: Tensor | None, *, kernel: str, fp32: bool
    ) -> Tensor:
        """Z (b h t dv) from Q (b h t dk) against the cached rotary keys (b 1 s dr) and latents (b 1 s r):
        kv_b's key rows folded into the query, its value rows applied to the attended latent, so every
        query head reads the one latent "kv head". kernel: "folded" (a static cache: zoo.attend's
        folded_attention), "fused" (SDPA, sharing the kv head) or "explicit"."""
        s = self.spec
        w = rearrange(self.kv_b_proj.weight, "(h e) r -> h e r", h=s.heads)
        q_latent = torch.einsum("b h t n, h n r -> b h t r", q[..., s.rope_dim :], w[:, : self.nope])
        q, k = torch.cat((q[..., : s.rope_dim], q_latent), dim=-1), torch.cat((k_rot, c), dim=-1)
        if kernel == "folded":
            z = folded_attention(q, k, c, s.scale_, allowed, bias)
        elif kernel == "fused":
            z = fused_attention(q, k, c, s.scale_, allowed, bias, causal_only=False, gqa=True, fp32=fp32)
        else:
            z, _ = explicit_attention(q, repeat_kv(k, s.heads), repeat_kv(c, s.heads), s.scale_, allowed, bias)
        return torch.einsum("b h t r, h v r -> b h t v", z, w[:, self.nope :])

    # -- head state --------------------------------------------------------------------------------------

    state_fields = ("q_a", "q_a_norm", "q_b", "kv_a", "kv_a_norm", "kv_b")

    def _held(self) -> dict[str, Tensor | None]:
        lora = self.spec.q_lora_rank is not None
        return {
            "q_a": self.q_a_proj.weight if lora else None,
            "q_a_norm": self.q_a_norm if lora else None,
            "q_b": self.q_b_proj.weight if lora else None,
            "kv_a": self.kv_a_proj.weight,
            "kv_a_norm": self.kv_a_norm,
            "kv_b": self.kv_b_proj.weight,
        }

    def head_state(self) -> dict[str, Tensor]:
        return {k: None if v is None else v.detach().clone() for k, v in self._held().items()}

    def load_head_state(self, state: dict[str, Any]) -> None:
        for key, held in self._held().items():
            if held is not None:
                held.copy_(state[key])

    @classmethod
    def select_heads(
        cls, spec: SpecFields, state: dict[str, Any], q_heads: Sequence[int], kv_heads: Sequence[int]
    ) -> dict[str, Any]:
        """q_b's rows and kv_b's rows follow their head; the latents are shared by every head."""
        out = dict(state)
        out["q_b"] = take_blocks(state["q_b"], q_heads, spec.heads)
        out["kv_b"] = take_blocks(state["kv_b"], q_heads, spec.heads)
        return out

    # -- the audit -----------------------------------------------------------------------------------------

    @classmethod
    def reference_project(cls, spec: SpecFields, x: Tensor, p: Any) -> tuple[Tensor, Tensor, Tensor] | None:
        """Per head, written out from the weights as the model stores them: Q, K rotary part first."""
        h, dk, dr, r, eps = spec.heads, spec.d_k_, spec.rope_dim, spec.kv_lora_rank, spec.latent_eps
        nope, dv = dk - dr, spec.d_v_

        def norm(z: Tensor, w: Tensor) -> Tensor:
            return z / torch.sqrt((z * z).mean(-1, keepdim=True) + eps) * w

        q_all = x @ p.w_q.T if spec.q_lora_rank is None else norm(x @ p.q_a.T, p.q_a_norm) @ p.q_b.T
        kv = x @ p.kv_a.T
        latent, k_rot = norm(kv[..., :r], p.kv_a_norm), kv[..., r:]
        qs, ks, vs = [], [], []
        for i in range(h):
            q_i = q_all[..., i * dk : (i + 1) * dk]
            kv_i = latent @ p.kv_b[i * (nope + dv) : (i + 1) * (nope + dv)].T
            qs.append(torch.cat((q_i[..., nope:], q_i[..., :nope]), -1))
            ks.append(torch.cat((k_rot, kv_i[..., :nope]), -1))
            vs.append(kv_i[..., nope:])
        return torch.stack(qs, 1), torch.stack(ks, 1), torch.stack(vs, 1)

    # -- the decode property -----------------------------------------------------------------------------------------

    @classmethod
    def audit(cls, m: nn.Module, x: Tensor) -> tuple[str, bool, str]:
        """The absorbed decode over the cached latent gives the expanded forward's rows, one step at a time."""
        t = x.shape[1]
        y = m(x)
        past = (None, None)
        rows = []
        for i in range(t):
            out, *past = m.decode(x[:, i : i + 1], *past)
            rows.append(out)
        err = (torch.cat(rows, dim=1) - y).abs().max().item()
        want = (x.shape[0], 1, t, m.spec.kv_lora_rank)
        ok = err < 1e-10 and tuple(past[1].shape) == want and past[0].shape[-1] == m.spec.rope_dim
        return (
            "latent: the absorbed decode equals the expanded forward",
            ok,
            f"{t} one-position decode steps vs forward: max err {err:.1e}; the cache holds the latent "
            f"{tuple(past[1].shape)} and the rotary key {tuple(past[0].shape)}, not per-head keys and values",
        )
