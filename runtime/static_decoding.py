"""Token-by-token runs of a static-cache decode model (export_onnx(..., decode=True, cache="static")).

The model takes the cache as two buffers of capacity n (past_key, past_value: b g n d) and
past_len, and writes this call's keys and values into them at past_len (ScatterElements). Each
buffer is bound once, as the input *and* as the output of the same name, so ONNX Runtime writes
the new positions in place: a step reads the weights and the cache and writes one position, and
nothing of the cache's size is allocated or copied per step.

The calls keep the growing-cache API: `decode(x, past_key, past_value)` places a past (b g p d)
into buffers of the model's capacity, and both calls return the presents holding the p + t valid
positions. A run that would write past the capacity is refused before anything is written.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

import zoo
from zoo.limits import check_room

from .decoding import chunks_one_row_at_a_time
from .feeds import check_cache_key_mask, check_decode_inputs, check_x
from .io import CACHE_KEY, CACHE_KEY_MASK, CACHE_PRESENT_KEY, CACHE_PRESENT_VALUE, CACHE_VALUE, PAST_LEN, X, Y
from .tensors import from_numpy, is_tensor

if TYPE_CHECKING:
    from .core import RuntimeSession


def capacity(sess: RuntimeSession) -> int:
    """The static cache's capacity n recorded at export (attnzoo.max_len): the one reader of that key
    (the session and the server), ASCII digits only ('²'.isdigit() is True, int('²') fails)."""
    raw = sess.metadata.get("attnzoo.max_len")
    if raw is None:
        raise zoo.InputError(f"{sess.path} has no attnzoo.max_len metadata; re-export it with attnzoo")
    if not (raw.isascii() and raw.isdigit()) or int(raw) < 1:
        raise zoo.InputError(
            f"{sess.path} records no valid capacity (attnzoo.max_len={raw!r}, not a positive int); "
            f"re-export it with --max-len N"
        )
    return int(raw)


def checked_capacity(sess: RuntimeSession, batch: int, max_len) -> int:
    """The capacity of a cache of `batch` rows: max_len (None: the exported one), a positive int no larger
    than the exported capacity, whose buffers fit in this machine's memory (zoo.ResourceError before
    anything is allocated, not numpy's MemoryError)."""
    exported = capacity(sess)
    n = exported if max_len is None else max_len
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise zoo.ArgumentError(f"max_len={n!r} must be a positive int (the cache's capacity)")
    if n > exported:
        raise zoo.ArgumentError(
            f"max_len={n} is past this model's capacity of {exported} positions (attnzoo.max_len, fixed at "
            f"export): give max_len <= {exported}, or re-export with --max-len {n} (max_len={n})"
        )
    from zoo.cache import check_static_fits  # a block's cache: its spec (and torch) are loaded

    check_static_fits(sess.spec, batch, n, sess.dtype.itemsize, key_mask=CACHE_KEY_MASK.name in sess.input_names)
    return n


RE_EXPORT = "re-export with a larger --max-len (max_len=)"


class OrtStaticCache:
    """The bound cache of a static-cache session: buffers (b g n d) written in place by each step.

        cache = sess.static_cache(batch=1, past_key=pk, past_value=pv)   # or an empty past
        y = cache.step(x)          # x (b t c) at positions length..length+t-1; length advances
        cache.rewind(p)            # forget everything after position p (nothing is copied)
        key, value = cache.presents()

    max_len (default: the model's attnzoo.max_len) is the capacity, at most the exported one;
    each step reads all of it (the unwritten tail is masked), so choose it near the longest run,
    as with transformers' StaticCache. key_mask (b, p + k) covers the past and the positions the
    run will add. Buffers past the machine's memory are refused (zoo.ResourceError) before any
    is allocated.
    """

    def __init__(self, sess: RuntimeSession, pk: np.ndarray, pv: np.ndarray, km: np.ndarray | None, *, max_len=None):
        import onnxruntime as ort

        b, g, p = pk.shape[:3]
        n = checked_capacity(sess, b, max_len)
        check_room(n, 0, p, fix="give max_len >= the past's length")
        self.sess, self.length, self.capacity, self.batch = sess, p, n, b
        self.key = np.zeros((b, g, n, pk.shape[3]), pk.dtype)
        self.value = np.zeros((b, g, n, pv.shape[3]), pv.dtype)
        self.key[:, :, :p] = pk
        self.value[:, :, :p] = pv
        self.device = "cuda" if sess.provider == "cuda" else "cpu"
        # On the CPU the OrtValue wraps the numpy buffer itself (no copy): writes land in self.key.
        self.key_ov = ort.OrtValue.ortvalue_from_numpy(self.key, self.device, 0)
        self.value_ov = ort.OrtValue.ortvalue_from_numpy(self.value, self.device, 0)
        self.binding = binding = sess.new_binding()
        binding.bind_output(Y.name, self.device)  # first: get_outputs()[0] is y
        binding.bind_ortvalue_input(CACHE_KEY.name, self.key_ov)
        binding.bind_ortvalue_input(CACHE_VALUE.name, self.value_ov)
        binding.bind_ortvalue_output(CACHE_PRESENT_KEY.name, self.key_ov)
        binding.bind_ortvalue_output(CACHE_PRESENT_VALUE.name, self.value_ov)
        if CACHE_KEY_MASK.name in sess.input_names:  # (b, p + k) -> the whole capacity; later positions are real
            self.key_mask = np.ones((b, n), np.bool_)
            if km is not None:
                self.key_mask[:, : min(km.shape[1], n)] = km[:, :n]
            binding.bind_cpu_input(CACHE_KEY_MASK.name, self.key_mask)

    def check_room(self, t: int) -> None:
        """Refuse, before anything is written, a run of t positions past the capacity."""
        check_room(self.capacity, self.length, t, fix=f"{RE_EXPORT}, or rewind()")

    def step(self, x):
        """x (b t c) -> y (b t c); this call's keys and values are written at `length` in place.

        x is checked as sess.decode checks it (a torch tensor or numpy array of the model's dtype,
        (b, t >= 1, d_model)) and must have this cache's batch; torch in -> torch out (on the CPU),
        numpy in -> numpy out."""
        as_torch = is_tensor(x)
        x = check_x(self.sess, x, batch=self.batch)
        if x.shape[1] > 1:  # a chunk's scores (b h t n); one token's are smaller than the buffers held
            self.sess.check_size(x.shape[0], x.shape[1], self.capacity)
        y = self._advance(x)
        return from_numpy(y) if as_torch else y

    def _advance(self, x: np.ndarray) -> np.ndarray:
        """step() after its checks (decode and generate_steps have made them for the whole call)."""
        self.check_room(x.shape[1])
        b, t = x.shape[:2]
        if b > 1 and t > 1 and self.length > 0 and chunks_one_row_at_a_time(self.sess):
            return self._step_rows(x)
        return self._step(x)

    def _step(self, x: np.ndarray) -> np.ndarray:
        """One run over the buffers bound once: this call's keys and values land in them in place."""
        self.binding.bind_cpu_input(X.name, np.ascontiguousarray(x))
        self.binding.bind_cpu_input(PAST_LEN.name, np.array(self.length, np.int64))
        self.binding.bind_output(Y.name, self.device)  # a fresh y each step (t may change); stays output 0
        self.sess.run_with_iobinding(self.binding)
        self.length += x.shape[1]
        return self.binding.get_outputs()[0].numpy()

    def _step_rows(self, x: np.ndarray) -> np.ndarray:
        """A chunk (t > 1) after a past, one row at a time: GroupQueryAttention refuses b > 1 there
        ("batch_size must be 1 when sequence_length > 1 and past context is given"). Each row binds
        its own slice of the buffers (a view on the CPU: still written in place); a device cache is
        copied to the host for the chunk and back, which only a chunked call pays."""
        import onnxruntime as ort

        on_cpu = self.device == "cpu"
        key, value = (self.key, self.value) if on_cpu else (self.key_ov.numpy(), self.value_ov.numpy())
        ys = []
        for r in range(x.shape[0]):
            rows = [ort.OrtValue.ortvalue_from_numpy(buf[r : r + 1], "cpu", 0) for buf in (key, value)]
            binding = self.sess.new_binding()
            binding.bind_output(Y.name, "cpu")
            binding.bind_cpu_input(X.name, np.ascontiguousarray(x[r : r + 1]))
            binding.bind_cpu_input(PAST_LEN.name, np.array(self.length, np.int64))
            for past, present, row in zip((CACHE_KEY, CACHE_VALUE), (CACHE_PRESENT_KEY, CACHE_PRESENT_VALUE), rows):
                binding.bind_ortvalue_input(past.name, row)
                binding.bind_ortvalue_output(present.name, row)
            if CACHE_KEY_MASK.name in self.sess.input_names:
                binding.bind_cpu_input(CACHE_KEY_MASK.name, self.key_mask[r : r + 1])
            self.sess.run_with_iobinding(binding)
            ys.append(binding.get_outputs()[0].numpy())
        if not on_cpu:
            self.key_ov.update_inplace(key)
            self.value_ov.update_inplace(value)
        self.length += x.shape[1]
        return np.concatenate(ys)

    def rewind(self, length: int) -> None:
        """Keep positions < length; the next step writes at `length` (nothing is copied or cleared)."""
        if isinstance(length, bool) or not isinstance(length, int) or not 0 <= length <= self.length:
            raise zoo.ArgumentError(f"length={length!r} must be an int in 0..{self.length}")
        self.length = length

    def presents(self) -> tuple[np.ndarray, np.ndarray]:
        """Copies of the written positions, (b g length dk) and (b g length dv)."""
        if self.device != "cpu":
            key, value = self.key_ov.numpy(), self.value_ov.numpy()
        else:
            key, value = self.key, self.value
        n = self.length
        return np.ascontiguousarray(key[:, :, :n]), np.ascontiguousarray(value[:, :, :n])


def static_cache(sess: RuntimeSession, batch: int, past_key=None, past_value=None, key_mask=None, *, max_len=None):
    """sess.static_cache(...): an OrtStaticCache for `batch` rows holding the given past (None: empty)."""
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise zoo.ArgumentError(f"batch={batch!r} must be a positive int")
    checked_capacity(sess, batch, max_len)  # before any array of `batch` rows is made
    x = np.zeros((batch, 1, sess.spec.d_model), sess.dtype)
    _, pk, pv, _, p = check_decode_inputs(sess, x, past_key, past_value, None)
    key_mask = check_cache_key_mask(sess, key_mask, batch, p)
    return OrtStaticCache(sess, pk, pv, key_mask, max_len=max_len)


def decode(sess: RuntimeSession, x, past_key=None, past_value=None, key_mask=None):
    """One call: x (b t c) after a past (b g p d) -> y (b t c), present_key, present_value (b g p+t d)."""
    as_torch = is_tensor(x)
    x, pk, pv, km, p = check_decode_inputs(sess, x, past_key, past_value, key_mask)
    cache = _call_cache(sess, pk, pv, km, x.shape[1])
    y = cache._advance(x)
    out = (y, *cache.presents())
    return tuple(from_numpy(o) for o in out) if as_torch else out


def generate_steps(sess: RuntimeSession, x_steps, past_key=None, past_value=None, key_mask=None):
    """x_steps (b k c) one position at a time into buffers bound once -> y (b k c), presents (b g p+k d).

    key_mask, if the model takes one, is (b p+k) for the whole run."""
    as_torch = is_tensor(x_steps)
    x, pk, pv, km, p = check_decode_inputs(sess, x_steps, past_key, past_value, key_mask, steps=None)
    k = x.shape[1]
    cache = _call_cache(sess, pk, pv, km, k)
    ys = np.empty_like(x)
    for i in range(k):
        ys[:, i] = cache._advance(x[:, i : i + 1])[:, 0]
    out = (ys, *cache.presents())
    return tuple(from_numpy(o) for o in out) if as_torch else out


def _call_cache(sess: RuntimeSession, pk, pv, km, new: int) -> OrtStaticCache:
    """Buffers for one stateless call that adds `new` positions to a past (the API of the growing
    cache, and what a server calls): refused past the model's capacity, before anything is written,
    but sized to the call (p + new), since the graph takes any capacity: a call allocates and reads
    what it uses, not the whole max_len."""
    p = pk.shape[2]
    check_room(capacity(sess), p, new, fix=RE_EXPORT)  # no rewind(): the caller holds no cache
    return OrtStaticCache(sess, pk, pv, km, max_len=p + new)
