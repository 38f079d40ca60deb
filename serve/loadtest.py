"""A bounded load test of an `attnzoo serve` endpoint: throughput, latency, errors, faults.

Requests go to the URL given (tests and the README use 127.0.0.1 only), a fixed count per
concurrency level, then it stops. Well-formed requests draw from a pool of inputs whose
answers were computed beforehand with `OnnxSession.run` on each input alone (when the model
file is given), so every answer is checked without slowing the run. A fraction of malformed
requests is mixed in: each must get a 4xx. With `kill_after` one replica is killed with Ray's
own actor kill mid-run and the time until the deployment is whole again is measured.

The client retries a failed request once (a connection error or a 5xx), and says how often.
"""

from __future__ import annotations

import io
import json
import os
import random
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from zoo import AttnzooError

from .client import Client, decode_reply
from .protocol import JSON, NPY

BAD_KINDS = ("not-json", "wrong-width", "wrong-rank", "wrong-dtype", "too-large", "empty", "nan", "unknown-field")
# Relative to the output scale, as the parity target says (fp32, CPU).
CHECK_RTOL = 1e-5


class LoadTestError(AttnzooError, ValueError):
    """A load test that cannot run as asked (bad options, a server that is not there)."""


@dataclass
class Sample:
    index: int
    kind: str  # "good" or one of BAD_KINDS
    status: int  # 0: no answer at all
    seconds: float
    model_ms: float | None = None
    queue_ms: float | None = None
    batch: int | None = None
    replica: str | None = None
    correct: bool | None = None  # None: not checked (no model file, or not a 2xx)
    retried: bool = False
    started: float = 0.0  # seconds since the level began
    error: str = ""


@dataclass
class Level:
    """One concurrency level's results."""

    concurrency: int
    requests: int
    seconds: float
    samples: list[Sample] = field(repr=False, default_factory=list)
    kill: dict[str, Any] | None = None

    def summary(self) -> dict[str, Any]:
        good = [s for s in self.samples if s.kind == "good"]
        bad = [s for s in self.samples if s.kind != "good"]
        ok = [s for s in good if 200 <= s.status < 300]
        lat = sorted(s.seconds * 1e3 for s in ok)
        model = [s.model_ms for s in ok if s.model_ms is not None]
        queue = [s.queue_ms for s in ok if s.queue_ms is not None]
        mean_lat = statistics.fmean(lat) if lat else float("nan")
        mean_model = statistics.fmean(model) if model else float("nan")
        mean_queue = statistics.fmean(queue) if queue else float("nan")
        return {
            "concurrency": self.concurrency,
            "requests": self.requests,
            "seconds": round(self.seconds, 3),
            "throughput_rps": round(len(self.samples) / self.seconds, 2) if self.seconds else 0.0,
            "good": len(good),
            "good_ok": len(ok),
            "good_ok_fraction": round(len(ok) / len(good), 4) if good else None,
            "good_checked": sum(s.correct is not None for s in good),
            "good_wrong": sum(s.correct is False for s in good),
            "good_failed_status": _count(s.status for s in good if not 200 <= s.status < 300),
            "bad": len(bad),
            "bad_4xx": sum(400 <= s.status < 500 for s in bad),
            "bad_statuses": _count(s.status for s in bad),
            "5xx": sum(s.status >= 500 for s in self.samples),
            "no_answer": sum(s.status == 0 for s in self.samples),
            "retried": sum(s.retried for s in self.samples),
            "latency_ms": {
                "p50": _pct(lat, 50),
                "p95": _pct(lat, 95),
                "p99": _pct(lat, 99),
                "mean": round(mean_lat, 3),
                "max": round(lat[-1], 3) if lat else None,
            },
            # Where a request's time goes (means over answered good requests): the ORT run of its
            # batch, the batch queue (forming, and behind the batch running), and the rest (HTTP,
            # Ray's proxy and routing, body (de)coding, the client's own threads).
            "time_split_ms": {
                "model": round(mean_model, 3),
                "batch_wait": round(mean_queue, 3),
                "engine": round(mean_lat - mean_model - mean_queue, 3),
            },
            "mean_batch_rows": round(statistics.fmean(s.batch for s in ok if s.batch), 2)
            if any(s.batch for s in ok)
            else None,
            "replicas_seen": len({s.replica for s in ok if s.replica}),
            "kill": self.kill,
        }


def _count(values) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[str(v)] = out.get(str(v), 0) + 1
    return out


def _pct(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    k = min(len(sorted_values) - 1, max(0, int(np.ceil(q / 100 * len(sorted_values))) - 1))
    return round(sorted_values[k], 3)


# -- requests --------------------------------------------------------------------------------


@dataclass
class Pool:
    """Pre-encoded request bodies: good ones with their expected answers, and malformed ones."""

    good: list[tuple[bytes, str, np.ndarray | None]]  # (body, content type, expected y or None)
    bad: dict[str, tuple[bytes, str]]


def build_pool(
    meta: dict[str, Any],
    *,
    seqs: list[int],
    batch: int = 1,
    size: int = 32,
    binary: bool = True,
    model: str | os.PathLike | None = None,
    seed: int = 0,
) -> Pool:
    """`size` well-formed inputs with T drawn from `seqs`, answers from `model` run alone."""
    spec = meta["spec"]
    c, c_ctx = spec["d_model"], spec.get("d_context")
    dtype = np.float16 if meta.get("dtype") == "float16" else np.float32
    sess = None
    if model is not None:
        from export.session import OnnxSession

        sess = OnnxSession(model, provider="cpu", verbose=False)
        import hashlib

        digest = hashlib.sha256(Path(model).read_bytes()).hexdigest()
        if meta.get("sha256") and digest != meta["sha256"]:
            raise LoadTestError(f"{model} is not the model this server runs (sha256 differs); give the served file")
    rng = np.random.default_rng(seed)
    client = Client("http://127.0.0.1/", binary=binary)  # used only to encode bodies
    good = []
    for i in range(size):
        t = seqs[i % len(seqs)]
        x = rng.standard_normal((batch, t, c)).astype(dtype)
        context = rng.standard_normal((batch, t + 3, c_ctx)).astype(dtype) if c_ctx else None
        body, kind = client.encode(x, context)
        want = None
        if sess is not None:
            # A decode model gets prompts (no past); its answer's y is checked.
            want = sess.decode(x) if "past_key" in sess.input_names else sess.run(x, context)
            want = want[0] if isinstance(want, tuple) else want
        good.append((body, kind, want))
    max_tokens = int(meta.get("max_tokens", 65_536))
    bad = {kind: _bad_body(kind, c, dtype, max_tokens, rng) for kind in BAD_KINDS}
    return Pool(good, bad)


def _npy(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=False)
    return buf.getvalue()


def _bad_body(kind: str, c: int, dtype, max_tokens: int, rng) -> tuple[bytes, str]:
    x = rng.standard_normal((1, 8, c)).astype(dtype)
    if kind == "not-json":
        return b'{"x": [[0.1, 0.2', JSON
    if kind == "wrong-width":
        return _npy(rng.standard_normal((1, 8, c + 1)).astype(dtype)), NPY
    if kind == "wrong-rank":
        return _npy(x[0, 0]), NPY
    if kind == "wrong-dtype":
        return _npy(x.astype(np.float64)), NPY
    if kind == "too-large":
        t = max_tokens + 1
        if t * c * 4 <= 32 * 2**20:
            return _npy(np.zeros((1, t, c), dtype)), NPY
        # A real body this size would only load the loopback: the header alone declares it, and
        # the server must refuse it from the header before reading data.
        head = io.BytesIO()
        np.lib.format.write_array_header_1_0(
            head, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": (1, t, c)}
        )
        return head.getvalue() + b"\0" * 64, NPY
    if kind == "empty":
        return _npy(np.zeros((1, 0, c), dtype)), NPY
    if kind == "nan":
        y = x.copy()
        y[0, 3, 1] = np.nan
        return _npy(y), NPY
    if kind == "unknown-field":
        return json.dumps({"x": x[0].tolist(), "y": [1]}).encode(), JSON
    raise LoadTestError(f"unknown malformed kind {kind!r}")


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
    for i in range(requests):
        if i in bad_at:
            plan.append(BAD_KINDS[k % len(BAD_KINDS)])
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
        reply = client.request("POST", "/predict", body, {"Content-Type": ctype})
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
    )
    if reply.ok and want is not None:
        try:
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

    from .app import replica_states

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
) -> dict[str, Any]:
    """Every concurrency level in turn against `url`; the report as a JSON-ready dict."""
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
    client = Client(url, retries=retries)
    if not client.health():
        raise LoadTestError(f"no attnzoo server answers GET {url.rstrip('/')}/healthz; start one with `attnzoo serve`")
    meta = client.metadata()
    client.close()
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
        "format": "npy" if binary else "json",
        "seqs": seqs,
        "batch": batch,
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
    return report


def format_report(report: dict[str, Any]) -> str:
    """A table: one line per concurrency level, then the fault summary."""
    m = report["model"]
    lines = [
        f"{report['url']}: {m['name']} ({m['lowering']}, {m['dtype']}, {m['provider']}), {report['format']} bodies, "
        f"T in {report['seqs']}, max batch {m['max_batch']}, wait {m['batch_wait_ms']} ms; "
        f"client retries {report['retries']}",
        f"{'conc':>4} {'req':>5} {'req/s':>7} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'model':>7} "
        f"{'wait':>6} {'engine':>7} {'batch':>5} {'ok':>9} {'wrong':>5} {'bad 4xx':>9} {'5xx':>4} {'retry':>5}",
    ]
    for lv in report["levels"]:
        lat, split = lv["latency_ms"], lv["time_split_ms"]
        lines.append(
            f"{lv['concurrency']:>4} {lv['requests']:>5} {lv['throughput_rps']:>7.1f} {_f(lat['p50']):>8} "
            f"{_f(lat['p95']):>8} {_f(lat['p99']):>8} {_f(split['model']):>7} {_f(split['batch_wait']):>6} "
            f"{_f(split['engine']):>7} {_f(lv['mean_batch_rows']):>5} {lv['good_ok']:>4}/{lv['good']:<4} "
            f"{lv['good_wrong']:>5} {lv['bad_4xx']:>4}/{lv['bad']:<4} {lv['5xx']:>4} {lv['retried']:>5}"
        )
        if lv["kill"]:
            k = lv["kill"]
            rec = f"recovered in {k['recovered_s']} s" if k.get("recovered_s") is not None else "NOT recovered"
            lines.append(
                f"     killed {k.get('killed')} at {k.get('after_s')} s: {rec}; {k.get('error', '')}".rstrip("; ")
            )
    if "speedup" in report:
        lines.append(
            f"throughput at concurrency {report['levels'][-1]['concurrency']} / "
            f"{report['levels'][0]['concurrency']}: {report['speedup']}x"
        )
    lines.append(
        "times in ms, means over answered good requests: model = the ORT run of its batch, wait = in the "
        "batch queue (forming, and behind the running batch), engine = the rest (HTTP, Ray's proxy and "
        "routing, body decoding, the client)"
    )
    return "\n".join(lines)


def _f(v) -> str:
    return "-" if v is None or (isinstance(v, float) and np.isnan(v)) else f"{v:.1f}"


__all__ = [
    "BAD_KINDS",
    "LoadTestError",
    "Level",
    "Pool",
    "Sample",
    "build_pool",
    "format_report",
    "loadtest",
    "replica_killer",
    "run_level",
]
