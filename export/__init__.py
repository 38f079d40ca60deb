"""attnzoo's export side: what writes graphs: the ONNX lowerings, tracing, splicing, precision, saving,
`export_onnx`. Sessions live in `runtime` and parity in `parity`; the names this package handed out
before they moved (OnnxSession, SessionError, cuda_status, run_parity) are handed on from there.

    from export import export_onnx, OnnxSession
    r = export_onnx("mha-combined-bias", "out.onnx")
    y = OnnxSession("out.onnx").run(x)

Depends on `zoo` and `runtime` (the graph's interface), never the reverse. Heavy imports (onnx,
onnxruntime) happen on first use, so `attnzoo list` stays quick.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "export_onnx": "export.writer",
    "ExportResult": "export.writer",
    "LOWERINGS": "export.names",
    "ExportError": "export.errors",
    "OnnxSession": "runtime.session",
    "Seq2SeqSession": "runtime.seq2seq_session",
    "SessionError": "runtime.providers",
    "RunError": "runtime.providers",
    "cuda_status": "runtime.providers",
    "run_parity": "parity.matrix",  # parity stands above export: imported by name, on first use
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'export' has no attribute {name!r}")
