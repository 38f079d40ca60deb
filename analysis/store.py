"""Shipped weights: `models/NAME.pt` (packaged as `zoo.presets`), torch's own format.

Each file is {"name", "kind", "config" (plain data), "state_dict", "log"}, read back with
torch.load(weights_only=True): no pickled code runs on load. The same training writes the same
bytes: the archive inside has a fixed name, and the log leaves out the run's timings.
"""

from __future__ import annotations

import importlib.resources
import io
from pathlib import Path
from typing import Any

import torch
from torch import nn

from zoo import files

from .dates import DatesConfig, DatesModel
from .errors import AnalysisError
from .lm import LMConfig, TinyLM
from .tasks import TASKS, get_task

# What a training run's log says about that run only (how long it took), not about the weights.
RUN_TIMINGS = ("wall_s", "cpu_s")
_REPO_MODELS = Path(__file__).resolve().parent.parent / "models"


def weight_dirs() -> list:
    """Where weights are looked for: the installed `zoo.presets` first (a wheel), then the
    checkout's models/ (a checkout or an editable install, where zoo.presets may not import).
    Entries are importlib.resources Traversables (a folder, or a folder inside a zip)."""
    dirs: list = []
    try:
        dirs.append(importlib.resources.files("zoo.presets"))
    except (ModuleNotFoundError, TypeError):
        pass
    dirs.append(_REPO_MODELS)
    return dirs


def weight_path(name: str):
    """The weight file of a known model name (a Path, or a Traversable inside an archive)."""
    get_task(name)  # unknown names: one clear line listing the known ones
    for d in weight_dirs():
        p = d.joinpath(f"{name}.pt")
        if p.is_file():
            return p
    raise AnalysisError(
        f"no weights for {name!r} in the installed zoo.presets or {_REPO_MODELS}; "
        f"train them with `python scripts/train_tiny.py {name}`"
    )


def save(model: nn.Module, name: str, path: str | Path, log: dict[str, Any] | None = None) -> Path:
    """Write model + config atomically (zoo.files: temp file + rename; a link there is replaced)."""
    path = Path(path)
    payload = {
        "name": name,
        "kind": model.kind,
        "config": model.config.to_dict(),
        "state_dict": {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()},
        "log": {k: v for k, v in (log or {}).items() if k not in RUN_TIMINGS},
    }
    # Serialised in memory: torch.save to a path names the archive after the (random) temp file.
    buf = io.BytesIO()
    torch.save(payload, buf)
    files.write_atomic(path, lambda tmp: tmp.write_bytes(buf.getvalue()))
    return path


def from_payload(payload: dict[str, Any]) -> nn.Module:
    kind = payload["kind"]
    if kind == "lm":
        model: nn.Module = TinyLM(LMConfig.from_dict(payload["config"]))
    elif kind == "seq2seq":
        model = DatesModel(DatesConfig.from_dict(payload["config"]))
    else:
        raise AnalysisError(f"unknown model kind {kind!r} in a weight file")
    model.load_state_dict(payload["state_dict"])
    model.eval()
    model.training_log = payload.get("log", {})
    model.name = payload.get("name")
    return model


def load(name: str, path: str | Path | None = None) -> nn.Module:
    """A trained model by name (`analysis.TASKS`), in eval mode, from the shipped weights."""
    p = Path(path) if path is not None else weight_path(name)
    payload = torch.load(io.BytesIO(p.read_bytes()), map_location="cpu", weights_only=True)
    return from_payload(payload)


__all__ = ["TASKS", "load", "save", "weight_path"]
