#!/usr/bin/env python3
"""Export a zoo entry to ONNX: the same as `attnzoo export ...`.

python scripts/export_onnx.py transformer-base -o transformer-base.onnx --lowering ort-mha
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout, installed or not

from cli.main import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["export", *sys.argv[1:]]))
