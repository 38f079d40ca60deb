"""The `attnzoo` console script: the CLI's imports (torch, onnx) take seconds, so they run
under the same Ctrl-C rule as the commands: one line on stderr, exit status 130."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from . import interrupt


def main(argv: Sequence[str] | None = None) -> int:
    old = interrupt.install()
    try:
        try:
            import numpy  # noqa: F401  # before torch, whose C init would swallow a Ctrl-C here

            from .main import main as cli_main
        except KeyboardInterrupt:
            print("attnzoo: interrupted", file=sys.stderr)
            return 130
        return cli_main(argv)
    finally:
        interrupt.restore(old)


if __name__ == "__main__":
    sys.exit(main())
