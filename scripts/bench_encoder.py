#!/usr/bin/env python3
"""Sentence-encoder throughput side by side (bench/encoder_bench.py says what and how); writes OUT.md and
OUT.json:

    python scripts/bench_encoder.py --st-onnx-python /work/venvs/optimum/bin/python --out docs/bench/encoder-minilm

`--smoke` (or ATTNZOO_BENCH_SMOKE=1): a 1-layer hidden-32 model, T 8, one timed call: the command end to
end in seconds (the tests run it).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    from bench.encoder_bench import MINILM, PATHS, SMOKE, benchmark_encoder, format_table
    from bench.side_by_side import write

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", default="1,8", help="batch sizes (default 1,8)")
    p.add_argument("--seq", default="32,128", help="tokens per text, [CLS] and [SEP] included (default 32,128)")
    p.add_argument("--threads", type=int, default=2, help="intra-op threads of every path (default 2)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--paths", default=",".join(PATHS))
    p.add_argument("--st-onnx-python", help="the python of an environment with sentence-transformers[onnx]")
    p.add_argument("--out", default="docs/bench/encoder-minilm", help="OUT.md and OUT.json are written")
    p.add_argument("--smoke", action="store_true", help="a tiny model and one call: seconds, for the tests")
    args = p.parse_args(argv)
    smoke = args.smoke or os.environ.get("ATTNZOO_BENCH_SMOKE") == "1"
    report = benchmark_encoder(
        batches=[int(x) for x in args.batch.split(",")],
        lengths=[8] if smoke else [int(x) for x in args.seq.split(",")],
        threads=args.threads,
        warmup=0 if smoke else args.warmup,
        repeats=1 if smoke else args.repeats,
        shape=SMOKE if smoke else MINILM,
        st_onnx_python=args.st_onnx_python,
        paths=args.paths.split(","),
    )
    command = "python scripts/bench_encoder.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    md, js = write(report, format_table(report, command.strip()), args.out)
    print(f"wrote {md} and {js}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
