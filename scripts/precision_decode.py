"""Per-token decode time at each weight precision, until `attnzoo bench --decode` has the axis:
python scripts/precision_decode.py [NAME] [--set k=v] [--past 128,1024] [--batch 1] [--rounds 7].

Exports the default decode lowering of NAME once per precision (fp32, int8, int4), then times
OnnxSession.generate_steps over 16 single-token steps from a random cache of `past` positions.
All sessions live in one process and are timed in alternating rounds (each round: the median
of 5 calls per precision), so a load change on the machine hits every precision alike; the
table gives the median over rounds and each precision's speed-up over fp32. Not a test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

import zoo  # noqa: E402
from export.lowering import export_onnx  # noqa: E402
from export.names import PRECISIONS  # noqa: E402
from export.session import OnnxSession  # noqa: E402

STEPS = 16


def measure(name: str, overrides: dict, pasts: list[int], batches: list[int], rounds: int) -> list[dict]:
    spec = zoo.spec(name, **overrides)
    rows = []
    with tempfile.TemporaryDirectory(prefix="attnzoo-precision-decode-") as tmp:
        sessions = {}
        for prec in PRECISIONS:
            r = export_onnx(name, Path(tmp) / f"{prec}.onnx", decode=True, precision=prec, **overrides)
            sessions[prec] = (OnnxSession(r.path, "cpu", verbose=False), r.lowering)
        rng = np.random.default_rng(0)
        for b in batches:
            for p in pasts:
                pk = rng.standard_normal((b, spec.kv_heads_, p, spec.d_k_), dtype=np.float32)
                pv = rng.standard_normal((b, spec.kv_heads_, p, spec.d_v_), dtype=np.float32)
                xs = rng.standard_normal((b, STEPS, spec.d_model), dtype=np.float32)
                times: dict[str, list[float]] = {prec: [] for prec in sessions}
                for sess, _ in sessions.values():
                    sess.generate_steps(xs, pk, pv)  # warm: arenas, thread pools
                for _ in range(rounds):
                    for prec, (sess, _) in sessions.items():
                        calls = []
                        for _ in range(5):
                            t0 = time.perf_counter()
                            sess.generate_steps(xs, pk, pv)
                            calls.append(time.perf_counter() - t0)
                        times[prec].append(1e3 * statistics.median(calls) / STEPS)
                base = statistics.median(times["fp32"])
                for prec, (_, lowering) in sessions.items():
                    med = statistics.median(times[prec])
                    rows.append(
                        {
                            "batch": b,
                            "past": p,
                            "precision": prec,
                            "lowering": lowering,
                            "ms_per_token": med,
                            "rounds_ms": [round(v, 3) for v in times[prec]],
                            "speedup_vs_fp32": base / med,
                        }
                    )
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("name", nargs="?", default="llama-3-8b")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--past", default="128,1024")
    p.add_argument("--batch", default="1")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--json")
    args = p.parse_args(argv)
    rows = measure(
        args.name,
        zoo.parse_overrides(args.set),
        [int(v) for v in args.past.split(",")],
        [int(v) for v in args.batch.split(",")],
        args.rounds,
    )
    print("| B | past | weights | lowering | ms/token (median of rounds) | x fp32 |")
    print("|---:|---:|---|---|---:|---:|")
    for r in rows:
        print(
            f"| {r['batch']} | {r['past']} | {r['precision']} | {r['lowering']} | {r['ms_per_token']:.2f} "
            f"| {r['speedup_vs_fp32']:.2f}x |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
