"""What a worker process measures, in that process: one (path, shape) of the full-sequence
benchmark, one decode row, the matmul roofline, ONNX Runtime's per-call overhead.
`worker.py` starts the processes; this module is what runs inside them."""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zoo

from .decode_measure import measure_decode
from .jobs import (
    BASELINE,
    ROOFLINE_CALL_S,
    ROOFLINE_MIN,
    ROOFLINE_SIZE,
    TEMP_PREFIX,
    BenchError,
    Job,
)
from .timing import PeakMemory, time_calls, torch_setup


def _path_call(job: Job) -> tuple[Callable[[int, int], Callable[[], Any]], str]:
    """A factory: (b, t) -> a no-argument call of the block on fresh inputs x (b t c)."""
    torch, device, dtype, _ = torch_setup(job)
    spec = zoo.spec(job.name, **job.overrides)
    if job.runtime == "torch":
        module = zoo.create(job.name, fused=job.path == BASELINE, **job.overrides)
        module = module.to(device=device, dtype=dtype).eval()
        run, where = (lambda x, c: module(x, c)), f"torch {job.provider}"
    else:
        from runtime.session import OnnxSession

        sess = OnnxSession(
            job.model,
            job.provider,
            threads=job.threads if job.provider == "cpu" else None,
            verbose=False,
            tf32=job.tf32,
        )
        run, where = (lambda x, c: sess.run(x, context=c)), f"onnxruntime {sess.provider}"

    def make(b: int, t: int) -> Callable[[], Any]:
        x = torch.randn(b, t, spec.d_model, device=device, dtype=dtype)
        c = torch.randn(b, t, spec.d_context, device=device, dtype=dtype) if spec.is_cross else None
        return lambda: run(x, c)

    return make, where


def _matmul_model(n: int, dtype: str, folder: Path) -> Path:
    """y (b t n) = x (b t n) @ W (n n), W a constant: an ONNX MatMul at IR 10 / opset 18."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    elem = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16}[dtype]
    w = numpy_helper.from_array(
        (np.random.default_rng(0).standard_normal((n, n)) / math.sqrt(n)).astype(
            {"float32": np.float32, "float16": np.float16}[dtype]
        ),
        "W",
    )
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])],
        "roofline",
        [helper.make_tensor_value_info("x", elem, ["b", "t", n])],
        [helper.make_tensor_value_info("y", elem, ["b", "t", n])],
        initializer=[w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    path = folder / f"matmul-{n}-{dtype}.onnx"
    onnx.save(model, str(path))
    return path


def identity_model(d: int, dtype: str, folder: Path) -> Path:
    """y = Identity(x), x (b t d): what one ONNX Runtime call costs with nothing to compute."""
    import onnx
    from onnx import TensorProto, helper

    elem = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16}[dtype]
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "noop",
        [helper.make_tensor_value_info("x", elem, ["b", "t", d])],
        [helper.make_tensor_value_info("y", elem, ["b", "t", d])],
    )
    path = folder / f"identity-{d}-{dtype}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), str(path))
    return path


def _roofline(job: Job) -> dict[str, Any]:
    """GFLOP/s of an n x n x n product through the job's runtime. n = job.seq when given
    (--roofline-size), else the largest power of two up to ROOFLINE_SIZE (from ROOFLINE_MIN)
    whose single product takes no more than about ROOFLINE_CALL_S here."""
    torch, device, dtype, sync = torch_setup(job)
    with tempfile.TemporaryDirectory(prefix=f"{TEMP_PREFIX}roofline-") as tmp:
        if job.seq:
            n, call = job.seq, _matmul_call(job, job.seq, Path(tmp))
        else:
            n = ROOFLINE_MIN
            call = _matmul_call(job, n, Path(tmp))
            while n * 2 <= ROOFLINE_SIZE[job.provider]:
                call()
                sync()
                t0 = time.perf_counter()
                call()
                sync()
                if (time.perf_counter() - t0) * 8 > ROOFLINE_CALL_S:  # 2n costs 8x
                    break
                n *= 2
                call = _matmul_call(job, n, Path(tmp))
        out = time_calls(call, sync, job.budget)
    out["n"] = n
    out["gflops"] = 2 * n**3 / (out["median_ms"] / 1e3) / 1e9
    return out


def _matmul_call(job: Job, n: int, folder: Path) -> Callable[[], Any]:
    """One x (1 n n) @ W (n n) product through the job's runtime, inputs made once."""
    torch, device, dtype, _ = torch_setup(job)
    x = torch.randn(1, n, n, device=device, dtype=dtype)
    if job.runtime == "torch":
        w = torch.randn(n, n, device=device, dtype=dtype) / math.sqrt(n)
        return lambda: torch.matmul(x, w)
    from runtime.session import OnnxSession

    model = _matmul_model(n, job.dtype, folder)
    sess = OnnxSession(
        model, job.provider, threads=job.threads if job.provider == "cpu" else None, verbose=False, tf32=job.tf32
    )
    return lambda: sess.run(x)


def _overhead(job: Job) -> dict[str, Any]:
    """Milliseconds per ORT call of an Identity model at (b, t): through OnnxSession.run, and
    through a binding made once (ONNX Runtime's own per-call cost, without our Python)."""
    torch, device, dtype, sync = torch_setup(job)
    from runtime.session import OnnxSession

    sess = OnnxSession(
        job.model, job.provider, threads=job.threads if job.provider == "cpu" else None, verbose=False, tf32=job.tf32
    )
    x = torch.randn(job.batch, job.seq, _identity_width(job.model), device=device, dtype=dtype)
    wrapped = time_calls(lambda: sess.run(x), sync, job.budget)
    y = torch.empty_like(x)
    binding = sess.new_binding()  # bind once, run many
    elem = {torch.float32: "float32", torch.float16: "float16"}[dtype]
    import numpy as np

    for name, t in (("x", x), ("y", y)):
        bind = binding.bind_input if name == "x" else binding.bind_output
        bind(name, device.type, device.index or 0, np.dtype(elem).type, tuple(t.shape), t.data_ptr())
    raw = time_calls(lambda: sess.run_with_iobinding(binding), sync, job.budget)
    return {
        "session_run_ms": wrapped["median_ms"],
        "bound_run_ms": raw["median_ms"],
        "repeats": wrapped["repeats"],
    }


def _identity_width(model: str) -> int:
    return int(Path(model).stem.split("-")[1])


def _measure_path(job: Job) -> dict[str, Any]:
    started = time.perf_counter()
    make, where = _path_call(job)
    torch, _, _, sync = torch_setup(job)
    make(1, 1)()  # lazily loaded kernels and buffers: setup, not the path's memory
    if job.provider == "cpu":  # torch's OpenMP threads start on the first parallel op
        torch.randn(256, 256) @ torch.randn(256, 256)
    call = make(job.batch, job.seq)
    sync()
    peak = PeakMemory(job.provider, job.runtime)
    setup_s = time.perf_counter() - started
    peak.start()
    out = time_calls(call, sync, job.budget, after_each=peak.sample)
    out.update(peak.stop())
    out.update(setup_s=setup_s, ran_on=where)
    return out


def run_worker(job: Job) -> dict[str, Any]:
    """Do one job in this process and return its measurements."""
    if job.kind == "path":
        return _measure_path(job)
    if job.kind == "roofline":
        return _roofline(job)
    if job.kind == "overhead":
        return _overhead(job)
    if job.kind == "decode":  # per-token decode timing (bench/decode.py)
        return measure_decode(job)
    raise BenchError(f"unknown job kind {job.kind!r}")
