"""The operations of a running whole-model server through HTTP, with the `openai` client and plain requests:
called by tests/serve/test_openai.py's one server test (one Ray Serve app for the module), which starts it with
--max-waiting 2 --request-timeout 600 --access-log PATH (and the prefix cache on, its default)."""

from __future__ import annotations

import json
import threading
import time

from prometheus_client.parser import text_string_to_metric_families


def metrics(plain) -> dict:
    """{sample name + sorted labels: value} of GET /metrics (no key asked), parsed by prometheus_client."""
    reply = plain.request("GET", "/metrics")
    assert reply.status == 200 and reply.headers["content-type"].startswith("text/plain"), reply.status
    out = {}
    for family in text_string_to_metric_families(reply.body.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(snapshot: dict, name: str, **labels) -> float:
    """The sum of a sample's values over the series that have these labels (model_name="chat" always)."""
    want = {"model_name": "chat", **labels}
    return sum(v for (n, ls), v in snapshot.items() if n == name and all(dict(ls).get(k) == w for k, w in want.items()))


def meta(plain, auth) -> dict:
    return json.loads(plain.request("GET", "/metadata", None, auth).body)


def wait_for(check, what: str, seconds: float = 60.0) -> None:
    ends = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < ends, what
        time.sleep(0.05)


def check_operations(url, key, model, codec, alone, access_log) -> None:
    """alone(ids, max_tokens, **knobs) -> (text, finish, made) of a request alone (test_openai._alone)."""
    import openai

    from serve import Client

    client = openai.OpenAI(base_url=url + "v1", api_key=key, max_retries=0)
    plain, auth = Client(url), {"Authorization": f"Bearer {key}"}
    health, ready = plain.request("GET", "/health"), plain.request("GET", "/ready")  # open, as /healthz
    assert (health.status, json.loads(health.body)["status"]) == (200, "ok")
    assert (ready.status, json.loads(ready.body)) == (200, {"status": "ready", "model": model})
    assert plain.request("POST", "/tokenize", b"{}").status == 401  # the key, as /v1

    def post(path, doc):
        return json.loads(plain.request("POST", path, json.dumps(doc).encode(), auth).body)

    # X-Request-Id: the client's own, returned; else one made; the metrics move by this request's tokens
    ids = codec.encode("import os\n")
    before = metrics(plain)
    raw = client.completions.with_raw_response.create(
        model=model, prompt=ids, max_tokens=5, extra_headers={"X-Request-Id": "ops-req-1"}
    )
    assert raw.headers["x-request-id"] == "ops-req-1", raw.headers  # once: Ray Serve's proxy returns it
    assert raw.parse().choices[0].text == alone(ids, 5)[0]
    made = plain.request("GET", "/health").headers["x-request-id"]  # one made (Ray Serve's proxy: a uuid4)
    assert len(made) >= 32 and made != "ops-req-1"
    after = metrics(plain)
    delta = lambda name, **labels: value(after, name, **labels) - value(before, name, **labels)  # noqa: E731
    assert delta("attnzoo:prompt_tokens_total") == len(ids) and delta("attnzoo:generation_tokens_total") == 5
    assert delta("attnzoo:request_success_total", finished_reason="length") == 1
    for name in ("time_to_first_token_seconds", "e2e_request_latency_seconds", "time_per_output_token_seconds"):
        assert delta(f"attnzoo:{name}_count") == 1 and value(after, f"attnzoo:{name}_sum") > 0, name
    assert value(after, "attnzoo:num_requests_running") == 0 == value(after, "attnzoo:num_requests_waiting")

    # /tokenize and /detokenize in vLLM's shapes: a chat's count is its answer's usage.prompt_tokens
    system = "You answer in one short line, in the manner of a patient teacher who has seen it all before. " * 2
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "What is a key?"}]
    tokens = post("/tokenize", {"model": model, "messages": messages})
    chat = client.chat.completions.create(model=model, messages=messages, max_tokens=4, temperature=0)
    assert tokens["count"] == chat.usage.prompt_tokens == len(tokens["tokens"]) and tokens["max_model_len"] > 0
    text = post("/tokenize", {"prompt": "def main("})
    assert text["tokens"] == codec.encode("def main(")
    assert post("/detokenize", {"tokens": text["tokens"]}) == {"prompt": "def main("}

    # the prefix cache: a second chat with the same system prompt reads its whole blocks, answers as alone
    before = metrics(plain)
    messages[1]["content"] = "And what is a lock?"
    second = post("/tokenize", {"messages": messages})["tokens"]
    shared = next(i for i, (a, b) in enumerate(zip(tokens["tokens"], second)) if a != b)
    got = client.chat.completions.create(model=model, messages=messages, max_tokens=6, temperature=0)
    assert got.choices[0].message.content == alone(second, 6)[0]
    after = metrics(plain)
    hits = value(after, "attnzoo:prefix_cache_hits_total") - value(before, "attnzoo:prefix_cache_hits_total")
    assert hits == shared // 16 * 16 > 0, (hits, shared)

    # a burst past --max-waiting 2: every request answered as alone, or refused 429 with Retry-After
    prompts = [codec.encode(p) for p in ("def f(", "class A", "x = 1\n", "# note")]
    want = {tuple(p): alone(p, 24)[0] for p in prompts}
    results = []

    def one(i):
        prompt = prompts[i % len(prompts)]
        try:
            if i % 5 == 4:
                stream = client.completions.create(model=model, prompt=prompt, max_tokens=24, stream=True)
                results.append(("".join(c.choices[0].text for c in stream if c.choices) == want[tuple(prompt)], 200))
            else:
                got = client.completions.create(model=model, prompt=prompt, max_tokens=24)
                results.append((got.choices[0].text == want[tuple(prompt)], 200))
        except openai.RateLimitError as e:
            retry = e.response.headers.get("retry-after", "")
            results.append((retry.isdigit() and e.body["code"] == "rate_limit_exceeded", 429))

    before = metrics(plain)
    threads = [threading.Thread(target=one, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads) and len(results) == 20, results
    assert all(ok for ok, _ in results), results
    refused = sum(status == 429 for _, status in results)
    after = metrics(plain)
    assert (
        value(after, "attnzoo:num_requests_refused_total") - value(before, "attnzoo:num_requests_refused_total")
        == refused
    )
    info = meta(plain, auth)
    assert (info["max_waiting"], info["request_timeout"], info["rows_running"]) == (2, 600, 0), info

    # a non-streamed client that leaves: its row is given back at the next step, long before its max_tokens
    import http.client

    left = info["requests_left"]
    host, port = url.split("//")[1].rstrip("/").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    body = json.dumps({"model": model, "prompt": ids, "max_tokens": 3000})
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json", **auth})
    wait_for(lambda: meta(plain, auth)["rows_running"] == 1, "the request never ran")
    conn.close()
    wait_for(lambda: meta(plain, auth)["rows_running"] == 0, "its row was never given back")
    assert meta(plain, auth)["requests_left"] == left + 1

    # one access-log line per request, with its id, tokens and timings; no prompt text (no --log-prompts)
    lines = [json.loads(line) for line in access_log.read_text().splitlines()]
    (mine,) = [doc for doc in lines if doc["request_id"] == "ops-req-1"]
    assert (mine["route"], mine["status"], mine["prompt_tokens"], mine["completion_tokens"]) == (
        "/v1/completions", 200, len(ids), 5,
    ), mine  # fmt: skip
    assert mine["ttft_ms"] > 0 and mine["total_ms"] >= mine["ttft_ms"] and mine["finish_reason"] == "length"
    assert sum(doc["status"] == 429 for doc in lines) == refused and not any("prompt" in doc for doc in lines)
    assert {doc["route"] for doc in lines} >= {"/health", "/metrics", "/tokenize", "/v1/chat/completions"}
    assert [doc["route"] for doc in lines if doc["request_id"] == made] == ["/health"]
    plain.close()
