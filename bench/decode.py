"""Per-token decode benchmark: eager `block.decode` (a growing cache, and a static cache written in
place), transformers' own attention with its StaticCache (the peer), and each decode lowering under
ONNX Runtime (growing and static caches), side by side with the physical floor.

    attnzoo bench gpt2-small --decode --past 128,1024,4096,16384 --batch 1,8

For every (batch b, past length p) and path, a fresh worker process (bench/worker.py) builds a
random cache of p positions, then times calls that each feed STEPS single tokens starting from
that cache (the cache grows to p + STEPS inside the call). Reported: milliseconds per token,
tokens/s (b tokens per step), and the peak memory a call adds over the worker's baseline (the
cache of p positions already counted in the baseline): O(p) for a path that copies the cache
once per step, O(p^2) for one that builds a (t, p) or (p, p) tensor it should not.

The floor: a step must read the projection weights and the whole cache once, so no path can beat
(weight bytes + cache bytes) / read bandwidth. Each worker measures that bandwidth in its own
process just before its path, with the path's threads, over a buffer of exactly those bytes read
again and again as the steps read them, so the part that stays in the last-level cache between
steps is read from there ("in L3": that part, from the working set's, memory's and L3's rates;
bench/decode_measure.py). "x floor" is ms/token over that floor.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import zoo

from .decode_measure import transformers_static_why_not
from .jobs import (
    BASELINE,
    DECODE_EXPORTS,
    DECODE_PATHS,
    DECODE_PRECISIONS,
    EAGER_DECODE_PATHS,
    EAGER_PRECISIONS,
    STEPS,
    BenchError,
    Budget,
    Job,
    refuse_broken_cuda,
)
from .machine import default_threads, machine_info, versions
from .worker import measure


def benchmark_decode(
    name: str,
    *,
    overrides: dict[str, Any],
    provider: str,
    dtype: str,
    batches: list[int],
    pasts: list[int],
    paths: list[str],
    threads: int | None,
    budget: Budget,
    timeout: float,
    retries: int,
    progress: bool = True,
    precisions: list[str] | None = None,
    tf32: bool = False,
) -> dict[str, Any]:
    """Export each (decode lowering, cache, precision) once, then measure every (path, precision, b, p)
    in its own worker. int8/int4 apply to the ONNX paths, fp16/bf16 to the eager ones. tf32: ONNX
    Runtime's sessions on CUDA run fp32 products in TF32 (off by default)."""
    from export.choice import why_not
    from zoo.progress import bar as progress_bar

    spec = zoo.spec(name, **overrides)
    precisions = list(precisions or ["fp32"])
    unknown = sorted(set(paths) - set(DECODE_PATHS))
    if unknown:
        raise BenchError(f"unknown decode path(s) {unknown}; choose from {', '.join(DECODE_PATHS)}")
    bad = sorted(set(precisions) - set(DECODE_PRECISIONS))
    if bad:
        raise BenchError(f"unknown precision(s) {bad}; choose from {', '.join(DECODE_PRECISIONS)}")
    if not spec.causal or spec.is_cross:
        raise BenchError(f"{name} is not causal self-attention ({spec.describe()}): it has no decode to measure")
    eager = [p in EAGER_DECODE_PATHS for p in paths]
    refuse_broken_cuda(provider, onnx=not all(eager), torch=any(eager))
    threads = threads or default_threads()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="attnzoo-bench-decode-") as tmp:
        models: dict[tuple[str, str], str] = {}
        weight_bytes: dict[tuple[str, str], int] = {}
        skipped: dict[str, str] = {}
        variants: list[tuple[str, str]] = []
        for path in paths:
            eager = path in EAGER_DECODE_PATHS
            for precision in precisions:
                if (precision in EAGER_PRECISIONS) != eager and precision != "fp32":
                    continue  # int8/int4 are ONNX exports; fp16/bf16 eager dtypes
                label = _label(path, precision)
                if eager:
                    reason = transformers_static_why_not(spec) if path == "transformers-static" else None
                    if reason:
                        skipped[label] = reason
                    else:
                        variants.append((path, precision))
                    continue
                lowering, cache = DECODE_EXPORTS[path]
                reason = why_not(lowering, spec, decode=True, dtype=dtype, cache=cache)
                if reason:
                    skipped[label] = reason
                    continue
                from export.writer import export_onnx

                started = time.perf_counter()
                target = Path(tmp) / f"{lowering}-{cache}-{precision}.onnx"
                extra = {} if precision == "fp32" else {"precision": precision}
                if cache == "static":  # room for the longest row's past and its timed steps
                    extra["max_len"] = max(pasts) + STEPS
                try:
                    export_onnx(
                        name, target, lowering=lowering, dtype=dtype, decode=True, cache=cache, **extra, **overrides
                    )
                except zoo.AttnzooError as e:
                    skipped[label] = f"export failed: {str(e).splitlines()[0][:200]}"
                    continue
                models[(path, precision)] = str(target)
                weight_bytes[(path, precision)] = _initializer_bytes(target)
                variants.append((path, precision))
                if progress:
                    print(f"exported {label} in {time.perf_counter() - started:.1f} s", file=sys.stderr)
        jobs = [(path, prec, b, p) for b in batches for p in pasts for path, prec in variants]
        bar = progress_bar(len(jobs), "decode bench", unit="run", disable=not progress)
        for path, precision, b, p in jobs:
            label = _label(path, precision)
            bar.set_postfix_str(f"{label} b={b} p={p}")
            eager = path in EAGER_DECODE_PATHS
            job_dtype = (EAGER_PRECISIONS[precision] or dtype) if eager else dtype
            weights = weight_bytes.get((path, precision), zoo.count_parameters(spec) * ITEMSIZE[job_dtype])
            job = Job(
                kind="decode",
                runtime="torch" if eager else "ort",
                provider=provider,
                dtype=job_dtype,
                threads=threads,
                budget=budget,
                path=path,
                name=name,
                overrides=overrides,
                model=models.get((path, precision), ""),
                batch=b,
                seq=p,
                floor_bytes=weights + cache_bytes(spec, job_dtype, b, p),
                tf32=tf32,
            )
            result = measure(job, timeout, retries)
            row = {"path": label, "precision": precision, "batch": b, "past": p, **result}
            rows.append({**row, **floor(spec, job_dtype, b, p, result, weights)})
            bar.update()
        bar.close()
    for row in rows:
        base = next(
            (r for r in rows if r["path"] == BASELINE and r["batch"] == row["batch"] and r["past"] == row["past"]),
            None,
        )
        if row.get("ok") and base and base.get("ok"):
            row["speedup_vs_eager"] = base["ms_per_token"] / row["ms_per_token"]
    return {
        "kind": "decode",
        "name": name,
        "spec": spec.to_dict(),
        "describe": spec.describe(),
        "provider": provider,
        "dtype": dtype,
        "precisions": precisions,
        "threads": threads,
        "steps_per_call": STEPS,
        "skipped": skipped,
        "rows": rows,
        "machine": machine_info(),
        "versions": versions(),
    }


def _label(path: str, precision: str) -> str:
    return path if precision == "fp32" else f"{path} {precision}"


def _initializer_bytes(model_path: Path) -> int:
    """The bytes of an ONNX model's weights as stored (quantized weights, scales and zero points)."""
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    total = 0
    for init in model.graph.initializer:
        n = 1
        for d in init.dims:
            n *= d
        total += n * onnx.helper.tensor_dtype_to_np_dtype(init.data_type).itemsize
    return total


ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}


def cache_bytes(spec: zoo.AttentionSpec, dtype: str, b: int, p: int) -> int:
    return b * spec.kv_heads_ * p * (spec.d_k_ + spec.d_v_) * ITEMSIZE[dtype]


def floor(spec: zoo.AttentionSpec, dtype: str, b: int, p: int, result: dict[str, Any], weight_bytes: int) -> dict:
    """The row's physical floor: its weights (as stored: quantized ones at their size) and the cache of
    p positions read once per step, at the bandwidth its worker measured with the path's threads over a
    buffer of that size read again and again (what of it stays in the last-level cache between steps is
    read from there: `l3_part`); and how far the path is from it. Without that figure (CUDA), the
    memory bandwidth."""
    bandwidth = result.get("working_set_gbs") or result.get("bandwidth_gbs")
    if not result.get("ok") or not bandwidth:
        return {}
    cache = cache_bytes(spec, dtype, b, p)
    floor_ms = (weight_bytes + cache) / (bandwidth * 1e9) * 1e3
    return {
        "weight_mb": weight_bytes / 1e6,
        "cache_mb": cache / 1e6,
        "floor_gbs": bandwidth,
        "floor_ms": floor_ms,
        "x_floor": result["ms_per_token"] / floor_ms,
    }


def format_decode_table(report: dict[str, Any]) -> str:
    """A markdown table: one row per (b, p, path), then the linearity of each path in p."""
    lines = [
        f"decode: {report['name']} ({report['describe']}), {report['provider']} {report['dtype']}, "
        f"{report['threads']} threads, {report['steps_per_call']} single-token steps per call",
        "",
        "| B | past | path | ms/token | tokens/s | floor ms | x floor | GB/s read | in L3 | added MB | x eager |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report["rows"]:
        if not r.get("ok"):
            lines.append(f"| {r['batch']} | {r['past']} | {r['path']} | error: {r.get('error', '?')} | | | | | | | |")
            continue
        mem = r.get("peak_added_mb")
        lines.append(
            f"| {r['batch']} | {r['past']} | {r['path']} | {r['ms_per_token']:.3f} | "
            f"{1e3 * r['batch'] / r['ms_per_token']:,.0f} | {_num(r, 'floor_ms', 3)} | {_num(r, 'x_floor', 2)} | "
            f"{_num(r, 'floor_gbs', 1)} | {_pct(r.get('l3_part'))} | {'' if mem is None else f'{mem:.1f}'} | "
            f"{_num(r, 'speedup_vs_eager', 2)} |"
        )
    for path, why in report["skipped"].items():
        lines.append(f"| | | {path} | skipped: {why} | | | | | | | |")
    growth = []
    for path in dict.fromkeys(r["path"] for r in report["rows"]):
        for b in sorted({r["batch"] for r in report["rows"]}):
            ok = {
                r["past"]: r["ms_per_token"]
                for r in report["rows"]
                if r["path"] == path and r["batch"] == b and r.get("ok")
            }
            if len(ok) >= 2:
                lo, hi = min(ok), max(ok)
                growth.append(f"{path} b={b}: x{ok[hi] / ok[lo]:.2f} from past {lo} to {hi} (x{hi / lo:g} positions)")
    if growth:
        lines += ["", "per-token time growth with the past:"] + [f"  {g}" for g in growth]
    return "\n".join(lines)


def _pct(value: float | None) -> str:
    return "" if value is None else f"{100 * value:.0f}%"


def _num(row: dict[str, Any], key: str, digits: int) -> str:
    value = row.get(key)
    return "" if value is None else f"{value:.{digits}f}"
