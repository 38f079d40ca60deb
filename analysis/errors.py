"""The one error root of `analysis`: a user mistake (unknown name, bad tokens, bad head index)."""

from __future__ import annotations

import zoo

# Under the library's error root where the zoo has one, so the CLI prints it as one line.
_BASES: tuple[type[Exception], ...] = (zoo.AttnzooError, ValueError) if hasattr(zoo, "AttnzooError") else (ValueError,)


class AnalysisError(*_BASES):
    """Bad input to an analysis function: the message names the value and the fix."""
