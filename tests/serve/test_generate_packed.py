"""Continuous batching over a packed-rows export (serve/generate/packed.py): check_continuous takes it, the server picks
the packed batcher for it, and each request's tokens equal `OnnxSession.generate` of the request alone: requests
of different prompt lengths, rows, own left padding, max_new_tokens and eos, joining a running batch, leaving, rows
reused lowest first (a free row below the highest held one fed and ignored), a request at the capacity's edge, a
prompt in chunks, and a decoder that chooses from the logits. One packed export of lm_cases' tiny LLaMA, shared."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from export import export_onnx
from helpers import submit_concurrently
from runtime.device_decode import GRAPH_ID, NOT_CAPTURED
from runtime.session import OnnxSession
from serve.generate.continuous import PackedBatcher, check_continuous, continuous_batcher
from serve.generate.protocol import GenInfo, GenItem, decode_generate_request

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "peers"))
import lm_cases  # noqa: E402 - the small random transformers models of the whole-model tests

VOCAB = lm_cases.VOCAB
CAPACITY = 40
INFO = GenInfo(vocab=VOCAB, max_len=None, max_rows=8, max_tokens=400, max_new_tokens=40)


@pytest.fixture(scope="module")
def sess(tmp_path_factory):
    """A packed-rows whole-model export (fp32: the CPU GroupQueryAttention kernel) of lm_cases' LLaMA."""
    from peers.lm import lm_from_hf

    lm = lm_from_hf(lm_cases.hf_model("llama")).eval()
    path = export_onnx(lm, tmp_path_factory.mktemp("packed") / "llama.onnx", max_len=64, padding="packed").path
    return OnnxSession(path, provider="cpu", verbose=False)


def _item(ids, new, mask=None, eos=None) -> GenItem:
    doc = {"input_ids": ids, "max_new_tokens": new, "attention_mask": mask, "eos_token_id": eos}
    return decode_generate_request(json.dumps({k: v for k, v in doc.items() if v is not None}).encode(), "", INFO)


def _alone(sess, it: GenItem) -> np.ndarray:
    return sess.generate(it.ids, it.max_new_tokens, attention_mask=it.mask, eos_token_id=it.eos_token_id)


def _requests(sess) -> list[GenItem]:
    """Prompts of 1 to 16 tokens, one and two rows (a row with left padding of its own), an eos one of them
    reaches, one at the capacity's edge (prompt + new - 1 == CAPACITY)."""
    rng = np.random.default_rng(7)
    items = []
    for k, (rows, t, new) in enumerate([(1, 3, 9), (2, 7, 4), (1, 12, 14), (2, 5, 6), (1, 1, 11), (1, 16, 25)]):
        ids = rng.integers(3, VOCAB, (rows, t)).tolist()
        mask = None
        if rows == 2:
            mask = [[0] * 2 + [1] * (t - 2), [1] * t]
            ids[0][:2] = [0, 0]
        eos = int(sess.generate(np.array(ids), new, attention_mask=mask)[0, t + 1]) if k == 2 else None
        items.append(_item(ids if rows > 1 else ids[0], new, mask=mask, eos=eos))
    assert items[-1].t + items[-1].max_new_tokens - 1 == CAPACITY
    return items


def test_continuous_batching_takes_a_packed_rows_export(sess):
    """A packed-rows export (a CUDA export's default) was refused ("serve it with --batching static"); now it
    passes check_continuous and gets the packed batcher, through the server too."""
    from serve.generate.app import GenerateServer
    from serve.replica import model_files

    check_continuous(sess)
    assert isinstance(continuous_batcher(sess, 2, CAPACITY), PackedBatcher)
    server = GenerateServer(model_files(sess.path), "llama", max_batch=2, batching="continuous", capacity=CAPACITY)
    assert isinstance(server._batcher, PackedBatcher) and server.openai.unavailable is None
    graphs = GenerateServer(model_files(sess.path), "llama", batching="continuous", capacity=CAPACITY, cuda_graph=True)
    assert graphs.sess.cuda_graph and isinstance(graphs._batcher, PackedBatcher)


def test_cuda_graph_serving_is_refused_for_what_is_not_a_packed_whole_model(tmp_path):
    from serve import ServeError, start

    block = export_onnx("mha-causal", tmp_path / "block.onnx").path
    with pytest.raises(ServeError, match="cuda_graph replays a packed-rows whole model's decode step"):
        start(block, cuda_graph=True)


def test_concurrent_requests_each_get_their_own_tokens(sess, monkeypatch):
    """Requests arriving 3 ms apart into 4 rows over steps of at least 5 ms: they join a running batch, wait
    for rows, leave, and rows are taken again; each prompt runs in chunks of 5 (PREFILL_CHUNK). Every answer
    is bit-equal to the request's run alone."""
    from runtime import generation

    items = _requests(sess) * 2
    wants = [_alone(sess, it) for it in items]
    monkeypatch.setattr(generation, "PREFILL_CHUNK", 5)
    batcher = PackedBatcher(sess, max_rows=4, capacity=CAPACITY)
    taken: list[list[int]] = []

    class Paced:
        def __getattr__(self, name):
            return getattr(sess, name)

        def run_with_iobinding(self, binding, options=None):
            time.sleep(0.005)
            return sess.run_with_iobinding(binding, options)

    started = batcher._started

    def recorded(it, rows, *rest):
        taken.append(rows)
        return started(it, rows, *rest)

    batcher.sess, batcher._started = Paced(), recorded
    answers = submit_concurrently(batcher, items, gap_s=0.003)
    for (tokens, _), want in zip(answers, wants):
        assert not isinstance(tokens, Exception), tokens
        np.testing.assert_array_equal(tokens, want)
    assert max(timing["x-attnzoo-batch"] for _, timing in answers) > 2
    assert len(taken) == len(items) and max(max(rows) for rows in taken) == 3  # rows reused, never past 4
    assert batcher.used == 0 and not batcher.held.any() and not batcher.running


class ArgmaxOfLogits:
    """A decoder that chooses from the logits (as a sampler would): their argmax, which must be next_token."""

    needs_logits, cancelled = True, False

    def choose(self, logits, argmax):
        assert logits.shape == (1, VOCAB), logits.shape
        np.testing.assert_array_equal(logits.argmax(axis=-1), argmax)
        return logits.argmax(axis=-1)

    def add(self, tokens) -> bool:
        return False


@pytest.mark.parametrize("cuda_graph", [False, True])
def test_a_free_row_below_the_highest_is_fed_harmlessly_and_taken_first(sess, cuda_graph):
    """Driven step by step: a short request on row 0 leaves while a long one runs on row 1; the step then runs
    rows 0..1 with row 0 free; the next request takes row 0 (the lowest free), reads the logits and outlives
    the long one (steps over row 0 alone), and every request's tokens are its own. With a cuda_graph session
    (on the CPU: uncaptured) each row count's step runs under a graph id of its own, every prefill under -1."""
    if cuda_graph:
        sess = OnnxSession(sess.path, provider="cpu", verbose=False, cuda_graph=True)
    rng = np.random.default_rng(3)
    short, long_, late = (_item(rng.integers(3, VOCAB, t).tolist(), new) for t, new in ((4, 2), (9, 12), (6, 12)))
    late.decoder = ArgmaxOfLogits()
    answers: dict[int, np.ndarray] = {}
    batcher = PackedBatcher(sess, max_rows=3, capacity=CAPACITY)
    batcher.waiting = [
        (it, lambda tokens, _, i=i: answers.setdefault(i, tokens)) for i, it in enumerate((short, long_))
    ]
    batcher._admit()
    assert [run.rows for run in batcher.running] == [[0], [1]]
    batcher._step()  # short has its 2 tokens: row 0 is free, row 1 runs
    assert 0 in answers and batcher.held.tolist() == [False, True, False]
    batcher._step()
    batcher._step()
    batcher.waiting = [(late, lambda tokens, _: answers.setdefault(2, tokens))]
    batcher._admit()
    assert batcher.running[-1].rows == [0]
    while batcher.running:
        batcher._step()
    if cuda_graph:  # k = 2 then 1: a graph id per k; prefills never captured
        ids = {k: int(o.get_run_config_entry(GRAPH_ID)) for k, o in batcher._graph_runs.items()}
        assert sorted(ids) == [1, 2] and len(set(ids.values())) == 2
        assert batcher.prefill_options.get_run_config_entry(GRAPH_ID) == NOT_CAPTURED
    for i, it in enumerate((short, long_)):
        np.testing.assert_array_equal(answers[i], _alone(sess, it))
    np.testing.assert_array_equal(answers[2], _alone(sess, late))
    if cuda_graph:  # generate on the same session captures under ids of its own, not the batcher's
        generates = {int(buf.graph_id) for buf in sess._graphs.values()}
        assert generates and not generates & set(ids.values())


def test_a_request_past_the_capacity_is_answered_with_an_error_not_kept(sess):
    batcher = PackedBatcher(sess, max_rows=2, capacity=8)
    answers = []
    batcher.waiting = [(_item([5, 6, 7, 8], 6), lambda tokens, _: answers.append(tokens))]
    batcher._admit()
    assert not batcher.waiting and not batcher.running
    assert "more than the 8 slots" in str(answers[0]) and "--capacity" in str(answers[0])


def test_a_request_submitted_as_the_idle_thread_ends_is_served(sess):
    """The batch's thread ends after an idle wait. A request put in the inbox once that wait had run out but
    before the thread was gone found it alive, so submit started no other, and nothing ever took it: its
    client waited forever. The window is widened here (the thread lingers 0.3 s after its wait runs out)."""
    import asyncio
    import queue
    import threading

    batcher = PackedBatcher(sess, max_rows=2, capacity=CAPACITY)
    real_get, idle = batcher.inbox.get, threading.Event()

    def get(block=True, timeout=None):
        if timeout is None or timeout < 1:  # get_nowait, or the wait_s gathering
            return real_get(block, timeout)
        try:  # the idle wait: it runs out at once
            return real_get(timeout=0.01)
        except queue.Empty:
            idle.set()
            time.sleep(0.3)
            raise

    batcher.inbox.get = get
    first, second = _requests(sess)[:2]

    async def main():
        await batcher.submit(first)
        await asyncio.to_thread(idle.wait, 5)
        return await asyncio.wait_for(batcher.submit(second), 5)

    tokens, _ = asyncio.run(main())
    np.testing.assert_array_equal(tokens, _alone(sess, second))


class FailsOnItsFirstToken:
    """A decoder whose add raises at the request's first token (as a text decoder whose tokenizer fails would)."""

    needs_logits, cancelled = False, False

    def choose(self, logits, argmax):
        return argmax

    def add(self, tokens) -> bool:
        raise ValueError("the decoder failed")


def test_a_request_failing_at_its_first_token_gives_its_rows_back(sess):
    """A request whose first token (read as it joins) raised was answered with the error but stayed running on
    its rows: they were never given back, and every later step ran it again (its error failing the batch)."""
    batcher = PackedBatcher(sess, max_rows=2, capacity=CAPACITY)
    bad, good = _item([5, 6, 7], 4), _item([8, 9, 10, 11], 5)
    bad.decoder = FailsOnItsFirstToken()
    answers: dict[int, object] = {}
    batcher.waiting = [(it, lambda tokens, _, i=i: answers.setdefault(i, tokens)) for i, it in enumerate((bad, good))]
    batcher._admit()
    assert isinstance(answers[0], ValueError) and "the decoder failed" in str(answers[0])
    assert [run.item is good for run in batcher.running] == [True] and batcher.used == 1
    assert batcher.held.tolist() == [True, False]  # its row given back: the next request took it
    while batcher.running:
        batcher._step()
    np.testing.assert_array_equal(answers[1], _alone(sess, good))
