"""What the whole-model side-by-side benchmarks share (bench/encoder_bench.py, bench/seq2seq_bench.py):
running one path's worker file in a fresh process (under this python, or a peer environment's), the
statistics of a list of timings, the machine line every table starts with, the lines it ends with, and
writing the .md and .json.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from .generate import cpu_facts
from .jobs import BenchError
from .machine import machine_info, versions
from .worker import import_root


def spawn(python: str, worker: Path, mark: str, job: dict, timeout: float, threads: int) -> dict[str, Any]:
    """Run `python worker JOB_JSON` in a fresh process; the dict on its line starting with `mark`, or
    {"ok": False, "error": ...}. This python's workers import attnzoo from exactly this code."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false")
    if python == sys.executable:
        root = import_root()
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    else:
        env.pop("PYTHONPATH", None)  # a peer environment imports nothing of ours
    try:
        proc = subprocess.run(
            [python, str(worker), json.dumps(job)], capture_output=True, text=True, timeout=timeout, env=env
        )
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"timed out after {timeout:.0f} s"}
    except OSError as e:
        return {"ok": False, "error": f"{python} could not start: {e}"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(mark):
            return json.loads(line[len(mark) :])
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1][:300]
    return {"ok": False, "error": f"worker exited {proc.returncode}: {tail}"}


def stats(seconds: list[float]) -> dict[str, float]:
    """Median and spread (the quartiles, min and max) of a list of timings, in seconds."""
    if not seconds:
        raise BenchError("no timings to summarize")
    s = sorted(seconds)
    q = statistics.quantiles(s, n=4, method="inclusive") if len(s) > 1 else [s[0]] * 3
    return {"median": statistics.median(s), "q1": q[0], "q3": q[2], "min": s[0], "max": s[-1], "n": len(s)}


def machine() -> dict[str, Any]:
    """machine_info, AVX-512 or not, the load average (1, 5, 15 min) and the versions of this environment."""
    return {"machine": {**machine_info(), **cpu_facts()}, "versions": versions()}


def machine_line(report: dict[str, Any]) -> str:
    m = report["machine"]
    load = ", ".join(f"{x:.2f}" for x in m["load_avg"])
    end = ", ".join(f"{x:.2f}" for x in report.get("load_avg_end", ()))
    return (
        f"CPU: {m.get('cpu')} ({'AVX-512' if m.get('avx512') else 'no AVX-512'}), {m.get('usable_cpus')} usable cores, "
        f"{report['threads']} threads per path; load average {load} (1, 5, 15 min) when the run began"
        + (f", {end} when it ended" if end else "")
    )


def facts_line(facts: dict[str, Any]) -> str:
    """A path's facts (build seconds, lowering, versions) as one line: floats to 0.1."""
    return ", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in facts.items())


def footer(report: dict[str, Any], command: str, environment: str = "") -> list[str]:
    """The lines every side-by-side table ends with: each path's facts, this environment's versions (after
    `environment`, e.g. "this environment: "), and the command that wrote the table."""
    lines = ["", "Paths:", *(f"- {key}: " + facts_line(f) for key, f in report["paths"].items())]
    v = report["versions"]
    return [
        *lines,
        f"- {environment}torch {v.get('torch')}, onnxruntime {v.get('onnxruntime')}, onnx {v.get('onnx')}",
        "",
        f"Command (writes this file and the JSON beside it): `{command}`",
    ]


def write(report: dict[str, Any], table: str, out: str | os.PathLike) -> tuple[Path, Path]:
    """OUT.md (the table) and OUT.json (the report), each written atomically; OUT without a suffix."""
    from zoo.files import write_atomic

    base = Path(out)
    written = []
    for suffix, text in ((".md", table + "\n"), (".json", json.dumps(report, indent=1) + "\n")):
        written.append(write_atomic(base.with_name(base.name + suffix), lambda tmp, text=text: tmp.write_text(text)))
    return written[0], written[1]
