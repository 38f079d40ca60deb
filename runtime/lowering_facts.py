"""What the run time must know about a graph of each lowering, as data: a session reads the
lowering's name from the file's metadata (attnzoo.lowering) and looks it up here. The lowering
records (export/lowerings/) read the same facts from this table, so each is spelled once."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RunFacts:
    # Score tensors (b h t s) its CPU kernels hold at once (measured peaks, README): the memory
    # estimate before a run (OnnxSession.check_size); 0 for a kernel that streams them.
    score_copies: int = 0
    # A decode model takes a chunk (t > 1) after a past for b > 1 rows in one call; False: one row at a time
    # (GroupQueryAttention takes b > 1 only for a prompt or a single token).
    batched_chunks: bool = True


# lowering name (export/names.py LOWERINGS; export/lowerings/__init__.py checks the keys) -> its facts
RUN_FACTS = {
    "decomposed": RunFacts(score_copies=2),  # the scores and their softmax
    "onnx-attention": RunFacts(score_copies=1),
    "ort-mha": RunFacts(),
    "ort-gqa": RunFacts(batched_chunks=False),
}

__all__ = ["RUN_FACTS", "RunFacts"]
