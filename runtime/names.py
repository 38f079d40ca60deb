"""The run time's names, each spelled once (export/names.py hands them on beside its own).

DEVICES     where a model runs (a concrete ONNX Runtime provider)
PROVIDERS   what a session may be asked for: a device, or "auto" (CUDA where it really works)
seq2seq_paths  the two graphs an encoder-decoder export's PATH names
"""

import os
from pathlib import Path

DEVICES = ("cpu", "cuda")
PROVIDERS = ("auto", *DEVICES)
ENCODER_SUFFIX, DECODER_SUFFIX = ".encoder.onnx", ".decoder.onnx"


def seq2seq_paths(path: str | os.PathLike) -> tuple[Path, Path]:
    """PATH -> (its encoder graph, its decoder graph): `m.onnx` -> `m.encoder.onnx`, `m.decoder.onnx`; a
    path that names one of the pair gives the pair."""
    p = Path(path)
    name = p.name
    for suffix in (ENCODER_SUFFIX, DECODER_SUFFIX, ".onnx"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    return p.with_name(name + ENCODER_SUFFIX), p.with_name(name + DECODER_SUFFIX)
