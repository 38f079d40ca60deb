"""What every command module shares: the one-line CLI error and the argument parsers.

export/cli.py builds the parser from the command modules (cli_onnx, cli_heads, cli_serve); they
import this module, never cli.py, so there is no import circle. Spec overrides (--set KEY=VALUE)
are parsed by zoo.parse_overrides, next to the spec they change.
"""

from __future__ import annotations

import argparse

import zoo


class CliError(zoo.AttnzooError, ValueError):
    """A user mistake on the command line: printed as one line, exit status 2."""


def _positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"{v} must be positive")
    return v


def _int_list(text: str) -> list[int]:
    values = [_positive(p) for p in text.replace(",", " ").split()]
    if not values:
        raise argparse.ArgumentTypeError(f"{text!r}: give positive integers, e.g. 1,16,512")
    return values
