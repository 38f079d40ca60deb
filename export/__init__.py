"""attnzoo's export side: ONNX lowerings, ONNX Runtime sessions, parity (benchmarks live in bench/).

    from export import export_onnx, OnnxSession
    r = export_onnx("mha-combined-bias", "out.onnx")
    y = OnnxSession("out.onnx").run(x)

Depends on `zoo`, never the reverse. Heavy imports (onnx, onnxruntime) happen on first use,
so `attnzoo list` stays quick.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "export_onnx": "export.lowering",
    "ExportResult": "export.lowering",
    "LOWERINGS": "export.lowering",
    "ExportError": "export.errors",
    "OnnxSession": "export.session",
    "SessionError": "export.session",
    "cuda_status": "export.session",
    "run_parity": "export.parity",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'export' has no attribute {name!r}")
