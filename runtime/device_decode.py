"""The drivers of a whole model's generation loop (runtime/generation.py): what is bound and run for the prompt
and for each decode step. numpy + onnxruntime only.

Both keep the public rule, transformers' left padding (attention_mask (b t)); they differ in the graph they feed
(export/lm_export.py, attnzoo.padding):

- LeftRows, a left-padded export (io.lm_interface): attention_mask (b n) over the capacity and one past_len;
  host arrays wrapped without a copy (the CPU's way).
- PackedRows, a packed-rows export (io.lm_interface(packed=True), docs/generation.md "The padding rule"): each
  row's real tokens are moved to start at cache slot 0 (a right-padded prompt of the longest row's width), so
  its slots are its positions; every call gives each row's length as seqlens_k (its length after the call - 1)
  and total_sequence_length: the prompt's width on a first call (GroupQueryAttention's "first prompt"), the
  capacity n on every later one (constant, as a captured CUDA graph needs: ort-cuda-kernels.md 1a, 1d), with
  position_ids (b t), each token's slot (the graph computes nothing from a shape on the device: a captured
  graph refuses a host-to-device copy inside it).
  Everything lives on the session's device (OrtValues allocated there; CPU OrtValues on the CPU, which is how
  it is tested), bound once per (batch, capacity) and reused by later calls:
    prefill  one run per prompt chunk (one row: chunks of PREFILL_CHUNK; a batch: one run), in a binding of its
             own (input_ids of the chunk's width), run option gpu_graph_id -1: never captured (genai's way);
    decode   one binding made once: input_ids (b 1), position_ids (b 1) and seqlens_k (b) on the device,
             written in place before each run (update_inplace: 2 b int64 and b int32 go up),
             total_sequence_length = n on the host (the op reads it there), the caches, logits (b 1 v) and
             next_token (b) on the device; with cuda_graph, run option gpu_graph_id = this binding's id:
             ONNX Runtime runs it twice, captures the third run and replays it from then on. Only
             next_token (b int64) comes back each step; a sampling call reads the logits back too (no
             sampling in the graph: ids-only is greedy's).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .io import (
    ATTENTION_MASK,
    INPUT_IDS,
    LM_PAST,
    LM_PRESENT,
    LOGITS,
    NEXT_TOKEN,
    PAST_LEN,
    POSITION_IDS,
    SEQLENS_K,
    TOTAL_SEQUENCE_LENGTH,
)
from .kv_buffers import BF16, as_float32, buffer_arrays, buffer_types, ort_value, widen

if TYPE_CHECKING:
    from .core import RuntimeSession

GRAPH_ID = "gpu_graph_id"  # ONNX Runtime's run option (kOrtRunOptionsConfigCudaGraphAnnotation)
NOT_CAPTURED = "-1"
PREFIX = LM_PAST.split("{", 1)[0]  # "past_key_values."


def is_packed(sess: RuntimeSession) -> bool:
    return SEQLENS_K.name in sess.input_names


def pack(ids: np.ndarray, mask: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Left-padded ids (b t) and their mask -> (ids (b w) with each row's real tokens from column 0, the rest
    0; lengths (b) int64), w the longest row."""
    b, t = ids.shape
    lengths = np.full(b, t, np.int64) if mask is None else mask.sum(axis=1).astype(np.int64)
    out = np.zeros((b, int(lengths.max())), np.int64)
    for r, n in enumerate(lengths):
        out[r, :n] = ids[r, t - n :]
    return out, lengths


def _logits_type(sess: RuntimeSession) -> str:
    return next(o.type for o in sess._sess.get_outputs() if o.name == LOGITS.name)


def returns_all_logits(sess: RuntimeSession) -> bool:
    """Whether a call's logits output holds every position of the call (an all_logits export: (b t v)), not the
    last one's only ((b 1 v))."""
    axes = next(o.shape for o in sess._sess.get_outputs() if o.name == LOGITS.name)
    return len(axes) == 3 and axes[1] != 1


def _logits_host(sess: RuntimeSession, b: int) -> np.ndarray:
    """A (b 1 v) host array for the step's logits in their type (bfloat16 as its uint16 bits)."""
    dtype = {"tensor(float16)": np.float16, BF16: np.uint16}.get(_logits_type(sess), np.float32)
    return np.zeros((b, 1, int(sess.metadata["attnzoo.vocab"])), dtype)


def _caches(sess: RuntimeSession, b: int, n: int, device: str) -> dict:
    """The zeroed cache buffers as OrtValues on `device`, each in the graph's element type (bfloat16 too)."""
    inputs = sess._sess.get_inputs()
    types = buffer_types(inputs, PREFIX)
    arrays = buffer_arrays(inputs, b, n, PREFIX, bf16_bits=True)
    return {name: (arr, ort_value(arr, types[name], device)) for name, arr in arrays.items()}


class LeftRows:
    """A left-padded export: the key mask over the capacity and one past_len, host arrays bound once."""

    def __init__(self, sess: RuntimeSession, b: int, t: int, n: int, prompt_mask, argmax: bool, choose) -> None:
        self.sess, self.t, self.argmax, self.choose, self.keep = sess, t, argmax, choose, []
        self.key_mask = np.ones((b, n), np.bool_)
        if prompt_mask is not None:
            self.key_mask[:, :t] = prompt_mask
        self.binding = binding = sess.new_binding()
        # name -> the host array its bound OrtValue wraps (a beam search reorders it; speculation binds row slices)
        self.cache_arrays = {}
        for name, (arr, buf) in _caches(sess, b, n, "cpu").items():
            self.cache_arrays[name] = arr
            layer, kv = name.split(".")[1:3]
            binding.bind_ortvalue_input(name, buf)
            binding.bind_ortvalue_output(LM_PRESENT.format(i=layer, kv=kv), buf)
        binding.bind_ortvalue_input(ATTENTION_MASK.name, self.bound(self.key_mask))
        self.past_len = np.zeros((), np.int64)
        binding.bind_ortvalue_input(PAST_LEN.name, self.bound(self.past_len))
        if argmax:
            self.next_token = np.zeros((b,), np.int64)
            binding.bind_ortvalue_output(NEXT_TOKEN.name, self.bound(self.next_token))
        self.logits_type = _logits_type(sess)
        self.step_logits = _logits_host(sess, b)
        self.step_ids = np.zeros((b, 1), np.int64)

    def bound(self, arr: np.ndarray, element_type: str = ""):
        self.keep.append(arr)  # the arrays the bound OrtValues wrap (CPU: no copy) stay alive for the whole loop
        return ort_value(arr, element_type, "cpu")

    def _fresh_run(self, ids: np.ndarray, starts) -> np.ndarray:
        """Runs ids from each of `starts` (chunks of ids' columns) into a fresh logits output -> the token."""
        binding = self.binding
        for start, end in starts:
            # a fresh logits output per chunk: an all_logits export's is (b, chunk, v), and a last, shorter chunk
            # run into the first one's output failed in ONNX Runtime (an output of another shape)
            binding.bind_output(LOGITS.name, "cpu")
            binding.bind_ortvalue_input(INPUT_IDS.name, self.bound(np.ascontiguousarray(ids[:, start:end])))
            self.past_len[()] = start
            self.sess.run_with_iobinding(binding)
        if self.argmax:
            token = self.next_token.copy()
        else:  # the logits are the one (b t|1 v) output; the presents are 4-d, next_token 1-d
            token = self.choose(as_float32(next(o for o in binding.get_outputs() if len(o.shape()) == 3))[:, -1])
        binding.bind_ortvalue_input(INPUT_IDS.name, self.bound(self.step_ids))
        binding.bind_ortvalue_output(LOGITS.name, self.bound(self.step_logits, self.logits_type))
        return token

    def prefill(self, ids: np.ndarray, chunk: int) -> np.ndarray:
        """The prompt at slots 0..t-1 (in chunks for one row: generation.prefill_chunk) -> the first token."""
        t = ids.shape[1]
        return self._fresh_run(ids, [(s, min(s + chunk, t)) for s in range(0, t, chunk)])

    def recompute(self, seq: np.ndarray) -> np.ndarray:
        """The whole sequence so far (b, t + i + 1) as one call from slot 0 -> the next token."""
        return self._fresh_run(seq, [(0, seq.shape[1])])

    def step(self, token: np.ndarray, i: int) -> np.ndarray:
        """Decode step i: token (b) at slot t + i -> the next token."""
        self.step_ids[:, 0] = token
        self.past_len[()] = self.t + i
        self.sess.run_with_iobinding(self.binding)
        if self.argmax:
            return self.next_token.copy()
        logits = widen(self.step_logits) if self.logits_type == BF16 else self.step_logits
        return self.choose(logits[:, -1])


class _DeviceBuffers:
    """The bound decode state of one (batch, capacity) on the session's device: the caches, the step's inputs
    and outputs and the step binding, made once and reused by every later call of that shape."""

    def __init__(self, sess: RuntimeSession, b: int, n: int, graph_id: int) -> None:
        import onnxruntime as ort

        self.device = sess.provider  # "cuda" | "cpu"
        self.graph_id = str(graph_id)

        def on_device(arr: np.ndarray):
            return ort.OrtValue.ortvalue_from_numpy(arr, self.device, 0)  # CPU: wraps arr (kept alive below)

        self.on_device = on_device
        self.on_host = lambda arr: ort.OrtValue.ortvalue_from_numpy(arr, "cpu", 0)
        # zeroed once, then never cleared: slots past a row's length are not read. A CPU OrtValue wraps its array
        # (a bfloat16 one its uint16 bits), which stays alive with this object; on a device the values are
        # copies, and the host arrays go (kept, they doubled the cache in host memory)
        caches = _caches(sess, b, n, self.device)
        self.cache_arrays = caches if self.device == "cpu" else {}
        self.caches = {name: value for name, (_, value) in caches.items()}
        self.ids_host, self.pos_host = np.zeros((b, 1), np.int64), np.zeros((b, 1), np.int64)
        self.seqlens_host, self.total_host = np.zeros((b,), np.int32), np.array(n, np.int32)
        self.ids, self.pos, self.seqlens = (
            on_device(self.ids_host),
            on_device(self.pos_host),
            on_device(self.seqlens_host),
        )
        self.total = self.on_host(self.total_host)  # GroupQueryAttention reads it on the host
        self.logits_host = _logits_host(sess, b)
        self.next_host = np.zeros((b,), np.int64)
        self.logits = ort_value(self.logits_host, _logits_type(sess), self.device)
        self.next_token = on_device(self.next_host)
        self.binding = self.bind(sess, self.ids, self.pos, self.seqlens, self.total, self.logits)

    def bind(self, sess: RuntimeSession, ids, positions, seqlens, total, logits):
        """A binding of the caches (each as past and present), next_token and the given step tensors."""
        binding = sess.new_binding()
        for name, buf in self.caches.items():
            layer, kv = name.split(".")[1:3]
            binding.bind_ortvalue_input(name, buf)
            binding.bind_ortvalue_output(LM_PRESENT.format(i=layer, kv=kv), buf)
        binding.bind_ortvalue_input(INPUT_IDS.name, ids)
        binding.bind_ortvalue_input(POSITION_IDS.name, positions)
        binding.bind_ortvalue_input(SEQLENS_K.name, seqlens)
        binding.bind_ortvalue_input(TOTAL_SEQUENCE_LENGTH.name, total)
        if logits is None:
            binding.bind_output(LOGITS.name, self.device)
        else:
            binding.bind_ortvalue_output(LOGITS.name, logits)
        if NEXT_TOKEN.name in sess.output_names:
            binding.bind_ortvalue_output(NEXT_TOKEN.name, self.next_token)
        return binding


def device_buffers(sess: RuntimeSession, b: int, n: int) -> _DeviceBuffers:
    """The session's bound decode state for (b, n): made on first use, then reused (a captured graph replays
    the addresses it was captured with, so a cuda_graph session keeps them; graph ids 1, 2, ... by shape)."""
    graphs = sess._graphs
    if (b, n) not in graphs:
        graphs[(b, n)] = _DeviceBuffers(sess, b, n, graph_id=sess.graph_id(("generate", b, n)))
    return graphs[(b, n)]


class PackedRows:
    """A packed-rows export (the module docstring): device-resident, bound once, the decode step replayable."""

    def __init__(self, sess: RuntimeSession, b: int, n: int, prompt_mask, argmax: bool, choose) -> None:
        import onnxruntime as ort

        self.sess, self.n, self.mask, self.choose = sess, n, prompt_mask, choose
        self.argmax = argmax and NEXT_TOKEN.name in sess.output_names
        # a cuda_graph session keeps its buffers for later calls; otherwise this call's own
        self.buf = device_buffers(sess, b, n) if sess.cuda_graph else _DeviceBuffers(sess, b, n, graph_id=1)
        self.lengths = np.zeros(b, np.int64)
        self.uncaptured = self.captured = None
        if sess.cuda_graph:
            self.uncaptured, self.captured = ort.RunOptions(), ort.RunOptions()
            self.uncaptured.add_run_config_entry(GRAPH_ID, NOT_CAPTURED)
            self.captured.add_run_config_entry(GRAPH_ID, self.buf.graph_id)

    def _first_call(self, ids: np.ndarray, lengths: np.ndarray, chunk: int) -> np.ndarray:
        """Packed ids (b w) from slot 0, each row's length, in chunks of `chunk` columns (one row) -> the token.
        A chunk's own binding: input_ids of its width, a fresh logits output, never captured."""
        buf, w = self.buf, ids.shape[1]
        for start in range(0, w, chunk):
            end = min(start + chunk, w)
            seqlens = (np.minimum(lengths, end) - 1).astype(np.int32)
            positions = np.broadcast_to(np.arange(start, end, dtype=np.int64), (ids.shape[0], end - start)).copy()
            total = np.array(end - start if start == 0 else self.n, np.int32)  # a first prompt: total == its width
            # held until the run: a CPU OrtValue wraps its array, which the binding alone does not keep alive
            chunk_ids = np.ascontiguousarray(ids[:, start:end])
            held = (buf.on_device(chunk_ids), buf.on_device(positions), buf.on_device(seqlens), buf.on_host(total))
            binding = buf.bind(self.sess, *held, None)
            self.sess.run_with_iobinding(binding, self.uncaptured)
        if self.argmax:
            return buf.next_token.numpy().copy()
        logits = next(o for o in binding.get_outputs() if len(o.shape()) == 3)
        return self.choose(as_float32(logits)[:, -1])

    def prefill(self, ids: np.ndarray, chunk: int) -> np.ndarray:
        """The left-padded prompt, packed -> the first token."""
        packed, self.lengths = pack(ids, self.mask)  # each row's prompt length: step i writes at lengths + i
        self.t = ids.shape[1]
        return self._first_call(packed, self.lengths, chunk)

    def recompute(self, seq: np.ndarray) -> np.ndarray:
        """The whole sequence so far (b, t + i + 1), left-padded as the prompt was, as one first call."""
        mask = None
        if self.mask is not None:  # the new tokens are real
            mask = np.ones(seq.shape, np.bool_)
            mask[:, : self.mask.shape[1]] = self.mask
        packed, lengths = pack(seq, mask)
        return self._first_call(packed, lengths, packed.shape[1])  # the lengths step i writes at stay the prompt's

    def step(self, token: np.ndarray, i: int) -> np.ndarray:
        """Decode step i: each row's token at its own slot, lengths[r] + i -> the next token."""
        buf = self.buf
        buf.ids_host[:, 0] = token
        buf.pos_host[:, 0] = self.lengths + i  # the slot it is written at, its position
        buf.seqlens_host[:] = self.lengths + i
        for value, host in ((buf.ids, buf.ids_host), (buf.pos, buf.pos_host), (buf.seqlens, buf.seqlens_host)):
            value.update_inplace(host)
        self.sess.run_with_iobinding(buf.binding, self.captured)
        if self.argmax:
            return buf.next_token.numpy().copy()
        return self.choose(as_float32(buf.logits)[:, -1])


__all__ = [
    "GRAPH_ID",
    "NOT_CAPTURED",
    "LeftRows",
    "PackedRows",
    "device_buffers",
    "is_packed",
    "pack",
    "returns_all_logits",
]
