"""The benchmark's vocabulary: its paths, its budget, one measurement job, its error."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

import zoo
from export.names import LOWERINGS, STATIC_CACHE_LOWERINGS


def ort_path(lowering: str) -> str:
    """The benchmark's path of a lowering under ONNX Runtime: "ort-" and its name, which an "ort-" name already is."""
    return lowering if lowering.startswith("ort-") else f"ort-{lowering}"


# path -> lowering, one ONNX Runtime path per record (export/lowerings/), in the records' order (LOWERINGS
# spells their names, so the command line's help needs no records).
LOWERING_OF = {ort_path(name): name for name in LOWERINGS}


PATHS = ("eager-explicit", "eager-sdpa", *LOWERING_OF)


BASELINE = "eager-sdpa"


DEFAULT_NAME = "transformer-base"


DEFAULT_SEQ = (1, 16, 512, 4096)


# The largest n of the n x n x n roofline product; the worker sizes it down to the dtype and
# the machine (fp16 matmuls on a CPU without fp16 units run ~400x slower than fp32: a
# 2048^3 product took 43 s on a 2-core VM), so that one product takes about ROOFLINE_CALL_S.
ROOFLINE_SIZE = {"cpu": 2048, "cuda": 8192}


ROOFLINE_MIN = 256


ROOFLINE_CALL_S = 0.05


RESULT_MARK = "ATTNZOO-BENCH-RESULT "  # the worker's one line of JSON on stdout


MB = 1e6


CONTENDED = 0.2  # CPUs' worth of other work during a measurement above which it is retried


class BenchError(zoo.AttnzooError, ValueError):
    """A benchmark request that cannot run here (bad option, no CUDA, unknown path)."""


@dataclass(frozen=True)
class Budget:
    """How many calls to make: `warmup` calls (and at least 0.2 s of them, but no more than half
    of `seconds` once one is done), then timed calls for `seconds`, at least `min_repeats` and
    at most `repeats`. Short shapes get thousands of calls, long ones `min_repeats`."""

    warmup: int = 3
    repeats: int = 2000
    min_repeats: int = 3
    seconds: float = 2.0


DEFAULT_BUDGET = Budget()


@dataclass(frozen=True)
class Job:
    """One measurement, run in a fresh worker process. kind: "path" | "roofline" | "overhead" | "decode"
    (for "decode", `seq` is the past length p)."""

    kind: str
    runtime: str  # "torch" | "ort"
    provider: str  # "cpu" | "cuda"
    dtype: str
    threads: int
    budget: Budget
    path: str = ""
    name: str = ""
    overrides: dict[str, Any] = field(default_factory=dict)
    model: str = ""  # ONNX file for ORT jobs
    batch: int = 1
    seq: int = 1
    precision: str = "fp32"  # the ONNX model's weight precision (export/precision.py); eager paths are fp32
    floor_bytes: int = 0  # decode: the bytes one step must read (weights as stored + the cache): the floor's buffer
    tf32: bool = False  # ORT jobs on CUDA: fp32 products in TF32 (OnnxSession(tf32=True)); off: fp32 is fp32

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Job:
        raw = json.loads(text)
        raw["budget"] = Budget(**raw["budget"])
        return cls(**raw)


TEMP_PREFIX = "attnzoo-"  # bench and roofline folders in the system temp dir


# The per-token decode benchmark (bench/decode.py): its paths share BASELINE and LOWERING_OF.
EAGER_DECODE_PATHS = ("eager-sdpa", "eager-static", "transformers-static")  # measured in torch


def _decode_paths(path: str, static: bool) -> tuple[str, ...]:
    """A lowering's decode paths: its growing cache, and "-static" beside it where it keeps a static one."""
    return (path, f"{path}-static") if static else (path,)


DECODE_PATHS = (
    *EAGER_DECODE_PATHS,
    *(p for name in LOWERINGS for p in _decode_paths(ort_path(name), name in STATIC_CACHE_LOWERINGS)),
)
# An ONNX decode path -> (lowering, cache kind).
DECODE_EXPORTS = {
    path: (LOWERING_OF[path.removesuffix("-static")], "static" if path.endswith("-static") else "grow")
    for path in DECODE_PATHS
    if path not in EAGER_DECODE_PATHS
}
DEFAULT_PAST = (128, 1024, 4096, 16384)
# Precisions of the decode bench: the ONNX paths' weight precisions (export/precision.py), and the
# half-precision eager rows (this CPU family has avx512_bf16); each applies to one kind of path.
ONNX_PRECISIONS = ("fp32", "int8", "int4")
EAGER_PRECISIONS = {"fp32": None, "fp16": "float16", "bf16": "bfloat16"}  # -> the eager job's dtype
DECODE_PRECISIONS = tuple(dict.fromkeys((*ONNX_PRECISIONS, *EAGER_PRECISIONS)))
STEPS = 16  # single-token steps per timed call


def refuse_broken_cuda(provider: str, *, onnx: bool, torch: bool) -> None:
    """provider="cuda" where the paths asked for cannot run on CUDA here: one BenchError before any export
    or worker starts (onnx: some path runs under ONNX Runtime; torch: some path runs in eager torch)."""
    if provider != "cuda":
        return
    from runtime.providers import cuda_status

    ok, why = cuda_status()
    if not ok and onnx:
        raise BenchError(f"--provider cuda: {why}")
    if torch:
        import torch as _torch

        if not _torch.cuda.is_available():
            raise BenchError("--provider cuda: torch sees no CUDA device (torch.cuda.is_available() is False)")
