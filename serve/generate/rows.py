"""What both continuous batchers share (serve/generate/continuous.py over a left-padded export,
serve/generate/packed.py over a packed-rows one): the rule of which exports they serve, one record per running
request, and the thread that takes requests in, admits them, steps the batch and answers each request when it
ends. A batcher says how a
request joins (`_admit`), how a step runs (`_step`) and how a request's rows are given back (`_release`).

Admission control (docs/serving.md): `max_waiting` bounds the requests submitted and not yet running (one more
is refused at once with Busy: a 429); `timeout_s` ends a request at the first step after it has waited or run
that long since it was submitted (one still waiting is answered TimedOut; a running one ends with the tokens it
made, its decoder told through `expire()`), its rows given back. `prefix`: a generate.prefix.PrefixCache the
joins read and fill. `observer`: told of each request that leaves the batch (serve/metrics.py).

Each request's tokens equal `OnnxSession.generate` of the request alone (the tests check it for both). Plain
numpy and a thread: no Ray.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import numpy as np

from runtime.device_decode import is_packed, pack
from runtime.generation import longrope_switch, one_call_prompt_len
from runtime.io import NEXT_TOKEN
from runtime.kv_buffers import BF16

from ..schema import ServeError
from .batching import end_at_eos
from .protocol import GenItem

_LONGROPE = (
    "has longrope layers, whose frequency set follows the largest position of a whole run: requests sharing "
    "one would not keep their own tokens"
)


def shares_runs(sess) -> bool:
    """Whether requests may share a run and keep their own tokens: not with longrope layers, which pick their
    frequency set by the largest position of the whole run (as transformers does for a batch), so a request
    beside one past the layer's rope_original_max would take the long set where alone it takes the short."""
    return one_call_prompt_len(sess) is None


class Busy(ServeError):
    """The batcher's queue is full (max_waiting): answered 429 with Retry-After `retry_after` seconds."""

    def __init__(self, message: str, retry_after: int = 1) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class TimedOut(ServeError):
    """A request that waited past the server's request timeout without starting."""


def check_continuous(sess, path=None) -> None:
    """ServeError, in one line, when continuous batching cannot serve this whole-model export (`path`:
    how to name it, default the session's). A packed-rows export (any cache dtype) runs on generate.packed's
    device buffers; a left-padded one on generate.continuous's numpy buffers, which hold no bfloat16."""
    why = None
    if NEXT_TOKEN.name not in sess.output_names:
        why = f"has no {NEXT_TOKEN.name} output (an all-logits export)"
    elif not shares_runs(sess):
        why = _LONGROPE
    elif not is_packed(sess) and any(x.type == BF16 for x in sess._sess.get_inputs()):
        why = "is left-padded and takes bfloat16 caches, which its batcher's numpy buffers cannot hold"
    if why:
        raise ServeError(f"{path or sess.path} {why}; serve it with --batching static")


def check_continuous_layers(specs, name) -> None:
    """check_continuous's longrope rule on a model's layer specs (zoo.AttentionSpec), before its export:
    ServeError naming `name`."""
    if longrope_switch((s.rope_scaling, s.rope_original_max) for s in specs) is not None:
        raise ServeError(f"{name} {_LONGROPE}; serve it with --batching static")


@dataclass(eq=False)  # one per request: compared by identity
class Running:
    item: GenItem
    rows: list[int]  # the batch rows it holds
    done: object  # a callable(result, timing)
    admitted: float
    tokens: list[np.ndarray] = field(default_factory=list)  # (r,) per new token
    peak_rows: int = 0
    first_at: float = 0.0  # when its first token was made (the batcher's clock)
    cached: int = 0  # prompt tokens whose keys and values came from the prefix cache


class RowBatcher(ABC):
    """`await submit(item)` -> (tokens, timings), as StaticBatcher; the steps run in a thread of their own.
    `used`: the rows running requests hold; `left`: requests dropped because their client left."""

    def __init__(
        self,
        sess,
        max_rows: int,
        capacity: int,
        wait_s: float = 0.0,
        *,
        max_waiting: int | None = None,
        timeout_s: float | None = None,
        prefix=None,
        observer=None,
    ) -> None:
        check_continuous(sess)
        self.sess, self.max_rows, self.n, self.wait_s = sess, max_rows, capacity, wait_s
        self.max_waiting, self.timeout_s, self.prefix, self.observer = max_waiting, timeout_s, prefix, observer
        self.clock = time.perf_counter  # what timeouts read (GenItem.enqueued is on it); tests may replace it
        self.inbox: queue.Queue = queue.Queue()
        self.waiting: list[tuple[GenItem, object]] = []
        self.running: list[Running] = []
        self.used = 0
        self.left = 0  # requests dropped because their client left (decoder.cancelled)
        self.failed: str | None = None  # the last step's exception, None once a step runs again (GET /ready)
        self.refused = self.timed_out = 0  # requests refused (Busy) and ended by the timeout
        self._cached = 0  # the joining request's prompt tokens that came from the prefix cache (set by _join)
        self._queued: set[int] = set()  # id() of the requests submitted and not yet running or answered
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._gate = threading.Event()  # cleared: the thread waits before its next round (hold())
        self._gate.set()

    @property
    def queued(self) -> int:
        """Requests submitted and not yet running or answered (what max_waiting bounds)."""
        return len(self._queued)

    def hold(self, held: bool = True) -> None:
        """Hold the thread before its next round (held=False lets it go): requests queue meanwhile (tests step
        the batcher so, with nothing left to timing)."""
        self._gate.clear() if held else self._gate.set()

    def _unqueue(self, it: GenItem) -> None:
        with self._lock:
            self._queued.discard(id(it))

    async def submit(self, item: GenItem):
        """(tokens or an exception, timings); raises Busy at once when max_waiting requests already wait."""
        return await self.enqueue(item)

    def enqueue(self, item: GenItem) -> asyncio.Future:
        """submit's first half, in the running loop: the request queued (or Busy raised, before anything is
        answered: a stream can still be refused with a 429), and the future of its answer."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()

        def done(result, timing):
            self._unqueue(item)
            loop.call_soon_threadsafe(lambda: future.done() or future.set_result((result, timing)))

        with self._lock:  # put and checked together: the thread ends only with the inbox empty (_idle_end)
            if self.max_waiting is not None and len(self._queued) >= self.max_waiting:
                self.refused += 1
                raise Busy(f"{len(self._queued)} requests are already waiting (--max-waiting {self.max_waiting})")
            self._queued.add(id(item))
            self.inbox.put((item, done))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._serve, name="attnzoo-continuous", daemon=True)
                self._thread.start()
        return future

    # -- what a batcher defines ----------------------------------------------------------------

    @abstractmethod
    def _admit(self) -> None:
        """Start the waiting requests that can start now (each through self._started)."""

    @abstractmethod
    def _join(self, it: GenItem, done) -> None:
        """Run one request's prompt into the rows it takes, then self._started."""

    def _join_or_answer(self, it: GenItem, done) -> None:
        """_join, or the request answered with the exception its prefill or first token raised (the others run
        on); one that had started running by then leaves, its rows given back."""
        try:
            self._join(it, done)
        except Exception as e:  # noqa: BLE001 - this request's prefill failed; the others run on
            for run in [r for r in self.running if r.item is it]:
                self.running.remove(run)
                self._release(run)
            done(e, {})

    @abstractmethod
    def _step(self) -> None:
        """One token for every running request (appended to its tokens), then self._finish_if_done on each."""

    @abstractmethod
    def _release(self, run: Running) -> None:
        """Give a request's rows back (it is already out of self.running)."""

    # -- the thread ----------------------------------------------------------------------------

    def _serve(self) -> None:
        while True:
            if not self.running and not self.waiting:
                try:
                    self.waiting.append(self.inbox.get(timeout=30))
                except queue.Empty:
                    if self._idle_end():
                        return  # idle: the next submit starts a thread again
                    continue
                until = time.perf_counter() + self.wait_s
                while (left := until - time.perf_counter()) > 0:
                    try:
                        self.waiting.append(self.inbox.get(timeout=left))
                    except queue.Empty:
                        break
            while True:
                try:
                    self.waiting.append(self.inbox.get_nowait())
                except queue.Empty:
                    break
            self._gate.wait()
            self._drop_cancelled()
            self._drop_expired()
            self._admit()
            if not self.running:
                continue
            try:
                self._step()
                self.failed = None
            except Exception as e:  # noqa: BLE001 - the run failed: its requests get it, the batch starts afresh
                self.failed = f"{type(e).__name__}: {e}"
                for run in list(self.running):
                    self.running.remove(run)
                    self._release(run)
                    run.done(e, {})

    def _idle_end(self) -> bool:
        """Whether the idle thread ends: only with the inbox still empty under the lock submit puts under, so a
        request put after the idle wait ran out finds the thread gone (and starts another) or is taken by it."""
        with self._lock:
            if not self.inbox.empty():
                return False
            self._thread = None
            return True

    def _started(self, it: GenItem, rows: list[int], done, admitted: float, first: np.ndarray) -> None:
        """A request whose prompt ran into `rows`, `first` (r,) its first tokens: running from the next step."""
        self._unqueue(it)
        run = Running(it, rows, done, admitted, [first], first_at=self.clock())
        run.cached, self._cached = self._cached, 0
        self.running.append(run)
        self._finish_if_done(run)

    def _drop_cancelled(self) -> None:
        """Requests whose client left (decoder.cancelled: a stream closed) give their rows back before the next
        step, and waiting ones never start; each is answered with what it made."""

        def gone(it: GenItem) -> bool:
            return it.cancelled or (it.decoder is not None and bool(it.decoder.cancelled))

        for it, done in self.waiting:
            if gone(it):
                self.left += 1
                done(it.ids, {})
        self.waiting = [w for w in self.waiting if not gone(w[0])]
        for run in [r for r in self.running if gone(r.item)]:
            self.left += 1
            self._end(run, "abort")

    def _drop_expired(self) -> None:
        """With timeout_s: a request submitted that long ago ends now, its rows given back (module docstring)."""
        if self.timeout_s is None:
            return
        now = self.clock()

        def late(it: GenItem) -> bool:
            return now - it.enqueued >= self.timeout_s

        expired = [w for w in self.waiting if late(w[0])]
        self.waiting = [w for w in self.waiting if not late(w[0])]
        for it, done in expired:
            self.timed_out += 1
            done(
                TimedOut(f"waited {now - it.enqueued:.1f} s without starting (--request-timeout {self.timeout_s:g})"),
                {},
            )
        for run in [r for r in self.running if late(r.item)]:
            self.timed_out += 1
            expire = getattr(run.item.decoder, "expire", None)
            if expire is not None:
                expire()
            self._end(run, "timeout")

    def _end(self, run: Running, reason: str) -> None:
        """A running request leaves before its end (its client left, its time ran out): answered with the tokens
        it made so far."""
        self.running.remove(run)
        self._release(run)
        self._observe(run, reason)
        run.done(np.concatenate([run.item.ids, np.stack(run.tokens, axis=1)], axis=1), self._timing(run))

    def _observe(self, run: Running, reason: str) -> None:
        if self.observer is not None:
            self.observer.finished(run, self.clock(), reason)

    def _finish_if_done(self, run: Running) -> None:
        it = run.item
        new = np.stack(run.tokens, axis=1)
        if it.decoder is not None:  # called once per new token: the decoder follows each one
            ended = it.decoder.add(run.tokens[-1])
        else:
            ended = it.eos_token_id is not None and (new == it.eos_token_id).any(axis=1).all()
        if new.shape[1] < it.max_new_tokens and not ended:
            return
        self.running.remove(run)
        self._release(run)
        self._observe(run, getattr(it.decoder, "finish", None) or ("stop" if ended else "length"))
        tokens = end_at_eos(np.concatenate([it.ids, new], axis=1), it.t, it.eos_token_id)
        run.done(tokens, self._timing(run))

    def _timing(self, run: Running) -> dict:
        """A request's timings (its answer's headers; the access log reads them)."""
        it, now = run.item, time.perf_counter()
        return {
            "x-attnzoo-model-ms": (now - run.admitted) * 1e3,
            "x-attnzoo-queue-ms": (run.admitted - it.enqueued) * 1e3,
            "x-attnzoo-ttft-ms": (run.first_at - it.enqueued) * 1e3,
            "x-attnzoo-cached-tokens": run.cached,
            "x-attnzoo-batch": max(run.peak_rows, len(run.rows)),
        }


class OwnSlotsBatcher(RowBatcher):
    """A RowBatcher whose rows each own their `n` slots from 0 (a request's real tokens, its left padding dropped:
    generate.packed, generate.speculating): a request joins when enough rows are free; one that could never fit
    its rows' slots is answered at once."""

    n: int  # each row's slots

    def _admit(self) -> None:
        keep = []
        for it, done in self.waiting:
            _, lengths = pack(it.ids, it.mask)
            if int(lengths.max()) + it.max_new_tokens - 1 > self.n:  # never fits: answered now, not kept
                done(
                    ServeError(
                        f"a prompt of {int(lengths.max())} tokens and {it.max_new_tokens} new ones need "
                        f"more than the {self.n} slots of this batch's rows (--capacity)"
                    ),
                    {},
                )
                continue
            if it.rows > self.max_rows - self.used:
                keep.append((it, done))
                continue
            self._join_or_answer(it, done)
        self.waiting = keep


__all__ = [
    "Busy",
    "OwnSlotsBatcher",
    "RowBatcher",
    "Running",
    "TimedOut",
    "check_continuous",
    "check_continuous_layers",
    "shares_runs",
]
