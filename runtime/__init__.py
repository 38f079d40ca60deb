"""attnzoo's run time: what a deployment needs to run an exported model, on onnxruntime and numpy
alone (importing it imports no torch; a whole model generates without torch in the process).

    from runtime import OnnxSession
    sess = OnnxSession("lm.onnx")                 # provider "auto": CUDA where it really works
    tokens = sess.generate(input_ids, 64)

Sessions (core.py, session.py), where they run and with which provider options (providers.py), their
inputs (feeds.py), token-by-token decoding (decoding.py, static_decoding.py), generation
(generation.py), node placement (placement.py), and the graph's interface: the input and output
names every export writes to (io.py) and what a session must know of each lowering
(lowering_facts.py). `export` writes graphs to this interface; parity stands above both.

Depends on `zoo` (its errors and torch-free helpers) only. Heavy imports (onnxruntime) happen on
first use.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "OnnxSession": "runtime.session",
    "Seq2SeqSession": "runtime.seq2seq_session",
    "RuntimeSession": "runtime.core",
    "SessionError": "runtime.providers",
    "cuda_status": "runtime.providers",
    "RunInputError": "runtime.feeds",
    "DecodeInputError": "runtime.feeds",
    "NodePlacement": "runtime.placement",
    "DEVICES": "runtime.names",
    "PROVIDERS": "runtime.names",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'runtime' has no attribute {name!r}")
