"""The score math of every path, written once: Q K^T * scale, the modifiers' score map, bias, mask,
the NaN-safe softmax, then A V.

    scores = Q K^T * scale               (b h t s)
    scores = map(scores) + bias           map: softcap (on the scaled scores, before any bias or mask)
    A = softmax_s(scores | allowed)       a disallowed key gets -inf; a row with none allowed gets A = 0;
                                          a sink (a logit per head) joins the denominator with no value
    Z = A V                               (b h t dv)

Three kernels share it:
  explicit_attention   materializes A (need_weights, score maps SDPA cannot express)
  fused_attention      F.scaled_dot_product_attention, with the same fully-masked-row rule
  folded_attention     one product per kv head: the r = h / g query heads of a group are folded into
                       the query axis, Q (b (g r) t d) -> (b g (r t) d), so a kv head is read once

The rules every path calls: `causal_allowed` (a query reads keys at or before it), `key_positions` and
`real_keys` (the key_mask rule: a row's positions count its real keys only, padding is never read),
`position_scores` (what the modifiers make of positions), `score_map` and `score_sink` (what they make of
the scores and the softmax) and `both` (masks meet, biases add).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from einops import rearrange, repeat
from torch import Tensor

if TYPE_CHECKING:
    from .modifiers import Modifier

SPLIT_HEADS = "b t (h d) -> b h t d"
MERGE_HEADS = "b h t d -> b t (h d)"
FOLD = "b (g r) t d -> b g (r t) d"
UNFOLD = "b g (r t) d -> b (g r) t d"

ScoreMap = Callable[[Tensor], Tensor]


# -- the rules ---------------------------------------------------------------------------------


def causal_allowed(q_at: Tensor | None, k_at: Tensor | None, t: int, s: int, device: torch.device) -> Tensor:
    """The causal rule: a query reads the keys at or before it.

    q_at (b|1, t) and k_at (b|1, s) say where each sits (token positions, or a static cache's
    indices) -> bool (b|1, 1, t, s); None means positions 0..t-1 and 0..s-1 -> one triangle (t, s).
    """
    if q_at is None:
        return torch.ones(t, s, dtype=torch.bool, device=device).tril()
    return rearrange(q_at, "b t -> b 1 t 1") >= rearrange(k_at, "b s -> b 1 1 s")


def key_positions(key_mask: Tensor) -> Tensor:
    """(b s) token positions of the keys under key_mask (b s) bool, True = a real key: a row's n-th
    real key sits at position n - 1, so a left-padded row computes what it would alone."""
    return key_mask.long().cumsum(-1) - 1


def real_keys(allowed: Tensor, key_mask: Tensor) -> Tensor:
    """`allowed` with the padding keys (key_mask (b s) False) never read."""
    return allowed & rearrange(key_mask, "b s -> b 1 1 s")


def both(a: Tensor | None, b: Tensor | None, *, add: bool = False) -> Tensor | None:
    """Two masks meet (a & b) or, with add, two biases add (a + b); None is no opinion."""
    if a is None or b is None:
        return b if a is None else a
    return a + b if add else a & b


def position_scores(
    mods: Iterable[Modifier], q_pos: Tensor, k_pos: Tensor, dtype: torch.dtype
) -> tuple[Tensor | None, Tensor | None]:
    """What the modifiers make of positions: (allowed, bias) on the (b h t s) scores, each None
    when no modifier has an opinion (the causal rule and user masks are the caller's)."""
    allowed = bias = None
    for mod in mods:
        allowed = both(allowed, mod.score_allowed(q_pos, k_pos))
        bias = both(bias, mod.score_bias(q_pos, k_pos, dtype), add=True)
    return allowed, bias


def score_sink(mods: Iterable[Modifier]) -> Tensor | None:
    """The logit per head (1, h, 1, 1) that joins every row's softmax denominator (attention sinks), or None."""
    sinks = [sink for mod in mods if (sink := mod.score_sink()) is not None]
    return sinks[0] if sinks else None  # one modifier (zoo/modifiers/sinks.py) has one


def score_map(mods: Iterable[Modifier]) -> ScoreMap | None:
    """The modifiers' maps of the scaled scores SDPA cannot express, applied in their order; None if none."""
    maps = [mod.score_map for mod in mods if mod.needs_explicit]
    if not maps:
        return None

    def apply(scores: Tensor) -> Tensor:
        for fn in maps:
            scores = fn(scores)
        return scores

    return apply


# -- the shared score math -----------------------------------------------------------------------


def _upcast(q: Tensor, k: Tensor) -> tuple[Tensor, Tensor, bool]:
    """Q and K for the scores, and whether they were half precision.

    Half-precision Q K^T overflows (fp16 max 65504) long before the softmax does: at inputs ~300x a
    unit normal the fp16 dot products are inf. The scores and the softmax come from fp32 copies of
    Q and K; only the (already normalized) weights go back to the input dtype.
    """
    if q.dtype in (torch.float16, torch.bfloat16):
        return q.float(), k.float(), True
    return q, k, False


def _weights(
    scores: Tensor,
    score_map: ScoreMap | None,
    bias: Tensor | None,
    allowed: Tensor | None,
    hook=None,
    sink: Tensor | None = None,
) -> Tensor:
    """A from the scaled scores: the score map, the bias, the mask, then the NaN-safe softmax.

    The softmax is written out so that a row with no allowed key (all -inf) gives exp(-inf) = 0
    everywhere and 0 / max(0, tiny) = 0 rather than 0 / 0 = NaN. A sink (b|1, h, t|1, 1), finite, is one
    more logit in each row's max and denominator (transformers' gpt-oss: a column appended, then dropped):
    the denominator is then at least 1, and a row with no allowed key gives 0 / 1 = 0.
    """
    if score_map is not None:
        scores = score_map(scores)
    if bias is not None:
        scores = scores + bias.to(scores.dtype)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    if hook is not None:  # the named location "scores" (zoo/hooks.py)
        scores = hook("scores", scores)
    finfo = torch.finfo(scores.dtype)
    row_max = scores.amax(dim=-1, keepdim=True).clamp_min(finfo.min)
    if sink is not None:
        sink = sink.to(scores.dtype)
        row_max = torch.maximum(row_max, sink)
        e = torch.exp(scores - row_max)
        return e / (e.sum(dim=-1, keepdim=True) + torch.exp(sink - row_max))
    e = torch.exp(scores - row_max)
    return e / e.sum(dim=-1, keepdim=True).clamp_min(finfo.tiny)


# -- the three kernels ----------------------------------------------------------------------------


def explicit_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scale: float,
    allowed: Tensor | None,
    bias: Tensor | None,
    *,
    score_map: ScoreMap | None = None,
    hook=None,
    sink: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Q (b h t dk), K (b h s dk), V (b h s dv) -> Z (b h t dv) and A (b h t s), materializing the scores.
    hook: a zoo.hooks.HookRun, called at "scores" and "pattern". sink: (1, h, 1, 1) or None."""
    q, k, low_precision = _upcast(q, k)
    scores = torch.einsum("b h t d, b h s d -> b h t s", q * scale, k)
    weights = _weights(scores, score_map, bias, allowed, hook, sink)
    if low_precision:
        weights = weights.to(v.dtype)
    if hook is not None:  # the named location "pattern" (zoo/hooks.py)
        weights = hook("pattern", weights)
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
    fp32: bool = False,
) -> Tensor:
    """Z (b h t dv) through F.scaled_dot_product_attention; fully masked rows give 0.

    With gqa, k and v hold g < h heads and SDPA maps query head r to kv head r // (h // g). With
    fp32, half-precision Q, K, V (and the bias) go to SDPA as fp32 copies and Z comes back in their
    dtype: for a runtime whose kernel forms half-precision Q K^T in half precision.
    """
    half = q.dtype if fp32 and q.dtype in (torch.float16, torch.bfloat16) else None
    if half is not None:
        q, k, v = q.float(), k.float(), v.float()
        bias = None if bias is None else bias.float()
    z = _sdpa(q, k, v, scale, allowed, bias, causal_only=causal_only, gqa=gqa)
    return z if half is None else z.to(half)


def _sdpa(
    q: Tensor, k: Tensor, v: Tensor, scale: float, allowed: Tensor | None, bias: Tensor | None, *, causal_only, gqa
) -> Tensor:
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


def folded_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scale: float,
    allowed: Tensor,
    bias: Tensor | None,
    *,
    score_map: ScoreMap | None = None,
    sink: Tensor | None = None,
) -> Tensor:
    """Q (b h t dk), K (b g n dk), V (b g n dv) -> Z (b h t dv), reading each kv head once.

    allowed (b|1, h|1, t|1, n), bias (b|1, h|1, t|1, n) and sink (1, h, 1, 1) are per head; the scores,
    mask and softmax are the explicit path's, on the folded layout (b g (r t) n).
    """
    h, t = q.shape[1], q.shape[2]
    r = h // k.shape[1]
    q, k, low_precision = _upcast(q, k)
    scores = torch.matmul(rearrange(q * scale, FOLD, r=r), k.transpose(-1, -2))  # (b g (r t) n)
    folded_bias = None if bias is None else _fold_heads(bias, h, r, t)
    folded_sink = None if sink is None else _fold_heads(sink, h, r, t)
    weights = _weights(scores, score_map, folded_bias, _fold_heads(allowed, h, r, t), sink=folded_sink)
    if low_precision:
        weights = weights.to(v.dtype)
    return rearrange(torch.matmul(weights, v), UNFOLD, r=r)  # (b g (r t) dv) -> (b h t dv)


def _fold_heads(m: Tensor, h: int, r: int, t: int) -> Tensor:
    """A per-head (b|1, h|1, t|1, n) mask or bias in the folded layout (b|1, g|1, (r t), n)."""
    m = m.expand(m.shape[0], m.shape[1], t, m.shape[3])
    if m.shape[1] == h:
        return rearrange(m, FOLD, r=r)
    return repeat(m, "b 1 t n -> b 1 (r t) n", r=r)


def repeat_kv(kv: Tensor, r: int) -> Tensor:
    """Blocked GQA: K or V (b g s d) -> (b (g r) s d), query head i reading kv head i // r."""
    return repeat(kv, "b g s d -> b (g r) s d", r=r)
