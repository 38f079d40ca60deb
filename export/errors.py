"""The export side's refusals; each derives from `zoo.AttnzooError` and keeps its builtin base."""

from __future__ import annotations

import zoo


class ExportError(zoo.AttnzooError, ValueError):
    """A request the chosen lowering cannot express, or an export that failed its checks."""

    detail: str = ""  # the underlying tool's full text, when it has more than one line (CLI: --verbose)
