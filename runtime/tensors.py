"""torch on the session side, without importing it: an export runs on onnxruntime and numpy alone.

A torch tensor can only exist once torch has been imported, so asking `sys.modules` is exact: a
process that never imported torch (a generation worker, a server of whole models) is given numpy
and never pays torch's import (about 200 MB of memory and a second of start-up). Callers who pass
torch tensors get torch tensors back, as before.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any


def loaded_torch() -> ModuleType | None:
    """torch if this process has imported it, else None."""
    return sys.modules.get("torch")


def is_tensor(x: Any) -> bool:
    """Whether x is a torch.Tensor (False, and nothing imported, when torch is not loaded)."""
    torch = loaded_torch()
    return torch is not None and isinstance(x, torch.Tensor)


def is_torch_dtype(x: Any) -> bool:
    torch = loaded_torch()
    return torch is not None and isinstance(x, torch.dtype)


def torch_dtype(np_type: type) -> Any:
    """The torch dtype of a numpy float32 / float16 / bool type (torch is loaded by then: a caller
    who asks holds torch tensors)."""
    import numpy as np
    import torch

    return {np.float32: torch.float32, np.float16: torch.float16, np.bool_: torch.bool}[np_type]


def from_numpy(a: Any) -> Any:
    """torch.from_numpy(a), for a caller that was given torch tensors (so torch is loaded)."""
    import torch

    return torch.from_numpy(a)


__all__ = ["from_numpy", "is_tensor", "is_torch_dtype", "loaded_torch", "torch_dtype"]
