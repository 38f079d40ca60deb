"""The report: a markdown table, JSON and a two-panel plot."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import zoo

from .jobs import CONTENDED
from .timing import contended

PLOT_FORMATS = ("png", "svg", "pdf")


def _fmt(v: float | None, spec: str, suffix: str = "") -> str:
    return "-" if v is None else f"{v:{spec}}{suffix}"


def format_table(report: dict[str, Any]) -> str:
    """The rows as a markdown table, then the roofline, ORT call overhead and notes."""
    cfg = report["config"]
    quantized = any(p != "fp32" for p in cfg.get("precisions", ["fp32"]))
    head = "| B | T | path | median ms | GFLOP/s | % roofline | +peak MB | speed-up vs SDPA | mem / SDPA |"
    head += " vs fp32 |" if quantized else ""
    lines = [
        f"{cfg['name']} ({zoo.AttentionSpec(**cfg['spec']).describe()}), {cfg['provider']}, {cfg['dtype']}, "
        f"{cfg['threads']} threads" + (f", weights {', '.join(cfg['precisions'])}" if quantized else ""),
        "",
        head,
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|" + ("---:|" if quantized else ""),
    ]
    notes: list[str] = []
    for r in report["rows"]:
        prec = r.get("precision", "fp32")
        name = r["path"] + (f" {prec}" if prec != "fp32" else "") + (" (auto)" if r["auto"] else "")
        extra = " |" if quantized else ""
        if r["status"] != "ok":
            if r["note"] not in notes:
                notes.append(r["note"])
            mark = f"{r['status']} [{notes.index(r['note']) + 1}]"
            lines.append(f"| {r['batch']} | {r['seq']} | {name} | {mark} | | | | | |{extra}")
            continue
        if r.get("note"):  # a quantized export that left some weights fp32 says so
            if r["note"] not in notes:
                notes.append(r["note"])
            name += f" [{notes.index(r['note']) + 1}]"
        if quantized:
            extra = f" {_fmt(r.get('speedup_vs_fp32'), '.2f', 'x')} |"
        pct = None if r.get("roofline_fraction") is None else 100 * r["roofline_fraction"]
        lines.append(
            f"| {r['batch']} | {r['seq']} | {name} "
            f"| {_fmt(r['median_ms'], '.3g' if r['median_ms'] < 1 else '.1f')}{'*' if contended(r) else ''} "
            f"| {_fmt(r['gflops'], '.1f')} | {_fmt(pct, '.0f', '%')} | {_fmt(r.get('peak_added_mb'), '.1f')} "
            f"| {_fmt(r.get('speedup_vs_sdpa'), '.2f', 'x')} | {_fmt(r.get('mem_vs_sdpa'), '.2f', 'x')} |{extra}"
        )
    lines.append("")
    if any(r["status"] == "ok" and contended(r) for r in report["rows"]):
        lines.append(f"* other processes used over {CONTENDED} CPUs during this measurement: the figure may be high")
    if quantized:
        lines.append(
            f"% roofline: of the {cfg['dtype']} MatMul roofline below, for the {cfg['dtype']} rows only; an int8 / "
            "int4 row runs integer kernels (MatMulNBits) whose peak is not measured here"
        )
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


def write_json(report: dict[str, Any], path: str | os.PathLike) -> None:
    from zoo.files import write_atomic

    # default=str: a value JSON has no type for (a path, a dtype) is written as its text
    write_atomic(Path(path), lambda tmp: tmp.write_text(json.dumps(report, indent=2, default=str) + "\n"))


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
            # the table's starred figures (other processes used CPUs meanwhile): a hollow red ring round the point
            busy = [(r["seq"], r["median_ms"]) for r in rows if r["path"] == p and r["batch"] == b and contended(r)]
            if busy:
                ax_t.scatter(*zip(*busy), s=160, facecolors="none", edgecolors="red", linewidths=1.5, zorder=5)
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
    if any(contended(r) for r in rows):
        ax_t.scatter([], [], s=160, facecolors="none", edgecolors="red", label="measured under load (* in the table)")
    ax_t.legend(fontsize=8)
    fig.suptitle(
        f"{cfg['name']}: {cfg['provider']}, {cfg['dtype']}, {cfg['threads']} threads "
        f"({report['machine'].get('cpu', '')})",
        fontsize=10,
    )
    fig.tight_layout()
    from zoo.files import write_atomic

    fmt = Path(path).suffix.lower().lstrip(".")
    write_atomic(Path(path), lambda tmp: fig.savefig(tmp, dpi=110, format=fmt if fmt in PLOT_FORMATS else "png"))
    plt.close(fig)
    return None
