"""Admission control in both continuous batchers (serve/generate/rows.py), stepped by hand (RowBatcher.hold) and
on a clock of the test's own, so nothing depends on timing: a bounded queue refuses one request more at once
(Busy: the 429), a request past its timeout ends (waiting: TimedOut; running: with the tokens it made, its
decoder told), a /generate request whose client left gives its rows back at the next step, and under a burst
every request gets an answer or a refusal, the answered ones equal to the request alone. The observer (metrics)
hears of every request that leaves. Exports: tests/serve/conftest.py's tiny_lm."""

from __future__ import annotations

import asyncio
import time

import lm_cases  # tests/peers (tests/serve/conftest.py puts it on the path)
import numpy as np
import pytest

from helpers import REPO
from runtime.sampling import Sampler, resolve
from runtime.stopping import Codec, RowText
from serve.generate.continuous import continuous_batcher
from serve.generate.protocol import GenItem
from serve.generate.rows import Busy, TimedOut
from serve.openai.serving import TextRun


@pytest.fixture(scope="module", params=["left-ort-gqa", "packed"])
def sess(request, tiny_lm):
    return tiny_lm(request.param)


def _ids(seed: int, t: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(3, lm_cases.VOCAB, (1, t))


class Clock:
    """The batcher's clock, moved on by the test (from a decoder's add: between two steps)."""

    def __init__(self) -> None:
        self.shift = 0.0

    def __call__(self) -> float:
        return time.perf_counter() + self.shift


class Seen:
    """An observer that keeps (reason, tokens made) of each request that left."""

    def __init__(self) -> None:
        self.left = []

    def finished(self, run, now, reason) -> None:
        self.left.append((reason, len(run.tokens)))


class Counting:
    """A greedy decoder that calls `after(n)` once it has added its n-th token; expire() is recorded."""

    def __init__(self, after=None) -> None:
        self.cancelled, self.made, self.expired, self.after = False, 0, False, after

    def choose(self, logits, argmax):
        return argmax

    def add(self, tokens) -> bool:
        self.made += 1
        if self.after:
            self.after(self.made)
        return False

    def expire(self) -> None:
        self.expired = True


def test_a_full_queue_refuses_one_more_at_once_and_answers_the_rest(sess):
    """Held before its first round, the batcher queues two requests (max_waiting=2); a third is refused at once
    with Busy (no future: nothing will answer it). Let go, it answers both, as each alone."""
    seen = Seen()
    batcher = continuous_batcher(sess, 1, 64, max_waiting=2, observer=seen)
    items = [GenItem(ids=_ids(i, 5 + i), max_new_tokens=6) for i in range(3)]
    batcher.hold()

    async def main():
        first, second = batcher.enqueue(items[0]), batcher.enqueue(items[1])
        with pytest.raises(Busy) as e:
            batcher.enqueue(items[2])
        assert e.value.retry_after >= 1 and "--max-waiting 2" in str(e.value)
        assert (batcher.queued, batcher.refused) == (2, 1)
        batcher.hold(False)
        return await asyncio.gather(first, second)

    answers = asyncio.run(main())
    for it, (tokens, _) in zip(items, answers):
        np.testing.assert_array_equal(tokens, sess.generate(it.ids, it.max_new_tokens))
    assert batcher.queued == 0 and batcher.used == 0 and sorted(seen.left) == [("length", 6), ("length", 6)]


def test_the_timeout_ends_a_running_request_with_its_tokens_and_a_waiting_one_with_timed_out(sess):
    """One row: the first request runs, the second waits. After the first's third token the clock moves past
    the timeout: at the next round the running one ends with its three tokens (its decoder's expire() called,
    its row given back), the waiting one is answered TimedOut; a later request runs as alone."""
    clock, seen = Clock(), Seen()
    batcher = continuous_batcher(sess, 1, 64, timeout_s=30.0, observer=seen)
    batcher.clock = clock
    runs = Counting(after=lambda n: n == 3 and setattr(clock, "shift", 60.0))
    running = GenItem(ids=_ids(1, 6), max_new_tokens=20, decoder=runs)
    waiting = GenItem(ids=_ids(2, 4), max_new_tokens=5)
    batcher.hold()

    async def main():
        futures = [batcher.enqueue(running), batcher.enqueue(waiting)]
        batcher.hold(False)
        return await asyncio.gather(*futures)

    (ran, _), (late, _) = asyncio.run(main())
    assert ran.shape[1] == 6 + 3 and runs.expired and isinstance(late, TimedOut), (ran.shape, late)
    np.testing.assert_array_equal(ran, sess.generate(running.ids, 3))
    assert batcher.timed_out == 2 and batcher.used == 0 and not batcher.running and not batcher.waiting
    assert seen.left == [("timeout", 3)]
    clock.shift = 0.0
    after = GenItem(ids=_ids(3, 5), max_new_tokens=4)
    (tokens, _), = asyncio.run(_gather(batcher, [after]))  # fmt: skip
    np.testing.assert_array_equal(tokens, sess.generate(after.ids, 4))


async def _gather(batcher, items):
    return await asyncio.gather(*(batcher.submit(it) for it in items))


def test_a_generate_request_whose_client_left_gives_its_rows_back(sess):
    """item.cancelled (the /generate route sets it when its client leaves) after the second token: the request
    leaves at the next round with what it made; the one beside it runs on to its own tokens."""
    gone = GenItem(ids=_ids(4, 5), max_new_tokens=30)

    def leave(n):
        if n == 2:
            gone.cancelled = True

    gone.decoder = Counting(leave)
    stays = GenItem(ids=_ids(5, 7), max_new_tokens=12)
    batcher = continuous_batcher(sess, 2, 64)
    (left, _), (tokens, _) = asyncio.run(_gather(batcher, [gone, stays]))
    assert left.shape[1] == 5 + 2 and batcher.left == 1 and batcher.used == 0
    np.testing.assert_array_equal(tokens, sess.generate(stays.ids, 12))


def test_a_text_run_that_expires_ends_as_length_with_its_text(sess):
    """TextRun.expire (the /v1 routes' decoder): finish_reason "length", the text held back released, emitted."""
    codec = Codec(str(REPO / "models" / "tiny-stdlib-llama" / "tokenizer.json"))
    pieces = []
    params = resolve({}, {"pad_token_id": 0})
    sampler = Sampler(params, _ids(6, 4), None, lm_cases.VOCAB)
    run = TextRun(sampler, (), RowText(codec, ()), 10, lambda piece, finish: pieces.append((piece, finish)))
    for token in (72, 105):
        run.add(np.array([token]))
    run.expire()
    assert run.finish == "length" and pieces[-1][1] == "length" and "".join(p for p, _ in pieces) == run.row.text
    run.expire()  # once only
    assert len(pieces) == 3


def test_a_burst_gets_answers_or_refusals_and_the_answers_equal_each_alone(sess):
    """24 requests at once into 2 rows with max_waiting=4, from one event loop (bounded, no network): every one
    is answered or refused with Busy, none hangs (the gather returns), the refused ones are counted, and every
    answer equals its request alone. Then the batcher is empty and takes a request again."""
    batcher = continuous_batcher(sess, 2, 64, max_waiting=4)
    items = [GenItem(ids=_ids(10 + i, 3 + i % 7), max_new_tokens=4 + i % 5) for i in range(24)]

    async def one(it):
        try:
            return await batcher.submit(it)
        except Busy:
            return None

    async def main():
        return await asyncio.gather(*(one(it) for it in items))

    answers = asyncio.run(main())
    refused = [a is None for a in answers]
    assert sum(refused) == batcher.refused
    for it, answer in zip(items, answers):
        if answer is not None:
            np.testing.assert_array_equal(answer[0], sess.generate(it.ids, it.max_new_tokens))
    assert batcher.queued == 0 and batcher.used == 0
    again = GenItem(ids=_ids(99, 6), max_new_tokens=3)
    np.testing.assert_array_equal(asyncio.run(_gather(batcher, [again]))[0][0], sess.generate(again.ids, 3))
