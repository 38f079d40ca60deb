"""What the hook points cost the plain forward: this checkout's block against the block of a git
revision without them (default: main), same weights, same process, timed interleaved.

    python scripts/hook_overhead.py [--rev main] [--rounds 7] [--runs 50]

Prints, per size, the median of each round's median ms for both, and the ratio. No hook installed.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import zoo  # noqa: E402

SIZES = [("mha-causal", 1, 16), ("mha-causal", 8, 128), ("gpt2-small", 1, 64), ("gqa-decoder-4096", 1, 32)]


def old_class(rev: str):
    """MultiHeadAttention as `rev` wrote it, loaded inside the zoo package (its relative imports)."""
    src = subprocess.run(["git", "show", f"{rev}:zoo/attention.py"], cwd=ROOT, capture_output=True, text=True)
    if src.returncode:
        sys.exit(f"git show {rev}:zoo/attention.py failed: {src.stderr.strip()}")
    spec = importlib.util.spec_from_loader("zoo._attention_before_hooks", loader=None)
    mod = importlib.util.module_from_spec(spec)
    mod.__package__ = "zoo"
    exec(compile(src.stdout, f"{rev}:zoo/attention.py", "exec"), mod.__dict__)
    return mod.MultiHeadAttention


def median_ms(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", default="main")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--runs", type=int, default=50)
    args = ap.parse_args()
    Old = old_class(args.rev)
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, 1 thread; {args.rounds} rounds x {args.runs} runs, interleaved")
    print("| variant | b | t | before (ms) | after (ms) | after / before |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, b, t in SIZES:
        new = zoo.create(name).eval()
        old = Old(new.spec).eval()
        old.load_state_dict(new.state_dict())
        x = torch.randn(b, t, new.spec.d_model)
        with torch.no_grad():
            torch.testing.assert_close(old(x), new(x))
            before, after = [], []
            for _ in range(args.rounds):
                before.append(median_ms(lambda old=old, x=x: old(x), args.runs))
                after.append(median_ms(lambda new=new, x=x: new(x), args.runs))
        mb, ma = statistics.median(before), statistics.median(after)
        print(f"| {name} | {b} | {t} | {mb:.4f} | {ma:.4f} | {ma / mb:.3f} |")


if __name__ == "__main__":
    main()
