"""One module family for every spec: multi-head attention written with named einops patterns.

    X (b t c) --W_Q--> Q (b h t dk)
    C (b s c) --W_K--> K (b g s dk)     C is x itself for self-attention
    C (b s c) --W_V--> V (b g s dv)
    A = softmax_s(Q K^T * scale + M)    (b h t s)
    Z = A V                             (b h t dv) -> (b t (h dv))
    Y = Z W_O                           (b t c)

Query head r reads kv head r // (h // g) (blocked GQA, as torch SDPA's enable_gqa).
A query row with no allowed key gets zero weights and Z = 0, never NaN.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from einops import rearrange, repeat
from torch import Tensor, nn

from . import modifiers
from .accounting import count_parameters
from .cache import StaticCache, eager_step
from .errors import InputError, InputTypeError
from .limits import check_fits
from .spec import AttentionSpec

SPLIT_HEADS = "b t (h d) -> b h t d"
MERGE_HEADS = "b h t d -> b t (h d)"


class MultiHeadAttention(nn.Module):
    """Multi-head attention for one `AttentionSpec`.

    Parameters (nn.Linear stores weight as (out, in), i.e. the math's W^T):
      separate: q_proj c->(h dk), k_proj c_kv->(g dk), v_proj c_kv->(g dv)
      combined, self:  qkv_proj c->[(h dk) | (g dk) | (g dv)]
      combined, cross: q_proj c->(h dk), kv_proj c_kv->[(g dk) | (g dv)]
      always: out_proj (h dv)->c

    `fused=True` uses F.scaled_dot_product_attention when weights are not asked for;
    `fused=False` always takes the explicit path (scores, mask, softmax, A @ V).
    `share_kv=True` lets SDPA share the kv heads itself under GQA (enable_gqa) instead of
    repeating K and V to h heads first; same function, less memory in eager torch.
    """

    def __init__(self, spec: AttentionSpec, *, fused: bool = True) -> None:
        super().__init__()
        if not isinstance(spec, AttentionSpec):
            raise InputTypeError(f"spec must be an AttentionSpec, got {type(spec).__name__}")
        # A block past the machine's memory is refused before torch tries to allocate it (on the
        # meta device nothing is allocated: `show` counts any size that way).
        if torch.get_default_device().type != "meta":
            check_fits(count_parameters(spec) * 4, f"a block of {count_parameters(spec):,} parameters (fp32)")
        self.spec = spec
        self.fused = fused
        self.share_kv = True
        # Hand SDPA fp32 copies of half-precision Q, K and V (and cast Z back). Off in eager torch,
        # whose SDPA accumulates in fp32 anyway; the onnx-attention export turns it on, because ONNX
        # Runtime's CPU Attention kernel forms Q K^T in fp16 and overflows at inputs ~300x a unit normal.
        self.sdpa_fp32 = False
        s = spec
        q_width, k_width, v_width = s.heads * s.d_k_, s.kv_heads_ * s.d_k_, s.kv_heads_ * s.d_v_
        if s.layout == "separate":
            self.q_proj = nn.Linear(s.d_model, q_width, bias=s.bias)
            self.k_proj = nn.Linear(s.d_kv_in, k_width, bias=s.bias)
            self.v_proj = nn.Linear(s.d_kv_in, v_width, bias=s.bias)
        elif s.is_cross:
            self.q_proj = nn.Linear(s.d_model, q_width, bias=s.bias)
            self.kv_proj = nn.Linear(s.d_kv_in, k_width + v_width, bias=s.bias)
        else:
            self.qkv_proj = nn.Linear(s.d_model, q_width + k_width + v_width, bias=s.bias)
        self.out_proj = nn.Linear(s.heads * s.d_v_, s.d_model, bias=s.bias)
        # Position and score modifiers (RoPE, ALiBi, window, softcap, QK-norm), in order of application.
        self.mods = modifiers.build(s)

    def extra_repr(self) -> str:
        return f"{self.spec.describe()}, fused={self.fused}, share_kv={self.share_kv}"

    # -- projections -------------------------------------------------------------------

    def project(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Q (b t (h dk)), K (b s (g dk)), V (b s (g dv)), still head-merged (after clip_qkv)."""
        q, k, v = self._project(x, context)
        for mod in self.mods.values():
            q, k, v = mod.qkv_projected(q, k, v)
        return q, k, v

    def _project(self, x: Tensor, context: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        s = self.spec
        src = x if context is None else context
        k_width = s.kv_heads_ * s.d_k_
        if s.layout == "separate":
            return self.q_proj(x), self.k_proj(src), self.v_proj(src)
        if s.is_cross:
            kv = self.kv_proj(src)
            return self.q_proj(x), kv[..., :k_width], kv[..., k_width:]
        qkv = self.qkv_proj(x)
        q_width = s.heads * s.d_k_
        return qkv[..., :q_width], qkv[..., q_width : q_width + k_width], qkv[..., q_width + k_width :]

    # -- forward -------------------------------------------------------------------------

    def forward(
        self,
        x: Tensor,
        context: Tensor | None = None,
        mask: Tensor | None = None,
        *,
        need_weights: bool = False,
        head_mask: Tensor | None = None,
        positions: Tensor | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """x (b t c) -> y (b t c); with need_weights also A (b h t s).

        context (b s c_ctx) for cross-attention. mask: bool (True = may attend) or float
        (added to the scores), broadcastable to (b h t s). head_mask (h) or (b h) scales
        each head's output Z^(r) before the heads are concatenated. positions (b t) or (t)
        integer positions of x for RoPE / ALiBi / window / causal (default 0..t-1).
        """
        s = self.spec
        self._check_inputs(x, context, mask, head_mask)
        pos = self._positions(positions, x)
        q, k, v = self.project(x, context)
        for mod in self.mods.values():
            q, k = mod.qk_merged(q, k)
        q = rearrange(q, SPLIT_HEADS, h=s.heads)
        k = rearrange(k, SPLIT_HEADS, h=s.kv_heads_)
        v = rearrange(v, SPLIT_HEADS, h=s.kv_heads_)
        if pos is not None:
            for mod in self.mods.values():
                q, k = mod.qk_heads(q, k, pos, pos)
        allowed, bias = self._resolve_mask(mask, q.shape[-2], k.shape[-2], x, pos)
        z, weights = self.attend(
            q, k, v, allowed, bias, need_weights=need_weights, plain_causal=self._causal_only(mask, positions)
        )
        if head_mask is not None:
            z = z * _head_scale(head_mask, z)
        y = self.out_proj(rearrange(z, MERGE_HEADS))
        return (y, weights) if need_weights else y

    def attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        allowed: Tensor | None,
        bias: Tensor | None,
        *,
        need_weights: bool = False,
        plain_causal: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Q (b h t dk), K (b g s dk), V (b g s dv) -> Z (b h t dv) and, on the explicit path, A (b h t s)."""
        s = self.spec
        maps = [mod.score_map for mod in self.mods.values() if mod.needs_explicit]
        score_map = _compose(maps) if maps else None
        explicit = need_weights or not self.fused or score_map is not None
        gqa = s.group_size > 1 and self.share_kv and not explicit
        if s.group_size > 1 and not gqa:  # blocked GQA: query head r reads kv head r // group_size
            k = repeat(k, "b g s d -> b (g r) s d", r=s.group_size)
            v = repeat(v, "b g s d -> b (g r) s d", r=s.group_size)
        if explicit:
            return explicit_attention(q, k, v, s.scale_, allowed, bias, score_map=score_map)
        if self.sdpa_fp32 and q.dtype in (torch.float16, torch.bfloat16):
            half = q.dtype
            q, k, v = q.float(), k.float(), v.float()
            bias = None if bias is None else bias.float()
            z = fused_attention(q, k, v, s.scale_, allowed, bias, causal_only=plain_causal, gqa=gqa)
            return z.to(half), None
        return fused_attention(q, k, v, s.scale_, allowed, bias, causal_only=plain_causal, gqa=gqa), None

    # -- incremental decoding ----------------------------------------------------------------

    def decode(
        self,
        x: Tensor,
        past_key: Tensor | None = None,
        past_value: Tensor | None = None,
        *,
        key_mask: Tensor | None = None,
        cache: StaticCache | None = None,
    ) -> tuple[Tensor, Tensor, Tensor] | Tensor:
        """One call of generation against a KV cache: x (b t c) holds positions p..p+t-1.

        past_key (b g p dk) and past_value (b g p dv) are the keys and values of the earlier
        positions as a previous call returned them (after QK-norm and RoPE); None means p = 0.
        Returns y (b t c) and the present cache (b g p+t dk), (b g p+t dv): the past followed by
        this call's keys and values. key_mask (b p+t) bool, True = a real key, serves batched
        rows of different lengths (left padding): a row's positions count its real keys only, so
        each row computes what it would alone, and a row with no real key gets Z = 0.

        The cache keeps every position, also under a sliding window (the mask hides keys older
        than the window), so decoding in any split gives exactly the rows of `block(x_all)`.

        With cache=zoo.StaticCache (preallocated, capacity n), this call's keys and values are
        written into it in place at cache.length (no copy of the past), the length advances, and
        only y is returned; key_mask is then (b, length + t). See zoo/cache.py.
        """
        if cache is not None:
            if past_key is not None or past_value is not None:
                raise InputError("pass either cache= (a StaticCache) or past_key/past_value, not both")
            self._check_decode(x, None, None, None)
            return eager_step(self, x, cache, key_mask)
        p = self._check_decode(x, past_key, past_value, key_mask)
        t = x.shape[1]
        if key_mask is None:
            k_pos = torch.arange(p + t, device=x.device)[None]
        else:
            k_pos = key_mask.long().cumsum(-1) - 1  # a row's n-th real key sits at position n - 1
        q_pos = k_pos[:, p:]
        q, k, v = self.new_heads(x, q_pos)
        if p:
            k = torch.cat((past_key, k), dim=2)
            v = torch.cat((past_value, v), dim=2)
        allowed, bias = self._resolve_mask(None, t, p + t, x, q_pos, k_pos)
        if key_mask is not None:
            allowed = allowed & rearrange(key_mask, "b s -> b 1 1 s")
        z, _ = self.attend(q, k, v, allowed, bias)
        return self.out_proj(rearrange(z, MERGE_HEADS)), k, v

    def new_heads(self, x: Tensor, pos: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """A decode call's Q (b h t dk), K (b g t dk), V (b g t dv) at positions pos (b|1, t), after the
        modifiers (QK-norm, RoPE): what the cache stores, whichever cache holds it."""
        s = self.spec
        q, k, v = self.project(x)
        for mod in self.mods.values():
            q, k = mod.qk_merged(q, k)
        q = rearrange(q, SPLIT_HEADS, h=s.heads)
        k = rearrange(k, SPLIT_HEADS, h=s.kv_heads_)
        v = rearrange(v, SPLIT_HEADS, h=s.kv_heads_)
        for mod in self.mods.values():
            q, k = mod.qk_heads(q, k, pos, pos)
        return q, k, v

    def _check_decode(self, x: Tensor, past_key: Tensor | None, past_value: Tensor | None, key_mask) -> int:
        """Validate a decode call; returns the past length p."""
        s = self.spec
        if s.is_cross or not s.causal:
            kind = "cross-attention" if s.is_cross else "non-causal"
            raise InputError(f"decode() needs a causal self-attention block; this one is {kind} ({s.describe()})")
        self._check_inputs(x, None, None, None)
        b = x.shape[0]
        if (past_key is None) != (past_value is None):
            raise InputError("pass past_key and past_value together (or neither, for an empty cache)")
        p = 0
        if past_key is not None:
            for name, past, d in (("past_key", past_key, s.d_k_), ("past_value", past_value, s.d_v_)):
                if not isinstance(past, Tensor):
                    raise InputTypeError(f"{name} must be a torch.Tensor, got {type(past).__name__}")
                want = f"(b={b}, g={s.kv_heads_}, p, {'dk' if name == 'past_key' else 'dv'}={d})"
                if past.dim() != 4 or past.shape[0] != b or past.shape[1] != s.kv_heads_ or past.shape[3] != d:
                    raise InputError(f"{name} has shape {tuple(past.shape)}; expected {want}")
                if past.dtype != x.dtype or past.device != x.device:
                    raise InputTypeError(f"{name} is {past.dtype} on {past.device}; x is {x.dtype} on {x.device}")
            if past_key.shape[2] != past_value.shape[2]:
                raise InputError(
                    f"past_key holds {past_key.shape[2]} positions but past_value {past_value.shape[2]}; "
                    f"they must be the same cache"
                )
            p = past_key.shape[2]
        if key_mask is not None:
            if not isinstance(key_mask, Tensor) or key_mask.dtype != torch.bool:
                raise InputTypeError("key_mask must be a bool torch.Tensor (True = a real key) of shape (b, p+t)")
            want = (b, p + x.shape[1])
            if tuple(key_mask.shape) != want:
                raise InputError(f"key_mask has shape {tuple(key_mask.shape)}; expected (b, p+t) = {want}")
            if key_mask.device != x.device:
                raise InputTypeError(f"key_mask is on {key_mask.device}; x is on {x.device}")
        return p

    # -- masks ---------------------------------------------------------------------------

    def _positions(self, positions: Tensor | None, x: Tensor) -> Tensor | None:
        """(b|1, t) integer positions, or None when no modifier and no causal mask needs them."""
        t = x.shape[1]
        if positions is None:
            if not self.mods:
                return None
            return torch.arange(t, device=x.device)[None]
        if not isinstance(positions, Tensor):
            raise InputTypeError(
                f"positions must be an integer torch.Tensor of shape (b, t) or (t,), got {type(positions).__name__}"
            )
        if positions.dtype.is_floating_point or positions.dtype == torch.bool or positions.is_complex():
            raise InputTypeError(f"positions has dtype {positions.dtype}; use integer positions (torch.long)")
        if positions.device != x.device:
            raise InputTypeError(f"positions is on {positions.device}; x is on {x.device}")
        if positions.dim() == 1:
            positions = positions[None]
        if positions.dim() != 2 or positions.shape[-1] != t or positions.shape[0] not in (1, x.shape[0]):
            raise InputError(
                f"positions has shape {tuple(positions.shape)}; expected (b={x.shape[0]}, t={t}) or (t={t},)"
            )
        if self.spec.is_cross:
            raise InputError(
                "positions are for self-attention (RoPE/ALiBi/window/causal); this block is cross-attention"
            )
        return positions

    def _causal_only(self, mask: Tensor | None, positions: Tensor | None) -> bool:
        """True when the only mask is the plain triangle over positions 0..t-1 (SDPA's is_causal)."""
        return self.spec.causal and mask is None and positions is None and not self._mask_mods()

    def _mask_mods(self) -> bool:
        return any(mod.shapes_scores for mod in self.mods.values())

    def position_scores(self, q_pos: Tensor, k_pos: Tensor, dtype: torch.dtype) -> tuple[Tensor | None, Tensor | None]:
        """What the modifiers make of positions: (allowed, bias) on the (b h t s) scores, each None
        when no modifier has an opinion (the causal rule and user masks are the caller's)."""
        allowed = bias = None
        for mod in self.mods.values():
            extra = mod.score_allowed(q_pos, k_pos)
            if extra is not None:
                allowed = extra if allowed is None else allowed & extra
            add = mod.score_bias(q_pos, k_pos, dtype)
            if add is not None:
                bias = add if bias is None else bias + add
        return allowed, bias

    def _resolve_mask(
        self,
        mask: Tensor | None,
        t: int,
        s_len: int,
        x: Tensor,
        pos: Tensor | None = None,
        k_pos: Tensor | None = None,
    ) -> tuple[Tensor | None, Tensor | None]:
        """(allowed, bias): a bool mask of allowed keys and/or an additive float bias."""
        allowed = None
        bias = None
        k_pos = pos if k_pos is None else k_pos  # self-attention: the keys are the queries' positions
        if self.spec.causal:
            if pos is None:
                allowed = torch.ones(t, s_len, dtype=torch.bool, device=x.device).tril()
            else:
                allowed = rearrange(pos, "b t -> b 1 t 1") >= rearrange(k_pos, "b s -> b 1 1 s")
        if pos is not None:
            extra, bias = self.position_scores(pos, k_pos, x.dtype)
            if extra is not None:
                allowed = extra if allowed is None else allowed & extra
        if mask is not None:
            mask = mask[(None,) * (4 - mask.dim())]  # always (b|1, h|1, t|1, s|1): SDPA wants >= 2-D
            if mask.dtype == torch.bool:
                allowed = mask if allowed is None else allowed & mask
            else:
                bias = mask.to(x.dtype) if bias is None else bias + mask.to(x.dtype)
        return allowed, bias

    # -- validation ------------------------------------------------------------------------

    def _check_inputs(self, x: Tensor, context: Tensor | None, mask: Tensor | None, head_mask: Tensor | None) -> None:
        s = self.spec
        if not isinstance(x, Tensor):
            raise InputTypeError(f"x must be a torch.Tensor of shape (b, t, {s.d_model}), got {type(x).__name__}")
        if x.dim() != 3 or x.shape[-1] != s.d_model:
            raise InputError(f"x has shape {tuple(x.shape)}; expected (b, t, d_model={s.d_model})")
        if x.shape[0] == 0 or x.shape[1] == 0:
            raise InputError(f"x has shape {tuple(x.shape)}; b and t must be at least 1")
        param = self.out_proj.weight
        if not x.is_floating_point():
            raise InputTypeError(
                f"x has dtype {x.dtype}; attention takes floating-point input: use x.to({param.dtype})"
            )
        if x.dtype != param.dtype:
            raise InputTypeError(
                f"x has dtype {x.dtype} but the module's parameters are {param.dtype}; "
                f"use x.to({param.dtype}) or module.to({x.dtype})"
            )
        if x.device != param.device:
            raise InputTypeError(f"x is on {x.device} but the module is on {param.device}; move one to the other")
        if s.is_cross:
            if context is None:
                raise InputError(
                    f"this module is cross-attention (d_context={s.d_context}); "
                    f"pass context of shape (b, s, {s.d_context})"
                )
            if not isinstance(context, Tensor):
                raise InputTypeError(f"context must be a torch.Tensor, got {type(context).__name__}")
            if context.dim() != 3 or context.shape[-1] != s.d_context or context.shape[0] != x.shape[0]:
                raise InputError(
                    f"context has shape {tuple(context.shape)}; expected (b={x.shape[0]}, s, d_context={s.d_context})"
                )
            if context.dtype != x.dtype or context.device != x.device:
                raise InputTypeError(f"context is {context.dtype} on {context.device}; x is {x.dtype} on {x.device}")
            s_len = context.shape[1]
            if s_len == 0:
                raise InputError(f"context has shape {tuple(context.shape)}; s must be at least 1")
        else:
            if context is not None:
                raise InputError(
                    "this module is self-attention (d_context=None) and takes no context; "
                    "create it with d_context=... for cross-attention"
                )
            s_len = x.shape[1]
        if mask is not None:
            if not isinstance(mask, Tensor):
                raise InputTypeError(f"mask must be a torch.Tensor, got {type(mask).__name__}")
            if not (mask.dtype == torch.bool or mask.is_floating_point()):
                raise InputTypeError(
                    f"mask has dtype {mask.dtype}; use bool (True = may attend) or a float tensor added to the scores"
                )
            if mask.device != x.device:
                raise InputTypeError(f"mask is on {mask.device}; x is on {x.device}")
            if mask.is_floating_point() and bool(torch.isnan(mask).any()):
                # SDPA and the explicit path disagree on NaN (one hides it, one spreads it); a
                # NaN score has no meaning, so refuse it rather than pick a silent answer.
                raise InputError(
                    f"mask holds NaN at {int(torch.isnan(mask).sum())} of {mask.numel()} entries; a float mask "
                    f"is added to the scores: use -inf (or a bool False) for keys that may not be attended"
                )
            if mask.dim() == 3 and mask.shape[0] != 1:
                # Right-aligned broadcasting reads a 3-D mask as (h, t, s); a (b, t, s) padding
                # mask would be silently taken per head whenever b == h. Make the caller say.
                raise InputError(
                    f"a 3-D mask of shape {tuple(mask.shape)} is ambiguous: use mask[:, None] for a "
                    f"(b, t, s) mask shared by all heads, or mask[None] for an (h, t, s) one"
                )
            target = (x.shape[0], s.heads, x.shape[1], s_len)
            try:
                shape = torch.broadcast_shapes(mask.shape, target)
            except RuntimeError:
                shape = None
            if mask.dim() > 4 or shape != torch.Size(target):
                raise InputError(f"mask of shape {tuple(mask.shape)} does not broadcast to (b, h, t, s) = {target}")
        if head_mask is not None:
            if not isinstance(head_mask, Tensor):
                raise InputTypeError(f"head_mask must be a torch.Tensor, got {type(head_mask).__name__}")
            ok = (head_mask.dim() == 1 and head_mask.shape[0] == s.heads) or (
                head_mask.dim() == 2 and head_mask.shape[1] == s.heads and head_mask.shape[0] in (1, x.shape[0])
            )
            if not ok:
                raise InputError(
                    f"head_mask has shape {tuple(head_mask.shape)}; expected (h={s.heads},) "
                    f"or (b={x.shape[0]}, h={s.heads})"
                )
            if head_mask.device != x.device:
                raise InputTypeError(f"head_mask is on {head_mask.device}; x is on {x.device}")


def _compose(maps: list[Callable[[Tensor], Tensor]]) -> Callable[[Tensor], Tensor]:
    """The score maps applied in order (the modifiers' order of application)."""

    def apply(scores: Tensor) -> Tensor:
        for fn in maps:
            scores = fn(scores)
        return scores

    return apply


def _head_scale(head_mask: Tensor, z: Tensor) -> Tensor:
    """head_mask (h) or (b h) -> a factor broadcastable to Z (b h t d)."""
    hm = head_mask.to(z.dtype)
    if hm.dim() == 1:
        return rearrange(hm, "h -> 1 h 1 1")
    return rearrange(hm, "b h -> b h 1 1")


def explicit_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scale: float,
    allowed: Tensor | None,
    bias: Tensor | None,
    *,
    score_map: Callable[[Tensor], Tensor] | None = None,
) -> tuple[Tensor, Tensor]:
    """Z (b h t dv) and A (b h t s), materializing the scores.

    The softmax is written out so that a row with no allowed key (all -inf) gives
    exp(-inf) = 0 everywhere and 0 / max(0, tiny) = 0 rather than 0 / 0 = NaN.
    """
    # Half-precision Q K^T overflows (fp16 max 65504) long before the softmax does: at inputs
    # ~300x a unit normal the fp16 dot products are inf. Take the scores and the softmax from
    # fp32 copies of Q and K; only the (already normalized) weights go back to the input dtype.
    low_precision = q.dtype in (torch.float16, torch.bfloat16)
    if low_precision:
        q, k = q.float(), k.float()
    scores = torch.einsum("b h t d, b h s d -> b h t s", q * scale, k)
    if score_map is not None:  # e.g. softcap: on the scaled scores, before any bias or mask
        scores = score_map(scores)
    if bias is not None:
        scores = scores + bias.to(scores.dtype)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    finfo = torch.finfo(scores.dtype)
    row_max = scores.amax(dim=-1, keepdim=True).clamp_min(finfo.min)
    e = torch.exp(scores - row_max)
    weights = e / e.sum(dim=-1, keepdim=True).clamp_min(finfo.tiny)
    if low_precision:
        weights = weights.to(v.dtype)
    z = torch.einsum("b h t s, b h s d -> b h t d", weights, v)
    return z, weights


def fused_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scale: float,
    allowed: Tensor | None,
    bias: Tensor | None,
    *,
    causal_only: bool,
    gqa: bool = False,
) -> Tensor:
    """Z (b h t dv) through F.scaled_dot_product_attention; fully masked rows give 0.

    With gqa, k and v hold g < h heads and SDPA maps query head r to kv head r // (h // g).
    """
    if causal_only:  # the kernel builds the triangle itself; no row is ever empty
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=gqa)
    if allowed is None and bias is None:
        return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=gqa)
    if allowed is not None and bias is not None:
        attn_mask = torch.where(allowed, bias, float("-inf"))
    else:
        attn_mask = allowed if allowed is not None else bias
    z = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=scale, enable_gqa=gqa)
    # A row whose keys are all disallowed must give Z = 0, whatever the kernel does with it.
    if attn_mask.dtype == torch.bool:
        has_key = attn_mask.any(dim=-1, keepdim=True)
    else:
        has_key = (attn_mask > float("-inf")).any(dim=-1, keepdim=True)
    return torch.where(has_key, z, torch.zeros((), dtype=z.dtype, device=z.device))
