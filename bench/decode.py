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
(weight bytes + cache bytes) / read bandwidth, the bandwidth measured by each worker in its own
process just before its path (bench/decode_measure.py). "x floor" is ms/token over that floor.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import zoo

from .decode_measure import transformers_static_why_not
from .jobs import BASELINE, DECODE_EXPORTS, DECODE_PATHS, EAGER_DECODE_PATHS, STEPS, BenchError, Budget, Job
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
) -> dict[str, Any]:
    """Export each decode lowering once, then measure every (path, b, p) in its own worker."""
    from tqdm import tqdm

    from export.lowering import why_not

    spec = zoo.spec(name, **overrides)
    unknown = sorted(set(paths) - set(DECODE_PATHS))
    if unknown:
        raise BenchError(f"unknown decode path(s) {unknown}; choose from {', '.join(DECODE_PATHS)}")
    if not spec.causal or spec.is_cross:
        raise BenchError(f"{name} is not causal self-attention ({spec.describe()}): it has no decode to measure")
    threads = threads or default_threads()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="attnzoo-bench-decode-") as tmp:
        models: dict[str, str | None] = {}
        skipped: dict[str, str] = {}
        for path in paths:
            if path in EAGER_DECODE_PATHS:
                reason = transformers_static_why_not(spec) if path == "transformers-static" else None
                if reason:
                    skipped[path] = reason
                continue
            lowering, cache = DECODE_EXPORTS[path]
            reason = why_not(lowering, spec, decode=True, dtype=dtype, cache=cache)
            if reason:
                skipped[path] = reason
                continue
            from export.lowering import export_onnx

            started = time.perf_counter()
            target = Path(tmp) / f"{lowering}-{cache}.onnx"
            try:
                export_onnx(name, target, lowering=lowering, dtype=dtype, decode=True, cache=cache, **overrides)
            except zoo.AttnzooError as e:
                skipped[path] = f"export failed: {str(e).splitlines()[0][:200]}"
                continue
            models[path] = str(target)
            if progress:
                print(f"exported {path} in {time.perf_counter() - started:.1f} s", file=sys.stderr)
        measured = [p for p in paths if p in models or (p in EAGER_DECODE_PATHS and p not in skipped)]
        jobs = [(path, b, p) for b in batches for p in pasts for path in measured]
        bar = tqdm(total=len(jobs), desc="decode bench", unit="run", file=sys.stderr, disable=not progress)
        for path, b, p in jobs:
            bar.set_postfix_str(f"{path} b={b} p={p}")
            job = Job(
                kind="decode",
                runtime="torch" if path in EAGER_DECODE_PATHS else "ort",
                provider=provider,
                dtype=dtype,
                threads=threads,
                budget=budget,
                path=path,
                name=name,
                overrides=overrides,
                model=models.get(path, ""),
                batch=b,
                seq=p,
            )
            result = measure(job, timeout, retries)
            rows.append({"path": path, "batch": b, "past": p, **result, **floor(spec, dtype, b, p, result)})
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
        "threads": threads,
        "steps_per_call": STEPS,
        "skipped": skipped,
        "rows": rows,
        "machine": machine_info(),
        "versions": versions(),
    }


ITEMSIZE = {"float32": 4, "float16": 2}


def floor(spec: zoo.AttentionSpec, dtype: str, b: int, p: int, result: dict[str, Any]) -> dict[str, Any]:
    """The row's physical floor: weights and the cache of p positions read once, at the bandwidth
    its worker measured; and how far the path is from it."""
    bandwidth = result.get("bandwidth_gbs")
    if not result.get("ok") or not bandwidth:
        return {}
    weight_bytes = zoo.count_parameters(spec) * ITEMSIZE[dtype]
    cache_bytes = b * spec.kv_heads_ * p * (spec.d_k_ + spec.d_v_) * ITEMSIZE[dtype]
    floor_ms = (weight_bytes + cache_bytes) / (bandwidth * 1e9) * 1e3
    return {
        "weight_mb": weight_bytes / 1e6,
        "cache_mb": cache_bytes / 1e6,
        "floor_ms": floor_ms,
        "x_floor": result["ms_per_token"] / floor_ms,
    }


def format_decode_table(report: dict[str, Any]) -> str:
    """A markdown table: one row per (b, p, path), then the linearity of each path in p."""
    lines = [
        f"decode: {report['name']} ({report['describe']}), {report['provider']} {report['dtype']}, "
        f"{report['threads']} threads, {report['steps_per_call']} single-token steps per call",
        "",
        "| B | past | path | ms/token | tokens/s | floor ms | x floor | GB/s read | added MB | x eager |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report["rows"]:
        if not r.get("ok"):
            lines.append(f"| {r['batch']} | {r['past']} | {r['path']} | error: {r.get('error', '?')} | | | | | | |")
            continue
        mem = r.get("peak_added_mb")
        lines.append(
            f"| {r['batch']} | {r['past']} | {r['path']} | {r['ms_per_token']:.3f} | "
            f"{1e3 * r['batch'] / r['ms_per_token']:,.0f} | {_num(r, 'floor_ms', 3)} | {_num(r, 'x_floor', 2)} | "
            f"{_num(r, 'bandwidth_gbs', 1)} | {'' if mem is None else f'{mem:.1f}'} | "
            f"{_num(r, 'speedup_vs_eager', 2)} |"
        )
    for path, why in report["skipped"].items():
        lines.append(f"| | | {path} | skipped: {why} | | | | | | |")
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


def _num(row: dict[str, Any], key: str, digits: int) -> str:
    value = row.get(key)
    return "" if value is None else f"{value:.{digits}f}"
