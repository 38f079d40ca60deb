"""Ctrl-C for the command line: one line on stderr and exit status 130, at any moment.

A Ctrl-C can arrive inside C code that swallows it: torch's extension module imports numpy
from C and clears whatever that import raises, a KeyboardInterrupt included, so startup went
on as if nothing had happened (`attnzoo audit '*'` then ran for a minute and exited 0). The
handler installed here also records the signal, and two things bring a swallowed one back:

- the CLI checks the record after building its parser;
- the commands import torch, onnx and the rest only when they run (so that `attnzoo --help`
  is quick), so a Ctrl-C that lands inside an import is also raised again at the next import
  (`_Resurface`, first on sys.meta_path while installed): torch alone imports hundreds more."""

from __future__ import annotations

import signal
import sys
import threading

_seen = threading.Event()
_in_import = threading.Event()  # the last Ctrl-C arrived inside an import, and was not raised again since


def _inside_import(frame) -> bool:
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _on_sigint(signum, frame):
    _seen.set()
    if _inside_import(frame):
        _in_import.set()
    raise KeyboardInterrupt


class _Resurface:
    """An import finder that finds nothing: at the first import after a Ctrl-C that arrived inside an
    import, it raises that Ctrl-C again (once; not while a KeyboardInterrupt is being handled)."""

    def find_spec(self, name, path=None, target=None):
        if _in_import.is_set() and not isinstance(sys.exc_info()[1], KeyboardInterrupt):
            _in_import.clear()
            raise KeyboardInterrupt
        return None


_FINDER = _Resurface()


def install():
    """Install the recording SIGINT handler; returns the one to restore (None off the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    _seen.clear()
    _in_import.clear()
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
    return signal.signal(signal.SIGINT, _on_sigint)


def restore(old) -> None:
    if old is not None:
        signal.signal(signal.SIGINT, old)
        if _FINDER in sys.meta_path:
            sys.meta_path.remove(_FINDER)
        _in_import.clear()


def seen() -> bool:
    """True once a SIGINT reached the process since `install` (even one a library swallowed)."""
    return _seen.is_set()


def handled() -> None:
    """A KeyboardInterrupt reached its handler: nothing left to raise again."""
    _in_import.clear()
