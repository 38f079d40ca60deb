"""What a load test measured: one `Sample` per request, one `Level` per concurrency level
(its `summary()` is the JSON report's entry), and the printed table."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

import numpy as np


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
    new_tokens: int | None = None  # a /generate answer's new tokens, all its rows (x-attnzoo-new-tokens)


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
        new = [s.new_tokens for s in ok if s.new_tokens is not None]
        return {
            "concurrency": self.concurrency,
            "requests": self.requests,
            "seconds": round(self.seconds, 3),
            "throughput_rps": round(len(self.samples) / self.seconds, 2) if self.seconds else 0.0,
            # A whole model's: new tokens of the answered good requests, over the level's wall time.
            "new_tokens": sum(new) if new else None,
            "tokens_per_s": round(sum(new) / self.seconds, 1) if new and self.seconds else None,
            "good": len(good),
            "good_ok": len(ok),
            "good_ok_fraction": round(len(ok) / len(good), 4) if good else None,
            "good_checked": sum(s.correct is not None for s in good),
            "good_wrong": sum(s.correct is False for s in good),
            "good_failed_status": count_values(s.status for s in good if not 200 <= s.status < 300),
            "bad": len(bad),
            "bad_4xx": sum(400 <= s.status < 500 for s in bad),
            "bad_statuses": count_values(s.status for s in bad),
            "5xx": sum(s.status >= 500 for s in self.samples),
            "no_answer": sum(s.status == 0 for s in self.samples),
            "retried": sum(s.retried for s in self.samples),
            "latency_ms": {
                "p50": percentile(lat, 50),
                "p95": percentile(lat, 95),
                "p99": percentile(lat, 99),
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


def count_values(values) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[str(v)] = out.get(str(v), 0) + 1
    return out


def percentile(sorted_values: list[float], q: float) -> float | None:
    """The q-th percentile (nearest rank) of ascending values, rounded to 0.001; None for none."""
    if not sorted_values:
        return None
    k = min(len(sorted_values) - 1, max(0, int(np.ceil(q / 100 * len(sorted_values))) - 1))
    return round(sorted_values[k], 3)


def format_report(report: dict[str, Any]) -> str:
    """A table: one line per concurrency level, then the fault summary."""
    m = report["model"]
    gen = report.get("mode") == "generate"
    what = f"prompts of T in {report['seqs']}, {report['new_tokens']} new tokens" if gen else f"T in {report['seqs']}"
    lines = [
        f"{report['url']}: {m['name']} ({m['lowering']}, {m['dtype']}, {m['provider']}), {report['format']} bodies, "
        f"{what}, max batch {m['max_batch']}, wait {m['batch_wait_ms']} ms; "
        f"client retries {report['retries']}",
        f"{'conc':>4} {'req':>5} {'req/s':>7}" + (f" {'tok/s':>7}" if gen else "") + f" {'p50 ms':>8} {'p95 ms':>8} "
        f"{'p99 ms':>8} {'model':>7} "
        f"{'wait':>6} {'engine':>7} {'batch':>5} {'ok':>9} {'wrong':>5} {'bad 4xx':>9} {'5xx':>4} {'retry':>5}",
    ]
    for lv in report["levels"]:
        lat, split = lv["latency_ms"], lv["time_split_ms"]
        tok = f" {_f(lv['tokens_per_s']):>7}" if gen else ""
        lines.append(
            f"{lv['concurrency']:>4} {lv['requests']:>5} {lv['throughput_rps']:>7.1f}{tok} {_f(lat['p50']):>8} "
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
            + (f" (tokens/s: {report['tokens_speedup']}x)" if report.get("tokens_speedup") is not None else "")
        )
    if gen:
        lines.append(
            "tok/s = new tokens of the answered good requests per second of the level (wall time, all clients); "
            "wrong = answers not token-equal to OnnxSession.generate of the request alone"
        )
    lines.append(
        "times in ms, means over answered good requests: model = the ORT run of its batch, wait = in the "
        "batch queue (forming, and behind the running batch), engine = the rest (HTTP, Ray's proxy and "
        "routing, body decoding, the client)"
    )
    return "\n".join(lines)


def _f(v) -> str:
    return "-" if v is None or (isinstance(v, float) and np.isnan(v)) else f"{v:.1f}"
