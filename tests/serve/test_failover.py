"""serve/failover.py, the wrapper Ray Serve's HTTP proxy runs around its app: a request whose answer never started
(the proxy's way of meeting a lost replica: nothing sent) is sent again with the same body and answered; a stream
already under way ends with OpenAI's error event; after the last attempt, a 503 with Retry-After. Plain ASGI apps
stand for the proxy (no Ray, no sockets); the whole path through a real proxy and a killed node is
tests/serve/test_cluster.py (slow)."""

from __future__ import annotations

import asyncio
import json

import pytest

from serve import failover
from serve.failover import Failover


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch):
    monkeypatch.setattr(failover, "BACKOFF_S", 0.0)


def _call(app, body: bytes = b'{"a": 1}', parts: int = 1, scope_type: str = "http"):
    """Run one request through Failover(app): the messages sent back."""
    sent = []
    step = max(1, -(-len(body) // parts))
    chunks = [body[i : i + step] for i in range(0, len(body), step)] or [b""]
    incoming = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]

    async def receive():
        if incoming:
            return incoming.pop(0)
        await asyncio.Event().wait()  # the client stays connected

    async def send(message):
        sent.append(message)

    asyncio.run(Failover(app)({"type": scope_type, "path": "/v1/completions"}, receive, send))
    return sent


async def _read(receive) -> bytes:
    parts = []
    while True:
        m = await receive()
        parts.append(m.get("body", b""))
        if not m.get("more_body"):
            return b"".join(parts)


def _headers(message) -> dict[bytes, bytes]:
    return dict(message["headers"])


def test_an_answer_passes_through_marked_with_one_attempt():
    async def app(scope, receive, send):
        body = await _read(receive)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": body[::-1], "more_body": False})

    sent = _call(app, b"abcdef", parts=3)
    assert sent[0]["status"] == 200 and _headers(sent[0])[failover.HEADER] == b"1"
    assert sent[1]["body"] == b"fedcba" and len(sent) == 2


def test_a_request_whose_answer_never_started_is_sent_again_with_its_body():
    bodies = []

    async def app(scope, receive, send):  # the first replica is lost: the proxy returns without an answer
        bodies.append(await _read(receive))
        if len(bodies) == 1:
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok", "more_body": False})

    sent = _call(app, b'{"prompt": [1, 2, 3]}', parts=4)
    assert bodies == [b'{"prompt": [1, 2, 3]}'] * 2
    assert sent[0]["status"] == 200 and _headers(sent[0])[failover.HEADER] == b"2" and sent[1]["body"] == b"ok"


def test_no_answer_in_every_attempt_is_a_503_with_retry_after_in_openais_format():
    calls = []

    async def app(scope, receive, send):
        calls.append(await _read(receive))
        raise RuntimeError("ActorDiedError")

    sent = _call(app)
    assert len(calls) == failover.ATTEMPTS
    assert sent[0]["status"] == 503 and _headers(sent[0])[b"retry-after"] == b"1"
    error = json.loads(sent[1]["body"])["error"]
    assert error["code"] == "replica_lost" and error["type"] == "server_error" and len(sent) == 2


def test_a_stream_cut_mid_answer_ends_with_an_error_event_and_is_not_sent_again():
    calls = []

    async def app(scope, receive, send):
        calls.append(await _read(receive))
        headers = [(b"content-type", b"text/event-stream; charset=utf-8")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b'data: {"choices": [{"text": "a"}]}\n\n', "more_body": True})
        # the replica is lost here: the proxy returns with the body unfinished

    sent = _call(app)
    assert len(calls) == 1 and sent[0]["status"] == 200
    events = b"".join(m.get("body", b"") for m in sent[1:]).split(b"\n\n")
    assert events[0] == b'data: {"choices": [{"text": "a"}]}'
    assert json.loads(events[1].removeprefix(b"data: "))["error"]["code"] == "replica_lost"
    assert events[2] == b"data: [DONE]" and sent[-1]["more_body"] is False


def test_a_body_too_large_to_keep_is_not_sent_again(monkeypatch):
    monkeypatch.setattr(failover, "MAX_REPLAY_BYTES", 4)
    calls = []

    async def app(scope, receive, send):
        calls.append(await _read(receive))

    sent = _call(app, b"0123456789", parts=5)
    assert calls == [b"0123456789"] and sent[0]["status"] == 503
    assert "too large" in json.loads(sent[1]["body"])["error"]["message"]


def test_other_scopes_pass_through_untouched():
    seen = []

    async def app(scope, receive, send):
        seen.append(scope["type"])

    assert _call(app, scope_type="lifespan") == [] and seen == ["lifespan"]


def test_the_proxy_callback_names_this_module():
    from starlette.middleware import Middleware

    (middleware,) = failover.proxy_middlewares()
    assert isinstance(middleware, Middleware) and middleware.cls is Failover
    module, _, name = failover.CALLBACK.rpartition(".")
    assert module == failover.__name__ and getattr(failover, name) is failover.proxy_middlewares
