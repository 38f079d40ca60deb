"""serve/loadtest/openai_bench.py, the serving benchmark's client, against a fake OpenAI server on loopback (the real
benchmark, attnzoo against llama-server, is `attnzoo bench --serve`, never run by the suite): the seeded workload,
the tokens and timings read from streamed chunks (usage first, chunks else), fixed concurrency never exceeded,
Poisson arrivals sending every request, errors counted, percentiles by nearest rank, the table."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from serve.loadtest.openai_bench import Ask, nearest_rank, one_request, run_level, sharegpt_like, summarize


class Fake(BaseHTTPRequestHandler):
    """Streams an empty chunk, then max_tokens chunks of one character each (usage last, when asked); prompt [666]
    is a 500; [777] ends with an error event; records how many requests run at once."""

    protocol_version = "HTTP/1.1"
    lock = threading.Lock()
    running = 0
    most = 0
    bodies: list[dict] = []

    def log_message(self, *args):
        pass

    def do_POST(self):
        doc = json.loads(self.rfile.read(int(self.headers["content-length"])))
        cls = type(self)
        with cls.lock:
            cls.bodies.append(doc)
            cls.running += 1
            cls.most = max(cls.most, cls.running)
        try:
            if doc["prompt"] == [666]:
                self.send_response(500)
                self.send_header("content-length", "4")
                self.end_headers()
                self.wfile.write(b"oops")
                return
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("connection", "close")
            self.end_headers()
            first = {"choices": [{"text": "", "index": 0, "finish_reason": None}]}  # on acceptance, as attnzoo's
            self.wfile.write(b"data: " + json.dumps(first).encode() + b"\n\n")
            for i in range(doc["max_tokens"]):
                chunk = {"choices": [{"text": "x", "index": 0, "finish_reason": None}]}
                self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                self.wfile.flush()
                if doc["prompt"] == [777] and i == 1:
                    self.wfile.write(b'data: {"error": {"message": "replica lost", "code": "replica_lost"}}\n\n')
                    break
            else:
                last = {"choices": [{"text": "", "index": 0, "finish_reason": "length"}]}
                self.wfile.write(b"data: " + json.dumps(last).encode() + b"\n\n")
                if doc.get("stream_options", {}).get("include_usage"):
                    usage = {"choices": [], "usage": {"completion_tokens": doc["max_tokens"] + 100}}
                    self.wfile.write(b"data: " + json.dumps(usage).encode() + b"\n\n")
            self.wfile.write(b"data: [DONE]\n\n")
        finally:
            with cls.lock:
                cls.running -= 1


@pytest.fixture
def fake():
    Fake.bodies, Fake.most, Fake.running = [], 0, 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), Fake)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def test_the_workload_is_seeded_and_shaped_like_sharegpt():
    a, b = sharegpt_like(200, seed=3), sharegpt_like(200, seed=3)
    assert a == b and a != sharegpt_like(200, seed=4)
    prompts = sorted(len(x.prompt) for x in a)
    outputs = sorted(x.max_tokens for x in a)
    assert 4 <= prompts[0] and prompts[-1] <= 1024 and 4 <= outputs[0] and outputs[-1] <= 256
    assert 64 < prompts[100] < 256 and 48 < outputs[100] < 192  # medians near 128 and 96
    assert prompts[190] > 3 * prompts[100]  # a long right tail, as ShareGPT's
    assert all(0 <= t < 256 for x in a for t in x.prompt)


def test_one_stream_is_timed_and_its_tokens_read_from_usage(fake):
    r = one_request(fake, "m", Ask([1, 2], 5), {"ignore_eos": True}, 30, 0.0)
    assert r.ok and r.tokens == 105  # the server's usage wins over the 5 chunks counted
    assert (
        len(r.itl) == 4 and 0 < r.ttft <= r.e2e
    )  # the empty first chunk is no token: 5 tokens, 4 gaps and r.tpot == pytest.approx((r.e2e - r.ttft) / 104)
    body = Fake.bodies[-1]
    assert body["stream"] and body["ignore_eos"] and body["max_tokens"] == 5 and body["prompt"] == [1, 2]


def test_errors_are_counted_not_timed(fake):
    bad = one_request(fake, "m", Ask([666], 3), {}, 30, 0.0)
    assert not bad.ok and bad.error.startswith("HTTP 500")
    cut = one_request(fake, "m", Ask([777], 8), {}, 30, 0.0)
    assert not cut.ok and "replica lost" in cut.error


def test_fixed_concurrency_is_never_exceeded_and_every_request_sent(fake):
    work = [Ask([i], 3) for i in range(12)] + [Ask([666], 3)]
    level = run_level(fake, "m", work, concurrency=3, sampler=lambda: 42.0)
    assert Fake.most <= 3 and len(Fake.bodies) == 13
    assert level["requests"] == 13 and level["errors"] == 1 and level["output_tokens"] == 12 * 103
    assert level["mode"] == "concurrency" and level["value"] == 3 and level["peak_rss_mb"] == 42.0
    assert set(level["ttft_ms"]) == {"p50", "p90", "p99"} and level["output_tokens_per_s"] > 0


def test_poisson_arrivals_send_every_request(fake):
    level = run_level(fake, "m", [Ask([i], 2) for i in range(6)], rate=1000.0, seed=1)
    assert level["requests"] == 6 and level["errors"] == 0 and level["mode"] == "rate"
    with pytest.raises(ValueError):
        run_level(fake, "m", [], rate=1.0, concurrency=1)


def test_percentiles_by_nearest_rank_in_milliseconds():
    values = [i / 1000 for i in range(1, 101)]  # 1..100 ms
    assert (nearest_rank(values, 50), nearest_rank(values, 90), nearest_rank(values, 99)) == (50.0, 90.0, 99.0)
    assert nearest_rank([], 50) is None
    assert summarize([], 1.0)["ttft_ms"] == {"p50": None, "p90": None, "p99": None}
