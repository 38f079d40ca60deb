"""Side-by-side benchmark of one attention block: eager torch against the ONNX Runtime lowerings.

    attnzoo bench transformer-base --batch 1 --seq 1,16,512,4096 --json b.json --plot b.png
    attnzoo bench gpt2-small --decode --past 128,1024,4096,16384      (decode.py: per-token latency)

For every shape (b, t) in batch x seq, every path that can express the spec runs:

    eager-explicit       zoo block, fused=False (einsum scores, written-out softmax, einsum)
    eager-sdpa           zoo block, fused=True (F.scaled_dot_product_attention): the baseline
    ort-<lowering>       one export lowering under ONNX Runtime, a path per record in export/lowerings/
                         (jobs.PATHS: ort-decomposed, ort-onnx-attention, ort-mha, ort-gqa; a lowering
                         named ort-* keeps its name), where that lowering can express the spec

Each (path, shape) runs in its own fresh subprocess (`python -m bench --worker JOB`),
so its memory is measured in isolation, and is timed in that same subprocess:

    setup     model (or session) built, inputs x (b t c) made, one call at (1, 1) so thread
              pools and lazily loaded kernels exist
    baseline  RSS now; the peak is reset (/proc/self/clear_refs 5 resets VmHWM on Linux)
    warm-up   calls at (b, t), then timed calls until `repeats`, or `min_repeats` and `budget` s
    peak      VmHWM - baseline: everything the calls add, ONNX Runtime's arena growth included
              (taking the baseline after the warm-up would hide the arena, which keeps its peak)

On CUDA the peak is torch.cuda.max_memory_allocated above the baseline for eager paths, and
for ONNX Runtime (whose allocations torch cannot see) the fall of cudaMemGetInfo's free bytes
from the baseline, sampled after every call: that is ORT's CUDA arena growth, which rounds
up (by default to the next power of two), so it is an upper bound.

FLOPs come from zoo.flops (matmuls only, see zoo.FLOP_CONVENTION). The roofline is a large
matrix product measured in the same run through each runtime: torch for the eager paths, an
ONNX MatMul model (IR 10, opset 18) through the same OnnxSession for the ORT paths.

The package, split by what changes together:

    jobs.py      the vocabulary: paths, budget, one job, the error
    timing.py    timing and memory inside a worker
    measure.py   what a worker measures: a path at a shape, a decode row, roofline, overhead
    worker.py    worker processes (`python -m bench --worker JOB`): start, collect, retry
    machine.py   machine facts and versions for the report
    plan.py      exports, the jobs of a run, the rows
    report.py    markdown table, JSON, plot
    decode.py    the per-token decode benchmark on the same workers

Depends on `zoo` and `export`; the command line (`attnzoo bench`, cli/cmd_bench.py) drives it.
"""

from __future__ import annotations

import importlib
from typing import Any

# name -> the bench module that defines it, imported on first use: `import bench` (and the command
# line's help, which reads bench.jobs) imports no torch, onnx or onnxruntime.
_LAZY = {
    "BASELINE": "bench.jobs",
    "DEFAULT_NAME": "bench.jobs",
    "DEFAULT_SEQ": "bench.jobs",
    "LOWERING_OF": "bench.jobs",
    "PATHS": "bench.jobs",
    "BenchError": "bench.jobs",
    "Budget": "bench.jobs",
    "Job": "bench.jobs",
    "default_threads": "bench.machine",
    "machine_info": "bench.machine",
    "versions": "bench.machine",
    "run_worker": "bench.measure",
    "benchmark": "bench.plan",
    "format_table": "bench.report",
    "plot": "bench.report",
    "write_json": "bench.report",
    "measure": "bench.worker",
    "spawn": "bench.worker",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # bound once imported: later lookups are plain attribute reads
        return value
    raise AttributeError(f"module 'bench' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
