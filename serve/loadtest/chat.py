"""A load test of OpenAI's chat endpoint (POST /v1/chat/completions, streamed) on an `attnzoo serve` whole model:
per concurrency level, tokens/s (every request's completion tokens over the level's wall time) and the time to
first token (until the first chunk with text), with latency and errors. Standard library only (http.client and
threads), so it loads any OpenAI-compatible server.

    report = chat_loadtest("http://127.0.0.1:8000/", concurrency=[1, 8], requests=32, max_tokens=32)
    print(format_chat_report(report))
"""

from __future__ import annotations

import http.client
import json
import random
import threading
import time
from typing import Any

from zoo import AttnzooError

from ..client import parse_url
from .report import percentile

ROUTE = "/v1/chat/completions"
WORDS = "the a code model token batch cache server stream prompt reply test line value name list".split()


class ChatLoadError(AttnzooError, RuntimeError):
    """The server did not answer as an OpenAI chat server (no model listed, not reachable)."""


def _connection(url: str, timeout: float):
    host, port, prefix = parse_url(url)
    return http.client.HTTPConnection(host, port, timeout=timeout), prefix.rstrip("/")


def _headers(api_key: str | None) -> dict[str, str]:
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


def served_model(url: str, api_key: str | None = None, timeout: float = 30.0) -> str:
    """The first model id of GET /v1/models."""
    conn, prefix = _connection(url, timeout)
    try:
        conn.request("GET", prefix + "/v1/models", headers=_headers(api_key))
        reply = conn.getresponse()
        body = reply.read()
    except OSError as e:
        raise ChatLoadError(f"{url}: {e}") from None
    finally:
        conn.close()
    if reply.status != 200:
        raise ChatLoadError(f"GET /v1/models answered {reply.status}: {body.decode(errors='replace')[:200]}")
    return json.loads(body)["data"][0]["id"]


def one_chat(url: str, body: bytes, api_key: str | None, timeout: float) -> dict[str, Any]:
    """One streamed chat request: {"ok", "ttft_s", "latency_s", "tokens", "status", "error"}."""
    started = time.perf_counter()
    out: dict[str, Any] = {"ok": False, "ttft_s": None, "latency_s": None, "tokens": 0, "status": None, "error": None}
    conn, prefix = _connection(url, timeout)
    try:
        conn.request("POST", prefix + ROUTE, body, _headers(api_key))
        reply = conn.getresponse()
        out["status"] = reply.status
        if reply.status != 200:
            out["error"] = reply.read().decode(errors="replace")[:200]
            return out
        for raw in reply:
            line = raw.strip()
            if not line.startswith(b"data: "):
                continue
            data = line[6:]
            if data == b"[DONE]":
                out["ok"] = True
                break
            doc = json.loads(data)
            if "error" in doc:
                out["error"] = doc["error"].get("message")
                break
            text = any(c.get("delta", {}).get("content") for c in doc.get("choices", []))
            if out["ttft_s"] is None and text:
                out["ttft_s"] = time.perf_counter() - started
            if doc.get("usage"):
                out["tokens"] = doc["usage"]["completion_tokens"]
    except OSError as e:
        out["error"] = f"{type(e).__name__}: {e}"
    finally:
        conn.close()
        out["latency_s"] = time.perf_counter() - started
    return out


def chat_level(
    url: str, model: str, *, concurrency: int, requests: int, max_tokens: int, api_key=None, seed=0, timeout=120.0
) -> dict[str, Any]:
    """`requests` streamed chat requests from `concurrency` threads; the level's numbers."""
    rng = random.Random(seed)
    bodies = []
    for _ in range(requests):
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 24)))
        doc = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens}
        doc.update(temperature=0, stream=True, stream_options={"include_usage": True})
        bodies.append(json.dumps(doc).encode())
    results: list[dict[str, Any] | None] = [None] * requests
    next_index = iter(range(requests))
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                i = next(next_index, None)
            if i is None:
                return
            results[i] = one_chat(url, bodies[i], api_key, timeout)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t0
    done = [r for r in results if r is not None]
    good = [r for r in done if r["ok"]]
    ttft = sorted(r["ttft_s"] for r in good if r["ttft_s"] is not None)
    latency = sorted(r["latency_s"] for r in good)
    tokens = sum(r["tokens"] for r in good)

    def ms(values, q):
        v = percentile(values, q)
        return None if v is None else round(v * 1e3, 1)

    return {
        "concurrency": concurrency,
        "requests": requests,
        "ok": len(good),
        "errors": len(done) - len(good),
        "first_error": next((r["error"] for r in done if not r["ok"]), None),
        "completion_tokens": tokens,
        "wall_s": round(wall, 3),
        "tokens_per_s": round(tokens / wall, 1) if wall > 0 else None,
        "ttft_p50_ms": ms(ttft, 50),
        "ttft_p95_ms": ms(ttft, 95),
        "latency_p50_ms": ms(latency, 50),
        "latency_p95_ms": ms(latency, 95),
    }


def chat_loadtest(
    url: str,
    *,
    concurrency: list[int],
    requests: int,
    max_tokens: int = 32,
    api_key: str | None = None,
    warmup: int = 2,
    seed: int = 0,
    progress=None,
) -> dict[str, Any]:
    """Every concurrency level in turn, after `warmup` uncounted requests; the report (JSON-ready)."""
    model = served_model(url, api_key)
    if warmup:
        chat_level(url, model, concurrency=1, requests=warmup, max_tokens=max_tokens, api_key=api_key, seed=seed)
    levels = []
    for i, c in enumerate(concurrency):
        level = chat_level(
            url, model, concurrency=c, requests=requests, max_tokens=max_tokens, api_key=api_key, seed=seed + i + 1
        )
        levels.append(level)
        if progress is not None:
            progress(level)
    return {"mode": "chat", "url": url, "route": ROUTE, "model": model, "max_tokens": max_tokens, "levels": levels}


def format_chat_report(report: dict[str, Any]) -> str:
    head = f"POST {report['route']} on {report['url']} (model {report['model']}, streamed, "
    head += f"max_tokens {report['max_tokens']}, temperature 0)"
    rows = [head, "concurrency  requests  ok  errors  tokens/s  TTFT p50/p95 ms  latency p50/p95 ms"]
    for lv in report["levels"]:
        rows.append(
            f"{lv['concurrency']:>11}  {lv['requests']:>8}  {lv['ok']:>2}  {lv['errors']:>6}  {lv['tokens_per_s']!s:>8}"
            f"  {lv['ttft_p50_ms']!s:>7}/{lv['ttft_p95_ms']!s:<7}  {lv['latency_p50_ms']!s:>8}/{lv['latency_p95_ms']!s}"
        )
        if lv["first_error"]:
            rows.append(f"  first error: {lv['first_error']}")
    return "\n".join(rows)


__all__ = ["ChatLoadError", "chat_level", "chat_loadtest", "format_chat_report", "one_chat", "served_model"]
