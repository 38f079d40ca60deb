"""Continuous batching of a left-padded export's requests: a request joins the running batch at its next step
(`continuous_batcher` gives a packed-rows export serve/generate/packed.py's batcher instead;
serve/generate/rows.py holds what both share: the thread, the answers).

The batch is `max_rows` rows of static buffers (b g n d) per layer, bound once, and one write index P
shared by every row (the export's past_len). A request of prompt length t joins when rows are free,
P >= t and its tokens fit before the capacity n: its prompt is run alone at the slots it will hold
(P-t..P-1 of a cache of P slots, the ones before masked out), its keys and values are copied into its
rows at those slots, and those rows' mask marks just these slots (and the ones to come) real. It then
attends as alone: the traced exports count a row's positions over its real keys
(zoo.attend.key_positions: 0..t-1), and a whole model's GroupQueryAttention rotates at slots, the same
shift for all its keys and queries, where attention reads only their differences. From there every
step feeds each row its last token at slot P. A request leaves when it has its max_new_tokens (or every
row of it made its eos_token_id); the rows above its own move down, so the running rows stay packed at
0..k-1 and a step runs over those k rows only (a binding per k, over views of the same buffers). When no
request runs, P restarts.

Each request's tokens equal `OnnxSession.generate` of the request alone (the tests check it; its
logits may differ by rounding, docs/serving.md). Plain numpy and a thread: no Ray.
"""

from __future__ import annotations

import time

import numpy as np

from runtime.device_decode import is_packed, returns_all_logits
from runtime.generation import prefill_chunk
from runtime.io import ATTENTION_MASK, INPUT_IDS, LM_PAST, LM_PRESENT, LOGITS, NEXT_TOKEN, PAST_LEN
from runtime.kv_buffers import buffer_arrays

from .packed import PackedBatcher
from .prefix import chunks, slot_bound
from .protocol import GenItem
from .rows import RowBatcher, check_continuous, check_continuous_layers, shares_runs

BATCHINGS = ("static", "continuous")
DEFAULT_CAPACITY = 512  # slots of the continuous batch's buffers (a request needs prompt + new tokens - 1)


def continuous_batcher(
    sess, max_rows: int, capacity: int, wait_s: float = 0.0, speculation=None, **options
) -> RowBatcher:
    """The continuous batcher of this export: over packed rows (generate.packed) or left-padded (this module);
    with a speculation (runtime/speculative.Speculation: serve --prompt-lookup / --draft) generate.speculating's,
    which runs each row's rounds on its own (options: its tally too). options: RowBatcher's (max_waiting,
    timeout_s, prefix, observer)."""
    if speculation is not None:
        from .speculating import SpeculativeBatcher

        return SpeculativeBatcher(sess, max_rows, capacity, wait_s=wait_s, speculation=speculation, **options)
    options.pop("tally", None)
    kind = PackedBatcher if is_packed(sess) else ContinuousBatcher
    return kind(sess, max_rows, capacity, wait_s=wait_s, **options)


class _Buffers:
    """b rows x n slots of the export's interface (export/io.lm_interface): the per-layer buffers (bound as
    past and present), the mask, past_len, input_ids and next_token; `binding(k)` binds the first k rows
    (views: nothing is copied; a step over k rows reads k rows' caches)."""

    def __init__(self, sess, b: int, n: int, t: int) -> None:  # sess passed check_continuous (the batcher's)
        self.sess = sess
        prefix = LM_PAST.split("{", 1)[0]
        logits_type = next(o.type for o in sess._sess.get_outputs() if o.name == LOGITS.name)
        dtype = np.float16 if "float16" in logits_type else np.float32
        self.cache = buffer_arrays(sess._sess.get_inputs(), b, n, prefix)  # fp32, or int8 + scales
        self.mask = np.ones((b, n), np.bool_)
        self.past_len = np.zeros((), np.int64)
        self.ids = np.zeros((b, t), np.int64)
        self.next_token = np.zeros((b,), np.int64)
        self.logits = np.zeros((b, 1, int(sess.metadata["attnzoo.vocab"])), dtype)
        # an all_logits export (serve --prompt-lookup's, or generate's cached one) returns a chunk's every position:
        # a prefill chunk binds logits of its own length (chunk_logits), a step's (b, 1, v) is these
        self.all_logits = returns_all_logits(sess)
        self._bindings: dict[int, object] = {}

    def chunk_logits(self, k: int, t: int):
        """Before a prefill chunk of t positions over the first k rows of an all_logits export: its logits
        output bound to a (k, t, v) array, which `logits` is until the next chunk (the last position is read)."""
        import onnxruntime as ort

        self.logits = np.zeros((k, t, self.logits.shape[-1]), self.logits.dtype)
        self.binding(k).bind_ortvalue_output(LOGITS.name, ort.OrtValue.ortvalue_from_numpy(self.logits, "cpu", 0))

    def binding(self, k: int):
        if k not in self._bindings:
            import onnxruntime as ort

            def bound(arr):  # a view of the first rows is contiguous: the OrtValue wraps it, no copy
                return ort.OrtValue.ortvalue_from_numpy(arr, "cpu", 0)

            binding = self.sess.new_binding()
            for name, buf in self.cache.items():
                layer, kv = name.split(".")[1:3]
                value = bound(buf[:k])
                binding.bind_ortvalue_input(name, value)
                binding.bind_ortvalue_output(LM_PRESENT.format(i=layer, kv=kv), value)
            for name, arr in ((ATTENTION_MASK.name, self.mask[:k]), (INPUT_IDS.name, self.ids[:k])):
                binding.bind_ortvalue_input(name, bound(arr))
            binding.bind_ortvalue_input(PAST_LEN.name, bound(self.past_len))
            binding.bind_ortvalue_output(NEXT_TOKEN.name, bound(self.next_token[:k]))
            binding.bind_ortvalue_output(LOGITS.name, bound(self.logits[:k]))
            self._bindings[k] = binding
        return self._bindings[k]


class ContinuousBatcher(RowBatcher):
    """The continuous batcher of a left-padded export (the module docstring): rows 0..used-1 hold the running
    requests (kept packed: a step runs over these only).

    capacity: the slots n of the batch's buffers (every row, every layer): a request needs
    prompt + max_new_tokens - 1 <= n to ever fit (GenInfo.max_len says so to clients)."""

    def __init__(self, sess, max_rows: int, capacity: int, wait_s: float = 0.0, **options) -> None:
        super().__init__(sess, max_rows, capacity, wait_s, **options)
        self.batch = _Buffers(sess, max_rows, capacity, 1)
        self.slot_bound = slot_bound(sess)  # cached blocks serve only prompts starting at their slot (prefix.py)
        self.write = 0  # P: the slot the next step writes, shared by every row

    def _fits(self, it: GenItem, write: int) -> bool:
        return self.used + it.rows <= self.max_rows and it.t <= write and write + it.max_new_tokens - 1 <= self.n

    def _admit(self) -> None:
        if not self.running:  # a fresh start: P is the longest prompt of the requests that can start together
            write = most_new = rows = 0
            for it, _ in self.waiting:
                w, m = max(write, it.t), max(most_new, it.max_new_tokens)
                if rows + it.rows <= self.max_rows and w + m - 1 <= self.n:
                    write, most_new, rows = w, m, rows + it.rows
            self.write = write
        keep = []
        for it, done in self.waiting:
            if not self._fits(it, self.write):
                keep.append((it, done))
                continue
            self._join_or_answer(it, done)
        self.waiting = keep

    def _join(self, it: GenItem, done) -> None:
        """Run the request's prompt alone at the slots its rows will hold (P-t..P-1: past_len P-t, the
        slots before it masked out), then copy its keys and values into its rows. Its keys are then
        where they were written: a whole model whose op rotates keys at their cache slots (ort-gqa)
        reads them as one that counts a row's real keys does. A prompt after masked slots runs one row
        at a time, through one scratch row of P slots (GroupQueryAttention takes a chunk with a past for
        one row only; any lowering takes one row); one row's prompt runs in chunks, each after the ones
        before, as OnnxSession.generate runs it (runtime.generation.prefill_chunk). With a prefix cache
        (generate/prefix.py) a one-row prompt's first cached whole blocks are copied into the scratch row at the
        slots they take and only the rest runs, on the same chunk grid; its whole blocks are kept after."""
        import onnxruntime as ort

        started = time.perf_counter()
        p, t = self.write, it.t
        rows = list(range(self.used, self.used + it.rows))
        first = np.zeros(it.rows, np.int64)
        parts = [list(range(it.rows))] if p == t else [[r] for r in range(it.rows)]
        chunk = prefill_chunk(self.sess, len(parts[0]), t)
        alone = _Buffers(self.sess, len(parts[0]), p, chunk)
        alone.mask[:, : p - t] = False
        cached, root, prefix = 0, (p - t) * self.slot_bound, self.prefix if it.rows == 1 and it.mask is None else None
        if prefix is not None:  # its first whole blocks' keys and values from the cache, at the slots they take
            cached, blocks = prefix.match(it.ids[0], root)
            for i, blob in enumerate(blocks):
                for name, arr in blob.items():
                    alone.cache[name][0, :, p - t + i * prefix.block : p - t + (i + 1) * prefix.block] = arr
        for part in parts:
            alone.mask[:, p - t :] = True if it.mask is None else it.mask[part]
            binding = alone.binding(len(part))
            for start, end in chunks(cached, t, chunk):
                ids = np.ascontiguousarray(it.ids[part, start:end])
                binding.bind_ortvalue_input(INPUT_IDS.name, ort.OrtValue.ortvalue_from_numpy(ids, "cpu", 0))
                alone.past_len[()] = p - t + start
                if alone.all_logits:
                    alone.chunk_logits(len(part), end - start)
                self.sess.run_with_iobinding(binding)
            for name, buf in self.batch.cache.items():
                buf[[rows[r] for r in part], :, p - t : p] = alone.cache[name][:, :, p - t : p]
            first[part] = alone.next_token[: len(part)]
            if it.decoder is not None:
                first[part] = it.decoder.choose(alone.logits[: len(part), -1], first[part])
        if prefix is not None:  # one row, one part: its prompt's keys and values are still in `alone`
            at = p - t
            prefix.store(it.ids[0], lambda a, b: {k: v[0, :, at + a : at + b] for k, v in alone.cache.items()}, root)
        self._cached = cached
        self.used += it.rows
        self.batch.mask[rows] = True
        self.batch.mask[rows, : p - t] = False
        if it.mask is not None:
            self.batch.mask[np.ix_(rows, range(p - t, p))] = it.mask
        self._started(it, rows, done, started, first)

    def _step(self) -> None:
        for run in self.running:
            self.batch.ids[run.rows, 0] = run.tokens[-1]
            run.peak_rows = max(run.peak_rows, self.used)
        self.batch.past_len[()] = self.write
        self.sess.run_with_iobinding(self.batch.binding(self.used))
        self.write += 1
        for run in self.running:  # every token read before any request leaves (leaving moves rows)
            token = self.batch.next_token[run.rows].copy()
            if run.item.decoder is not None:
                token = run.item.decoder.choose(self.batch.logits[run.rows, -1], token)
            run.tokens.append(token)
        for run in list(self.running):
            self._finish_if_done(run)

    def _pack(self) -> None:
        """Move the running requests' rows down to 0..used-1 (their caches and masks with them)."""
        at = 0
        for run in sorted(self.running, key=lambda r: r.rows[0]):
            new = list(range(at, at + len(run.rows)))
            if new != run.rows:
                for buf in self.batch.cache.values():
                    buf[new] = buf[run.rows]
                self.batch.mask[new] = self.batch.mask[run.rows]
                run.rows = new
            at += len(new)
        self.used = at

    def _release(self, run) -> None:
        self._pack()


__all__ = [
    "BATCHINGS",
    "DEFAULT_CAPACITY",
    "ContinuousBatcher",
    "PackedBatcher",
    "continuous_batcher",
    "check_continuous",
    "check_continuous_layers",
    "shares_runs",
]
