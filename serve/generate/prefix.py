"""Prefix caching for the continuous batchers: a joining request whose prompt starts with blocks of tokens an
earlier prompt ran copies their keys and values into its rows and prefills only the rest (docs/serving.md,
"Prefix caching").

The cache holds blocks of BLOCK tokens, each the keys and values of every layer (each cache buffer's (g, BLOCK,
d) slice, int8 and its scales alike), keyed by the whole chain of tokens before and in it (a nested tuple:
exact, no hash can collide), as vLLM's automatic prefix caching keys its blocks. A prompt of t tokens reuses
its longest run of cached whole blocks that leaves at least one token to run (the last token's logits choose
the first new token). Bounded in bytes; the least recently used block goes first (a lookup or a store touches
a chain's blocks from its first on, so a chain's later blocks leave before its earlier ones).

Exact: a block's keys and values are reused only where the request alone would compute the same ones:
- a packed-rows export (serve/generate/packed.py) writes row slot j at position j: any prompt's block i sits
  at the same slots and positions, so a block serves any later prompt;
- a left-padded export whose graph counts positions over real keys (traced lowerings: zoo.attend.key_positions)
  computes a block's keys at positions 0.. whatever slots the prompt takes: the same;
- a left-padded export of spliced GroupQueryAttention (ort-gqa) rotates keys at their cache slots, so a block
  computed with the prompt starting at slot s0 serves only prompts that start at s0 too (the chain's root is
  s0: a request joining an idle batch alone starts at slot 0, as every turn of a one-user chat does).

Plain numpy: no Ray.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

BLOCK = 16  # tokens per cached block (vLLM's default block size)


def slot_bound(sess) -> bool:
    """Whether this export's cached keys depend on their slots (the module docstring): a left-padded export of a
    lowering built by hand (ort-gqa), not a traced one."""
    if sess.metadata.get("attnzoo.padding") == "packed":
        return False
    from export.lowerings import record

    lowering = sess.metadata.get("attnzoo.lowering", "")
    try:
        return not record(lowering).traced
    except Exception:  # noqa: BLE001 - a lowering this version does not know: the safe answer
        return True


def chunks(start: int, t: int, chunk: int) -> list[tuple[int, int]]:
    """The prefill calls of tokens start..t-1: on the grid of `chunk` a prompt run from 0 takes (a prompt whose
    first tokens came from the prefix cache runs the rest of its first chunk, then whole ones, as alone)."""
    out, at = [], start
    while at < t:
        end = min((at // chunk + 1) * chunk, t)
        out.append((at, end))
        at = end
    return out


class PrefixCache:
    """Blocks of keys and values by their token chains, at most `max_bytes` of them (least recently used first
    out). `queries` and `hits` count prompt tokens looked up and found (vLLM's prefix_cache_queries / _hits)."""

    def __init__(self, max_bytes: int, block: int = BLOCK) -> None:
        self.max_bytes, self.block = int(max_bytes), block
        self.blocks: OrderedDict[tuple, dict[str, np.ndarray]] = OrderedDict()
        self.bytes = 0
        self.queries = self.hits = self.evicted = 0

    def _keys(self, ids: np.ndarray, root: int, n: int) -> list[tuple]:
        keys, key = [], (root,)
        for i in range(n):
            key = (key, tuple(int(x) for x in ids[i * self.block : (i + 1) * self.block]))
            keys.append(key)
        return keys

    def match(self, ids: np.ndarray, root: int = 0) -> tuple[int, list[dict[str, np.ndarray]]]:
        """(L, blocks): the cached blocks that start the prompt `ids` (t,), L = their tokens, at most t - 1."""
        whole = (len(ids) - 1) // self.block
        self.queries += len(ids)
        found = []
        for key in self._keys(ids, root, whole):
            kv = self.blocks.get(key)
            if kv is None:
                break
            self.blocks.move_to_end(key)
            found.append(kv)
        self.hits += len(found) * self.block
        return len(found) * self.block, found

    def store(self, ids: np.ndarray, kv, root: int = 0) -> None:
        """Keep the whole blocks of the prompt `ids` (t,) not yet kept (those kept are touched);
        kv(a, b) -> {buffer name: the (g, b - a, d) keys or values of tokens a..b-1}, copied here."""
        whole = len(ids) // self.block
        for i, key in enumerate(self._keys(ids, root, whole)):
            if key in self.blocks:
                self.blocks.move_to_end(key)
                continue
            blob = {name: np.array(arr) for name, arr in kv(i * self.block, (i + 1) * self.block).items()}
            size = sum(a.nbytes for a in blob.values())
            if size > self.max_bytes:
                return
            while self.bytes + size > self.max_bytes:
                _, old = self.blocks.popitem(last=False)
                self.bytes -= sum(a.nbytes for a in old.values())
                self.evicted += 1
            self.blocks[key] = blob
            self.bytes += size

    def stats(self) -> dict:
        return {
            "blocks": len(self.blocks),
            "bytes": self.bytes,
            "max_bytes": self.max_bytes,
            "queries": self.queries,
            "hits": self.hits,
            "evicted": self.evicted,
        }


__all__ = ["BLOCK", "PrefixCache", "chunks", "slot_bound"]
