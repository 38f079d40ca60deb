"""Measure each transformers parity case's eager max error and write peers/measured.json.

    python scripts/measure_hf.py [-o peers/measured.json] [CASE ...]

For every case of tests/peers/test_hf.py (a tiny random model of the family, run with its own masks),
from_hf(module) is compared with the module's captured output in fp32: the max abs error per case,
with the class it converts. `attnzoo families` and the README show the largest per class;
tests/peers/test_hf.py re-measures each case and checks it agrees with this file.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# the cases and their capture live with the tests
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "peers")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--output", default=str(ROOT / "peers" / "measured.json"))
    ap.add_argument("cases", nargs="*", help="measure only these cases; the file's others are kept")
    args = ap.parse_args()

    import torch
    import transformers
    from test_hf import CASES, eager_error

    cases = {}
    if args.cases:
        unknown = sorted(set(args.cases) - set(CASES))
        if unknown:
            print(f"no such case: {', '.join(unknown)}", file=sys.stderr)
            return 2
        cases = json.loads(Path(args.output).read_text())["cases"]
    for name in args.cases or CASES:
        cls, err = eager_error(name)
        cases[name] = {"class": cls, "eager_max_abs_err": float(f"{err:.3g}")}
        print(f"{name:24s} {cls:28s} {err:.2e}")
    data = {
        "what": "eager max abs error of zoo.from_hf(module) against the module's output inside its own tiny "
        "random model, fp32, per parity case of tests/peers/test_hf.py (written by scripts/measure_hf.py)",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "cases": {name: cases[name] for name in CASES if name in cases},
    }
    Path(args.output).write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {args.output} ({len(cases)} cases)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
