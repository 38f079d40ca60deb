"""Where each node of a model really ran: one profiled run, read back from ONNX Runtime's trace."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from .core import RuntimeSession


@dataclass(frozen=True)
class NodePlacement:
    name: str
    op_type: str
    provider: str


def node_placements(sess: RuntimeSession, x, context=None, mask=None, head_mask=None) -> list[NodePlacement]:
    """Run `sess`'s model once with profiling, on its provider, and report the provider each node ran on."""
    prof = RuntimeSession(sess.path, sess.provider, verbose=False, profile=True)
    prof.run(x, context, mask, head_mask)
    trace = prof.end_profiling()
    try:
        events = json.loads(Path(trace).read_text())
    finally:
        Path(trace).unlink(missing_ok=True)
    seen: dict[str, NodePlacement] = {}
    for ev in events:
        args = ev.get("args", {})
        if ev.get("cat") == "Node" and "provider" in args:
            node = ev["name"].rsplit("_kernel_time", 1)[0]
            seen.setdefault(node, NodePlacement(node, args.get("op_name", "?"), args["provider"]))
    return list(seen.values())


def summarize(placements: list[NodePlacement]) -> dict[str, dict[str, int]]:
    """{op_type: {provider: count}}."""
    out: dict[str, Counter] = {}
    for p in placements:
        out.setdefault(p.op_type, Counter())[p.provider] += 1
    return {k: dict(v) for k, v in sorted(out.items())}


__all__ = ["NodePlacement", "node_placements", "summarize"]
