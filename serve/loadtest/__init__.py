"""A bounded load test of an `attnzoo serve` endpoint: throughput, latency, errors, faults.

Requests go to the URL given (tests and the README use 127.0.0.1 only), a fixed count per
concurrency level, then it stops. Well-formed requests draw from a pool of inputs whose
answers were computed beforehand with `OnnxSession.run` on each input alone (when the model
file is given), so every answer is checked without slowing the run. A fraction of malformed
requests is mixed in: each must get a 4xx. With `kill_after` one replica is killed with Ray's
own actor kill mid-run and the time until the deployment is whole again is measured.

The client retries a failed request once (a connection error or a 5xx), and says how often.

Split by job: the requests sent (`pool.py`), what was measured and the table
(`report.py`), and here the running, the replica killer and the whole run. Every name
stays importable from `serve.loadtest`.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from typing import Any

import numpy as np

from ..client import Client, decode_reply
from .pool import (
    BAD_KINDS,
    GEN_BAD_KINDS,
    LoadTestError,
    Pool,
    bad_body,
    build_gen_pool,
    build_pool,
    gen_bad_body,
)
from .report import Level, Sample, format_report, percentile

# Relative to the output scale, as the parity target says (fp32, CPU).
CHECK_RTOL = 1e-5


# -- running ---------------------------------------------------------------------------------


def run_level(
    url: str,
    pool: Pool,
    *,
    concurrency: int,
    requests: int,
    bad_fraction: float = 0.0,
    retries: int = 1,
    timeout: float = 60.0,
    seed: int = 0,
    kill_after: float | None = None,
    killer=None,
    max_seconds: float = 600.0,
) -> Level:
    """`requests` requests from `concurrency` threads, then stop (also after `max_seconds`)."""
    rng = random.Random(seed)
    n_bad = round(requests * bad_fraction)
    bad_at = set(rng.sample(range(requests), n_bad)) if n_bad else set()
    plan: list[str] = []
    k = 0
    kinds = list(pool.bad)
    for i in range(requests):
        if i in bad_at:
            plan.append(kinds[k % len(kinds)])
            k += 1
        else:
            plan.append("good")
    picks = [rng.randrange(len(pool.good)) for _ in range(requests)]
    samples: list[Sample | None] = [None] * requests
    next_index = iter(range(requests))
    lock = threading.Lock()
    t0 = time.perf_counter()
    deadline = t0 + max_seconds

    def worker() -> None:
        client = Client(url, retries=retries, timeout=timeout)
        try:
            while time.perf_counter() < deadline:
                with lock:
                    i = next(next_index, None)
                if i is None:
                    return
                samples[i] = _one(client, pool, plan[i], picks[i], i, t0)
        finally:
            client.close()

    kill_result: dict[str, Any] = {}
    kill_thread = None
    if kill_after is not None and killer is not None:
        kill_thread = threading.Thread(target=lambda: kill_result.update(killer(kill_after)), daemon=True)
        kill_thread.start()
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    seconds = time.perf_counter() - t0
    if kill_thread is not None:
        kill_thread.join(timeout=60)
    done = [s for s in samples if s is not None]
    return Level(concurrency, len(done), seconds, done, kill_result or None)


def _one(client: Client, pool: Pool, kind: str, pick: int, index: int, t0: float) -> Sample:
    if kind == "good":
        body, ctype, want = pool.good[pick]
    else:
        (body, ctype), want = pool.bad[kind], None
    before = client.retried
    started = time.perf_counter() - t0
    try:
        reply = client.request("POST", pool.route, body, {"Content-Type": ctype})
    except ConnectionError as e:
        return Sample(index, kind, 0, 0.0, retried=client.retried > before, started=started, error=str(e)[:200])
    s = Sample(
        index,
        kind,
        reply.status,
        reply.seconds,
        model_ms=reply.timing("model-ms"),
        queue_ms=reply.timing("queue-ms"),
        batch=int(reply.headers["x-attnzoo-batch"]) if "x-attnzoo-batch" in reply.headers else None,
        replica=reply.headers.get("x-attnzoo-replica"),
        retried=client.retried > before,
        started=started,
        new_tokens=int(reply.headers["x-attnzoo-new-tokens"]) if "x-attnzoo-new-tokens" in reply.headers else None,
    )
    if reply.ok and want is not None:
        try:
            if pool.exact:  # token ids: each answer equals the request's own run alone, bit for bit
                got = np.asarray(json.loads(reply.body)["tokens"], np.int64)
                s.correct = got.shape == want.shape and bool(np.array_equal(got, want))
                return s
            got = decode_reply(reply)
            got = got[0] if isinstance(got, tuple) else got
            scale = max(float(np.abs(want).max()), 1e-30)
            s.correct = got.shape == want.shape and float(np.abs(got - want).max()) <= CHECK_RTOL * scale
        except Exception as e:  # noqa: BLE001 - an undecodable answer is a wrong answer
            s.correct, s.error = False, f"{type(e).__name__}: {e}"[:200]
    elif not reply.ok:
        s.error = reply.body[:200].decode(errors="replace")
    return s


# -- killing a replica -----------------------------------------------------------------------


# How long the killer waits for the deployment to be whole again before it reports no recovery:
# a ceiling for a loaded machine, not a target (the measured time is in the report).
RECOVER_WITHIN_S = 180.0


def replica_killer(app: str = "attnzoo", address: str | None = "auto", recover_within: float = RECOVER_WITHIN_S):
    """A killer(after_s) for run_level: joins Ray, kills one of the app's replicas with
    `ray.kill(no_restart=True)` after `after_s` seconds, and times the Serve controller's
    recovery (as many RUNNING replicas as before)."""
    import ray

    from ..app import replica_states

    if not ray.is_initialized():
        try:
            ray.init(address=address, include_dashboard=False, log_to_driver=False)
        except Exception as e:  # noqa: BLE001 - ConnectionError and Ray's own types
            raise LoadTestError(f"cannot join the Ray cluster at {address!r} to kill a replica: {e}") from None
    before = replica_states(app).get("RUNNING", 0)
    if before < 2:
        raise LoadTestError(f"app {app!r} has {before} running replica(s); killing one needs at least 2 (--replicas 2)")

    def kill(after_s: float) -> dict[str, Any]:
        time.sleep(after_s)
        names = [
            a["name"]
            for a in ray.util.list_named_actors(all_namespaces=True)
            if a["name"].startswith("SERVE_REPLICA::") and f"{app}#" in a["name"]
        ]
        if not names:
            return {"error": f"no replica actor of app {app!r} found"}
        victim = sorted(names)[0]
        ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=True)
        killed = time.perf_counter()
        recovered = None
        seen_down = False
        while time.perf_counter() - killed < recover_within:
            states = replica_states(app)
            running = states.get("RUNNING", 0)
            seen_down = seen_down or running < before or len(states) > 1
            if seen_down and running >= before and len(states) == 1:
                recovered = time.perf_counter() - killed
                break
            time.sleep(0.2)
        return {
            "killed": victim,
            "after_s": after_s,
            "recovered_s": None if recovered is None else round(recovered, 2),
            "replicas": before,
        }

    return kill


# -- the whole run -----------------------------------------------------------------------------


def loadtest(
    url: str,
    *,
    concurrency: list[int],
    requests: int,
    seqs: list[int],
    batch: int = 1,
    binary: bool = True,
    bad_fraction: float = 0.0,
    model: str | os.PathLike | None = None,
    kill_after: float | None = None,
    ray_address: str | None = "auto",
    app: str = "attnzoo",
    retries: int = 1,
    warmup: int = 8,
    seed: int = 0,
    progress=None,
    new_tokens: int = 32,
) -> dict[str, Any]:
    """Every concurrency level in turn against `url`; the report as a JSON-ready dict.

    A server of a whole model (its metadata's kind is "lm") is loaded on POST /generate: prompts of
    `seqs` random ids asking `new_tokens` greedy tokens each, and the report adds tokens per second."""
    if not concurrency or any(c < 1 for c in concurrency):
        raise LoadTestError(f"concurrency={concurrency!r}: give positive integers, e.g. 1,16")
    if requests < 1:
        raise LoadTestError(f"requests={requests!r} must be positive")
    if not 0 <= bad_fraction < 1:
        raise LoadTestError(f"bad_fraction={bad_fraction!r} must be in [0, 1)")
    if retries < 0 or warmup < 0:
        raise LoadTestError(f"retries={retries!r} and warmup={warmup!r} must be >= 0")
    if not seqs or any(t < 1 for t in seqs):
        raise LoadTestError(f"seqs={seqs!r}: give positive lengths, e.g. 16,32,64,128")
    if isinstance(new_tokens, bool) or not isinstance(new_tokens, int) or new_tokens < 1:
        raise LoadTestError(f"new_tokens={new_tokens!r} must be a positive integer")
    client = Client(url, retries=retries)
    if not client.health():
        raise LoadTestError(f"no attnzoo server answers GET {url.rstrip('/')}/healthz; start one with `attnzoo serve`")
    meta = client.metadata()
    client.close()
    generating = meta.get("kind") == "lm"
    if generating:
        pool = build_gen_pool(meta, seqs=seqs, new_tokens=new_tokens, batch=batch, model=model, seed=seed)
    else:
        pool = build_pool(meta, seqs=seqs, batch=batch, binary=binary, model=model, seed=seed)
    killer = replica_killer(app, ray_address) if kill_after is not None else None
    if warmup:
        run_level(url, pool, concurrency=min(warmup, max(concurrency)), requests=warmup, retries=retries, seed=seed)
    levels = []
    for c in concurrency:
        level = run_level(
            url,
            pool,
            concurrency=c,
            requests=requests,
            bad_fraction=bad_fraction,
            retries=retries,
            seed=seed + c,
            kill_after=kill_after,
            killer=killer,
        )
        levels.append(level.summary())
        if progress:
            progress(levels[-1])
    report = {
        "url": url,
        "model": {k: meta.get(k) for k in ("name", "lowering", "dtype", "provider", "max_batch", "batch_wait_ms")},
        "mode": "generate" if generating else "predict",
        "format": "json" if generating or not binary else "npy",
        "seqs": seqs,
        "batch": batch,
        "new_tokens": new_tokens if generating else None,
        "bad_fraction": bad_fraction,
        "checked_against": str(model) if model else None,
        "retries": retries,
        "levels": levels,
    }
    if len(levels) > 1:
        first, last = levels[0], levels[-1]
        report["speedup"] = (
            round(last["throughput_rps"] / first["throughput_rps"], 2) if first["throughput_rps"] else None
        )
        if generating:
            report["tokens_speedup"] = (
                round(last["tokens_per_s"] / first["tokens_per_s"], 2) if first["tokens_per_s"] else None
            )
    return report


__all__ = [
    "BAD_KINDS",
    "CHECK_RTOL",
    "GEN_BAD_KINDS",
    "LoadTestError",
    "Level",
    "Pool",
    "Sample",
    "bad_body",
    "build_gen_pool",
    "build_pool",
    "gen_bad_body",
    "format_report",
    "loadtest",
    "percentile",
    "replica_killer",
    "run_level",
]
