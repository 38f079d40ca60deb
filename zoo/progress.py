"""Progress bars on stderr for long work (tqdm), one style for every command.

On a terminal the bar redraws in place. Where stderr is a file or a pipe (a log, CI), each redraw
would be another line, so the bar writes at most one line every LOGGED_INTERVAL_S seconds and its
last state when it closes.
"""

from __future__ import annotations

import sys

LOGGED_INTERVAL_S = 30.0


def bar(total: int, desc: str, *, unit: str = "it", disable: bool = False, leave: bool = True):
    """A tqdm bar of `total` steps on stderr (disabled: nothing is written)."""
    from tqdm import tqdm

    logged = not (hasattr(sys.stderr, "isatty") and sys.stderr.isatty())
    interval = {"mininterval": LOGGED_INTERVAL_S, "maxinterval": LOGGED_INTERVAL_S} if logged else {}
    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, disable=disable, leave=leave, **interval)


__all__ = ["LOGGED_INTERVAL_S", "bar"]
