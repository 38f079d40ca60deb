"""torch's table of ONNX translations (torchlib), built once per process instead of once per export.

`torch.onnx.export(dynamo=True)` rebuilds its registry of torchlib functions on every call: 1.5 to 2
s of a core on the machines of docs/testing.md, a third of a small block's export. attnzoo exports
many small graphs in one process (the parity matrix, the benchmarks, the tests), and its exports add
no custom translations, so within `torchlib_once()` the registry of each opset is built on first use
and reused. The registry is only read during an export that adds no custom translations (torch's
compat layer registers into it only when given a `custom_translation_table`, which attnzoo never
passes), and the graphs are byte-identical with and without it (tests/export/test_export.py).

Outside the context torch's own method is back in place, so a user's own `torch.onnx.export` calls,
with their custom translations, never see the shared registry. Where torch's private layout differs
(another torch version), the context does nothing and each export builds its own registry as before.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

_LOCK = threading.RLock()
_BUILT: dict[object, object] = {}


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
        return _BUILT[key]

    with _LOCK:  # one of our exports at a time patches and restores the method
        owner.from_torchlib = classmethod(from_torchlib)
        try:
            yield
        finally:
            owner.from_torchlib = original
