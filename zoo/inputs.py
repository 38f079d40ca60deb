"""The block's input checks, in one place: a forward call's x, context, mask, head_mask and positions,
and a decode call's cache (growing: past_key/past_value; static: zoo.StaticCache) and key_mask.

Each raises InputError (a value: shape, count) or InputTypeError (a type, dtype or device) naming
what it got and what it expects; `param` is one of the block's parameters (its dtype and device).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .attention_spec import AttentionSpec
from .cache import StaticCache
from .errors import InputError, InputTypeError
from .limits import check_room


def check_forward(
    spec: AttentionSpec, param: Tensor, x: Tensor, context: Tensor | None, mask: Tensor | None, head_mask: Tensor | None
) -> Tensor | None:
    """Validate a forward call; returns the mask as (b|1, h|1, t|1, s|1) (None without one)."""
    s = spec
    _check_x(spec, param, x)
    if s.is_cross:
        if context is None:
            raise InputError(
                f"this module is cross-attention (d_context={s.d_context}); pass context of shape (b, s, {s.d_context})"
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
        mask = score_mask(mask, (x.shape[0], s.heads, x.shape[1], s_len), x)
    if head_mask is not None:
        _check_head_mask(spec, head_mask, x)
    return mask


def _check_x(spec: AttentionSpec, param: Tensor, x: Tensor) -> None:
    if not isinstance(x, Tensor):
        raise InputTypeError(f"x must be a torch.Tensor of shape (b, t, {spec.d_model}), got {type(x).__name__}")
    if x.dim() != 3 or x.shape[-1] != spec.d_model:
        raise InputError(f"x has shape {tuple(x.shape)}; expected (b, t, d_model={spec.d_model})")
    if x.shape[0] == 0 or x.shape[1] == 0:
        raise InputError(f"x has shape {tuple(x.shape)}; b and t must be at least 1")
    if not x.is_floating_point():
        raise InputTypeError(f"x has dtype {x.dtype}; attention takes floating-point input: use x.to({param.dtype})")
    if x.dtype != param.dtype:
        raise InputTypeError(
            f"x has dtype {x.dtype} but the module's parameters are {param.dtype}; "
            f"use x.to({param.dtype}) or module.to({x.dtype})"
        )
    if x.device != param.device:
        raise InputTypeError(f"x is on {x.device} but the module is on {param.device}; move one to the other")


def score_mask(mask: Tensor, target: tuple[int, int, int, int], x: Tensor) -> Tensor:
    """The user's mask, checked against the scores' (b, h, t, s) = target, as (b|1, h|1, t|1, s|1).

    bool: True = may attend; float: added to the scores. Broadcast right-aligned, as torch does,
    except that a 3-D mask must say which of (b, t, s) and (h, t, s) it is.
    """
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
    try:
        shape = torch.broadcast_shapes(mask.shape, target)
    except RuntimeError:
        shape = None
    if mask.dim() > 4 or shape != torch.Size(target):
        raise InputError(f"mask of shape {tuple(mask.shape)} does not broadcast to (b, h, t, s) = {target}")
    return mask[(None,) * (4 - mask.dim())]  # always 4-D: SDPA wants >= 2-D


def _check_head_mask(spec: AttentionSpec, head_mask: Tensor, x: Tensor) -> None:
    h = spec.heads
    if not isinstance(head_mask, Tensor):
        raise InputTypeError(f"head_mask must be a torch.Tensor, got {type(head_mask).__name__}")
    ok = (head_mask.dim() == 1 and head_mask.shape[0] == h) or (
        head_mask.dim() == 2 and head_mask.shape[1] == h and head_mask.shape[0] in (1, x.shape[0])
    )
    if not ok:
        raise InputError(f"head_mask has shape {tuple(head_mask.shape)}; expected (h={h},) or (b={x.shape[0]}, h={h})")
    if head_mask.device != x.device:
        raise InputTypeError(f"head_mask is on {head_mask.device}; x is on {x.device}")


def check_positions(spec: AttentionSpec, positions: Tensor, x: Tensor) -> Tensor:
    """Validate a forward call's positions (b, t) or (t) integers; returns them as (b|1, t)."""
    t = x.shape[1]
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
        raise InputError(f"positions has shape {tuple(positions.shape)}; expected (b={x.shape[0]}, t={t}) or (t={t},)")
    if spec.is_cross:
        raise InputError("positions are for self-attention (RoPE/ALiBi/window/causal); this block is cross-attention")
    return positions


def check_decode(
    spec: AttentionSpec,
    param: Tensor,
    x: Tensor,
    past_key: Tensor | None,
    past_value: Tensor | None,
    key_mask: Tensor | None,
    cache: StaticCache | None,
) -> int:
    """Validate a decode call against either kind of cache; returns p, the positions already in it."""
    if cache is not None and (past_key is not None or past_value is not None):
        raise InputError("pass either cache= (a StaticCache) or past_key/past_value, not both")
    s = spec
    if s.is_cross or not s.causal:
        kind = "cross-attention" if s.is_cross else "non-causal"
        raise InputError(f"decode() needs a causal self-attention block; this one is {kind} ({s.describe()})")
    check_forward(spec, param, x, None, None, None)
    p = _check_past(spec, x, past_key, past_value) if cache is None else _check_static(spec, x, cache)
    if key_mask is not None:
        want = (x.shape[0], p + x.shape[1])
        if not isinstance(key_mask, Tensor) or key_mask.dtype != torch.bool:
            raise InputTypeError(f"key_mask must be a bool torch.Tensor (True = a real key) of shape (b, p+t) = {want}")
        if tuple(key_mask.shape) != want:
            raise InputError(f"key_mask has shape {tuple(key_mask.shape)}; expected (b, p+t) = {want}")
        if key_mask.device != x.device:
            raise InputTypeError(f"key_mask is on {key_mask.device}; x is on {x.device}")
    return p


def _check_past(spec: AttentionSpec, x: Tensor, past_key: Tensor | None, past_value: Tensor | None) -> int:
    """A growing cache: past_key (b g p dk) and past_value (b g p dv), or neither."""
    s, b = spec, x.shape[0]
    if (past_key is None) != (past_value is None):
        raise InputError("pass past_key and past_value together (or neither, for an empty cache)")
    if past_key is None:
        return 0
    g, dk, dv = s.cache_widths_
    for name, past, d in (("past_key", past_key, dk), ("past_value", past_value, dv)):
        if not isinstance(past, Tensor):
            raise InputTypeError(f"{name} must be a torch.Tensor, got {type(past).__name__}")
        want = f"(b={b}, g={g}, p, {'dk' if name == 'past_key' else 'dv'}={d})"
        if past.dim() != 4 or past.shape[0] != b or past.shape[1] != g or past.shape[3] != d:
            raise InputError(f"{name} has shape {tuple(past.shape)}; expected {want}")
        if past.dtype != x.dtype or past.device != x.device:
            raise InputTypeError(f"{name} is {past.dtype} on {past.device}; x is {x.dtype} on {x.device}")
    if past_key.shape[2] != past_value.shape[2]:
        raise InputError(
            f"past_key holds {past_key.shape[2]} positions but past_value {past_value.shape[2]}; "
            f"they must be the same cache"
        )
    return past_key.shape[2]


def _check_static(spec: AttentionSpec, x: Tensor, cache: StaticCache) -> int:
    """A static cache: its buffers (b g n d) in x's dtype and device, with room for this call."""
    if not isinstance(cache, StaticCache):
        raise InputTypeError(f"cache must be a zoo.StaticCache, got {type(cache).__name__}")
    b = x.shape[0]
    g, dk, dv = spec.cache_widths_
    for name, buf, d in (("key", cache.key, dk), ("value", cache.value, dv)):
        want = (b, g, cache.capacity, d)
        if tuple(buf.shape) != want:
            raise InputError(f"cache.{name} has shape {tuple(buf.shape)}; expected (b, g, n, d) = {want}")
        if buf.dtype != x.dtype or buf.device != x.device:
            raise InputTypeError(f"cache.{name} is {buf.dtype} on {buf.device}; x is {x.dtype} on {x.device}")
    check_room(cache.capacity, cache.length, x.shape[1], fix="allocate a larger cache with max_len")
    return cache.length
