"""One module family for every spec: multi-head attention written with named einops patterns.

    X (b t c) --W_Q--> Q (b h t dk)
    C (b s c) --W_K--> K (b g s dk)     C is x itself for self-attention
    C (b s c) --W_V--> V (b g s dv)
    A = softmax_s(Q K^T * scale + M)    (b h t s)
    Z = A V                             (b h t dv) -> (b t (h dv))
    Y = Z W_O                           (b t c)

Query head r reads kv head r // (h // g) (blocked GQA, as torch SDPA's enable_gqa).
A query row with no allowed key gets zero weights and Z = 0, never NaN.

The block holds the projections and one heads step (project, split, modifiers) that `forward` and
every decode step call; the score math is zoo/attend.py, the caches zoo/cache.py, the input
checks zoo/inputs.py.
"""

from __future__ import annotations

import torch
from einops import rearrange
from torch import Tensor, nn

from . import modifiers
from .accounting import count_parameters
from .attend import (
    MERGE_HEADS,
    SPLIT_HEADS,
    both,
    causal_allowed,
    explicit_attention,
    folded_attention,
    fused_attention,
    position_scores,
    real_keys,
    repeat_kv,
    score_map,
    score_sink,
)
from .attention_spec import AttentionSpec
from .cache import GrowingCache, KVCache, StaticBuffers, StaticCache
from .errors import InputError, InputTypeError
from .hooks import HookPoints, output
from .inputs import check_decode, check_forward, check_positions
from .limits import check_fits


class MultiHeadAttention(HookPoints, nn.Module):
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
    `hook` (None unless a run installs one: run_with_cache, run_with_hooks, zoo.hooks.hooked) is
    called at the named locations of zoo/hooks.py.
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
        if s.kv_lora_rank is not None:  # latent attention: K and V come up from the latent (zoo/modifiers/latent.py)
            if s.q_lora_rank is None:
                self.q_proj = nn.Linear(s.d_model, q_width, bias=False)
        elif s.layout == "separate":
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
        if s.kv_lora_rank is not None:
            return self.mods["latent"].project(x, getattr(self, "q_proj", None))
        if s.layout == "separate":
            return self.q_proj(x), self.k_proj(src), self.v_proj(src)
        if s.is_cross:
            kv = self.kv_proj(src)
            return self.q_proj(x), kv[..., :k_width], kv[..., k_width:]
        qkv = self.qkv_proj(x)
        q_width = s.heads * s.d_k_
        return qkv[..., :q_width], qkv[..., q_width : q_width + k_width], qkv[..., q_width + k_width :]

    # -- the heads step ---------------------------------------------------------------------

    def heads(self, x: Tensor, pos: Tensor | None, context: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Q (b h t dk), K (b g s dk), V (b g s dv) after the modifiers (QK-norm, RoPE): what
        attention reads and a cache stores. pos (b|1, t): the positions of x (None: no modifier needs them)."""
        s = self.spec
        q, k, v = self.project(x, context)
        for mod in self.mods.values():
            q, k = mod.qk_merged(q, k)
        q = rearrange(q, SPLIT_HEADS, h=s.heads)
        k = rearrange(k, SPLIT_HEADS, h=s.kv_heads_)
        v = rearrange(v, SPLIT_HEADS, h=s.kv_heads_)
        if pos is not None:
            for mod in self.mods.values():
                q, k = mod.qk_heads(q, k, pos, pos)
        return q, k, v

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
        score_mask = check_forward(self.spec, self.out_proj.weight, x, context, mask, head_mask)
        pos = self._positions(positions, x)
        hook = self.hook
        q, k, v = self.heads(x, pos, context)
        if hook is not None:
            q, k, v = hook("q", q), hook("k", k), hook("v", v)
        allowed, bias = self._resolve_mask(score_mask, q.shape[-2], k.shape[-2], x, pos)
        z, weights = self.attend(
            q, k, v, allowed, bias, need_weights=need_weights, plain_causal=self._causal_only(mask, positions)
        )
        z = self.gated(z, x)
        if head_mask is not None:
            z = z * _head_scale(head_mask, z)
        y = self.out_proj(rearrange(z, MERGE_HEADS)) if hook is None else output(z, self.out_proj, hook, MERGE_HEADS)
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
        smap, sink = score_map(self.mods.values()), score_sink(self.mods.values())
        hook = self.hook
        explicit = need_weights or not self.fused or smap is not None or sink is not None
        explicit = explicit or (hook is not None and hook.explicit)
        gqa = s.group_size > 1 and self.share_kv and not explicit
        if s.group_size > 1 and not gqa:  # blocked GQA: query head r reads kv head r // group_size
            k, v = repeat_kv(k, s.group_size), repeat_kv(v, s.group_size)
        if explicit:
            return explicit_attention(q, k, v, s.scale_, allowed, bias, score_map=smap, hook=hook, sink=sink)
        z = fused_attention(q, k, v, s.scale_, allowed, bias, causal_only=plain_causal, gqa=gqa, fp32=self.sdpa_fp32)
        return z, None

    def gated(self, z: Tensor, x: Tensor) -> Tensor:
        """Z (b h t dv) after the modifiers that act on it (the output gate), from x (b t c)."""
        for mod in self.mods.values():
            z = mod.z_heads(z, x)
        return z

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
        than the window), so decoding in any split gives exactly the rows of `block(x_all)` (save
        longrope across its switch, where a cached key keeps its call's frequencies: rope_scaling.py).

        With cache=zoo.StaticCache (preallocated, capacity n), this call's keys and values are
        written into it in place at cache.length (no copy of the past), the length advances, and
        only y is returned; key_mask is then (b, length + t). See zoo/cache.py.
        """
        p = check_decode(self.spec, self.out_proj.weight, x, past_key, past_value, key_mask, cache)
        if cache is None:
            return self.step(x, GrowingCache(past_key, past_value, key_mask))
        y, _, _ = self.step(x, cache.open(x.shape[1], key_mask))
        cache.length = p + x.shape[1]
        return y

    def step(self, x: Tensor, cache: KVCache) -> tuple[Tensor, Tensor, Tensor]:
        """One decode step of x (b t c) against either kind of cache (checked before): y (b t c) and
        the keys (b g s dk) and values (b g s dv) the step read, this call's among them."""
        t, hook = x.shape[1], self.hook
        at = cache.place(t, x.device)
        latent = self.mods["latent"] if "latent" in self.mods else None
        if latent is not None:  # the cache keeps the rotary key (b 1 t dr) and the latent (b 1 t r)
            if hook is not None:
                raise InputError(
                    "a latent (MLA) block's decode step has no per-head k and v to name: its cache holds the "
                    "latent; read the named locations from the full forward (run_with_cache(x))"
                )
            q, k, v = latent.cached_heads(x, getattr(self, "q_proj", None), self.mods["rope"], at.q_pos)
        else:
            q, k, v = self.heads(x, at.q_pos)
        k, v = present = cache.write(k, v, at)
        if hook is not None:  # k, v over the whole cache; a replacement is read by this step only
            q, k, v = hook("q", q), hook("k", k), hook("v", v)
        allowed = causal_allowed(at.q_at, at.k_at, t, k.shape[2], x.device)
        extra, bias = position_scores(self.mods.values(), at.q_pos, at.k_pos, x.dtype)
        allowed = both(allowed, extra)
        if at.key_mask is not None:
            allowed = real_keys(allowed, at.key_mask)
        if latent is not None:  # the absorbed form: attention over the latent, one kv head
            kernel = "folded" if cache.folded else "fused" if self.fused else "explicit"
            z = latent.absorbed(q, k, v, allowed, bias, kernel=kernel, fp32=self.sdpa_fp32)
        elif cache.folded and (hook is None or not hook.explicit):
            mods = self.mods.values()
            smap, sink = score_map(mods), score_sink(mods)
            z = folded_attention(q, k, v, self.spec.scale_, allowed, bias, score_map=smap, sink=sink)
        else:
            z, _ = self.attend(q, k, v, allowed, bias)
        z = self.gated(z, x)
        y = self.out_proj(rearrange(z, MERGE_HEADS)) if hook is None else output(z, self.out_proj, hook, MERGE_HEADS)
        return y, *present

    # -- masks ---------------------------------------------------------------------------

    def _positions(self, positions: Tensor | None, x: Tensor) -> Tensor | None:
        """(b|1, t) integer positions, or None when no modifier and no causal mask needs them."""
        if positions is None:
            if not self.mods:
                return None
            return torch.arange(x.shape[1], device=x.device)[None]
        return check_positions(self.spec, positions, x)

    def _causal_only(self, mask: Tensor | None, positions: Tensor | None) -> bool:
        """True when the only mask is the plain triangle over positions 0..t-1 (SDPA's is_causal)."""
        return self.spec.causal and mask is None and positions is None and not self._mask_mods()

    def _mask_mods(self) -> bool:
        return any(mod.shapes_scores for mod in self.mods.values())

    def _resolve_mask(
        self, mask: Tensor | None, t: int, s_len: int, x: Tensor, pos: Tensor | None
    ) -> tuple[Tensor | None, Tensor | None]:
        """(allowed, bias) of a forward call: a bool mask of allowed keys and/or an additive float bias.

        mask is the user's (b|1, h|1, t|1, s|1); for self-attention the keys sit at the queries' positions.
        """
        allowed = bias = None
        if self.spec.causal:
            allowed = causal_allowed(pos, pos, t, s_len, x.device)
        if pos is not None:
            extra, bias = position_scores(self.mods.values(), pos, pos, x.dtype)
            allowed = both(allowed, extra)
        if mask is not None:
            if mask.dtype == torch.bool:
                allowed = both(allowed, mask)
            else:
                bias = both(bias, mask.to(x.dtype), add=True)
        return allowed, bias


def static_step(
    block: MultiHeadAttention,
    x: Tensor,
    cache_key: Tensor,
    cache_value: Tensor,
    past_len: Tensor,
    key_mask: Tensor | None = None,
    *,
    in_place: bool,
    rows: tuple[Tensor, Tensor, Tensor] | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """x (b t c) at cache indices past_len..past_len+t-1 -> y (b t c), the caches with this call's
    keys and values written (the same tensors when in_place): the step the static-cache graph traces.

    past_len is a 0-d int64 tensor; key_mask (b n) bool over the whole capacity (entries at or
    past past_len + t are not read). rows: a traced whole model's packed rows (StaticBuffers.rows).
    """
    return block.step(x, StaticBuffers(cache_key, cache_value, past_len, key_mask, in_place=in_place, rows=rows))


def _head_scale(head_mask: Tensor, z: Tensor) -> Tensor:
    """head_mask (h) or (b h) -> a factor broadcastable to Z (b h t d)."""
    hm = head_mask.to(z.dtype)
    if hm.dim() == 1:
        return rearrange(hm, "h -> 1 h 1 1")
    return rearrange(hm, "b h -> b h 1 1")
