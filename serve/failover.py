"""A lost replica's requests, in Ray Serve's HTTP proxy: retried on another replica while nothing of the answer has
been sent, ended with a clean error where part of it has.

Ray Serve 2.60's proxy answers a request whose replica dies (its node stopped, its process killed) by sending
nothing at all: the exception it catches (RayActorError, ActorUnavailableError) is a 500, and its
`send_http_response_on_exception` sends a body only for 408, 429 and 503, so uvicorn closes the connection
without an answer; a stream whose first bytes were sent is cut mid-answer. `Failover` wraps the proxy's ASGI app:

- it keeps the request's body (up to MAX_REPLAY_BYTES) and, when the app returns or raises without having
  started an answer, calls it again with the same body, up to `attempts` times: Serve's router then picks a
  live replica (it drops one whose actor died). Every route attnzoo serves is safe to run twice (generation,
  embeddings, a block's outputs: nothing is written), so nothing of such a request is lost; after the last
  attempt, 503 in OpenAI's error format with Retry-After.
- a streamed answer (server-sent events) already started cannot be taken back: its stream ends with an error
  event in OpenAI's format (`data: {"error": {..., "code": "replica_lost"}}`) and `data: [DONE]`, so a client
  reads a clean end instead of a cut connection. Another answer already started (a non-streamed body sent in
  parts) is closed as it is: nothing can be added to it.

Every answer carries `x-attnzoo-failover: N` (the attempts it took), which says the proxy runs this wrapper.
Ray's proxy loads it from the environment variable RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH, read when the proxy
starts, on the head node: serve.app.init_local_ray sets it for a Ray of our own; a cluster's head is started with
it (docs/serving.md). No Ray import here: the wrapper is plain ASGI."""

from __future__ import annotations

import asyncio
import json
import logging

CALLBACK = "serve.failover.proxy_middlewares"
CALLBACK_ENV = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"
HEADER = b"x-attnzoo-failover"
ATTEMPTS = 4
MAX_REPLAY_BYTES = 64 * 1024 * 1024
RETRY_AFTER_S = 1
BACKOFF_S = 0.2

logger = logging.getLogger("ray.serve")


def _error(message: str, code: str) -> bytes:
    return json.dumps({"error": {"message": message, "type": "server_error", "param": None, "code": code}}).encode()


class Failover:
    """The ASGI wrapper (see the module's docstring). attempts: how many times one request is tried."""

    def __init__(self, app, attempts: int = ATTEMPTS) -> None:
        self.app, self.attempts = app, attempts

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body = _Body(receive)
        for attempt in range(1, self.attempts + 1):
            state = _Answer(send, attempt)
            try:
                await self.app(scope, body.receive if attempt == 1 else body.replay(), state)
            except Exception as e:  # noqa: BLE001 - the proxy's own error: the same as an answer never started
                if state.started:
                    await state.cut(type(e).__name__)
                    return
                logger.warning("attnzoo failover: attempt %d of %s raised %s", attempt, scope.get("path"), e)
            else:
                if state.started:
                    if not state.finished:
                        await state.cut("the replica was lost")
                    return
                logger.warning(
                    "attnzoo failover: attempt %d of %s got no answer (replica lost)", attempt, scope.get("path")
                )
            if not body.whole:  # not kept whole (too large, or not all read): cannot be sent again
                break
            await asyncio.sleep(BACKOFF_S * attempt)  # the router hears of the dead replica meanwhile
        why = "replicas lost" if body.whole else "its replica lost, its body too large to send again"
        message = f"no replica answered this request in {attempt} attempt(s) ({why}); retry it"
        headers = [(b"content-type", b"application/json"), (b"retry-after", str(RETRY_AFTER_S).encode())]
        await send(
            {"type": "http.response.start", "status": 503, "headers": [*headers, (HEADER, str(attempt).encode())]}
        )
        await send({"type": "http.response.body", "body": _error(message, "replica_lost"), "more_body": False})


class _Body:
    """The request's body as the first attempt reads it, kept (up to MAX_REPLAY_BYTES) to send again."""

    def __init__(self, receive) -> None:
        self._receive, self.kept, self.size, self.whole = receive, [], 0, False

    async def receive(self):
        message = await self._receive()
        if message["type"] == "http.request" and self.size <= MAX_REPLAY_BYTES:
            self.kept.append(message)
            self.size += len(message.get("body", b""))
            self.whole = not message.get("more_body", False) and self.size <= MAX_REPLAY_BYTES
        return message

    def replay(self):
        """A `receive` that gives the kept body first, then the connection's own (a disconnect)."""
        queue = list(self.kept)

        async def replayed():
            return queue.pop(0) if queue else await self._receive()

        return replayed


class _Answer:
    """The proxy's `send` as one attempt sees it: what was sent (started, finished, an event stream)."""

    def __init__(self, send, attempt: int) -> None:
        self.send, self.attempt = send, attempt
        self.started = self.finished = self.events = False
        self.status = 0

    async def __call__(self, message) -> None:
        if message["type"] == "http.response.start":
            self.started, self.status = True, message.get("status", 200)
            headers = list(message.get("headers") or [])
            self.events = any(k.lower() == b"content-type" and v.startswith(b"text/event-stream") for k, v in headers)
            message = {**message, "headers": [*headers, (HEADER, str(self.attempt).encode())]}
        elif message["type"] == "http.response.body" and not message.get("more_body", False):
            self.finished = True
        await self.send(message)

    async def cut(self, why: str) -> None:
        """End an answer that was started and not finished: an error event where it streams events."""
        body = b""
        if self.events:
            message = f"{why} mid-answer; the part sent stands, the rest is not coming (not retried: sent tokens stay)"
            body = b"data: " + _error(message, "replica_lost") + b"\n\ndata: [DONE]\n\n"
        self.finished = True
        await self.send({"type": "http.response.body", "body": body, "more_body": False})


def proxy_middlewares() -> list:
    """Ray Serve's proxy callback (RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH=serve.failover.proxy_middlewares)."""
    from starlette.middleware import Middleware

    return [Middleware(Failover)]


__all__ = ["ATTEMPTS", "CALLBACK", "CALLBACK_ENV", "HEADER", "Failover", "proxy_middlewares"]
