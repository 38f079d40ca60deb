"""The stages of a long export, told to whoever listens: `reporting(listener)` around an export calls
`listener(stage)` as each begins, in this thread (a ContextVar: another thread's export is not told). Nobody
listening costs one lookup per stage. The command line draws them as a progress bar on a terminal (cli/progress.py).

    trace     torch's exporter on the configured model (it runs its own graph optimizer too)
    optimize  attnzoo's rewrites of the traced graph: hand-built layers spliced in, norms fused
    quantize  weight-only int8 / int4 (a pass through for fp32)
    save      the graph and its weights written beside it, checked, then published
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

STAGES = ("trace", "optimize", "quantize", "save")
_LISTENER: ContextVar[Callable[[str], None] | None] = ContextVar("export_progress", default=None)


def stage(name: str) -> None:
    """Tell the listener, if any, that stage `name` (one of STAGES) begins."""
    listener = _LISTENER.get()
    if listener is not None:
        listener(name)


@contextmanager
def reporting(listener: Callable[[str], None]) -> Iterator[None]:
    """`listener(stage)` for each stage an export in this block begins."""
    token = _LISTENER.set(listener)
    try:
        yield
    finally:
        _LISTENER.reset(token)


__all__ = ["STAGES", "reporting", "stage"]
