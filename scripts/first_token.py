"""Time to first token of `attnzoo generate` on the shipped checkpoint with its export cached: from the process's
start to the first generated character on stdout (--stream), each run a fresh process, trees alternated.

    python scripts/first_token.py [--runs 7] [--tree OTHER_CHECKOUT ...]

Each tree (this one, and any --tree: an older checkout to compare with) runs with its own ATTNZOO_CACHE under the
system temp folder, exported once before the timed runs. Prints min and median per tree and one JSON line.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
ARGV = ["-m", "cli", "generate", "models/tiny-stdlib-llama", "--prompt", "def main(", "--max-new-tokens", "8"]


def _env(tree: Path) -> dict:
    tag = hashlib.sha256(str(tree).encode()).hexdigest()[:12]  # the same folder in every run of the script
    cache = Path(tempfile.gettempdir()) / f"attnzoo-first-token-{tag}"
    return {**os.environ, "PYTHONPATH": str(tree), "ATTNZOO_CACHE": str(cache)}


def first_token(tree: Path) -> float:
    """Seconds from starting the process to the first character after the prompt's echo (`'...' -> `)."""
    started = time.perf_counter()
    p = subprocess.Popen(
        [sys.executable, *ARGV, "--stream"], cwd=tree, env=_env(tree), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    seen = b""
    while not seen.endswith(b"-> "):
        c = p.stdout.read(1)
        if not c:
            raise SystemExit(f"{tree}: the output ended before a token: {seen!r}")
        seen += c
    p.stdout.read(1)
    took = time.perf_counter() - started
    p.stdout.read()
    p.wait()
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--tree", action="append", default=[], help="another checkout to time beside this one")
    args = ap.parse_args()
    trees = [HERE, *(Path(t).resolve() for t in args.tree)]
    for tree in trees:  # the export, once, outside the timing
        subprocess.run([sys.executable, *ARGV, "--no-stream"], cwd=tree, env=_env(tree), check=False,
                       capture_output=True)  # fmt: skip
    times = {str(t): [] for t in trees}
    for _ in range(args.runs):
        for tree in trees:
            times[str(tree)].append(first_token(tree))
    load = os.getloadavg()[0]
    for tree, ts in times.items():
        print(f"{tree}: first token min {min(ts):.3f} s, median {statistics.median(ts):.3f} s ({len(ts)} runs)")
    print(f"1-min load average at the end: {load:.1f} on {os.cpu_count()} CPUs")
    doc = {t: {"min_s": min(ts), "median_s": statistics.median(ts), "runs": ts} for t, ts in times.items()}
    print(json.dumps({"first_token": doc, "load_average": load}))


if __name__ == "__main__":
    main()
