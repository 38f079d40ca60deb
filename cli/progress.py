"""A long export's stages (export/progress.py) as a progress bar on a terminal (stderr a tty), nothing when
stderr is piped or with --quiet: `with export_bar(quiet): export_lm(...)`."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def export_bar(quiet: bool = False, stream=None) -> Iterator[None]:
    """A tqdm bar over the export's stages (trace, optimize, quantize, save) on `stream` (default stderr), named
    by the stage it is in; gone when the export ends. No bar when `quiet` or `stream` is not a terminal."""
    from export.progress import STAGES, reporting

    stream = sys.stderr if stream is None else stream
    if quiet or not stream.isatty():
        yield
        return
    from tqdm import tqdm

    bar = tqdm(total=len(STAGES), file=stream, leave=False, bar_format="{desc}: {bar} {n_fmt}/{total_fmt} {elapsed}")

    def listener(name: str) -> None:
        bar.set_description_str(f"export: {name}")
        bar.update(STAGES.index(name) - bar.n)  # stages done before this one (a lowering retried starts over)

    try:
        with reporting(listener):
            yield
        bar.update(len(STAGES) - bar.n)
    finally:
        bar.close()


__all__ = ["export_bar"]
