"""Continuous batching over a packed-rows export (a CUDA export's default: runtime/device_decode.py, docs/generation.md
"The padding rule"): input_ids, position_ids, seqlens_k and total_sequence_length, no attention mask.

Every row owns its cache slots from 0 (its slots are its positions; seqlens_k[r] = its length - 1 after a call),
so rows are independent: no shared write index, no wait for one, no restart, and no row ever moves.

- Buffers: device_decode's _DeviceBuffers of max_rows rows x n slots, allocated once on the session's device
  (CPU OrtValues on the CPU) in the export's cache dtype (fp32, fp16 or bf16: numpy never touches a cache).
- A joining request takes the lowest free row r for each of its rows, and each row's prompt (its real tokens)
  runs alone INTO row r: past_* and present_* are bound to row r's slice, the contiguous (1 g n d) block at
  data_ptr + r * g*n*d * itemsize (pointer and shape: nothing is copied), position_ids 0..t-1, seqlens_k t-1,
  total_sequence_length the chunk's width on the first chunk (GroupQueryAttention's "first prompt"), n after
  (chunks of PREFILL_CHUNK, as OnnxSession.generate runs one row: runtime.generation.prefill_chunk).
- Each step runs rows 0..k-1, k the highest held row + 1, through a binding per k over the first k rows of
  the same buffers (pointer and shape again): input_ids, position_ids and seqlens_k (k) updated in place from
  host arrays (update_inplace), total_sequence_length = n (constant, as a captured graph needs), next_token
  (k) read back; the logits only when a running request chooses from them (a sampler, logprobs: bfloat16
  widened by kv_buffers.as_float32). A free row below k is fed token 0 at its slot 0 and its output ignored.
- With a cuda_graph session each k's step runs under a graph id of its own (ONNX Runtime captures it on its
  third run and replays it), every prefill under -1 (never captured). Unproven on a GPU so far.

Each request's tokens equal `OnnxSession.generate` of the request alone (tests/serve/test_generate_packed.py).
"""

from __future__ import annotations

import time

import numpy as np

from runtime.device_decode import GRAPH_ID, NOT_CAPTURED, _DeviceBuffers, pack
from runtime.generation import prefill_chunk
from runtime.io import INPUT_IDS, LM_PRESENT, LOGITS, NEXT_TOKEN, POSITION_IDS, SEQLENS_K, TOTAL_SEQUENCE_LENGTH
from runtime.kv_buffers import as_float32

from .prefix import chunks
from .protocol import GenItem
from .rows import OwnSlotsBatcher


def _needs_logits(it: GenItem) -> bool:
    """Whether a request chooses from the logits (a decoder that samples or lists logprobs); greedy /generate
    requests take next_token alone."""
    return it.decoder is not None and getattr(it.decoder, "needs_logits", True)


class PackedBatcher(OwnSlotsBatcher):
    """The continuous batcher of a packed-rows export (the module docstring).

    capacity: the slots n of every row: a request needs its prompt + max_new_tokens - 1 <= n."""

    def __init__(self, sess, max_rows: int, capacity: int, wait_s: float = 0.0, **options) -> None:
        super().__init__(sess, max_rows, capacity, wait_s, **options)
        import onnxruntime as ort

        self.buf = _DeviceBuffers(sess, max_rows, capacity, graph_id=0)
        if not self.buf.cache_arrays:  # the prefix cache copies numpy slices: the CPU's buffers only
            self.prefix = None
        self.lengths = np.zeros(max_rows, np.int64)  # each held row's cache length before the next step
        self.held = np.zeros(max_rows, np.bool_)
        self._steps: dict[int, object] = {}  # k -> the step's binding over rows 0..k-1
        self._graph_runs: dict[int, object] = {}  # k -> RunOptions with its graph id (cuda_graph)
        self.prefill_options = None
        if sess.cuda_graph:
            self.prefill_options = ort.RunOptions()
            self.prefill_options.add_run_config_entry(GRAPH_ID, NOT_CAPTURED)

    # -- binding views ------------------------------------------------------------------------

    def _view(self, value, start: int, rows: int) -> tuple:
        """(device, device id, element type, shape, pointer) of rows start..start+rows-1 of an OrtValue on
        the device: a contiguous block of its first axis."""
        shape = value.shape()
        per_row = value.tensor_size_in_bytes() // shape[0]
        return self.buf.device, 0, value.element_type(), [rows, *shape[1:]], value.data_ptr() + start * per_row

    def _bind_caches(self, binding, start: int, rows: int) -> None:
        """Each layer's cache as past and present: one and the same slice (the shared-buffer contract)."""
        for name, value in self.buf.caches.items():
            layer, kv = name.split(".")[1:3]
            view = self._view(value, start, rows)
            binding.bind_input(name, *view)
            binding.bind_output(LM_PRESENT.format(i=layer, kv=kv), *view)

    def _step_binding(self, k: int):
        if k not in self._steps:
            buf, binding = self.buf, self.sess.new_binding()
            self._bind_caches(binding, 0, k)
            for name, value in ((INPUT_IDS, buf.ids), (POSITION_IDS, buf.pos), (SEQLENS_K, buf.seqlens)):
                binding.bind_input(name.name, *self._view(value, 0, k))
            binding.bind_ortvalue_input(TOTAL_SEQUENCE_LENGTH.name, buf.total)  # n, on the host
            binding.bind_output(LOGITS.name, *self._view(buf.logits, 0, k))
            binding.bind_output(NEXT_TOKEN.name, *self._view(buf.next_token, 0, k))
            self._steps[k] = binding
            if self.sess.cuda_graph:  # a graph id of its own per batch size, apart from generate's
                import onnxruntime as ort

                options = ort.RunOptions()
                options.add_run_config_entry(GRAPH_ID, str(self.sess.graph_id(("continuous", id(self), k))))
                self._graph_runs[k] = options
        return self._steps[k]

    # -- joining --------------------------------------------------------------------------------

    def _prefill(self, row: int, ids: np.ndarray, logits: bool) -> tuple[int, np.ndarray | None]:
        """One row's real tokens (t,) into cache row `row` from slot 0 -> (the argmax token, with `logits` the
        last position's logits (v,) float32, else None). With a prefix cache, its first cached blocks are copied
        into the row's first slots (slot j is position j in every row: any row takes them) and the rest runs."""
        buf, t = self.buf, ids.shape[0]
        chunk = prefill_chunk(self.sess, 1, t)
        cached, prefix = 0, self.prefix
        if prefix is not None:
            cached, blocks = prefix.match(ids)
            for i, blob in enumerate(blocks):
                for name, arr in blob.items():
                    buf.cache_arrays[name][0][row, :, i * prefix.block : (i + 1) * prefix.block] = arr
            self._cached += cached
        for start, end in chunks(cached, t, chunk):
            # held until the run: a CPU OrtValue wraps its array, which the binding alone does not keep alive
            held = (
                buf.on_device(np.ascontiguousarray(ids[None, start:end])),
                buf.on_device(np.arange(start, end, dtype=np.int64)[None]),
                buf.on_device(np.array([end - 1], np.int32)),
                buf.on_host(np.array(end - start if start == 0 else self.n, np.int32)),  # a first prompt: its width
            )
            binding = self.sess.new_binding()
            self._bind_caches(binding, row, 1)
            for name, value in zip((INPUT_IDS, POSITION_IDS, SEQLENS_K, TOTAL_SEQUENCE_LENGTH), held):
                binding.bind_ortvalue_input(name.name, value)
            binding.bind_output(LOGITS.name, buf.device)
            binding.bind_output(NEXT_TOKEN.name, buf.device)
            self.sess.run_with_iobinding(binding, self.prefill_options)
        if prefix is not None:
            prefix.store(ids, lambda a, b: {k: v[0][row, :, a:b] for k, v in buf.cache_arrays.items()})
        outputs = binding.get_outputs()  # the presents are 4-d, the logits (1 w v) 3-d, next_token (1,) 1-d
        token = int(next(o for o in outputs if len(o.shape()) == 1).numpy()[0])
        if not logits:
            return token, None
        return token, as_float32(next(o for o in outputs if len(o.shape()) == 3))[0, -1]

    def _join(self, it: GenItem, done) -> None:
        started = time.perf_counter()
        packed, lengths = pack(it.ids, it.mask)
        rows = [int(r) for r in np.flatnonzero(~self.held)[: it.rows]]  # the lowest free rows
        first = np.zeros(it.rows, np.int64)
        logits, wanted = [], _needs_logits(it)
        self._cached = 0
        for i, row in enumerate(rows):
            first[i], last = self._prefill(row, packed[i, : lengths[i]], wanted)
            logits.append(last)
        if it.decoder is not None:
            first = it.decoder.choose(np.stack(logits) if wanted else None, first)
        self.held[rows], self.lengths[rows] = True, lengths
        self.used += it.rows
        self._started(it, rows, done, started, first)

    # -- steps ----------------------------------------------------------------------------------

    def _step(self) -> None:
        buf = self.buf
        k = int(np.flatnonzero(self.held).max()) + 1
        free = ~self.held[:k]  # a free row below k: token 0 at its slot 0, its output ignored
        buf.ids_host[:k][free] = 0
        buf.pos_host[:k, 0] = buf.seqlens_host[:k] = np.where(free, 0, self.lengths[:k])
        for run in self.running:
            buf.ids_host[run.rows, 0] = run.tokens[-1]
            run.peak_rows = max(run.peak_rows, self.used)
        for value, host in ((buf.ids, buf.ids_host), (buf.pos, buf.pos_host), (buf.seqlens, buf.seqlens_host)):
            value.update_inplace(host)
        self.sess.run_with_iobinding(self._step_binding(k), self._graph_runs.get(k))
        self.lengths[:k][~free] += 1
        next_token = buf.next_token.numpy()
        logits = None
        if any(_needs_logits(run.item) for run in self.running):
            logits = as_float32(buf.logits)[:, -1]
        for run in self.running:
            token = next_token[run.rows].copy()
            if run.item.decoder is not None:
                token = run.item.decoder.choose(None if logits is None else logits[run.rows], token)
            run.tokens.append(token)
        for run in list(self.running):
            self._finish_if_done(run)

    def _release(self, run) -> None:
        self.held[run.rows] = False
        self.used -= len(run.rows)


__all__ = ["PackedBatcher"]
