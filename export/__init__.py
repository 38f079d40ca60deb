"""attnzoo's export side: the ONNX lowerings, writing the file, ONNX Runtime sessions, parity.

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
    "export_onnx": "export.writer",
    "ExportResult": "export.writer",
    "LOWERINGS": "export.names",
    "ExportError": "export.errors",
    "OnnxSession": "export.session",
    "SessionError": "export.providers",
    "RunError": "export.providers",
    "cuda_status": "export.providers",
    "run_parity": "export.parity",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'export' has no attribute {name!r}")
