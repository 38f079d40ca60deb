"""The `attnzoo` console script. The CLI's own imports run under the same Ctrl-C rule as the
commands (one line on stderr, exit status 130); torch, onnx and the rest wait until a command
runs, so `attnzoo --help` takes a fraction of a second (docs/testing.md)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from . import interrupt


def main(argv: Sequence[str] | None = None) -> int:
    old = interrupt.install()
    try:
        try:
            from .main import main as cli_main
        except KeyboardInterrupt:
            print("attnzoo: interrupted", file=sys.stderr)
            return 130
        return cli_main(argv)
    finally:
        interrupt.restore(old)


if __name__ == "__main__":
    sys.exit(main())
