"""Batching across /v1/embeddings requests: each request's inputs become rows of token ids (texts tokenized
and truncated as sentence-transformers does), the rows of the requests a StaticBatcher gathered
(serve/generate/batching.py) are sorted by length and run in padded runs of at most `max_rows` rows, a row joining
a run only while it is at least half as long as the run's longest (so padding never doubles a run's work),
and each request's embeddings are put back in its own order. The graph's attention_mask hides the padding
and its pooling reads only real tokens, so a request's embeddings equal what it gets alone (to float
rounding). Plain numpy: no Ray, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from runtime.embedding import with_prompt

Row = tuple[np.ndarray, np.ndarray]  # one input's (input_ids (t,), token_type_ids (t,)) int64, unpadded


@dataclass
class EmbedItem:
    """One request's rows, as the StaticBatcher takes them (`rows`: how many; `enqueued`: when it arrived)."""

    seqs: list[Row]
    enqueued: float = 0.0

    @property
    def rows(self) -> int:
        return len(self.seqs)

    @property
    def tokens(self) -> int:
        return sum(len(ids) for ids, _ in self.seqs)


def text_rows(sess, texts: list[str], prompt_name: str | None = None) -> list[Row]:
    """Rows of `texts` as EmbeddingSession.encode tokenizes them: the prompt (prompt_name's, else the model's
    default) before each text, truncated at max_seq_length; the padding taken off again."""
    texts = with_prompt(texts, sess.prompts, sess.default_prompt_name, prompt_name, None)
    feeds = sess.tokenizer(texts)
    lengths = feeds["attention_mask"].sum(axis=1)  # right-padded: the real tokens come first
    return [(feeds["input_ids"][i, :n], feeds["token_type_ids"][i, :n]) for i, n in enumerate(lengths)]


def id_rows(ids: list[list[int]]) -> list[Row]:
    """Rows of token-id lists, fed as they are (segment 0)."""
    return [(np.asarray(row, np.int64), np.zeros(len(row), np.int64)) for row in ids]


def plan_runs(lengths: list[int], max_rows: int) -> list[list[int]]:
    """The row indices of each run: longest first, at most max_rows a run, and a row joins the open run only
    while it is at least half as long as that run's first (longest) row."""
    runs: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        if runs and len(runs[-1]) < max_rows and 2 * lengths[i] >= lengths[runs[-1][0]]:
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs


def pad_rows(rows: list[Row], pad_id: int, token_types: bool) -> dict[str, np.ndarray]:
    """The graph's feeds for `rows`, right-padded to the longest: input_ids, attention_mask [, token_type_ids]."""
    t = max(len(ids) for ids, _ in rows)
    ids = np.full((len(rows), t), pad_id, np.int64)
    mask = np.zeros((len(rows), t), np.int64)
    types = np.zeros((len(rows), t), np.int64)
    for r, (row_ids, row_types) in enumerate(rows):
        ids[r, : len(row_ids)], mask[r, : len(row_ids)], types[r, : len(row_ids)] = row_ids, 1, row_types
    feeds = {"input_ids": ids, "attention_mask": mask}
    if token_types:
        feeds["token_type_ids"] = types
    return feeds


def run_embed_batch(sess, items: list[EmbedItem], max_rows: int) -> list[np.ndarray | Exception]:
    """Each item's embeddings (rows e) float32 from padded runs over all the items' rows (plan_runs); or, when a
    run raises, that exception for every item (answered as a 500)."""
    rows = [row for it in items for row in it.seqs]
    out = np.empty((len(rows), sess.dim), np.float32)
    pad_id = int(sess.metadata.get("attnzoo.pad_id", "0"))
    try:
        for run in plan_runs([len(ids) for ids, _ in rows], max_rows):
            out[run] = sess.run_feeds(pad_rows([rows[i] for i in run], pad_id, sess.token_types))[0]
    except Exception as e:  # noqa: BLE001 - every request of the batch gets it
        return [e] * len(items)
    results: list[np.ndarray | Exception] = []
    r = 0
    for it in items:
        results.append(out[r : r + it.rows])
        r += it.rows
    return results


__all__ = ["EmbedItem", "id_rows", "pad_rows", "plan_runs", "run_embed_batch", "text_rows"]
