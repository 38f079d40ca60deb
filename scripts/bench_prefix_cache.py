"""Time to first token on a multi-turn chat workload, with and without the prefix cache (docs/serving.md,
"Prefix caching"; table and JSON in docs/bench/prefix-cache.{md,json}).

The workload: C conversations at once, each TURNS turns; every turn's prompt is a shared 512-token system prompt,
then the conversation's history (its user messages of 24 tokens, the model's own answers of 32 tokens), then the
new user message: the next turn's prompt starts with the whole of this one's, as a chat client sends it. Token ids
directly (the byte tokenizer would give the same ids), greedy, fixed max_tokens. Each configuration runs in a
process of its own, on the continuous batcher in-process (no HTTP, no Ray: the prefill is what the cache saves).

    PYTHONPATH=. python scripts/bench_prefix_cache.py                  # export, run every configuration, write
    PYTHONPATH=. python scripts/bench_prefix_cache.py --one PATH MB C  # one configuration: JSON on stdout
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
CHECKPOINT = REPO / "models" / "tiny-stdlib-llama"
SYSTEM, USER, ANSWER, TURNS = 512, 24, 32, 4
CAPACITY, ROWS, THREADS = 1024, 4, 2


def one(path: str, mb: float, conversations: int) -> dict:
    from runtime.session import OnnxSession
    from serve.generate.continuous import continuous_batcher
    from serve.generate.prefix import PrefixCache
    from serve.generate.protocol import GenItem

    sess = OnnxSession(path, provider="cpu", threads=THREADS, verbose=False)
    cache = PrefixCache(int(mb * 2**20)) if mb else None
    batcher = continuous_batcher(sess, ROWS, CAPACITY, prefix=cache)
    rng = np.random.default_rng(0)
    system = rng.integers(0, 256, SYSTEM).tolist()
    ttft, prompt_tokens, cached = [], [], []

    async def chat(c: int):
        own = np.random.default_rng(100 + c)
        history = list(system)
        for _turn in range(TURNS):
            history += own.integers(0, 256, USER).tolist()
            item = GenItem(ids=np.asarray([history], np.int64), max_new_tokens=ANSWER)
            tokens, timing = await batcher.submit(item)
            ttft.append(timing["x-attnzoo-ttft-ms"])
            prompt_tokens.append(len(history))
            cached.append(timing["x-attnzoo-cached-tokens"])
            history = tokens[0].tolist()  # the prompt and the model's answer: the next turn's history

    async def main():
        await asyncio.gather(*(chat(c) for c in range(conversations)))

    asyncio.run(chat(99))  # warm-up: one conversation of its own (its system prompt is the shared one)
    for kept in (ttft, prompt_tokens, cached):
        kept.clear()
    if cache is not None:  # measured from an empty cache: the first turn of each conversation pays its prefill
        cache.blocks.clear()
        cache.bytes = cache.queries = cache.hits = 0
    started = time.perf_counter()
    asyncio.run(main())
    wall = time.perf_counter() - started
    t = np.asarray(ttft)
    return {
        "padding": sess.metadata.get("attnzoo.padding"),
        "prefix_cache_mb": mb,
        "conversations": conversations,
        "requests": len(t),
        "ttft_mean_ms": float(t.mean()),
        "ttft_p50_ms": float(np.percentile(t, 50)),
        "ttft_p90_ms": float(np.percentile(t, 90)),
        "prompt_tokens": int(sum(prompt_tokens)),
        "cached_tokens": int(sum(cached)),
        "wall_s": wall,
        "cache": cache.stats() if cache is not None else None,
    }


def cpu() -> dict:
    name = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    flags = next((ln for ln in open("/proc/cpuinfo") if ln.startswith("flags")), "")
    return {"cpu": name, "avx512f": " avx512f" in flags, "cores": os.cpu_count(), "load": os.getloadavg()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--one", nargs=3, metavar=("PATH", "MB", "C"))
    ap.add_argument("--out", default=str(REPO / "docs" / "bench" / "prefix-cache"))
    ap.add_argument("--work", default="/tmp/attnzoo-prefix-bench")
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], float(args.one[1]), int(args.one[2]))))
        return 0
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    paths = {}
    for padding in ("left", "packed"):
        paths[padding] = work / f"tiny-{padding}.onnx"
        if not paths[padding].is_file():
            cmd = [sys.executable, "-m", "cli", "export", "--checkpoint", str(CHECKPOINT), "--whole"]
            cmd += ["--padding", padding, "--max-len", str(CAPACITY), "-o", str(paths[padding])]
            subprocess.run(cmd, check=True, env=env, cwd=REPO)
    before = cpu()
    rows = []
    for conversations in (1, 4):
        for padding in ("left", "packed"):
            for mb in (0.0, 256.0):
                cmd = [sys.executable, __file__, "--one", str(paths[padding]), str(mb), str(conversations)]
                out = subprocess.run(cmd, check=True, env=env, capture_output=True, text=True).stdout
                rows.append(json.loads(out.strip().splitlines()[-1]))
                print(json.dumps(rows[-1]), flush=True)
    host = {**before, "load_after": os.getloadavg(), "python": platform.python_version()}
    doc = {"host": host, "workload": {"system": SYSTEM, "user": USER, "answer": ANSWER, "turns": TURNS,
           "rows": ROWS, "capacity": CAPACITY, "threads": THREADS, "model": "models/tiny-stdlib-llama"},
           "rows": rows, "command": "PYTHONPATH=. python scripts/bench_prefix_cache.py"}  # fmt: skip
    Path(args.out + ".json").write_text(json.dumps(doc, indent=1) + "\n")
    Path(args.out + ".md").write_text(table(doc))
    print(json.dumps(host))
    return 0


def table(doc: dict) -> str:
    """The markdown page of a run's JSON."""
    host, w = doc["host"], doc["workload"]
    lines = [
        "# Prefix caching: time to first token on a multi-turn chat",
        "",
        "Back to [serving](../serving.md#whole-models-prefix-caching).",
        "",
        f"`{doc['command']}` (made the table and [prefix-cache.json](prefix-cache.json)). CPU: {host['cpu']} "
        f"({host['cores']} cores, avx512f {'yes' if host['avx512f'] else 'no'}), a host shared with other jobs: "
        f"load average {host['load'][0]:.1f} before, {host['load_after'][0]:.1f} after (figures are noisy).",
        "",
        f"Model: {w['model']} (4 layers, hidden 256, the byte tokenizer), exported whole in fp32 (`attnzoo export "
        f"--checkpoint models/tiny-stdlib-llama --whole --padding left|packed`); the continuous batcher in-process "
        f"(no HTTP, no Ray), {w['rows']} rows, capacity {w['capacity']}, {w['threads']} ONNX Runtime threads. "
        f"Workload: C conversations at once, {w['turns']} turns each; a turn's prompt is a shared {w['system']}-token "
        f"system prompt, the history (user messages of {w['user']} tokens, the model's answers of {w['answer']}) "
        f"and the new message; greedy, {w['answer']} new tokens. The cache starts empty after a warm-up "
        "conversation: a conversation's first turn finds the system prompt only where a request before it in the "
        "run prefilled it (four first turns at once all prefill it).",
        "",
        "| C | padding | prefix cache | TTFT mean | p50 | p90 | prompt tokens | from the cache | wall |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in doc["rows"]:
        cache = f"{r['prefix_cache_mb']:g} MB" if r["prefix_cache_mb"] else "off"
        lines.append(
            f"| {r['conversations']} | {r['padding']} | {cache} | {r['ttft_mean_ms']:.0f} ms "
            f"| {r['ttft_p50_ms']:.0f} ms | {r['ttft_p90_ms']:.0f} ms | {r['prompt_tokens']} | {r['cached_tokens']} "
            f"| {r['wall_s']:.1f} s |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
