"""Prefix caching (serve/generate/prefix.py) in both continuous batchers: the cache's blocks, its bound and its
least-recently-used eviction; and, for every kind of export it serves (left-padded ort-gqa, whose keys are
bound to their slots; left-padded traced, positions over real keys; packed rows), a request that shares a
prefix with an earlier one reads the cached blocks and makes the tokens and the logits of the request run
without the cache, alone and beside others. One export of lm_cases' tiny LLaMA per kind, shared."""

from __future__ import annotations

import asyncio

import lm_cases  # tests/peers (tests/serve/conftest.py puts it on the path): the small random transformers models
import numpy as np
import pytest

from serve.generate.continuous import ContinuousBatcher, PackedBatcher, continuous_batcher
from serve.generate.prefix import BLOCK, PrefixCache, chunks, slot_bound
from serve.generate.protocol import GenItem

KINDS = ["left-ort-gqa", pytest.param("left-traced", marks=pytest.mark.slow), "packed"]  # conftest.LM_KINDS


@pytest.fixture(scope="module", params=KINDS)
def sess(request, tiny_lm):
    return tiny_lm(request.param)


class Logits:
    """A decoder that takes the argmax and keeps each step's logits (what logprobs are made of)."""

    needs_logits = True

    def __init__(self) -> None:
        self.cancelled, self.logits = False, []

    def choose(self, logits, argmax):
        self.logits.append(np.array(logits[0]))
        return argmax

    def add(self, tokens) -> bool:
        return False


def _item(ids, new) -> GenItem:
    return GenItem(ids=np.asarray([ids], np.int64), max_new_tokens=new, decoder=Logits())


def _run(batcher, groups):
    """Each group of items submitted together, the groups one after another: [(tokens, logits)] in order."""

    async def main():
        out = []
        for group in groups:
            answers = await asyncio.gather(*(batcher.submit(it) for it in group))
            out += [(tokens, np.stack(it.decoder.logits)) for it, (tokens, _) in zip(group, answers)]
        return out

    return asyncio.run(main())


def _prompts(seed=3):
    """A shared 'system prompt' of 2.5 blocks, then turns: each prompt extends the one before (a chat's history),
    and one that shares only the system prompt."""
    rng = np.random.default_rng(seed)
    system = rng.integers(3, lm_cases.VOCAB, 2 * BLOCK + 8).tolist()
    turn1 = system + rng.integers(3, lm_cases.VOCAB, 11).tolist()
    turn2 = turn1 + rng.integers(3, lm_cases.VOCAB, 90).tolist()  # 141 tokens: past one prefill chunk of 128
    other = system + rng.integers(3, lm_cases.VOCAB, 5).tolist()
    return system, turn1, turn2, other


def test_the_cache_keeps_whole_blocks_by_their_chains_and_evicts_the_least_recently_used():
    block = 4
    kv = lambda a, b: {"k": np.full((2, b - a, 3), a, np.float32)}  # noqa: E731 - 24 bytes a token
    cache = PrefixCache(max_bytes=3 * 2 * block * 3 * 4, block=block)  # three blocks
    ids = np.arange(10, 23)  # 13 tokens: 3 whole blocks
    assert cache.match(ids) == (0, []) and (cache.queries, cache.hits) == (13, 0)
    cache.store(ids, kv)
    assert cache.stats()["blocks"] == 3 and cache.bytes == cache.max_bytes
    found, blocks = cache.match(ids)
    assert found == 12 and [b["k"][0, 0, 0] for b in blocks] == [0, 4, 8]
    assert cache.match(ids[:12])[0] == 8  # at least one token left to run: the last token's logits
    other = ids.copy()
    other[5] = 99  # the second block differs: only the first is shared (the chain, not the block alone)
    assert cache.match(other)[0] == 4
    assert cache.match(ids, root=7)[0] == 0  # a slot-bound chain starts elsewhere: nothing shared
    cache.store(np.arange(50, 55), kv)  # one new block: the least recently used (ids' third) goes
    assert cache.evicted == 1 and cache.match(ids)[0] == 8 and cache.match(np.arange(50, 56))[0] == 4
    assert cache.bytes <= cache.max_bytes
    tiny = PrefixCache(max_bytes=10, block=block)
    tiny.store(ids, kv)
    assert tiny.stats()["blocks"] == 0  # a block larger than the whole bound is never kept


def test_a_cached_prompt_runs_its_chunks_on_the_uncached_grid():
    assert chunks(0, 300, 128) == [(0, 128), (128, 256), (256, 300)]
    assert chunks(48, 300, 128) == [(48, 128), (128, 256), (256, 300)]
    assert chunks(128, 130, 128) == [(128, 130)]


def test_a_shared_prefix_is_read_from_the_cache_and_changes_no_token_or_logit(sess):
    """Turn 1 fills the cache; turn 2 (its history) and a request sharing the system prompt read it. Each
    request's tokens equal those of the batcher without a cache, and its logits at every step too, bit for bit
    (the model's log-probabilities are made of them): the cached keys and values are the ones the request would
    compute, and the rest of the prompt runs in the chunks it would run in."""
    system, turn1, turn2, other = _prompts()
    groups = lambda: [[_item(turn1, 6)], [_item(turn2, 6)], [_item(other, 5)]]  # noqa: E731
    plain = _run(continuous_batcher(sess, 2, 256), groups())
    cache = PrefixCache(max_bytes=1 << 24)
    batcher = continuous_batcher(sess, 2, 256, prefix=cache)
    cached = _run(batcher, groups())
    for (want, want_logits), (got, got_logits) in zip(plain, cached):
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(got_logits, want_logits)  # bit for bit
    # turn 2 found turn 1's whole blocks (3: 48 of its 51 tokens), `other` the system prompt's two
    assert cache.hits == 3 * BLOCK + 2 * BLOCK, cache.stats()
    assert cache.queries == len(turn1) + len(turn2) + len(other)


def test_requests_beside_a_running_one_read_the_cache_where_exact(sess):
    """Turn 2 joins while a long request runs (the left-padded batch's write index is then past its prompt's
    length: its prompt starts at a later slot): the packed and traced exports read the cached blocks there;
    the ort-gqa left-padded one, whose keys are bound to their slots, reads none (its chain starts at slot 0).
    Its tokens and logits equal the uncached batcher's either way, bit for bit."""
    system, turn1, turn2, _ = _prompts(seed=5)
    long_prompt = np.random.default_rng(1).integers(3, lm_cases.VOCAB, len(turn2) + 9).tolist()
    groups = lambda: [[_item(turn1, 4)], [_item(long_prompt, 30), _item(turn2, 8)]]  # noqa: E731
    plain = _run(continuous_batcher(sess, 2, 256), groups())
    cache = PrefixCache(max_bytes=1 << 24)
    batcher = continuous_batcher(sess, 2, 256, prefix=cache)
    got = _run(batcher, groups())
    for (want, want_logits), (tokens, logits) in zip(plain, got):
        np.testing.assert_array_equal(tokens, want)
        np.testing.assert_array_equal(logits, want_logits)
    bound = isinstance(batcher, ContinuousBatcher) and slot_bound(sess)
    assert isinstance(batcher, PackedBatcher) == (sess.metadata["attnzoo.padding"] == "packed")
    assert cache.hits == (0 if bound else 3 * BLOCK), (cache.stats(), bound)
