"""Static batching of /generate requests: the requests gathered in one window are left-padded to one
(B, T) batch with its attention_mask, generated from ONCE to the largest max_new_tokens, and each
request's rows are cut back out: its own prompt, then its own max_new_tokens (and its own eos rule).

Left padding leaves a row's tokens its own: the export's attention_mask hides the padded keys, and each
row's positions count its real tokens only (zoo.lm.DecoderLM.step). A row whose eos_token_id differs
from the batch's is run to the end and cut afterwards, which is what `OnnxSession.generate` does to
it alone (a row that ended is padded with eos while the others go on; the answer stops once every
row of the request has ended). Plain numpy and asyncio: no Ray.

`StaticBatcher` forms the batches: one run at a time; the requests that arrive while a run goes on are
all in the next one (Ray Serve's serve.batch forms each batch before it waits for the running one, so
under load its batches stay small and queue up behind each other).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

import numpy as np

from ..schema import ServeError
from .protocol import GenItem

PAD_ID = 0  # the id under a padded (masked) position: never attended to, its logits never read


def left_pad(items: list[GenItem]) -> tuple[np.ndarray, np.ndarray]:
    """(input_ids (B T) int64, attention_mask (B T) bool) of `items`, each right-aligned at T."""
    bsz = sum(it.rows for it in items)
    tmax = max(it.t for it in items)
    ids = np.full((bsz, tmax), PAD_ID, np.int64)
    mask = np.zeros((bsz, tmax), np.bool_)
    r = 0
    for it in items:
        rows = slice(r, r + it.rows)
        ids[rows, tmax - it.t :] = it.ids
        mask[rows, tmax - it.t :] = it.mask if it.mask is not None else True
        r += it.rows
    return ids, mask


def end_at_eos(tokens: np.ndarray, t: int, eos: int | None) -> np.ndarray:
    """What `generate` returns with eos_token_id=eos for rows whose eos-free tokens are `tokens` (r, t + N):
    after a row's first eos, eos (the pad); the answer cut after the step where every row has ended."""
    if eos is None:
        return tokens
    new = tokens[:, t:]
    hit = new == eos
    ended = hit.any(axis=1)
    first = np.where(ended, hit.argmax(axis=1), new.shape[1])
    after = np.arange(new.shape[1])[None, :] > first[:, None]
    out = tokens.copy()
    out[:, t:][after] = eos
    if ended.all():
        out = out[:, : t + int(first.max()) + 1]
    return out


def run_generate_batch(
    sess, items: list[GenItem], timings: dict | None = None, options: dict | None = None
) -> list[np.ndarray | Exception]:
    """Each item's tokens (r_i, t_i + k_i) from one `sess.generate` over all of them; or, when that run
    raises, the exception for every item (the server answers it with failure_answer). options: generate's
    (a speculating server's: generate.speculating.generate_options); timings receives the run's sizes (and,
    speculating, generate's "speculation" counts)."""
    ids, mask = left_pad(items)
    tmax = ids.shape[1]
    eos_ids = {it.eos_token_id for it in items}
    # One eos for all: the run may stop once every row has ended; otherwise each row is cut afterwards.
    eos = eos_ids.pop() if len(eos_ids) == 1 else None
    new = max(it.max_new_tokens for it in items)
    own: dict = {}
    try:
        mask_or_none = mask if not mask.all() else None
        out = sess.generate(ids, new, attention_mask=mask_or_none, eos_token_id=eos, timings=own, **(options or {}))
    except Exception as e:  # noqa: BLE001 - every request of the run gets it, answered as 503 / 500
        return [e] * len(items)
    if timings is not None:
        timings.update(rows=ids.shape[0], prompt=tmax, new=new)
        if "speculation" in own:
            timings["speculation"] = own["speculation"]
    results: list[np.ndarray | Exception] = []
    r = 0
    for it in items:
        rows = out[r : r + it.rows, tmax - it.t : tmax + it.max_new_tokens]
        results.append(np.ascontiguousarray(end_at_eos(rows, it.t, it.eos_token_id)))
        r += it.rows
    return results


class StaticBatcher:
    """Static batches of GenItems for one replica: `await submit(item)` -> (item's result, timings).

    One run at a time (in a thread: ONNX Runtime releases the GIL, so requests keep arriving). A batch is
    what is waiting when the last run ends, up to `max_rows` rows, in arrival order; when fewer rows wait,
    it waits until `wait_s` after the first of them arrived for more. `run(items)` returns one result
    per item (run_generate_batch, bound to a session). `max_requests`: at most that many requests a run
    (1 for an export whose requests cannot share one: generate.continuous.shares_runs); None, no limit."""

    def __init__(
        self, run: Callable[[list[GenItem]], list], max_rows: int, wait_s: float, max_requests: int | None = None
    ) -> None:
        bad = isinstance(max_requests, bool) or not isinstance(max_requests, int) or max_requests < 1
        if max_requests is not None and bad:
            raise ServeError(f"max_requests={max_requests!r} must be a positive integer or None")
        self.run, self.max_rows, self.wait_s, self.max_requests = run, max_rows, wait_s, max_requests
        self._waiting: deque[tuple[GenItem, asyncio.Future]] = deque()
        self._arrived: asyncio.Event | None = None
        self._worker: asyncio.Task | None = None

    async def submit(self, item: GenItem) -> tuple[np.ndarray | Exception, dict[str, float]]:
        if self._arrived is None:
            self._arrived = asyncio.Event()
        future = asyncio.get_running_loop().create_future()
        self._waiting.append((item, future))
        self._arrived.set()
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._serve())
        return await future

    def _rows_waiting(self) -> int:
        return sum(it.rows for it, _ in self._waiting)

    def _full(self) -> bool:
        """A run's worth is waiting: max_rows rows, or max_requests requests."""
        many = self.max_requests is not None and len(self._waiting) >= self.max_requests
        return many or self._rows_waiting() >= self.max_rows

    async def _serve(self) -> None:
        while self._waiting:
            deadline = self._waiting[0][0].enqueued + self.wait_s
            while not self._full() and (left := deadline - time.perf_counter()) > 0:
                self._arrived.clear()
                try:
                    await asyncio.wait_for(self._arrived.wait(), left)
                except asyncio.TimeoutError:
                    break
            batch, rows = [], 0
            while self._waiting and (not batch or rows + self._waiting[0][0].rows <= self.max_rows):
                if self.max_requests is not None and len(batch) == self.max_requests:
                    break
                batch.append(self._waiting.popleft())
                rows += batch[-1][0].rows
            started = time.perf_counter()
            items = [it for it, _ in batch]
            try:
                results = await asyncio.to_thread(self.run, items)
            except Exception as e:  # noqa: BLE001 - every request of the run gets it
                results = [e] * len(items)
            model_ms = (time.perf_counter() - started) * 1e3
            for (it, future), res in zip(batch, results):
                if not future.done():  # a request whose client went away is cancelled
                    timing = {
                        "x-attnzoo-model-ms": model_ms,
                        "x-attnzoo-queue-ms": (started - it.enqueued) * 1e3,
                        "x-attnzoo-batch": rows,
                    }
                    future.set_result((res, timing))


__all__ = ["PAD_ID", "StaticBatcher", "end_at_eos", "left_pad", "run_generate_batch"]
