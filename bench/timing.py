"""Timing and memory inside a worker: timed calls with the CPU other processes took meanwhile,
and the peak memory the calls add (VmHWM on Linux; torch's or cudaMemGetInfo on CUDA)."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .jobs import CONTENDED, MB, Budget, Job


def _nothing() -> None:
    return None


def repeat_timed(
    call: Callable[[], Any],
    repeats: int,
    *,
    sync: Callable[[], None] = _nothing,
    after_each: Callable[[], None] = _nothing,
    min_repeats: int = 0,
    seconds: float | None = None,
) -> list[float]:
    """The one timing loop (bench workers, `attnzoo run`, `attnzoo ablate`): seconds of each of up
    to `repeats` calls, each ended by `sync()` (a device's queue; `sync()` also runs once before the
    first); `after_each()` runs between calls, untimed. With `seconds`, it stops early once
    `min_repeats` calls are done and the loop has run that long. No warm-up: the caller's."""
    times: list[float] = []
    sync()
    started = time.perf_counter()
    while len(times) < repeats:
        t0 = time.perf_counter()
        call()
        sync()
        times.append(time.perf_counter() - t0)
        after_each()
        if seconds is not None and len(times) >= min_repeats and time.perf_counter() - started > seconds:
            break
    return times


def time_calls(
    call: Callable[[], Any], sync: Callable[[], None], budget: Budget, after_each: Callable[[], None] = _nothing
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
    cpu_before = _cpu_ticks()
    started = time.perf_counter()
    times = repeat_timed(
        call, budget.repeats, sync=sync, after_each=after_each, min_repeats=budget.min_repeats, seconds=budget.seconds
    )
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


def contended(result: dict[str, Any]) -> bool:
    return (result.get("others_cpus") or 0.0) > CONTENDED


def torch_setup(job: Job):
    """(torch, device, dtype, sync) with the job's threads; inference mode is on."""
    import torch

    torch.set_num_threads(job.threads)
    torch.manual_seed(0)
    torch.set_grad_enabled(False)
    device = torch.device(job.provider)
    dtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[job.dtype]
    sync = torch.cuda.synchronize if job.provider == "cuda" else (lambda: None)
    return torch, device, dtype, sync
