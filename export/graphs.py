"""Small facts about ONNX graphs, and a quiet context for the tools that make them."""

from __future__ import annotations

import logging
import warnings
from collections import Counter


def op_counts(model) -> dict[str, int]:
    """{'MatMul': 4, 'com.microsoft::MultiHeadAttention': 1, ...} for an onnx_ir or onnx model."""
    import onnx

    nodes = model.graph.node if isinstance(model, onnx.ModelProto) else model.graph
    c = Counter(f"{n.domain}::{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type for n in nodes)
    return dict(sorted(c.items()))


class quiet:
    """Silence torch.onnx's progress prints and warnings for one call (they're not ours)."""

    def __enter__(self):
        import contextlib
        import io

        self._stack = contextlib.ExitStack()
        self._stack.enter_context(warnings.catch_warnings())
        warnings.simplefilter("ignore")
        self._stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
        level = logging.root.manager.disable
        logging.disable(logging.WARNING)
        self._stack.callback(logging.disable, level)
        return self

    def __exit__(self, *exc):
        self._stack.close()
        return False
