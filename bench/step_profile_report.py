"""The markdown of scripts/profile_step.py's report: one decode step of each path, then its ops side by side."""

from __future__ import annotations

from typing import Any

FUSED = ("GroupQueryAttention", "SkipSimplifiedLayerNormalization", "SimplifiedLayerNormalization", "RotaryEmbedding")


def _f(x: Any, spec: str = ".0f") -> str:
    return "" if x is None else format(x, spec)


def markdown(report: dict[str, Any]) -> str:
    rows = report["rows"]
    m = report["machine"]
    loads = {p: r.get("load_avg") for p, r in rows.items()}
    out = [
        f"# One decode step: prompt {report['prompt']}, {report['new']} new tokens, fp32, {report['threads']} threads",
        "",
        f"`{report['command']}`",
        "",
        f"{m.get('cpu')} ({'AVX-512' if m.get('avx512') else 'no AVX-512'}, L3 {m.get('l3', '?')}), "
        f"load average at the start {_f(m['load_avg'][0], '.2f')}; per worker (start, end): "
        + "; ".join(f"{p} {_f(a[0], '.2f')}, {_f(a[1], '.2f')}" for p, a in loads.items() if a)
        + ". Versions: "
        + ", ".join(f"{k} {v}" for k, v in report["versions"].items() if k in ("onnxruntime", "torch", "numpy"))
        + (f"; genai's onnxruntime {g}" if (g := rows.get("onnxruntime-genai", {}).get("onnxruntime")) else "")
        + ".",
        "",
        "| path | step ms (unprofiled) | end to end s | profiled: wall us | run us | host us | node sum us "
        "| nodes | MatMul / layer | floor ms (memory / working set) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    floor = report["floor"]
    floors = f"{floor['memory_ms']:.2f} / {floor['working_set_ms']:.2f}"
    for path, r in rows.items():
        if not r.get("ok"):
            out.append(f"| {path} | {r.get('error')} | | | | | | | | |")
            continue
        p = r["profile"]
        out.append(
            f"| {path} | {r['step_ms']:.3f} | {r['end_to_end_s']:.3f} | {_f(p['wall_us'])} | {_f(p['run_us'])} "
            f"| {_f(p['host_us'])} | {_f(p['nodes_us'])} | {_f(p['nodes'])} | {_f(p['matmuls_per_layer'], '.0f')} "
            f"| {floors} |"
        )
    az = rows.get("attnzoo", {})
    if az.get("ok"):
        out += [
            "",
            f"attnzoo without the profiler (each decode run timed from Python, medians): wall {az['wall_us']:.0f} us "
            f"a step, the session's run {az['run_us']:.0f} us, host {az['host_us']:.0f} us (the loop's Python and "
            "the binding's call between runs).",
        ]
    sb = report["step_bytes"]
    bw = report["bandwidth"]
    out += [
        "",
        f"Floor: a step reads {sb['weights'] / 1e6:.1f} MB of weights (all but the embedding table, one row of "
        f"it) and {sb['cache'] / 1e6:.2f} MB of cache (the mean past), {sb['total'] / 1e6:.1f} MB, at "
        f"{bw['memory_gbs']:.1f} GB/s (a 512 MiB read) or {bw['working_set_gbs']:.1f} GB/s (the working set read "
        f"again: part of it from L3), {report['threads']} threads.",
        "",
        "Per decode step, by op type (ONNX Runtime's node events; us and count a step, the mean over the profiled "
        "call's steps):",
        "",
    ]
    ok = [p for p, r in rows.items() if r.get("ok")]
    ops = sorted(
        {op for p in ok for op in rows[p]["profile"]["ops"]},
        key=lambda op: -max(rows[p]["profile"]["ops"].get(op, {}).get("us", 0) for p in ok),
    )
    out.append("| op | " + " | ".join(f"{p} us | {p} count" for p in ok) + " |")
    out.append("|---|" + "---:|---:|" * len(ok))
    for op in ops:
        cells = []
        for p in ok:
            o = rows[p]["profile"]["ops"].get(op)
            cells += [f"{o['us']:.0f}", f"{o['count']:.0f}"] if o else ["", ""]
        name = f"**{op}**" if op in FUSED else op
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    out += [
        "",
        "wall: one decode run's start to the next's (median); run: ONNX Runtime's model_run; host: wall less run "
        "(attnzoo's Python loop, genai's C++ generator); node sum: the kernels' own time. The profiler's own cost "
        "falls in run less node sum: compare the unprofiled step between paths, the split within one.",
        "",
    ]
    return "\n".join(out)


__all__ = ["markdown", "FUSED"]
