"""Side-by-side benchmark of one attention block: eager torch against the ONNX Runtime lowerings.

    python -m export.bench transformer-base --batch 1 --seq 1,16,512,4096 --json b.json --plot b.png

For every shape (b, t) in batch x seq, every path that can express the spec runs:

    eager-explicit       zoo block, fused=False (einsum scores, written-out softmax, einsum)
    eager-sdpa           zoo block, fused=True (F.scaled_dot_product_attention): the baseline
    ort-decomposed       export lowering "decomposed" under ONNX Runtime
    ort-onnx-attention   export lowering "onnx-attention" (the standard Attention op)
    ort-mha              export lowering "ort-mha" (com.microsoft MultiHeadAttention)

Each (path, shape) runs in its own fresh subprocess (`python -m export.bench --worker JOB`),
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
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import zoo

PATHS = ("eager-explicit", "eager-sdpa", "ort-decomposed", "ort-onnx-attention", "ort-mha", "ort-gqa")
# path -> lowering: "ort-decomposed" runs lowering "decomposed"; "ort-mha" and "ort-gqa" keep their names
LOWERING_OF = {p: p if p in ("ort-mha", "ort-gqa") else p[len("ort-") :] for p in PATHS if p.startswith("ort-")}
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

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Job:
        raw = json.loads(text)
        raw["budget"] = Budget(**raw["budget"])
        return cls(**raw)


# -- timing and memory (run inside a worker) ------------------------------------------------


def time_calls(
    call: Callable[[], Any], sync: Callable[[], None], budget: Budget, after_each: Callable[[], None] = lambda: None
) -> dict[str, Any]:
    """Warm up, then time `call` (synchronized); milliseconds per call, and how much CPU other
    processes took meanwhile (`others_cpus`: 0.5 = half a core; anything above ~0.2 skews)."""
    warm_started = time.perf_counter()
    warm = 0
    while True:
        call()
        sync()
        after_each()
        warm += 1
        spent = time.perf_counter() - warm_started
        if spent > budget.seconds / 2 or (warm >= budget.warmup and spent >= min(0.2, budget.seconds / 4)):
            break
    times: list[float] = []
    cpu_before = _cpu_ticks()
    started = time.perf_counter()
    while len(times) < budget.repeats:
        t0 = time.perf_counter()
        call()
        sync()
        times.append(time.perf_counter() - t0)
        after_each()
        if len(times) >= budget.min_repeats and time.perf_counter() - started > budget.seconds:
            break
    wall = time.perf_counter() - started
    ms = [t * 1e3 for t in times]
    return {
        "median_ms": statistics.median(ms),
        "min_ms": min(ms),
        "max_ms": max(ms),
        "repeats": len(ms),
        "warmup": warm,
        "others_cpus": _others_cpus(cpu_before, _cpu_ticks(), wall),
    }


def _cpu_ticks() -> tuple[int, int] | None:
    """(busy ticks of the whole machine incl. steal, ticks of this process), or None without /proc."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        own = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, ValueError, IndexError):
        return None
    busy = sum(fields[:8]) - fields[3] - fields[4]  # all but idle and iowait; steal counts as busy
    return busy, int(own[11]) + int(own[12])  # utime + stime, all threads


def _others_cpus(before, after, wall: float) -> float | None:
    """CPUs' worth of work done by other processes (or the hypervisor) over `wall` seconds."""
    if before is None or after is None or wall <= 0:
        return None
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    others = (after[0] - before[0]) - (after[1] - before[1])
    return max(others, 0) / hz / wall


def _proc_status_kb(key: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


class PeakMemory:
    """Bytes the calls between start() and stop() add at their peak, measured per device."""

    def __init__(self, provider: str, runtime: str) -> None:
        self.provider, self.runtime = provider, runtime
        self.base = 0
        self.low_free: int | None = None
        self.method = ""

    def start(self) -> None:
        import torch

        if self.provider == "cuda":
            torch.cuda.synchronize()
            if self.runtime == "torch":
                torch.cuda.reset_peak_memory_stats()
                self.base = torch.cuda.memory_allocated()
                self.method = "torch.cuda.max_memory_allocated - allocated at baseline"
            else:
                self.base = self.low_free = torch.cuda.mem_get_info()[0]
                self.method = "fall of cudaMemGetInfo free bytes (ORT CUDA arena growth, an upper bound)"
            return
        rss = _proc_status_kb("VmRSS")
        if rss is None:  # no /proc (macOS, Windows): no per-call peak to read
            self.method = "unavailable (no /proc/self/status)"
            return
        self.base = rss * 1024
        try:
            Path("/proc/self/clear_refs").write_text("5")
            self.method = "VmHWM (reset at baseline) - VmRSS at baseline"
        except OSError:
            self.method = "lifetime VmHWM - VmRSS at baseline (could not reset VmHWM)"

    def sample(self) -> None:
        """After each call: ORT on CUDA has no peak counter torch can read, so track the low."""
        if self.provider == "cuda" and self.runtime == "ort":
            import torch

            free = torch.cuda.mem_get_info()[0]
            self.low_free = free if self.low_free is None else min(self.low_free, free)

    def stop(self) -> dict[str, Any]:
        import torch

        if self.provider == "cuda":
            if self.runtime == "torch":
                peak = torch.cuda.max_memory_allocated() - self.base
            else:
                self.sample()
                peak = self.base - (self.low_free or self.base)
            return {"peak_added_mb": peak / MB, "mem_method": self.method}
        hwm, rss = _proc_status_kb("VmHWM"), _proc_status_kb("VmRSS")
        if hwm is None or rss is None or not self.base:
            return {"peak_added_mb": None, "mem_method": self.method}
        return {
            "peak_added_mb": (hwm * 1024 - self.base) / MB,
            "retained_mb": (rss * 1024 - self.base) / MB,
            "baseline_mb": self.base / MB,
            "mem_method": self.method,
        }


# -- the worker: one measurement in a fresh process ----------------------------------------


def _torch_setup(job: Job):
    """(torch, device, dtype, sync) with the job's threads; inference mode is on."""
    import torch

    torch.set_num_threads(job.threads)
    torch.manual_seed(0)
    torch.set_grad_enabled(False)
    device = torch.device(job.provider)
    dtype = {"float32": torch.float32, "float16": torch.float16}[job.dtype]
    sync = torch.cuda.synchronize if job.provider == "cuda" else (lambda: None)
    return torch, device, dtype, sync


def _path_call(job: Job) -> tuple[Callable[[int, int], Callable[[], Any]], str]:
    """A factory: (b, t) -> a no-argument call of the block on fresh inputs x (b t c)."""
    torch, device, dtype, _ = _torch_setup(job)
    spec = zoo.spec(job.name, **job.overrides)
    if job.runtime == "torch":
        module = zoo.create(job.name, fused=job.path == BASELINE, **job.overrides)
        module = module.to(device=device, dtype=dtype).eval()
        run, where = (lambda x, c: module(x, c)), f"torch {job.provider}"
    else:
        from .session import OnnxSession

        sess = OnnxSession(
            job.model, job.provider, threads=job.threads if job.provider == "cpu" else None, verbose=False
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


def _identity_model(d: int, dtype: str, folder: Path) -> Path:
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
    torch, device, dtype, sync = _torch_setup(job)
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
    torch, device, dtype, _ = _torch_setup(job)
    x = torch.randn(1, n, n, device=device, dtype=dtype)
    if job.runtime == "torch":
        w = torch.randn(n, n, device=device, dtype=dtype) / math.sqrt(n)
        return lambda: torch.matmul(x, w)
    from .session import OnnxSession

    model = _matmul_model(n, job.dtype, folder)
    sess = OnnxSession(model, job.provider, threads=job.threads if job.provider == "cpu" else None, verbose=False)
    return lambda: sess.run(x)


def _overhead(job: Job) -> dict[str, Any]:
    """Milliseconds per ORT call of an Identity model at (b, t): through OnnxSession.run, and
    through a binding made once (ONNX Runtime's own per-call cost, without our Python)."""
    torch, device, dtype, sync = _torch_setup(job)
    from .session import OnnxSession

    sess = OnnxSession(job.model, job.provider, threads=job.threads if job.provider == "cpu" else None, verbose=False)
    x = torch.randn(job.batch, job.seq, _identity_width(job.model), device=device, dtype=dtype)
    wrapped = time_calls(lambda: sess.run(x), sync, job.budget)
    y = torch.empty_like(x)
    binding = sess._sess.io_binding()  # the raw session: bind once, run many
    elem = {torch.float32: "float32", torch.float16: "float16"}[dtype]
    import numpy as np

    for name, t in (("x", x), ("y", y)):
        bind = binding.bind_input if name == "x" else binding.bind_output
        bind(name, device.type, device.index or 0, np.dtype(elem).type, tuple(t.shape), t.data_ptr())
    raw = time_calls(lambda: sess._sess.run_with_iobinding(binding), sync, job.budget)
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
    torch, _, _, sync = _torch_setup(job)
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
    if job.kind == "decode":  # per-token decode timing (export/bench_decode.py)
        from .bench_decode import measure_decode

        return measure_decode(job)
    raise BenchError(f"unknown job kind {job.kind!r}")


def _worker_main(text: str) -> int:
    job = Job.from_json(text)
    try:
        result = {"ok": True, **run_worker(job)}
    except Exception as e:  # noqa: BLE001 - any failure becomes a row's note, not a crash
        first = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
        result = {"ok": False, "error": f"{type(e).__name__}: {first}"}
    print(RESULT_MARK + json.dumps(result), flush=True)
    return 0


def measure(job: Job, timeout: float, retries: int) -> dict[str, Any]:
    """spawn(job), again up to `retries` times while other processes skew it; the least skewed."""
    best = spawn(job, timeout)
    for attempt in range(retries):
        if not (best.get("ok") and _contended(best)):
            break
        again = spawn(job, timeout)
        if again.get("ok") and (again.get("others_cpus") or 0) < (best.get("others_cpus") or 0):
            best = again
        best["attempts"] = attempt + 2
    return best


def spawn(job: Job, timeout: float) -> dict[str, Any]:
    """Run `job` in a fresh interpreter (memory measured in isolation); its result dict."""
    root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    cmd = [sys.executable, "-m", "export.bench", "--worker", job.to_json()]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=root)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"timed out after {timeout:.0f} s (raise --timeout)"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_MARK):
            return json.loads(line[len(RESULT_MARK) :])
    if proc.returncode < 0:
        why = "killed (out of memory?)" if proc.returncode == -9 else f"died with signal {-proc.returncode}"
        return {"ok": False, "error": f"worker {why}"}
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1][:300]
    return {"ok": False, "error": f"worker exited {proc.returncode}: {tail}"}


# -- the run: exports, jobs, report ---------------------------------------------------------


@dataclass
class Export:
    """One lowering exported once per spec (dynamic b and t: one file serves every shape)."""

    lowering: str
    path: str | None
    reason: str | None = None
    op_counts: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0


def export_lowerings(
    name: str, overrides: dict[str, Any], dtype: str, folder: Path, lowerings: Sequence[str]
) -> dict[str, Export]:
    """{lowering: Export}; a lowering that cannot express the spec gets path None and the reason."""
    from .lowering import ExportError, export_onnx

    out = {}
    for lw in lowerings:
        try:
            r = export_onnx(name, folder / f"{lw}.onnx", lowering=lw, dtype=dtype, overwrite=True, **overrides)
        except ExportError as e:
            out[lw] = Export(lw, None, str(e).splitlines()[0])
            continue
        out[lw] = Export(lw, str(r.path), op_counts=r.op_counts, seconds=r.seconds)
    return out


def auto_lowering(provider: str, spec: zoo.AttentionSpec, exports: dict[str, Export]) -> str | None:
    """What export_onnx(lowering="auto", provider=...) picks (no mask input): the first that exports."""
    from .lowering import auto_order

    order = auto_order(provider, spec, with_mask=False)
    return next((lw for lw in order if lw in exports and exports[lw].path), None)


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
        "logical_cpus": os.cpu_count(),
    }
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
        kb = int(Path("/proc/meminfo").read_text().split("MemTotal:")[1].split()[0])
        info["memory_gb"] = round(kb / 1e6, 1)
    except (OSError, IndexError, ValueError):
        pass
    if hasattr(os, "sched_getaffinity"):
        info["usable_cpus"] = len(os.sched_getaffinity(0))
    return info


def versions() -> dict[str, str]:
    import importlib

    out = {"attnzoo": zoo.__version__}
    for mod in ("torch", "onnxruntime", "onnx", "onnxscript", "numpy"):
        try:
            out[mod] = importlib.import_module(mod).__version__
        except ImportError:
            out[mod] = "missing"
    import torch

    out["torch_cuda"] = str(torch.version.cuda)
    return out


def default_threads() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _jobs(
    args_name: str,
    overrides: dict[str, Any],
    provider: str,
    dtype: str,
    threads: int,
    budget: Budget,
    paths: Sequence[str],
    exports: dict[str, Export],
    shapes: Sequence[tuple[int, int]],
) -> list[Job]:
    jobs = []
    for b, t in shapes:
        for p in paths:
            lw = LOWERING_OF.get(p)
            if lw and not exports[lw].path:
                continue  # n/a: filled in from the export's reason
            jobs.append(
                Job(
                    "path",
                    "ort" if lw else "torch",
                    provider,
                    dtype,
                    threads,
                    budget,
                    path=p,
                    name=args_name,
                    overrides=overrides,
                    model=exports[lw].path if lw else "",
                    batch=b,
                    seq=t,
                )
            )
    return jobs


def benchmark(
    name: str = DEFAULT_NAME,
    *,
    overrides: dict[str, Any] | None = None,
    provider: str = "cpu",
    dtype: str = "float32",
    batches: Sequence[int] = (1,),
    seqs: Sequence[int] = DEFAULT_SEQ,
    threads: int | None = None,
    paths: Sequence[str] = PATHS,
    budget: Budget = Budget(),
    roofline_size: int | None = None,
    timeout: float = 1800.0,
    retries: int = 2,
    progress: bool = True,
) -> dict[str, Any]:
    """Measure every path on every (b, t); the report as a JSON-ready dict (see write_json)."""
    from tqdm import tqdm

    overrides = dict(overrides or {})
    threads = threads or default_threads()
    spec = zoo.spec(name, **overrides)  # raises on a bad name or override, before any work
    _check_request(provider, dtype, paths)
    shapes = [(b, t) for b in batches for t in seqs]
    if roofline_size is not None and (not isinstance(roofline_size, int) or roofline_size < 1):
        raise BenchError(f"roofline_size={roofline_size!r} must be a positive integer, or None to size it here")
    n = roofline_size or 0  # 0: the worker sizes it to the dtype and the machine
    runtimes = sorted({"ort" if p in LOWERING_OF else "torch" for p in paths})
    _check_fits(spec, shapes, dtype)
    _sweep_stale_temp()
    with _terminate_as_interrupt(), tempfile.TemporaryDirectory(prefix=f"{TEMP_PREFIX}bench-") as tmp:
        folder = Path(tmp)
        lowerings = [LOWERING_OF[p] for p in paths if p in LOWERING_OF]
        with tqdm(
            total=len(lowerings),
            desc="export",
            unit="model",
            file=sys.stderr,
            disable=not progress,
            leave=False,
        ) as bar:
            exports = {}
            for lw in lowerings:
                bar.set_postfix_str(lw)
                exports.update(export_lowerings(name, overrides, dtype, folder, [lw]))
                bar.update()
        calib = [
            Job(
                "roofline",
                rt,
                provider,
                dtype,
                threads,
                budget,
                seq=n,
            )
            for rt in runtimes
        ]
        if "ort" in runtimes:
            ident = str(_identity_model(spec.d_model, dtype, folder))
            calib += [
                Job("overhead", "ort", provider, dtype, threads, budget, model=ident, batch=b, seq=t)
                for b, t in shapes
                if t <= 16
            ]
        jobs = _jobs(name, overrides, provider, dtype, threads, budget, paths, exports, shapes)
        results: list[tuple[Job, dict[str, Any]]] = []
        with tqdm(total=len(calib) + len(jobs), desc="bench", unit="run", file=sys.stderr, disable=not progress) as bar:
            for job in calib + jobs:
                bar.set_postfix_str(
                    f"B={job.batch} T={job.seq} {job.path}" if job.kind == "path" else f"{job.kind} {job.runtime}"
                )
                results.append((job, measure(job, timeout, retries)))
                bar.update()
    roofline = {j.runtime: r for j, r in results if j.kind == "roofline"}
    overhead = [{"batch": j.batch, "seq": j.seq, **r} for j, r in results if j.kind == "overhead"]
    measured = {(j.batch, j.seq, j.path): r for j, r in results if j.kind == "path"}
    rows = _rows(spec, shapes, paths, exports, measured, roofline, provider)
    return {
        "schema": "attnzoo.bench/1",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]),
        "machine": machine_info(),
        "versions": versions(),
        "config": {
            "name": name,
            "overrides": overrides,
            "spec": spec.to_dict(),
            "provider": provider,
            "dtype": dtype,
            "threads": threads,
            "batch": list(batches),
            "seq": list(seqs),
            "paths": list(paths),
            "budget": asdict(budget),
            "flop_convention": zoo.FLOP_CONVENTION,
        },
        "exports": {lw: asdict(e) for lw, e in exports.items()},
        "auto_lowering": auto_lowering(provider, spec, exports),
        "roofline": roofline,
        "ort_call_overhead": overhead,
        "rows": rows,
    }


TEMP_PREFIX = "attnzoo-"  # bench and roofline folders in the system temp dir
_STALE_SECONDS = 3600


def _sweep_stale_temp() -> None:
    """Remove bench temp folders older than an hour: what a SIGKILLed run (which runs no
    cleanup) left behind. Younger ones may be another run's, still working."""
    import shutil

    now = time.time()
    for pattern in (f"{TEMP_PREFIX}bench-*", f"{TEMP_PREFIX}roofline-*"):
        for p in Path(tempfile.gettempdir()).glob(pattern):
            try:
                if p.is_dir() and not p.is_symlink() and now - p.stat().st_mtime > _STALE_SECONDS:
                    shutil.rmtree(p, ignore_errors=True)
            except OSError:
                pass


class _terminate_as_interrupt:
    """SIGTERM (a CI timeout, `kill`) unwinds like Ctrl-C, so temp folders and worker processes
    are cleaned up; Python's default for SIGTERM is to die on the spot."""

    def __enter__(self):
        import signal
        import threading

        self._old = None
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGTERM, self._raise)
        return self

    @staticmethod
    def _raise(signum, frame):
        raise KeyboardInterrupt

    def __exit__(self, *exc):
        import signal

        if self._old is not None:
            signal.signal(signal.SIGTERM, self._old)
        return False


def _check_fits(spec: zoo.AttentionSpec, shapes: Sequence[tuple[int, int]], dtype: str) -> None:
    """Refuse shapes that cannot fit in memory even on the leanest path (SDPA, no score tensor)."""
    from zoo.accounting import working_set_bytes
    from zoo.limits import check_fits

    itemsize = 2 if dtype == "float16" else 4
    for b, t in shapes:
        need = working_set_bytes(spec, b, t, t if spec.is_cross else None, itemsize=itemsize)
        check_fits(need, f"benchmarking {spec.describe()} at b={b}, t={t}")


def _check_request(provider: str, dtype: str, paths: Sequence[str]) -> None:
    unknown = [p for p in paths if p not in PATHS]
    if unknown:
        raise BenchError(f"unknown path(s) {', '.join(unknown)}; choose from {', '.join(PATHS)}")
    if not paths:
        raise BenchError(f"no path to run; choose from {', '.join(PATHS)}")
    if dtype not in ("float32", "float16"):
        raise BenchError(f"dtype={dtype!r} is not float32 or float16")
    if provider not in ROOFLINE_SIZE:
        raise BenchError(f"provider={provider!r} is not cpu or cuda")
    if provider == "cuda":
        import torch

        from .session import cuda_status

        ok, why = cuda_status()
        if not ok and any(p in LOWERING_OF for p in paths):
            raise BenchError(f"--provider cuda: {why}")
        if not torch.cuda.is_available() and any(p not in LOWERING_OF for p in paths):
            raise BenchError("--provider cuda: torch sees no CUDA device (torch.cuda.is_available() is False)")


def _rows(spec: zoo.AttentionSpec, shapes, paths, exports, measured, roofline, provider) -> list[dict[str, Any]]:
    """One row per (b, t, path), with the derived figures: GFLOP/s, roofline share, vs SDPA."""
    auto = auto_lowering(provider, spec, exports)
    rows = []
    for b, t in shapes:
        flop = zoo.flops(spec, b, t).total
        base = measured.get((b, t, BASELINE), {})
        for p in paths:
            lw = LOWERING_OF.get(p)
            row: dict[str, Any] = {
                "batch": b,
                "seq": t,
                "path": p,
                "lowering": lw,
                "auto": lw is not None and lw == auto,
                "flops": flop,
            }
            if lw and not exports[lw].path:
                rows.append({**row, "status": "n/a", "note": exports[lw].reason})
                continue
            r = measured.get((b, t, p), {"ok": False, "error": "not run"})
            if not r.get("ok"):
                rows.append({**row, "status": "error", "note": r.get("error")})
                continue
            row.update({k: v for k, v in r.items() if k != "ok"}, status="ok")
            row["gflops"] = flop / (r["median_ms"] / 1e3) / 1e9
            peak = roofline.get("ort" if lw else "torch", {})
            row["roofline_fraction"] = row["gflops"] / peak["gflops"] if peak.get("ok") else None
            if base.get("ok"):
                row["speedup_vs_sdpa"] = base["median_ms"] / r["median_ms"]
                pm, bm = r.get("peak_added_mb"), base.get("peak_added_mb")
                # below ~1 MB the added peak is page-granular noise; a ratio of noise says nothing
                row["mem_vs_sdpa"] = pm / bm if pm is not None and bm and bm >= 1.0 else None
            rows.append(row)
    return rows


# -- output: markdown, JSON, plot ------------------------------------------------------------


def _fmt(v: float | None, spec: str, suffix: str = "") -> str:
    return "-" if v is None else f"{v:{spec}}{suffix}"


def format_table(report: dict[str, Any]) -> str:
    """The rows as a markdown table, then the roofline, ORT call overhead and notes."""
    cfg = report["config"]
    head = "| B | T | path | median ms | GFLOP/s | % roofline | +peak MB | speed-up vs SDPA | mem / SDPA |"
    lines = [
        f"{cfg['name']} ({zoo.AttentionSpec(**cfg['spec']).describe()}), {cfg['provider']}, {cfg['dtype']}, "
        f"{cfg['threads']} threads",
        "",
        head,
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    notes: list[str] = []
    for r in report["rows"]:
        name = r["path"] + (" (auto)" if r["auto"] else "")
        if r["status"] != "ok":
            if r["note"] not in notes:
                notes.append(r["note"])
            mark = f"{r['status']} [{notes.index(r['note']) + 1}]"
            lines.append(f"| {r['batch']} | {r['seq']} | {name} | {mark} | | | | | |")
            continue
        pct = None if r.get("roofline_fraction") is None else 100 * r["roofline_fraction"]
        lines.append(
            f"| {r['batch']} | {r['seq']} | {name} "
            f"| {_fmt(r['median_ms'], '.3g' if r['median_ms'] < 1 else '.1f')}{'*' if _contended(r) else ''} "
            f"| {_fmt(r['gflops'], '.1f')} | {_fmt(pct, '.0f', '%')} | {_fmt(r.get('peak_added_mb'), '.1f')} "
            f"| {_fmt(r.get('speedup_vs_sdpa'), '.2f', 'x')} | {_fmt(r.get('mem_vs_sdpa'), '.2f', 'x')} |"
        )
    lines.append("")
    for rt, r in sorted(report["roofline"].items()):
        label = "torch.matmul" if rt == "torch" else "ONNX Runtime MatMul"
        if r.get("ok"):
            lines.append(
                f"roofline ({label}, {r['n']}^3, {cfg['dtype']}): {r['median_ms']:.1f} ms, {r['gflops']:.1f} GFLOP/s"
            )
        else:
            lines.append(f"roofline ({label}): failed: {r.get('error')}")
    for o in report["ort_call_overhead"]:
        if o.get("ok"):
            lines.append(
                f"ORT per-call overhead (Identity model, B={o['batch']} T={o['seq']}): "
                f"{o['session_run_ms'] * 1e3:.0f} us via OnnxSession.run, "
                f"{o['bound_run_ms'] * 1e3:.0f} us via a pre-made IO binding"
            )
    lines.append(f"auto lowering on {cfg['provider']}: {report['auto_lowering']}")
    m = report["machine"]
    busy = max(m.get("load_average_before") or 0, m.get("load_average_after") or 0)
    if cfg["provider"] == "cpu" and busy > 0.5 * (m.get("usable_cpus") or m.get("logical_cpus") or 1):
        lines.append(
            f"warning: the machine was busy (1-min load average up to {busy:.1f} on "
            f"{m.get('usable_cpus') or m.get('logical_cpus')} CPUs): timings are skewed"
        )
    lines += [f"[{i}] {n}" for i, n in enumerate(notes, 1)]
    return "\n".join(lines)


def _contended(result: dict[str, Any]) -> bool:
    return (result.get("others_cpus") or 0.0) > CONTENDED


def write_json(report: dict[str, Any], path: str | os.PathLike) -> None:
    from .lowering import write_atomic

    write_atomic(Path(path), lambda tmp: tmp.write_text(json.dumps(report, indent=2) + "\n"))


def plot(report: dict[str, Any], path: str | os.PathLike) -> str | None:
    """Latency and added peak memory against T, log axes, one line per (path, B).
    Returns None when written, else why not (matplotlib missing, nothing to plot)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install 'attnzoo[plot]'); no plot written"
    rows = [r for r in report["rows"] if r["status"] == "ok"]
    if not rows:
        return "no path ran; no plot written"
    cfg = report["config"]
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(12, 4.8))
    batches = sorted({r["batch"] for r in rows})
    styles = ["-", "--", ":", "-."]
    for p in cfg["paths"]:
        for i, b in enumerate(batches):
            pts = sorted(
                (r["seq"], r["median_ms"], r.get("peak_added_mb")) for r in rows if r["path"] == p and r["batch"] == b
            )
            if not pts:
                continue
            label = p + (f", B={b}" if len(batches) > 1 else "")
            ts = [q[0] for q in pts]
            line = ax_t.plot(ts, [q[1] for q in pts], styles[i % 4], marker="o", label=label)[0]
            mem = [(q[0], max(q[2], 0.1)) for q in pts if q[2] is not None]
            ax_m.plot(
                [m[0] for m in mem],
                [m[1] for m in mem],
                styles[i % 4],
                marker="o",
                color=line.get_color(),
                label=label,
            )
    for ax, ylabel in ((ax_t, "median latency (ms)"), (ax_m, "added peak memory (MB, floor 0.1)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length T")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    ax_t.legend(fontsize=8)
    fig.suptitle(
        f"{cfg['name']}: {cfg['provider']}, {cfg['dtype']}, {cfg['threads']} threads "
        f"({report['machine'].get('cpu', '')})",
        fontsize=10,
    )
    fig.tight_layout()
    from .lowering import write_atomic

    fmt = Path(path).suffix.lower().lstrip(".")
    write_atomic(Path(path), lambda tmp: fig.savefig(tmp, dpi=110, format=fmt if fmt in PLOT_FORMATS else "png"))
    plt.close(fig)
    return None


# -- command line ------------------------------------------------------------------------------


def _int_list(text: str) -> list[int]:
    try:
        values = [int(p) for p in text.replace(",", " ").split()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of integers, e.g. 1,16,512") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: give positive integers, e.g. 1,16,512")
    return values


def _path_list(text: str) -> list[str]:
    return [p for p in text.replace(",", " ").split() if p]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `attnzoo bench` options (also `python -m export.bench` and scripts/bench.py)."""
    parser.add_argument("name", nargs="?", default=DEFAULT_NAME, help=f"a zoo name (default {DEFAULT_NAME})")
    if "--set" not in parser._option_string_actions:  # the CLI may have added it already
        parser.add_argument(
            "--set",
            action="append",
            metavar="KEY=VALUE",
            help="override a spec field, e.g. --set heads=4 (repeatable)",
        )
    parser.add_argument("--provider", choices=["cpu", "cuda"], default="cpu", help="where to run (default cpu)")
    parser.add_argument("--dtype", choices=["float32", "float16"], default="float32")
    parser.add_argument(
        "--batch",
        "-b",
        type=_int_list,
        action="extend",
        metavar="LIST",
        help="batch sizes, e.g. 1,4 (default 1)",
    )
    parser.add_argument(
        "--seq",
        "-t",
        type=_int_list,
        action="extend",
        metavar="LIST",
        help=f"sequence lengths (default {','.join(map(str, DEFAULT_SEQ))})",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch and ONNX Runtime intra-op threads (default: every usable core)",
    )
    parser.add_argument(
        "--paths", type=_path_list, default=list(PATHS), metavar="LIST", help=f"a subset of {','.join(PATHS)}"
    )
    parser.add_argument("--warmup", type=int, default=Budget.warmup, help="warm-up calls (default %(default)s)")
    parser.add_argument("--repeats", type=int, default=Budget.repeats, help="timed calls at most (default %(default)s)")
    parser.add_argument(
        "--min-repeats",
        type=int,
        default=Budget.min_repeats,
        help="timed calls at least (default %(default)s)",
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=Budget.seconds,
        metavar="SECONDS",
        help="stop timing a path after this long, once --min-repeats are done (default %(default)s)",
    )
    parser.add_argument(
        "--roofline-size",
        type=int,
        default=None,
        metavar="N",
        help="n of the n^3 matmul roofline (default 2048 on cpu, 8192 on cuda)",
    )
    parser.add_argument(
        "--retries",
        type=int,
        default=2,
        help=f"re-measure a path while other processes use over {CONTENDED} CPUs (default %(default)s)",
    )
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per measurement process")
    parser.add_argument("--json", metavar="PATH", help="write the full report as JSON")
    parser.add_argument("--plot", metavar="PATH", help="write a PNG of latency and memory against T")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    parser.add_argument(
        "--decode",
        action="store_true",
        help="per-token decode latency instead: eager block.decode vs each decode lowering's generate_steps",
    )
    parser.add_argument(
        "--past",
        type=_int_list,
        action="extend",
        metavar="LIST",
        help="with --decode: past lengths, e.g. 128,1024,4096,16384 (the default)",
    )


PLOT_FORMATS = ("png", "svg", "pdf")


def _check_flags(args: argparse.Namespace) -> None:
    """Every numeric flag in range and finite, and the plot's name says its format."""
    ints = {
        "--threads": (args.threads, 1, 1024),
        "--warmup": (args.warmup, 0, 10**6),
        "--repeats": (args.repeats, 1, 10**7),
        "--min-repeats": (args.min_repeats, 1, 10**7),
        "--retries": (args.retries, 0, 100),
        "--roofline-size": (args.roofline_size, 1, 65536),
    }
    for flag, (value, low, high) in ints.items():
        if value is not None and not low <= value <= high:
            raise BenchError(f"{flag} {value} is outside {low}..{high}")
    if args.min_repeats > args.repeats:
        raise BenchError(f"--min-repeats {args.min_repeats} is more than --repeats {args.repeats}")
    for flag, value in (("--budget", args.budget), ("--timeout", args.timeout)):
        if not math.isfinite(value) or value <= 0:
            raise BenchError(f"{flag} {value} must be a positive number of seconds")
    if args.timeout < args.budget:
        raise BenchError(
            f"--timeout {args.timeout:g} s is shorter than --budget {args.budget:g} s: every path would time out"
        )
    if args.plot and Path(args.plot).suffix.lower().lstrip(".") not in PLOT_FORMATS:
        raise BenchError(f"--plot {args.plot}: name a .png, .svg or .pdf file (the suffix is the format)")


def run_from_args(args: argparse.Namespace) -> int:
    """`attnzoo bench`: measure, print the markdown table, write JSON and the plot."""
    from .cli import parse_overrides

    _check_flags(args)
    from .lowering import ensure_writable_parent

    for out in (args.json, args.plot):  # fail now, not after minutes of measuring
        if out:
            ensure_writable_parent(Path(out))
    budget = Budget(args.warmup, args.repeats, args.min_repeats, args.budget)
    if args.decode:
        return _run_decode_from_args(args, budget)
    if args.past:
        raise BenchError("--past goes with --decode (past lengths of the KV cache)")
    report = benchmark(
        args.name,
        overrides=parse_overrides(args.set),
        provider=args.provider,
        dtype=args.dtype,
        batches=args.batch or [1],
        seqs=args.seq or list(DEFAULT_SEQ),
        threads=args.threads,
        paths=args.paths,
        budget=budget,
        roofline_size=args.roofline_size,
        timeout=args.timeout,
        retries=args.retries,
        progress=not args.no_progress,
    )
    print(format_table(report))
    if args.json:
        write_json(report, args.json)
        print(f"wrote {args.json}")
    if args.plot:
        why = plot(report, args.plot)
        print(why or f"wrote {args.plot}", file=sys.stderr if why else sys.stdout)
    failed = [r for r in report["rows"] if r["status"] == "error"]
    return 1 if failed else 0


def _run_decode_from_args(args: argparse.Namespace, budget: Budget) -> int:
    from .bench_decode import DECODE_PATHS, DEFAULT_PAST, benchmark_decode, format_decode_table, write_decode_json
    from .cli import parse_overrides

    if args.seq or args.plot:
        raise BenchError("--decode measures t = 1 per step: give past lengths with --past (no --seq, no --plot)")
    paths = [p for p in args.paths if p in DECODE_PATHS] if args.paths != list(PATHS) else list(DECODE_PATHS)
    report = benchmark_decode(
        args.name,
        overrides=parse_overrides(args.set),
        provider=args.provider,
        dtype=args.dtype,
        batches=args.batch or [1],
        pasts=args.past or list(DEFAULT_PAST),
        paths=paths,
        threads=args.threads,
        budget=budget,
        timeout=args.timeout,
        retries=args.retries,
        progress=not args.no_progress,
    )
    print(format_decode_table(report))
    if args.json:
        write_decode_json(report, args.json)
        print(f"wrote {args.json}")
    return 1 if any(not r.get("ok") for r in report["rows"]) else 0


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m export.bench ...` is `attnzoo bench ...`; `--worker JOB` runs one measurement."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--worker"] and len(argv) == 2:
        return _worker_main(argv[1])
    from .cli import main as cli_main

    return cli_main(["bench", *argv])


if __name__ == "__main__":
    sys.exit(main())
