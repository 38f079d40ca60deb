"""KV caches, as the decode step sees them: a small protocol (`KVCache`) and its two kinds.

  GrowingCache   past_key/past_value as a previous call returned them; the present is the past
                 followed by this call's keys and values (torch.cat copies all of it every step)
  StaticBuffers  buffers of a fixed capacity written in place, the way a deployed decoder keeps its
                 cache (transformers' StaticCache, ONNX Runtime's shared past/present buffer);
                 zoo.StaticCache holds them between eager calls

    cache = zoo.StaticCache.empty(block.spec, batch=1, max_len=4096)
    y = block.decode(x, cache=cache)          # writes this call's keys/values at cache.length

A kind says where a call's t positions sit among the keys it reads (`place`: token positions for
the modifiers, the coordinates the causal rule compares, the key_mask) and stores this call's keys
and values (`write`). The block does the rest, the same step for both (zoo/attention.py).

A static step reads the projection weights and the cache once and writes only this call's keys
and values. Its attention reads each kv head once (zoo.attend.folded_attention), and its causal
rule compares cache indices, so the buffer's tail past the written length is never read into a
result. The exported graph runs the same step: eager writes the buffers in place (`index_copy_`);
traced, the write is a functional scatter (ONNX ScatterElements), which ONNX Runtime performs in
place when the session binds the same buffer as the cache input and the present output.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol

import torch
from einops import rearrange
from torch import Tensor

from .attend import key_positions
from .attention_spec import AttentionSpec
from .errors import InputError, InputTypeError
from .limits import check_fits, check_room


def static_cache_bytes(spec: AttentionSpec, batch: int, max_len: int, itemsize: int, *, key_mask: bool = False) -> int:
    """Bytes of a static cache's buffers: key (b g n dk) and value (b g n dv), and a key mask (b n) bool
    (under a KV latent: the rotary key (b 1 n rope_dim) and the latent (b 1 n kv_lora_rank))."""
    g, dk, dv = spec.cache_widths_
    return _buffer_bytes(batch, max_len, g, dk + dv, itemsize, key_mask)


def _buffer_bytes(batch: int, max_len: int, kv_heads: int, d_kv: int, itemsize: int, key_mask: bool) -> int:
    return batch * max_len * (kv_heads * d_kv * itemsize + int(key_mask))


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
        g, dk, dv = spec.cache_widths_
        key = torch.zeros(batch, g, max_len, dk, dtype=dtype, device=device)
        value = torch.zeros(batch, g, max_len, dv, dtype=dtype, device=device)
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

    def open(self, t: int, key_mask: Tensor | None) -> StaticBuffers:
        """The in-place view of one eager call of t positions at `length` (checked: they fit), its
        key_mask (b, length + t) written into the cache's own; the caller advances `length` after."""
        p = self.length
        if key_mask is not None:
            if self.key_mask is None:  # earlier positions were all real
                self.key_mask = torch.ones(key_mask.shape[0], self.capacity, dtype=torch.bool, device=key_mask.device)
            self.key_mask[:, : p + t] = key_mask
        elif self.key_mask is not None:
            self.key_mask[:, p : p + t] = True
        past_len = torch.tensor(p, dtype=torch.long, device=self.key.device)
        return StaticBuffers(self.key, self.value, past_len, self.key_mask, in_place=True)


# -- the protocol a decode step reads -------------------------------------------------------------


@dataclass(frozen=True)
class Placement:
    """Where one decode call's t positions sit among the s keys it reads.

    q_pos (b|1, t), k_pos (b|1, s): token positions, for the modifiers (RoPE, ALiBi, window).
    q_at (b|1, t), k_at (b|1, s): what the causal rule compares: token positions in a growing
      cache; cache indices in a static one, so its unwritten tail is never read.
    key_mask (b, s) bool or None: the real keys (the key_mask rule); None = all real.
    index (t) and inside (0-d bool), a static cache's own: the indices this call writes, and, in
      the exported graph, whether past_len lay inside the buffer (None when checked before).
    """

    q_pos: Tensor
    k_pos: Tensor
    q_at: Tensor
    k_at: Tensor
    key_mask: Tensor | None = None
    index: Tensor | None = None
    inside: Tensor | None = None


class KVCache(Protocol):
    """One decode call's cache: where its positions sit, and where its keys and values go."""

    # Read each kv head once (zoo.attend.folded_attention), or take the block's own kernel.
    folded: ClassVar[bool]

    def place(self, t: int, device: torch.device) -> Placement:
        """Where this call's t new positions sit."""
        ...

    def write(self, k: Tensor, v: Tensor, at: Placement) -> tuple[Tensor, Tensor]:
        """Store this call's K (b g t dk), V (b g t dv); returns the keys and values the step reads."""
        ...


@dataclass(frozen=True)
class GrowingCache:
    """past_key (b g p dk), past_value (b g p dv) from an earlier call (None: p = 0) and key_mask
    (b p+t) bool, True = a real key; this call's keys and values are appended (a new present)."""

    past_key: Tensor | None = None
    past_value: Tensor | None = None
    key_mask: Tensor | None = None
    folded: ClassVar[bool] = False

    def place(self, t: int, device: torch.device) -> Placement:
        p = 0 if self.past_key is None else self.past_key.shape[2]
        if self.key_mask is None:
            k_pos = torch.arange(p + t, device=device)[None]
        else:
            k_pos = key_positions(self.key_mask)
        q_pos = k_pos[:, p:]
        return Placement(q_pos, k_pos, q_pos, k_pos, self.key_mask)

    def write(self, k: Tensor, v: Tensor, at: Placement) -> tuple[Tensor, Tensor]:
        if self.past_key is not None and self.past_key.shape[2]:
            k = torch.cat((self.past_key, k), dim=2)
            v = torch.cat((self.past_value, v), dim=2)
        return k, v


@dataclass(frozen=True)
class StaticBuffers:
    """key (b g n dk), value (b g n dv) of capacity n, past_len (0-d int64) positions written, and
    key_mask (b n) bool over the whole capacity (entries at or past past_len + t are not read).

    in_place: eager, the buffers are written in place (index_copy_) and past_len was checked;
    otherwise (the exported graph) the write is functional and guards past_len itself.
    """

    key: Tensor
    value: Tensor
    past_len: Tensor
    key_mask: Tensor | None = None
    in_place: bool = True
    # a traced whole model's packed rows (position_ids (b t) int64, seqlens_k (b) int32, total_sequence_length
    # () int32), which only a spliced layer reads (export/splice.py); past_len is then each row's (b), key_mask None
    rows: tuple[Tensor, Tensor, Tensor] | None = None
    folded: ClassVar[bool] = True

    def place(self, t: int, device: torch.device) -> Placement:
        n, past_len, inside = self.key.shape[2], self.past_len, None
        if not self.in_place:
            # The exported graph's guard: another runtime may feed any past_len, and ScatterElements and
            # Gather read a negative index from the end (past_len = -1 wrote at n - 1). Outside 0..n-t
            # the indices are moved to 0.. (clipped to n - 1, for t > n) and the write puts back
            # what is there: every index stays inside the buffer, whether or not the runtime checks
            # bounds, and the buffer is unchanged (eager calls are checked before).
            inside = (past_len >= 0) & (past_len <= n - t)
            past_len = torch.where(inside, past_len, 0)
        idx = past_len + torch.arange(t, device=device)  # (t) cache indices written by this call
        if inside is not None:
            idx = idx.clamp(max=n - 1)
        q_at, k_at = idx[None], torch.arange(n, device=device)[None]
        if self.key_mask is None:
            q_pos, k_pos = q_at, k_at
        else:
            k_pos = key_positions(self.key_mask)
            q_pos = k_pos.index_select(1, idx)
        return Placement(q_pos, k_pos, q_at, k_at, self.key_mask, idx, inside)

    def write(self, k: Tensor, v: Tensor, at: Placement) -> tuple[Tensor, Tensor]:
        key, value, idx = self.key, self.value, at.index
        if self.in_place:
            key.index_copy_(2, idx, k)
            value.index_copy_(2, idx, v)
            return key, value
        # ONNX ScatterElements on axis 2: no transpose of the cache around the write
        where = rearrange(idx, "t -> 1 1 t 1")
        wk, wv = where.expand_as(k), where.expand_as(v)
        # a bad past_len writes back the t positions' own values (a Gather of t, not a Where of n)
        k_w = torch.where(at.inside, k, key.gather(2, wk))
        v_w = torch.where(at.inside, v, value.gather(2, wv))
        return key.scatter(2, wk, k_w), value.scatter(2, wv, v_w)
