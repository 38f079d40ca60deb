"""torch's dynamo exporter set up for many small exports: `fast_export()` around each of attnzoo's traces.

Two settings, both about time only (the graphs are byte-identical with and without them:
tests/export/test_export.py):

- **torch's table of ONNX translations (torchlib), built once per process instead of once per export.**
  `torch.onnx.export(dynamo=True)` rebuilds its registry of torchlib functions on every call: 1.5 to 2 s of
  a core on the machines of docs/testing.md, a third of a small block's export. attnzoo exports many small
  graphs in one process (the parity matrix, the benchmarks, the tests), so within `torchlib_once()` the
  registry of each opset is built on first use and reused.
  Each export gets its own copy of the built table (a dict of short lists: milliseconds), since torch's
  compat layer registers a `custom_translation_table`'s functions into the table it is given (attnzoo
  passes one for a whole model's spliced layers, export/splice.py): they stay with that export.
- **torch's fake-tensor cache off** (`fake_tensor_cache_off()`). Tracing with dynamic axes, each op's
  output is a fake tensor of symbolic sizes; torch caches them by op and inputs, and rebuilding an output
  from a cache entry redoes its symbolic arithmetic (in cProfile, a third of a block's export went to
  `_output_from_cache_entry`), so the cache costs more than it saves here. Off, a block's export took 3.3
  to 3.8 s where it took 5.5 to 5.6 s (torch 2.13, one thread, the mean over four presets' decomposed
  exports, two alternating runs each: `torch.export` 1.4 -> 0.7 s, the decompositions 3.8 -> 2.3-2.6 s).

Outside the context torch's own method and setting are back in place, so a user's own `torch.onnx.export`
calls, with their custom translations, and their own tracing never see either. Where torch's private
layout differs (another torch version), a setting it does not have is left alone: each export then does
what torch does by default.
"""

from __future__ import annotations

import contextlib
import copy
import threading
from collections.abc import Iterator

_LOCK = threading.RLock()
_BUILT: dict[object, object] = {}


@contextlib.contextmanager
def fast_export() -> Iterator[None]:
    """Both settings, for one of attnzoo's exports (one at a time in a process: they are process-wide)."""
    with _LOCK, torchlib_once(), fake_tensor_cache_off():
        yield


@contextlib.contextmanager
def fake_tensor_cache_off() -> Iterator[None]:
    """Within the block, torch traces without its fake-tensor cache (where this torch has the setting)."""
    try:
        from torch._dynamo import config
    except ImportError:
        yield
        return
    if not isinstance(getattr(config, "fake_tensor_cache_enabled", None), bool):
        yield
        return
    with _LOCK, config.patch(fake_tensor_cache_enabled=False):
        yield


def _own_copy(registry):
    """The export's own registry: the built one's table copied (a dict of short lists, fast to copy), so the
    translations an export registers (torch's compat layer adds a custom_translation_table's into the registry
    it is given) stay with that export."""
    functions = getattr(registry, "functions", None)
    if not isinstance(functions, dict):  # another torch's layout: share it, as before
        return registry
    own = copy.copy(registry)
    own.functions = {op: list(entries) for op, entries in functions.items()}
    return own


@contextlib.contextmanager
def torchlib_once() -> Iterator[None]:
    """Within the block, torch's exporter gets the registry of each opset built once per process."""
    try:
        from torch.onnx._internal.exporter import _registration

        owner = _registration.ONNXRegistry
        original = owner.__dict__["from_torchlib"]
        build = original.__func__
    except (ImportError, AttributeError, KeyError):
        yield
        return

    def from_torchlib(cls, *args, **kwargs):
        key = (cls, args, tuple(sorted(kwargs.items())))
        if key not in _BUILT:
            _BUILT[key] = build(cls, *args, **kwargs)
        return _own_copy(_BUILT[key])

    with _LOCK:  # one of our exports at a time patches and restores the method
        owner.from_torchlib = classmethod(from_torchlib)
        try:
            yield
        finally:
            owner.from_torchlib = original
