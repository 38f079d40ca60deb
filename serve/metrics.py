"""GET /metrics of a whole-model replica: Prometheus' text format through prometheus_client, with vLLM's metric
names where the meaning is the same, `attnzoo:` where vLLM writes `vllm:`, labelled by model_name (vLLM's label).

Each replica keeps its own registry and /metrics answers with the replica the request lands on: with one
replica (`serve`'s default) that is the whole server; with several, Ray Serve's proxy picks one per scrape, so
scrape each replica's own (docs/serving.md, "Operations" says why not Ray Serve's metrics endpoint).

Histograms (observed when a request leaves the continuous batch, serve/generate/rows.py's observer):
time_to_first_token_seconds, time_per_output_token_seconds (the request's mean gap after its first token),
e2e_request_latency_seconds, request_queue_time_seconds. Counters: prompt_tokens_total, generation_tokens_total,
request_success_total{finished_reason}, prefix_cache_queries_total / prefix_cache_hits_total (prompt tokens
looked up / found, vLLM v1's), and our own num_requests_refused_total (429s) and num_requests_timed_out_total.
Gauges read at each scrape: num_requests_running, num_requests_waiting, kv_cache_usage_perc (the batch's rows
held, 0..1: every row holds the capacity's slots), prefix_cache_usage_bytes (our own). A speculating server
(serve --prompt-lookup / --draft) adds vLLM's spec_decode_num_draft_tokens_total (candidates proposed) and
spec_decode_num_accepted_tokens_total, and our own spec_decode_num_target_calls_total (verifying calls),
spec_decode_num_emitted_tokens_total (tokens made by rounds), spec_decode_num_draft_calls_total, with the gauges
spec_decode_acceptance_rate (accepted / proposed) and spec_decode_tokens_per_target_call (emitted / target calls)
since the replica started.
"""

from __future__ import annotations

PREFIX = "attnzoo:"
TEXT_FORMAT = "text/plain; version=0.0.4; charset=utf-8"  # prometheus_client.CONTENT_TYPE_LATEST
# vLLM's buckets (vllm/v1/metrics/loggers.py)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
                80.0, 160.0, 640.0, 2560.0)  # fmt: skip
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
                80.0)  # fmt: skip
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
               960.0, 1920.0, 7680.0)  # fmt: skip


class ReplicaMetrics:
    """One replica's registry. batchers() -> the continuous batchers made so far (their state is read at each
    scrape); `finished` is the batchers' observer."""

    def __init__(self, model: str, batchers, speculation: dict | None = None) -> None:
        """speculation: the tally a speculating server's rounds count into (runtime/speculative.TALLY), or None."""
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.model, self.batchers, self.speculation = model, batchers, speculation
        self.registry = CollectorRegistry(auto_describe=False)
        lab, reg = ["model_name"], self.registry

        def hist(name, doc, buckets):
            return Histogram(PREFIX + name, doc, lab, buckets=buckets, registry=reg).labels(model)

        self.ttft = hist("time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS)
        self.tpot = hist(
            "time_per_output_token_seconds", "Histogram of time per output token in seconds.", TPOT_BUCKETS
        )
        self.e2e = hist(
            "e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.", E2E_BUCKETS
        )
        self.queue = hist("request_queue_time_seconds", "Histogram of time spent waiting in the queue.", E2E_BUCKETS)
        self.prompt = Counter(PREFIX + "prompt_tokens", "Number of prefill tokens processed.", lab, registry=reg)
        self.generation = Counter(
            PREFIX + "generation_tokens", "Number of generation tokens processed.", lab, registry=reg
        )
        self.success = Counter(
            PREFIX + "request_success", "Count of finished requests.", [*lab, "finished_reason"], registry=reg
        )
        self.prompt, self.generation = self.prompt.labels(model), self.generation.labels(model)
        reg.register(_State(self))

    def finished(self, run, now: float, reason: str) -> None:
        """A request left the batch (rows.RowBatcher's observer): reason stop, length, abort or timeout."""
        it = run.item
        made = len(run.tokens)
        self.prompt.inc(int(it.ids.size if it.mask is None else it.mask.sum()))
        self.generation.inc(made * it.rows)
        self.success.labels(self.model, reason).inc()
        self.queue.observe(max(run.admitted - it.enqueued, 0.0))
        self.ttft.observe(max(run.first_at - it.enqueued, 0.0))
        self.e2e.observe(max(now - it.enqueued, 0.0))
        if made > 1:
            self.tpot.observe(max(now - run.first_at, 0.0) / (made - 1))

    def text(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


# (metric, runtime/speculative.TALLY's count, help): vLLM's names where the meaning is the same
SPEC_COUNTERS = (
    ("spec_decode_num_draft_tokens", "proposed", "Number of candidate tokens proposed."),
    ("spec_decode_num_accepted_tokens", "accepted", "Number of candidate tokens accepted."),
    ("spec_decode_num_target_calls", "target_calls", "Target model calls that verified candidates."),
    ("spec_decode_num_emitted_tokens", "emitted", "Tokens made under speculation (accepted and the target's own)."),
    ("spec_decode_num_draft_calls", "draft_calls", "Draft model calls."),
)


class _State:
    """The gauges and counters read from the batchers at each scrape."""

    def __init__(self, metrics: ReplicaMetrics) -> None:
        self.m = metrics

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        batchers = self.m.batchers()
        caches = [b.prefix for b in batchers if b.prefix is not None]
        rows = sum(b.max_rows for b in batchers)

        def family(kind, name, doc, value):
            metric = kind(PREFIX + name, doc, labels=["model_name"])
            metric.add_metric([self.m.model], value)
            return metric

        yield family(GaugeMetricFamily, "num_requests_running", "Number of requests in the running batch.",
                     sum(len(b.running) for b in batchers))  # fmt: skip
        yield family(GaugeMetricFamily, "num_requests_waiting", "Number of requests waiting to be processed.",
                     sum(b.queued for b in batchers))  # fmt: skip
        yield family(GaugeMetricFamily, "kv_cache_usage_perc", "KV-cache usage: the batch's rows held (1 = all).",
                     sum(b.used for b in batchers) / rows if rows else 0.0)  # fmt: skip
        yield family(CounterMetricFamily, "prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                     sum(c.queries for c in caches))  # fmt: skip
        yield family(CounterMetricFamily, "prefix_cache_hits", "Prompt tokens found in the prefix cache.",
                     sum(c.hits for c in caches))  # fmt: skip
        yield family(GaugeMetricFamily, "prefix_cache_usage_bytes", "Bytes of keys and values the prefix cache holds.",
                     sum(c.bytes for c in caches))  # fmt: skip
        yield family(CounterMetricFamily, "num_requests_refused", "Requests refused with 429 (--max-waiting).",
                     sum(b.refused for b in batchers))  # fmt: skip
        yield family(CounterMetricFamily, "num_requests_timed_out", "Requests ended by --request-timeout.",
                     sum(b.timed_out for b in batchers))  # fmt: skip
        tally = self.m.speculation
        if tally is None:
            return
        n = dict(tally)  # one reading of the batchers' counts
        for name, key, doc in SPEC_COUNTERS:
            yield family(CounterMetricFamily, name, doc, n.get(key, 0))
        rate = n.get("accepted", 0) / n["proposed"] if n.get("proposed") else 0.0
        per_call = n.get("emitted", 0) / n["target_calls"] if n.get("target_calls") else 0.0
        yield family(GaugeMetricFamily, "spec_decode_acceptance_rate", "Candidates accepted / proposed.", rate)
        yield family(GaugeMetricFamily, "spec_decode_tokens_per_target_call",
                     "Tokens made under speculation per verifying target call.", per_call)  # fmt: skip


__all__ = ["PREFIX", "SPEC_COUNTERS", "TEXT_FORMAT", "ReplicaMetrics"]
