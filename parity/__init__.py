"""attnzoo's parity: eager torch against the exported graph run under ONNX Runtime, at shapes the export
never saw. It stands above both sides it compares: `export` (which writes the graph) and `runtime`
(which runs it); neither imports it, so a deployment (runtime alone) and an export (export alone) never
load the eager reference.

    from parity import run_parity, check
    rows = run_parity("mha-*", lowerings=["decomposed"])

The full-sequence check and the matrix are matrix.py, the token-by-token check decode.py, the row and
its measures rows.py.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "run_parity": "parity.matrix",
    "check": "parity.matrix",
    "format_matrix": "parity.matrix",
    "CASES": "parity.matrix",
    "check_decode": "parity.decode",
    "ParityRow": "parity.rows",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'parity' has no attribute {name!r}")
