"""Planning a run: export each lowering once, lay out the jobs, measure them, assemble the rows."""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import zoo
from export.names import PRECISIONS, SESSION_DTYPES
from zoo import files

from .jobs import (
    BASELINE,
    DEFAULT_BUDGET,
    DEFAULT_NAME,
    DEFAULT_SEQ,
    LOWERING_OF,
    PATHS,
    ROOFLINE_SIZE,
    TEMP_PREFIX,
    BenchError,
    Budget,
    Job,
    refuse_broken_cuda,
)
from .machine import default_threads, machine_info, versions
from .measure import identity_model
from .worker import measure


@dataclass
class Export:
    """One lowering exported once per spec (dynamic b and t: one file serves every shape)."""

    lowering: str
    path: str | None
    reason: str | None = None
    op_counts: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    precision: str = "fp32"
    notes: list[str] = field(default_factory=list)


def label(lowering: str, precision: str) -> str:
    """The key of an export in a report: the lowering, with its precision when not fp32."""
    return lowering if precision == "fp32" else f"{lowering} {precision}"


def export_lowerings(
    name: str,
    overrides: dict[str, Any],
    dtype: str,
    folder: Path,
    lowerings: Sequence[str],
    precision: str = "fp32",
    provider: str = "cpu",
) -> dict[str, Export]:
    """{label(lowering, precision): Export}; one that cannot be made gets path None and the reason."""
    from export.errors import ExportError
    from export.writer import export_onnx

    out = {}
    for lw in lowerings:
        key = label(lw, precision)
        try:
            r = export_onnx(
                name,
                folder / f"{lw}-{precision}.onnx",
                lowering=lw,
                dtype=dtype,
                overwrite=True,
                precision=precision,
                provider=provider,
                **overrides,
            )
        except ExportError as e:
            out[key] = Export(lw, None, str(e).splitlines()[0], precision=precision)
            continue
        out[key] = Export(lw, str(r.path), op_counts=r.op_counts, seconds=r.seconds, precision=precision)
        out[key].notes = [n for n in r.notes if n.startswith(precision)]
    return out


def auto_lowering(provider: str, spec: zoo.AttentionSpec, exports: dict[str, Export]) -> str | None:
    """What export_onnx(lowering="auto", provider=...) picks (no mask input): the first that exports."""
    from export.choice import auto_order

    order = auto_order(provider, spec, with_mask=False)
    return next((lw for lw in order if lw in exports and exports[lw].path), None)  # the fp32 exports


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
    precisions: Sequence[str] = ("fp32",),
) -> list[Job]:
    jobs = []
    for b, t in shapes:
        for p, prec in _cells(paths, precisions):
            lw = LOWERING_OF.get(p)
            if lw and not exports[label(lw, prec)].path:
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
                    model=exports[label(lw, prec)].path if lw else "",
                    batch=b,
                    seq=t,
                    precision=prec,
                )
            )
    return jobs


def _cells(paths: Sequence[str], precisions: Sequence[str]) -> list[tuple[str, str]]:
    """(path, precision) in report order: eager paths once (fp32), each ORT path at each precision."""
    return [(p, prec) for p in paths for prec in (precisions if p in LOWERING_OF else ("fp32",))]


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
    budget: Budget = DEFAULT_BUDGET,
    roofline_size: int | None = None,
    timeout: float = 1800.0,
    retries: int = 2,
    progress: bool = True,
    precisions: Sequence[str] = ("fp32",),
    tf32: bool = False,
) -> dict[str, Any]:
    """Measure every path on every (b, t), each ONNX Runtime path at each weight precision
    (export/precision.py; eager paths stay fp32); the report as a JSON-ready dict (see write_json).
    tf32: ONNX Runtime's sessions on CUDA run fp32 products in TF32 (off by default: fp32 is fp32)."""
    from zoo.progress import bar as progress_bar

    overrides = dict(overrides or {})
    threads = threads or default_threads()
    spec = zoo.spec(name, **overrides)  # raises on a bad name or override, before any work
    _check_request(provider, dtype, paths)
    precisions = list(dict.fromkeys(precisions))
    bad = [p for p in precisions if p not in PRECISIONS]
    if bad or not precisions:
        raise BenchError(f"precision {', '.join(bad) or '(none)'}: choose from {', '.join(PRECISIONS)}")
    shapes = [(b, t) for b in batches for t in seqs]
    if roofline_size is not None and (not isinstance(roofline_size, int) or roofline_size < 1):
        raise BenchError(f"roofline_size={roofline_size!r} must be a positive integer, or None to size it here")
    n = roofline_size or 0  # 0: the worker sizes it to the dtype and the machine
    runtimes = sorted({"ort" if p in LOWERING_OF else "torch" for p in paths})
    _check_fits(spec, shapes, dtype)
    sweep_stale_temp()
    with _terminate_as_interrupt(), tempfile.TemporaryDirectory(prefix=f"{TEMP_PREFIX}bench-") as tmp:
        folder = Path(tmp)
        lowerings = [LOWERING_OF[p] for p in paths if p in LOWERING_OF]
        with progress_bar(
            len(lowerings) * len(precisions), "export", unit="model", disable=not progress, leave=False
        ) as bar:
            exports = {}
            for lw in lowerings:
                for prec in precisions:
                    bar.set_postfix_str(label(lw, prec))
                    exports.update(export_lowerings(name, overrides, dtype, folder, [lw], prec, provider))
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
            ident = str(identity_model(spec.d_model, dtype, folder))
            calib += [
                Job("overhead", "ort", provider, dtype, threads, budget, model=ident, batch=b, seq=t)
                for b, t in shapes
                if t <= 16
            ]
        jobs = _jobs(name, overrides, provider, dtype, threads, budget, paths, exports, shapes, precisions)
        calib, jobs = ([replace(j, tf32=tf32) for j in js] for js in (calib, jobs))
        results: list[tuple[Job, dict[str, Any]]] = []
        with progress_bar(len(calib) + len(jobs), "bench", unit="run", disable=not progress) as bar:
            for job in calib + jobs:
                bar.set_postfix_str(
                    f"B={job.batch} T={job.seq} {job.path} {job.precision}"
                    if job.kind == "path"
                    else f"{job.kind} {job.runtime}"
                )
                results.append((job, measure(job, timeout, retries)))
                bar.update()
    roofline = {j.runtime: r for j, r in results if j.kind == "roofline"}
    overhead = [{"batch": j.batch, "seq": j.seq, **r} for j, r in results if j.kind == "overhead"]
    measured = {(j.batch, j.seq, j.path, j.precision): r for j, r in results if j.kind == "path"}
    rows = _rows(spec, shapes, _cells(paths, precisions), exports, measured, roofline, provider)
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
            "precisions": list(precisions),
            "budget": asdict(budget),
            "flop_convention": zoo.FLOP_CONVENTION,
        },
        "exports": {lw: asdict(e) for lw, e in exports.items()},
        "auto_lowering": auto_lowering(provider, spec, exports),
        "roofline": roofline,
        "ort_call_overhead": overhead,
        "rows": rows,
    }


def sweep_stale_temp() -> None:
    """Remove bench temp folders older than an hour: what a SIGKILLed run (which runs no
    cleanup) left behind. Younger ones may be another run's, still working."""
    for kind in ("bench-", "roofline-"):
        files.sweep_stale(Path(tempfile.gettempdir()), prefix=TEMP_PREFIX + kind)


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
    if dtype not in SESSION_DTYPES:
        raise BenchError(f"dtype={dtype!r} is not float32 or float16")
    if provider not in ROOFLINE_SIZE:
        raise BenchError(f"provider={provider!r} is not cpu or cuda")
    refuse_broken_cuda(
        provider, onnx=any(p in LOWERING_OF for p in paths), torch=any(p not in LOWERING_OF for p in paths)
    )


def _rows(spec: zoo.AttentionSpec, shapes, cells, exports, measured, roofline, provider) -> list[dict[str, Any]]:
    """One row per (b, t, path, precision), with the derived figures: GFLOP/s, roofline share,
    vs SDPA, and a quantized row's speed-up over the same path in fp32 (when that ran)."""
    auto = auto_lowering(provider, spec, exports)
    rows = []
    for b, t in shapes:
        flop = zoo.flops(spec, b, t).total
        base = measured.get((b, t, BASELINE, "fp32"), {})
        for p, prec in cells:
            lw = LOWERING_OF.get(p)
            row: dict[str, Any] = {
                "batch": b,
                "seq": t,
                "path": p,
                "lowering": lw,
                "precision": prec,
                "auto": lw is not None and lw == auto,
                "flops": flop,
            }
            export = exports.get(label(lw, prec)) if lw else None
            if export is not None and not export.path:
                rows.append({**row, "status": "n/a", "note": export.reason})
                continue
            r = measured.get((b, t, p, prec), {"ok": False, "error": "not run"})
            if not r.get("ok"):
                rows.append({**row, "status": "error", "note": r.get("error")})
                continue
            row.update({k: v for k, v in r.items() if k != "ok"}, status="ok")
            row["gflops"] = flop / (r["median_ms"] / 1e3) / 1e9
            peak = roofline.get("ort" if lw else "torch", {})
            # the roofline is an fp32 MatMul's: an int8 / int4 row runs integer kernels of another peak (110% of
            # the fp32 one was printed), which is not measured: no share for it
            fair = peak.get("ok") and prec == "fp32"
            row["roofline_fraction"] = row["gflops"] / peak["gflops"] if fair else None
            if base.get("ok"):
                row["speedup_vs_sdpa"] = base["median_ms"] / r["median_ms"]
                pm, bm = r.get("peak_added_mb"), base.get("peak_added_mb")
                # below ~1 MB the added peak is page-granular noise; a ratio of noise says nothing
                row["mem_vs_sdpa"] = pm / bm if pm is not None and bm and bm >= 1.0 else None
            fp32 = measured.get((b, t, p, "fp32"), {})
            if prec != "fp32" and fp32.get("ok"):
                row["speedup_vs_fp32"] = fp32["median_ms"] / r["median_ms"]
            if export is not None and export.notes:
                row["note"] = "; ".join(export.notes)
            rows.append(row)
    return rows
