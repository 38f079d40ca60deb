"""Machine facts every report carries: CPU, memory, versions, the default thread count."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

import zoo


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
