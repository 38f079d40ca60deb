"""Progress bars on stderr for long work (tqdm), one style for every command.

On a terminal the bar redraws in place. Where stderr is a file or a pipe (a log, CI), each redraw
would be another line, so the bar writes a line at most every LOGGED_INTERVAL_S seconds (a new
postfix or description waits for the next one too) and, unless it is left off (`leave=False`), its
last state when it closes.
"""

from __future__ import annotations

import functools
import sys

LOGGED_INTERVAL_S = 30.0


@functools.cache
def _logged_bar() -> type:
    from tqdm import tqdm

    class LoggedBar(tqdm):
        """tqdm whose postfix and description changes wait for the next timed line."""

        def set_postfix_str(self, s: str = "", refresh: bool = False) -> None:
            super().set_postfix_str(s, refresh=refresh)

        def set_description(self, desc: str | None = None, refresh: bool = False) -> None:
            super().set_description(desc, refresh=refresh)

    return LoggedBar


def bar(total: int, desc: str, *, unit: str = "it", disable: bool = False, leave: bool = True):
    """A tqdm bar of `total` steps on stderr (disabled: nothing is written)."""
    from tqdm import tqdm

    if hasattr(sys.stderr, "isatty") and sys.stderr.isatty():
        return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, disable=disable, leave=leave)
    interval = LOGGED_INTERVAL_S
    return _logged_bar()(
        total=total,
        desc=desc,
        unit=unit,
        file=sys.stderr,
        disable=disable,
        leave=leave,
        mininterval=interval,
        maxinterval=interval,
    )


__all__ = ["LOGGED_INTERVAL_S", "bar"]
