"""Ctrl-C for the command line: one line on stderr and exit status 130, at any moment.

A Ctrl-C can arrive inside C code that swallows it: torch's extension module imports numpy
from C and clears whatever that import raises, a KeyboardInterrupt included, so startup went
on as if nothing had happened (`attnzoo audit '*'` then ran for a minute and exited 0). The
handler installed here also records the signal, and the CLI checks the record after its
imports, so a swallowed Ctrl-C still ends the command."""

from __future__ import annotations

import signal
import threading

_seen = threading.Event()


def _on_sigint(signum, frame):
    _seen.set()
    raise KeyboardInterrupt


def install():
    """Install the recording SIGINT handler; returns the one to restore (None off the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    _seen.clear()
    return signal.signal(signal.SIGINT, _on_sigint)


def restore(old) -> None:
    if old is not None:
        signal.signal(signal.SIGINT, old)


def seen() -> bool:
    """True once a SIGINT reached the process since `install` (even one a library swallowed)."""
    return _seen.is_set()
