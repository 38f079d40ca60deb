"""A serving benchmark's client: streamed POST /v1/completions against any OpenAI-compatible server (attnzoo serve,
llama.cpp's llama-server), the requests' lengths drawn from a seeded synthetic distribution shaped like ShareGPT's,
sent at fixed concurrency (N clients, each sending its next request when its answer ends) or as Poisson arrivals
(exponential gaps at a rate, however many are under way). Standard library only (http.client and threads).

Per request: time to first token (TTFT: until the first chunk that carries text; an empty chunk sent on
acceptance, as attnzoo's first, does not count), the gaps between chunks with text (inter-token latency, ITL),
time per output token after the first (TPOT: (end - first) / (tokens - 1)), the end-to-end latency and the output
tokens (the answer's `usage` where the server sends it, else its chunks). Per level: those at p50, p90, p99,
requests/s and output tokens/s over the level's wall time, and errors.
The definitions are vLLM's benchmarks/benchmark_serving.py's.

    work = sharegpt_like(32, seed=0)
    level = run_level("http://127.0.0.1:8000/", "model", work, concurrency=4)
    print(format_table([level]))
"""

from __future__ import annotations

import http.client
import json
import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from zoo import AttnzooError

from ..client import parse_url

ROUTE = "/v1/completions"
# ShareGPT's conversations as serving benchmarks use them (vLLM's benchmark_serving.py, first turn of each): prompt
# and output lengths in tokens are both roughly log-normal, the prompt's median near 100-200 and its tail past
# 1,000, the output's median near 100-250. Here: log-normal with these (median, sigma), clipped.
PROMPT_MEDIAN, PROMPT_SIGMA = 128, 1.0
OUTPUT_MEDIAN, OUTPUT_SIGMA = 96, 0.7


class BenchClientError(AttnzooError, ValueError):
    """A level asked for wrongly (both or neither of concurrency and rate)."""


@dataclass(frozen=True)
class Ask:
    prompt: list[int]  # token ids (every OpenAI-compatible server here takes them, no tokenizer in between)
    max_tokens: int


def sharegpt_like(
    n: int,
    seed: int,
    *,
    max_prompt: int = 1024,
    max_output: int = 256,
    vocab: int = 256,
    scale: float = 1.0,
) -> list[Ask]:
    """`n` requests: prompt and output lengths log-normal around PROMPT_MEDIAN / OUTPUT_MEDIAN (times `scale`),
    clipped to 4..max_prompt and 4..max_output; prompt ids uniform in 0..vocab-1. The same seed, the same list."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        p = int(round(PROMPT_MEDIAN * scale * math.exp(rng.gauss(0, PROMPT_SIGMA))))
        o = int(round(OUTPUT_MEDIAN * scale * math.exp(rng.gauss(0, OUTPUT_SIGMA))))
        p, o = min(max(p, 4), max_prompt), min(max(o, 4), max_output)
        out.append(Ask([rng.randrange(vocab) for _ in range(p)], o))
    return out


@dataclass
class Result:
    ok: bool
    sent: float  # seconds since the level began
    ttft: float | None = None
    e2e: float | None = None
    itl: list[float] = field(default_factory=list)
    tokens: int = 0
    prompt_tokens: int = 0
    error: str = ""

    @property
    def tpot(self) -> float | None:
        if self.ttft is None or self.e2e is None or self.tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.tokens - 1)


def one_request(url: str, model: str, ask: Ask, extra: dict, timeout: float, t0: float) -> Result:
    """Send one streamed completion and time it (seconds from the level's start t0)."""
    host, port, prefix = parse_url(url)
    doc = {"model": model, "prompt": ask.prompt, "max_tokens": ask.max_tokens, "stream": True, "temperature": 0}
    doc["stream_options"] = {"include_usage": True}
    body = json.dumps({**doc, **extra}).encode()
    start = time.perf_counter()
    res = Result(ok=False, sent=start - t0, prompt_tokens=len(ask.prompt))
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    chunks, usage, last = 0, None, None
    try:
        conn.request("POST", prefix.rstrip("/") + ROUTE, body, {"Content-Type": "application/json"})
        reply = conn.getresponse()
        if reply.status != 200:
            res.error = f"HTTP {reply.status}: {reply.read()[:200].decode(errors='replace')}"
            return res
        while True:
            line = reply.readline()
            if not line:
                break
            if not line.startswith(b"data: "):
                continue
            data = line[6:].strip()
            if data == b"[DONE]":
                break
            doc = json.loads(data)
            if "error" in doc:
                res.error = str(doc["error"].get("message", doc["error"]))[:200]
                return res
            usage = doc.get("usage") or usage
            text = "".join(c.get("text") or "" for c in doc.get("choices") or [])
            if not text:  # a chunk without text carries no token to the reader (attnzoo's first, sent on
                continue  # acceptance; usage; a piece ending inside a UTF-8 character, joined to the next)
            now = time.perf_counter() - start
            if res.ttft is None:
                res.ttft = now
            elif last is not None:
                res.itl.append(now - last)
            last, chunks = now, chunks + 1
        res.e2e = time.perf_counter() - start
        res.tokens = int(usage["completion_tokens"]) if usage and usage.get("completion_tokens") else chunks
        res.ok = res.ttft is not None
        if not res.ok:
            res.error = "no token came"
    except (OSError, http.client.HTTPException, ValueError) as e:
        res.error = f"{type(e).__name__}: {e}"[:200]
    finally:
        conn.close()
    return res


def run_level(
    url: str,
    model: str,
    work: list[Ask],
    *,
    concurrency: int | None = None,
    rate: float | None = None,
    seed: int = 0,
    extra: dict | None = None,
    timeout: float = 600.0,
    sampler: Callable[[], Any] | None = None,
) -> dict[str, Any]:
    """Send every request of `work` at fixed `concurrency` or as Poisson arrivals at `rate` requests/s (seeded);
    `sampler`, when given, is called about every 0.2 s while the level runs (a server's memory) and its largest
    value reported as `peak`. Returns the level's summary (summarize)."""
    if (concurrency is None) == (rate is None):
        raise BenchClientError("give concurrency or rate, not both")
    results: list[Result] = []
    lock = threading.Lock()
    stop = threading.Event()
    peak: list[Any] = []

    def watch():
        while not stop.is_set():
            v = sampler()
            if v is not None and (not peak or v > peak[0]):
                peak[:] = [v]
            stop.wait(0.2)

    def send(ask: Ask):
        r = one_request(url, model, ask, extra or {}, timeout, t0)
        with lock:
            results.append(r)

    watcher = threading.Thread(target=watch, daemon=True) if sampler else None
    t0 = time.perf_counter()
    if watcher:
        watcher.start()
    threads: list[threading.Thread] = []
    if concurrency is not None:
        queue = list(work)

        def worker():
            while True:
                with lock:
                    if not queue:
                        return
                    ask = queue.pop(0)
                send(ask)

        threads = [threading.Thread(target=worker, daemon=True) for _ in range(min(concurrency, len(work)))]
        for t in threads:
            t.start()
    else:
        rng = random.Random(seed)
        due = 0.0
        for ask in work:
            due += rng.expovariate(rate)
            pause = t0 + due - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            t = threading.Thread(target=send, args=(ask,), daemon=True)
            t.start()
            threads.append(t)
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    stop.set()
    if watcher:
        watcher.join()
    out = summarize(results, seconds)
    out.update({"mode": "concurrency" if concurrency is not None else "rate", "value": concurrency or rate})
    out["peak_rss_mb"] = peak[0] if peak else None
    return out


def summarize(results: list[Result], seconds: float) -> dict[str, Any]:
    """A level's figures from its requests: p50/p90/p99 of TTFT, TPOT, ITL and end-to-end latency (ms),
    requests/s and output tokens/s over `seconds`, and the errors (the first three named)."""
    good = [r for r in results if r.ok]

    def pcts(values: list[float]) -> dict[str, float | None]:
        return {f"p{q}": nearest_rank(values, q) for q in (50, 90, 99)}

    return {
        "requests": len(results),
        "errors": len(results) - len(good),
        "error_examples": [r.error for r in results if not r.ok][:3],
        "seconds": round(seconds, 3),
        "requests_per_s": round(len(good) / seconds, 3) if seconds else None,
        "output_tokens_per_s": round(sum(r.tokens for r in good) / seconds, 2) if seconds else None,
        "output_tokens": sum(r.tokens for r in good),
        "prompt_tokens": sum(r.prompt_tokens for r in good),
        "ttft_ms": pcts([r.ttft for r in good if r.ttft is not None]),
        "tpot_ms": pcts([r.tpot for r in good if r.tpot is not None]),
        "itl_ms": pcts([g for r in good for g in r.itl]),
        "e2e_ms": pcts([r.e2e for r in good if r.e2e is not None]),
    }


def nearest_rank(values: list[float], q: float) -> float | None:
    """The q-th percentile (nearest rank) of `values` in seconds, as milliseconds to 0.01; None for none."""
    if not values:
        return None
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))
    return round(ordered[k] * 1000, 2)


def format_table(rows: list[dict[str, Any]]) -> str:
    """A markdown table, one row per (server, precision, level)."""
    head = (
        "| server | precision | load | req/s | out tok/s | TTFT p50/p90/p99 ms | TPOT p50/p90/p99 ms | "
        "ITL p50/p90/p99 ms | e2e p50/p99 ms | RSS idle / peak MB | errors |"
    )
    lines = [head, "|" + "---|" * 11]

    def trio(d: dict, keys=("p50", "p90", "p99")) -> str:
        return " / ".join("-" if d.get(k) is None else f"{d[k]:.1f}" for k in keys)

    for r in rows:
        load = f"c={r['value']}" if r["mode"] == "concurrency" else f"{r['value']:g} req/s"
        lines.append(
            f"| {r.get('server', '')} | {r.get('precision', '')} | {load} | {r['requests_per_s']} | "
            f"{r['output_tokens_per_s']} | {trio(r['ttft_ms'])} | {trio(r['tpot_ms'])} | {trio(r['itl_ms'])} | "
            f"{trio(r['e2e_ms'], ('p50', 'p99'))} | {r.get('idle_rss_mb') or '-'} / {r.get('peak_rss_mb') or '-'} | "
            f"{r['errors']} |"
        )
    return "\n".join(lines)


__all__ = [
    "Ask",
    "BenchClientError",
    "Result",
    "format_table",
    "nearest_rank",
    "one_request",
    "run_level",
    "sharegpt_like",
    "summarize",
]
