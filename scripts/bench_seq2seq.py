#!/usr/bin/env python3
"""Seq2seq greedy generation (or beam search: --num-beams K) side by side (bench/seq2seq_bench.py says what
and how); writes OUT.md and OUT.json:

    python scripts/bench_seq2seq.py --out docs/bench/seq2seq-t5-bart

`--smoke` (or ATTNZOO_BENCH_SMOKE=1): 1-layer d_model-32 models, 4 new tokens, one timed call: the
command end to end in seconds (the tests run it).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    from bench.seq2seq_bench import MODELS, SHAPE, SMOKE, benchmark_seq2seq, format_table
    from bench.side_by_side import write

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS), help="t5, bart or both (default both)")
    p.add_argument("--batch", default="1,8", help="batch sizes (default 1,8)")
    p.add_argument("--prompt", type=int, default=32, help="prompt tokens (default 32)")
    p.add_argument("--new", type=int, default=32, help="new tokens per row (default 32)")
    p.add_argument("--threads", type=int, default=2, help="intra-op threads of every path (default 2)")
    p.add_argument("--num-beams", type=int, default=1, help="beam search with K beams on both paths (default 1)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default="docs/bench/seq2seq-t5-bart", help="OUT.md and OUT.json are written")
    p.add_argument("--smoke", action="store_true", help="tiny models and one call: seconds, for the tests")
    args = p.parse_args(argv)
    smoke = args.smoke or os.environ.get("ATTNZOO_BENCH_SMOKE") == "1"
    report = benchmark_seq2seq(
        models=args.models.split(","),
        batches=[int(x) for x in args.batch.split(",")],
        prompt=8 if smoke else args.prompt,
        new=4 if smoke else args.new,
        threads=args.threads,
        warmup=0 if smoke else args.warmup,
        repeats=1 if smoke else args.repeats,
        shape=SMOKE if smoke else SHAPE,
        num_beams=args.num_beams,
    )
    command = "python scripts/bench_seq2seq.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    md, js = write(report, format_table(report, command.strip()), args.out)
    print(f"wrote {md} and {js}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
