"""What sampling adds to a decode step, against greedy, on the benchmark's random LLaMA (the same model as
scripts/profile_generate.py: hidden 512, 8 layers, vocab 8000), in one process, the runs alternated.

    python scripts/sampling_cost.py [--prompt 128] [--new 64] [--rounds 6] [--threads 2]

Greedy takes the graph's argmax (next_token); sampling reads the step's logits (b 1 vocab, bound once) and
chooses in numpy (runtime/sampling.py: temperature 0.8, top_k 50, top_p 0.95, min_p 0.05, repetition penalty
1.1, seeded). Prints the median decode step of each, their ratio, and the numpy choice alone per step; one
JSON line at the end.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

SAMPLED = {"temperature": 0.8, "top_k": 50, "top_p": 0.95, "min_p": 0.05, "repetition_penalty": 1.1, "seed": 0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    import numpy as np
    from profile_generate import exported

    from export import OnnxSession
    from runtime.sampling import Sampler, resolve

    with tempfile.TemporaryDirectory() as tmp:
        sess = OnnxSession(exported("fp32", Path(tmp)), provider="cpu", threads=args.threads)
        ids = np.random.default_rng(0).integers(0, 8000, (1, args.prompt))
        steps = {"greedy": [], "sampled": []}
        for _ in range(args.rounds + 1):  # the first round warms up
            for name, kw in (("greedy", {}), ("sampled", SAMPLED)):
                t = {}
                sess.generate(ids, args.new, eos_token_id=[], timings=t, **kw)
                steps[name].append(t["decode_s"] / t["steps"])
    greedy, sampled = (statistics.median(v[1:]) for v in steps.values())
    sampler = Sampler(resolve(SAMPLED), ids, None, 8000)
    logits = np.random.default_rng(1).normal(size=(1, 8000)).astype(np.float32) * 3
    t0 = time.perf_counter()
    for _ in range(200):
        sampler.observe(sampler.choose(logits))
    choice = (time.perf_counter() - t0) / 200
    doc = {
        "prompt": args.prompt,
        "new": args.new,
        "threads": args.threads,
        "greedy_step_ms": 1e3 * greedy,
        "sampled_step_ms": 1e3 * sampled,
        "ratio": sampled / greedy,
        "choice_alone_ms": 1e3 * choice,
        "greedy_steps_ms": [round(1e3 * s, 3) for s in steps["greedy"][1:]],
        "sampled_steps_ms": [round(1e3 * s, 3) for s in steps["sampled"][1:]],
    }
    print(
        f"decode step, median of {args.rounds}: greedy {1e3 * greedy:.2f} ms, sampled {1e3 * sampled:.2f} ms "
        f"({100 * (sampled / greedy - 1):+.1f}%); the numpy choice alone {1e3 * choice:.3f} ms"
    )
    print(json.dumps(doc))


if __name__ == "__main__":
    main()
