"""A static KV cache: buffers of a fixed capacity written in place, the way a deployed decoder
keeps its cache (transformers' StaticCache, ONNX Runtime's shared past/present buffer).

    cache = zoo.StaticCache.empty(block.spec, batch=1, max_len=4096)
    y = block.decode(x, cache=cache)          # writes this call's keys/values at cache.length

One step reads the projection weights and the cache once, and writes only this call's keys and
values: no per-step copy of the past (`torch.cat` copies all of it every step). The attention
reads each kv head once: the r = h / g query heads of a group are folded into the query axis,

    Q (b (g r) t d) -> (b g (r t) d),   scores = Q K^T over (b g (r t) n),

so a kv head is streamed once per step, not once per query head. Positions past the written
length are hidden by the causal rule in cache-index space, so the buffer's tail is never read
into a result.

`static_step` is the one function both the eager path and the exported graph run: eager writes
the buffers in place (`index_copy_`); traced, the write is a functional `index_copy` (ONNX
ScatterND), which ONNX Runtime performs in place when the session binds the same buffer as the
cache input and the present output.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from einops import rearrange, repeat
from torch import Tensor

from .errors import CacheFullError, InputError, InputTypeError
from .limits import check_fits
from .spec import AttentionSpec

MERGE_HEADS = "b h t d -> b t (h d)"
FOLD = "b (g r) t d -> b g (r t) d"
UNFOLD = "b g (r t) d -> b (g r) t d"


def static_cache_bytes(spec: AttentionSpec, batch: int, max_len: int, itemsize: int, *, key_mask: bool = False) -> int:
    """Bytes of a static cache's buffers: key (b g n dk) and value (b g n dv), and a key mask (b n) bool."""
    return _buffer_bytes(batch, max_len, spec.kv_heads_, spec.d_k_ + spec.d_v_, itemsize, key_mask)


def _buffer_bytes(batch: int, max_len: int, kv_heads: int, d_kv: int, itemsize: int, key_mask: bool) -> int:
    return batch * max_len * (kv_heads * d_kv * itemsize + int(key_mask))


def check_room(capacity: int, length: int, new: int, *, fix: str) -> None:
    """The one capacity rule of a static cache, eager, ONNX Runtime and served alike: `length`
    written positions and `new` ones must fit in `capacity` (max_len); CacheFullError otherwise,
    naming the numbers and `fix`, before anything is written."""
    if length + new > capacity:
        raise CacheFullError(
            f"a static cache of max_len={capacity} positions cannot take {length} written + {new} new = "
            f"{length + new}: {fix}"
        )


def check_static_fits(
    spec: AttentionSpec, batch: int, max_len: int, itemsize: int, *, key_mask: bool = False, device=None
) -> None:
    """Raise ResourceError, before anything is allocated, for buffers past the memory of this machine
    (or of `device`, a CUDA device's total memory); a "meta" device allocates nothing."""
    _check_bytes_fit(static_cache_bytes(spec, batch, max_len, itemsize, key_mask=key_mask), batch, max_len, device)


def _check_bytes_fit(need: int, batch: int, max_len: int, device) -> None:
    limit = None
    device = torch.device(device) if device is not None else None
    if device is not None and device.type == "meta":
        return
    if device is not None and device.type == "cuda" and torch.cuda.is_available():
        limit = torch.cuda.get_device_properties(device).total_memory
    where = f" on {device}" if limit is not None else ""
    check_fits(need, f"a static cache (batch={batch}, max_len={max_len}){where}", limit=limit)


@dataclass
class StaticCache:
    """key (b g n dk) and value (b g n dv) of capacity n; `length` positions are written.

    key_mask (b n) bool, True = a real key, serves left-padded rows (a row's positions count its
    real keys only); None means every written position is real. A decode call's key_mask
    (b, length + t) is written into it.
    """

    key: Tensor
    value: Tensor
    length: int = 0
    key_mask: Tensor | None = None

    @classmethod
    def empty(
        cls,
        spec: AttentionSpec,
        *,
        batch: int,
        max_len: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> StaticCache:
        for name, v in (("batch", batch), ("max_len", max_len)):
            if isinstance(v, bool) or not isinstance(v, int):
                raise InputTypeError(f"{name}={v!r} must be an int")
            if v < 1:
                raise InputError(f"{name}={v} must be at least 1")
        if not isinstance(dtype, torch.dtype):
            raise InputTypeError(f"dtype={dtype!r} must be a torch.dtype, e.g. torch.float32")
        try:
            device = torch.device(device)
        except (RuntimeError, TypeError):
            raise InputTypeError(f"device={device!r} is not a torch device (e.g. 'cpu', 'cuda')") from None
        check_static_fits(spec, batch, max_len, dtype.itemsize, device=device)  # before torch allocates
        g = spec.kv_heads_
        key = torch.zeros(batch, g, max_len, spec.d_k_, dtype=dtype, device=device)
        value = torch.zeros(batch, g, max_len, spec.d_v_, dtype=dtype, device=device)
        return cls(key, value)

    @classmethod
    def from_past(cls, past_key: Tensor, past_value: Tensor, *, max_len: int) -> StaticCache:
        """A cache of capacity max_len holding a past (b g p d) from a growing-cache call."""
        b, g, p, dk = past_key.shape
        if isinstance(max_len, bool) or not isinstance(max_len, int):
            raise InputTypeError(f"max_len={max_len!r} must be an int")
        check_room(max_len, 0, p, fix=f"give max_len >= {p} for this past")
        need = _buffer_bytes(b, max_len, g, dk + past_value.shape[-1], past_key.element_size(), False)
        _check_bytes_fit(need, b, max_len, past_key.device)  # empty()'s check: a CUDA past against its device
        key = past_key.new_zeros(b, g, max_len, dk)
        value = past_value.new_zeros(b, g, max_len, past_value.shape[-1])
        key[:, :, :p] = past_key
        value[:, :, :p] = past_value
        return cls(key, value, p)

    @property
    def capacity(self) -> int:
        return self.key.shape[2]

    def valid(self) -> tuple[Tensor, Tensor]:
        """The written positions as (b g length d) views."""
        return self.key[:, :, : self.length], self.value[:, :, : self.length]


def static_step(
    block,
    x: Tensor,
    cache_key: Tensor,
    cache_value: Tensor,
    past_len: Tensor,
    key_mask: Tensor | None = None,
    *,
    in_place: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """x (b t c) at cache indices past_len..past_len+t-1 -> y (b t c), the caches with this call's
    keys and values written (the same tensors when in_place).

    past_len is a 0-d int64 tensor; key_mask (b n) bool over the whole capacity (entries at or
    past past_len + t are not read).
    """
    t, n = x.shape[1], cache_key.shape[2]
    ok = None
    if not in_place:
        # The exported graph's guard: another runtime may feed any past_len, and ScatterElements and
        # Gather read a negative index from the end (past_len = -1 wrote at n - 1). Outside 0..n-t
        # the indices are moved to 0.. (clipped to n - 1, for t > n) and the write below puts back
        # what is there: every index stays inside the buffer, whether or not the runtime checks
        # bounds, and the buffer is unchanged (eager calls are checked before).
        ok = (past_len >= 0) & (past_len <= n - t)
        past_len = torch.where(ok, past_len, 0)
    idx = past_len + torch.arange(t, device=x.device)  # (t) cache indices written by this call
    if ok is not None:
        idx = idx.clamp(max=n - 1)
    j = torch.arange(n, device=x.device)
    if key_mask is None:
        k_pos, q_pos = j[None], idx[None]
    else:
        k_pos = key_mask.long().cumsum(-1) - 1  # a row's n-th real key sits at position n - 1
        q_pos = k_pos.index_select(1, idx)
    q, k, v = block.new_heads(x, q_pos)
    if in_place:
        cache_key.index_copy_(2, idx, k)
        cache_value.index_copy_(2, idx, v)
    else:  # ONNX ScatterElements on axis 2: no transpose of the cache around the write
        where = rearrange(idx, "t -> 1 1 t 1")
        wk, wv = where.expand_as(k), where.expand_as(v)
        # a bad past_len writes back the t positions' own values (a Gather of t, not a Where of n)
        k_w = torch.where(ok, k, cache_key.gather(2, wk))
        v_w = torch.where(ok, v, cache_value.gather(2, wv))
        cache_key = cache_key.scatter(2, wk, k_w)
        cache_value = cache_value.scatter(2, wv, v_w)
    # Causal in cache-index space: a query at index i reads indices <= i, so the unwritten tail
    # (indices >= past_len + t) is never read. Modifiers add their rules over token positions.
    allowed = rearrange(j, "n -> 1 1 1 n") <= rearrange(idx, "t -> 1 1 t 1")
    extra, bias = block.position_scores(q_pos, k_pos, x.dtype)
    if extra is not None:
        allowed = allowed & extra
    if key_mask is not None:
        allowed = allowed & rearrange(key_mask, "b n -> b 1 1 n")
    z = folded_attention(block, q, cache_key, cache_value, allowed, bias)
    return block.out_proj(rearrange(z, MERGE_HEADS)), cache_key, cache_value


def folded_attention(block, q: Tensor, k: Tensor, v: Tensor, allowed: Tensor, bias: Tensor | None) -> Tensor:
    """Z (b h t dv) from Q (b h t dk) and K, V (b g n d), reading each kv head once.

    The scores, mask and softmax are written out (as the explicit path): a row with no allowed
    key gets zero weights and Z = 0.
    """
    s = block.spec
    r, t = s.group_size, q.shape[2]
    half = q.dtype in (torch.float16, torch.bfloat16)
    qf = rearrange(q * s.scale_, FOLD, r=r)
    if half:  # fp16 Q K^T overflows long before the softmax does: scores in fp32 (explicit path's rule)
        scores = torch.matmul(qf.float(), k.float().transpose(-1, -2))
    else:
        scores = torch.matmul(qf, k.transpose(-1, -2))  # (b g (r t) n)
    for mod in block.mods.values():
        if mod.needs_explicit:
            scores = mod.score_map(scores)
    if bias is not None:
        scores = scores + _fold_heads(bias, s.heads, r, t).to(scores.dtype)
    scores = scores.masked_fill(~_fold_heads(allowed, s.heads, r, t), float("-inf"))
    finfo = torch.finfo(scores.dtype)
    row_max = scores.amax(dim=-1, keepdim=True).clamp_min(finfo.min)
    e = torch.exp(scores - row_max)
    weights = e / e.sum(dim=-1, keepdim=True).clamp_min(finfo.tiny)
    z = torch.matmul(weights.to(v.dtype), v)  # (b g (r t) dv)
    return rearrange(z, UNFOLD, r=r)


def _fold_heads(m: Tensor, h: int, r: int, t: int) -> Tensor:
    """A per-head (b|1, h|1, t|1, n) mask or bias in the folded layout (b|1, g|1, (r t), n)."""
    m = m.expand(m.shape[0], m.shape[1], t, m.shape[3])
    if m.shape[1] == h:
        return rearrange(m, FOLD, r=r)
    return repeat(m, "b 1 t n -> b 1 (r t) n", r=r)


def check_static_call(spec: AttentionSpec, x: Tensor, cache: StaticCache, key_mask: Tensor | None) -> None:
    """Validate an eager decode call against a static cache (shapes, dtype, capacity)."""
    if not isinstance(cache, StaticCache):
        raise InputTypeError(f"cache must be a zoo.StaticCache, got {type(cache).__name__}")
    b, t = x.shape[0], x.shape[1]
    for name, buf, d in (("key", cache.key, spec.d_k_), ("value", cache.value, spec.d_v_)):
        want = (b, spec.kv_heads_, cache.capacity, d)
        if tuple(buf.shape) != want:
            raise InputError(f"cache.{name} has shape {tuple(buf.shape)}; expected (b, g, n, d) = {want}")
        if buf.dtype != x.dtype or buf.device != x.device:
            raise InputTypeError(f"cache.{name} is {buf.dtype} on {buf.device}; x is {x.dtype} on {x.device}")
    check_room(cache.capacity, cache.length, t, fix="allocate a larger cache with max_len")
    if key_mask is not None:
        want = (b, cache.length + t)
        if not isinstance(key_mask, Tensor) or key_mask.dtype != torch.bool:
            raise InputTypeError(f"key_mask must be a bool torch.Tensor (True = a real key) of shape (b, p+t) = {want}")
        if tuple(key_mask.shape) != want:
            raise InputError(f"key_mask has shape {tuple(key_mask.shape)}; expected (b, p+t) = {want}")
        if key_mask.device != x.device:
            raise InputTypeError(f"key_mask is on {key_mask.device}; x is on {x.device}")


def eager_step(block, x: Tensor, cache: StaticCache, key_mask: Tensor | None) -> Tensor:
    """block.decode(x, cache=cache): write this call's keys/values in place, advance the length."""
    check_static_call(block.spec, x, cache, key_mask)
    p, t = cache.length, x.shape[1]
    if key_mask is not None:
        if cache.key_mask is None:  # earlier positions were all real
            cache.key_mask = torch.ones(x.shape[0], cache.capacity, dtype=torch.bool, device=x.device)
        cache.key_mask[:, : p + t] = key_mask
    elif cache.key_mask is not None:
        cache.key_mask[:, p : p + t] = True
    past_len = torch.tensor(p, dtype=torch.long, device=x.device)
    y, _, _ = static_step(block, x, cache.key, cache.value, past_len, cache.key_mask, in_place=True)
    cache.length = p + t
    return y
