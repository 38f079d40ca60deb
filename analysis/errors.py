"""The one error root of `analysis`: a user mistake (unknown name, bad tokens, bad head index)."""

from __future__ import annotations

from zoo import AttnzooError


class AnalysisError(AttnzooError, ValueError):
    """Bad input to an analysis function: the message names the value and the fix. Under the library's
    error root, so the CLI prints it as one line; `except ValueError` catches it too."""
