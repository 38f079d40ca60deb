"""The ONNX Runtime latency of zoo blocks exported alone, for `attnzoo ablate`'s latency column
(each pruned or ablated variant of a model, timed in turn on one CPU thread)."""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

import torch

from .timing import repeat_timed


class OnnxLatency:
    """latency([(blocks, head_masks), ...]) -> [ms, ...]: per request, the sum over its blocks of
    the ONNX Runtime CPU latency of each block exported alone (b=1, its held-out t and s, one
    thread). Each round times every request in turn (a median of `repeats` runs per block); a
    request's figure is its lowest round, so that a burst of load on a shared machine, or a
    drift in its speed, does not decide a row.

    Exports are cached by (spec, head-mask input): latency does not depend on the weights, and
    the experiments share most block shapes.
    """

    def __init__(self, repeats: int = 40, rounds: int = 5) -> None:
        self.repeats, self.rounds = repeats, rounds
        self.description = (
            f"b=1, one thread; every row timed in turn, the lowest of {rounds} rounds of a median of {repeats} "
            f"runs per block, summed over blocks"
        )
        self._tmp = tempfile.TemporaryDirectory(prefix="attnzoo-ablate-")
        self._sessions: dict = {}

    def _session(self, block, with_head_mask: bool):
        from export.writer import export_onnx
        from runtime.session import OnnxSession

        key = (block.spec, with_head_mask)
        if key not in self._sessions:
            path = Path(self._tmp.name) / f"block{len(self._sessions)}.onnx"
            export_onnx(block, path, with_head_mask=with_head_mask, overwrite=True)
            self._sessions[key] = OnnxSession(path, provider="cpu", threads=1, verbose=False)
        return self._sessions[key]

    def _feeds(self, block, t: int, s: int | None, hm):
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(1, t, block.spec.d_model, generator=gen)
        ctx = torch.randn(1, s, block.spec.d_context, generator=gen) if block.spec.is_cross else None
        return (x, ctx, None, None if hm is None else hm[None].float())

    def __call__(self, requests) -> list[float]:
        """ms per request [(blocks, head_masks), ...], the requests measured in turn each round."""
        prepared = []
        for blocks, head_masks in requests:
            runs = [
                (self._session(b, hm is not None), self._feeds(b, t, s, hm))
                for (b, t, s), hm in zip(blocks, head_masks)
            ]
            for sess, feeds in runs:
                sess.run(*feeds)  # warm-up: the first run allocates
            prepared.append(runs)
        best = [float("inf")] * len(prepared)
        for _ in range(self.rounds):
            for i, runs in enumerate(prepared):
                total = 0.0
                for sess, feeds in runs:
                    times = repeat_timed(lambda sess=sess, feeds=feeds: sess.run(*feeds), self.repeats)
                    total += statistics.median([t * 1e3 for t in times])
                best[i] = min(best[i], total)
        return best

    def close(self) -> None:
        self._sessions.clear()
        self._tmp.cleanup()
