"""How much memory this machine has, and refusing requests that cannot fit in it.

A request past the machine (d_model = 10^9, or b = t = 10^5) would otherwise fail deep in
an allocator with a traceback, or be killed by the OS. Estimates come from zoo.accounting.
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import CacheFullError, ResourceError


def machine_memory_bytes() -> int | None:
    """Physical memory, or the cgroup's limit when that is smaller; None when unknown."""
    total = None
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        try:
            kb = int(Path("/proc/meminfo").read_text().split("MemTotal:")[1].split()[0])
            total = kb * 1024
        except (OSError, IndexError, ValueError):
            pass
    for f in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(f).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and (total is None or int(text) < total):
            total = int(text)
    return total


def _human(n: float) -> str:
    for div, unit in ((1e18, "EB"), (1e15, "PB"), (1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if n >= div:
            return f"{n / div:.3g} {unit}"
    return f"{n:.0f} B"


def check_fits(need: int, what: str, *, limit: int | None = None) -> None:
    """Raise ResourceError when `need` bytes exceed the machine's memory (or `limit`)."""
    limit = machine_memory_bytes() if limit is None else limit
    if limit is not None and need > limit:
        raise ResourceError(
            f"{what} needs about {_human(need)} ({need:,} bytes) of memory; this machine has {_human(limit)}: "
            f"ask for a smaller size"
        )


def check_room(capacity: int, length: int, new: int, *, fix: str) -> None:
    """The one capacity rule of a static cache, eager, ONNX Runtime and served alike: `length`
    written positions and `new` ones must fit in `capacity` (max_len); CacheFullError otherwise,
    naming the numbers and `fix`, before anything is written."""
    if length + new > capacity:
        raise CacheFullError(
            f"a static cache of max_len={capacity} positions cannot take {length} written + {new} new = "
            f"{length + new}: {fix}"
        )


__all__ = ["check_fits", "check_room", "machine_memory_bytes"]
