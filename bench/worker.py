"""Worker processes: each (path, shape) job runs in a fresh interpreter (`python -m bench
--worker JOB`) so its memory is its own; the roofline and ORT's per-call overhead likewise."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from .jobs import RESULT_MARK, BenchError, Job
from .timing import contended


def import_root() -> str:
    """The folder this process imports attnzoo's packages from (a checkout or site-packages):
    workers must run exactly this code, not another copy installed elsewhere."""
    roots = {str(Path(sys.modules[p].__file__).resolve().parent.parent) for p in ("zoo", __name__.split(".")[0])}
    if len(roots) != 1:
        raise BenchError(f"zoo and the benchmark are imported from different places: {sorted(roots)}")
    return roots.pop()


def worker_main(text: str) -> int:
    job = Job.from_json(text)
    try:
        from .measure import run_worker

        result = {"ok": True, "code_root": import_root(), **run_worker(job)}
    except Exception as e:  # noqa: BLE001 - any failure becomes a row's note, not a crash
        first = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
        result = {"ok": False, "error": f"{type(e).__name__}: {first}"}
    print(RESULT_MARK + json.dumps(result), flush=True)
    return 0


def measure(job: Job, timeout: float, retries: int) -> dict[str, Any]:
    """spawn(job), again up to `retries` times while other processes skew it; the least skewed."""
    best = spawn(job, timeout)
    for attempt in range(retries):
        if not (best.get("ok") and contended(best)):
            break
        again = spawn(job, timeout)
        if again.get("ok") and (again.get("others_cpus") or 0) < (best.get("others_cpus") or 0):
            best = again
        best["attempts"] = attempt + 2
    return best


def spawn(job: Job, timeout: float) -> dict[str, Any]:
    """Run `job` in a fresh interpreter (memory measured in isolation); its result dict."""
    root = import_root()
    env = dict(os.environ)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    cmd = [sys.executable, "-m", "bench", "--worker", job.to_json()]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=root)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"timed out after {timeout:.0f} s (raise --timeout)"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_MARK):
            result = json.loads(line[len(RESULT_MARK) :])
            if result.get("ok") and result.get("code_root") != root:
                return {"ok": False, "error": f"the worker ran the code in {result.get('code_root')}, not {root}"}
            return result
    if proc.returncode < 0:
        why = "killed (out of memory?)" if proc.returncode == -9 else f"died with signal {-proc.returncode}"
        return {"ok": False, "error": f"worker {why}"}
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1][:300]
    return {"ok": False, "error": f"worker exited {proc.returncode}: {tail}"}
