"""Cross-check the serving benchmark's client (serve/loadtest/openai_bench.py) with an independent one, NVIDIA's
aiperf, against the same running server, one level back to back: fixed prompt and output lengths (aiperf's
--isl/--osl with no spread), fixed concurrency, streamed /v1/completions, the server's own token counts.

    python scripts/serve_crosscheck.py URL MODEL --aiperf /work/venvs/aiperf/bin/aiperf \\
        --tokenizer CHECKPOINT_DIR [--concurrency 4] [--requests 16] [--isl 128] [--osl 64] [--extra ignore_eos:true]

aiperf lives in a venv of its own (python3 -m venv /work/venvs/aiperf && /work/venvs/aiperf/bin/pip install
aiperf==0.13.0), never in attnzoo's. Its prompts are text through --tokenizer (the bench checkpoint's byte-level
tokenizer: one token per byte, as attnzoo's server reads them); ours are token ids of the same length. aiperf's
"inter_token_latency" is per request (end - first) / (tokens - 1): our TPOT. Prints both and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from serve.loadtest.openai_bench import Ask, run_level  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("url")
    ap.add_argument("model")
    ap.add_argument("--aiperf", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--isl", type=int, default=128)
    ap.add_argument("--osl", type=int, default=64)
    ap.add_argument("--extra", action="append", default=[], help="KEY:VALUE sent by both (e.g. ignore_eos:true)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    extra = {k: json.loads(v) for k, v in (e.split(":", 1) for e in args.extra)}

    asks = [Ask([65 + (i + j) % 26 for j in range(args.isl)], args.osl) for i in range(args.requests)]
    ours = run_level(args.url, args.model, asks, concurrency=args.concurrency, extra=extra)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            args.aiperf, "profile", "--model", args.model, "--url", args.url.rstrip("/"), "--endpoint-type",
            "completions", "--streaming", "--concurrency", str(args.concurrency), "--request-count",
            str(args.requests), "--isl", str(args.isl), "--isl-stddev", "0", "--osl", str(args.osl), "--osl-stddev",
            "0", "--tokenizer", args.tokenizer, "--random-seed", "0", "--ui-type", "none", "--output-artifact-dir",
            tmp, "--warmup-request-count", "1", "--use-server-token-count",
        ]  # fmt: skip
        for e in args.extra:
            cmd += ["--extra-inputs", e]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        found = list(Path(tmp).rglob("profile_export_aiperf.json"))
        if done.returncode or not found:
            print(done.stdout[-3000:], done.stderr[-3000:], file=sys.stderr)
            return 1
        theirs = json.loads(found[0].read_text())

    def ms(d, q):
        return round(d[q], 2) if d and d.get(q) is not None else None

    rows = [
        ("TTFT p50 ms", ours["ttft_ms"]["p50"], ms(theirs["time_to_first_token"], "p50")),
        ("TTFT p99 ms", ours["ttft_ms"]["p99"], ms(theirs["time_to_first_token"], "p99")),
        ("TPOT p50 ms", ours["tpot_ms"]["p50"], ms(theirs["inter_token_latency"], "p50")),
        ("TPOT p99 ms", ours["tpot_ms"]["p99"], ms(theirs["inter_token_latency"], "p99")),
        ("e2e p50 ms", ours["e2e_ms"]["p50"], ms(theirs["request_latency"], "p50")),
        ("output tok/s", ours["output_tokens_per_s"], round(theirs["output_token_throughput"]["avg"], 2)),
        ("requests/s", ours["requests_per_s"], round(theirs["request_throughput"]["avg"], 3)),
    ]
    print(
        f"| {args.url} c={args.concurrency}, {args.requests} requests, {args.isl} in / {args.osl} out | ours | aiperf |"
    )
    print("|---|---|---|")
    for name, a, b in rows:
        print(f"| {name} | {a} | {b} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"ours": ours, "aiperf": theirs, "rows": rows}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
