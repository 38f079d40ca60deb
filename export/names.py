"""The names the export side offers, each spelled once: every module and every command-line
choice reads them from here.

    DEVICES     where a model runs (runtime/names.py spells it)
    PROVIDERS   what a session may be asked for (runtime/names.py spells it)
    DTYPES      the element types a model is exported in
    SESSION_DTYPES  those a session here feeds (numpy has no bfloat16)
    CACHES      how a decode model keeps its KV cache
    LOWERINGS   how a block becomes an ONNX graph (export/lowerings/ holds one record each)
    PRECISIONS  the weight precisions of an export (export/precision.py says how each is made)
    KV_PRECISIONS  a whole model's KV cache precisions (export/kv_int8.py)
    seq2seq_paths  the two graphs an encoder-decoder export's PATH names (export/seq2seq_export.py)
"""

import os
from pathlib import Path

from runtime.names import DEVICES, PROVIDERS  # the run time's; handed on for the command line

DTYPES = ("float32", "float16", "bfloat16")  # bfloat16: for CUDA only (export/tracing.py, BF16_CPU)
# the dtypes a session here feeds and reads with numpy, which has no bfloat16: parity, bench and serve
SESSION_DTYPES = ("float32", "float16")
CACHES = ("grow", "static")  # a decode model's KV cache: returned grown each step, or buffers written in place
CACHE_CHOICES = ("auto", *CACHES)  # auto: the measured-faster kind for the provider (export/choice.py DECODE_CACHE)
DEFAULT_MAX_LEN = 4096  # a static cache's capacity when export_onnx is not given max_len
LOWERINGS = ("decomposed", "onnx-attention", "ort-mha", "ort-gqa")
STATIC_CACHE_LOWERINGS = ("decomposed", "ort-gqa")  # those whose decode graph can keep a static cache
PRECISIONS = ("fp32", "int8", "int4")  # weight precision of an export (export/precision.py)
KV_PRECISIONS = ("fp32", "int8")  # a whole model's KV cache: the model's dtype, or int8 (export/kv_int8.py)
ERROR_BOUNDS = {"int8": 0.04, "int4": 0.22}  # a precision's relative L2 error bound (why: export/precision.py)
ENCODER_SUFFIX, DECODER_SUFFIX = ".encoder.onnx", ".decoder.onnx"


DTYPE_SHORT = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


def precision_words(precision: str, dtype: str = "float32", method: str = "") -> str:
    """What an export's summary says of its weights: precision fp32 means unquantized, so the weights are in the
    export's dtype ("fp16" for a float16 export); int8 / int4 is its method, with the activations' dtype where it is
    not fp32."""
    if precision == "fp32":
        return DTYPE_SHORT.get(dtype, dtype)
    said = method or precision
    return said if dtype == "float32" else f"{said}, {DTYPE_SHORT.get(dtype, dtype)} activations"


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


__all__ = [
    "DECODER_SUFFIX",
    "ENCODER_SUFFIX",
    "ERROR_BOUNDS",
    "CACHES",
    "CACHE_CHOICES",
    "DEFAULT_MAX_LEN",
    "DEVICES",
    "DTYPES",
    "DTYPE_SHORT",
    "KV_PRECISIONS",
    "LOWERINGS",
    "PRECISIONS",
    "PROVIDERS",
    "SESSION_DTYPES",
    "STATIC_CACHE_LOWERINGS",
    "precision_words",
    "seq2seq_paths",
]
