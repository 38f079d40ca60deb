#!/usr/bin/env python3
"""`python scripts/bench.py ...` is `attnzoo bench ...`; runs from a checkout without install."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cli.entry import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
