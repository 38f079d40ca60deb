"""Request ids and the access log of a replica (docs/serving.md, "Operations").

Each request gets an id: its own `X-Request-Id` header when it sends a usable one (1 to 256 printable ASCII
characters, no spaces), else a fresh uuid4 hex; the answer carries it back in `X-Request-Id`, and every line
this server logs about the request carries it (`request_id`: the contextvar REQUEST_ID, which the logging
filter adds to each record of the `attnzoo.serve` loggers). Under Ray Serve the proxy does the first two
itself (its RequestIdMiddleware: the client's X-Request-Id, else a uuid4, put in the request the replica
gets and appended to the answer), so the replica takes the proxy's and leaves the answer's header to it; Ray
Serve's own replica log lines carry the same id.

One access-log line per request, when its answer ends (a stream at its last event): a JSON object with ts,
request_id, method, route, status, prompt_tokens, completion_tokens, cached_tokens (from the prefix cache),
finish_reason, queue_ms, ttft_ms, total_ms and the replica; the prompt's text (`prompt`) only with
--log-prompts; a speculating server's continuous batch adds spec_proposed, spec_accepted and spec_target_calls
(the request's candidates proposed and kept, and its verifying calls). Written to the `attnzoo.serve.access`
logger (the replica's stderr: Ray's log folder), or appended to a file (--access-log PATH: one write per line,
so replicas on one machine may share it).
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
import time
import uuid
from dataclasses import asdict, dataclass, field

HEADER = "x-request-id"
REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("attnzoo_request_id", default="-")
_USABLE = re.compile(r"[!-~]{1,256}")  # printable ASCII, no space
LOG = logging.getLogger("attnzoo.serve")


def request_id(headers) -> str:
    """The request's own X-Request-Id when usable, else a fresh one."""
    given = (headers.get(HEADER) or "").strip()
    return given if _USABLE.fullmatch(given) else uuid.uuid4().hex


class WithRequestId(logging.Filter):
    """Adds `request_id` (the current request's, "-" outside one) to every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = REQUEST_ID.get()
        return True


@dataclass
class Access:
    """One request's access-log record, filled as it goes (the /v1 routes add tokens, timings and the prompt)."""

    request_id: str
    method: str
    route: str
    status: int = 0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    finish_reason: str | None = None
    queue_ms: float | None = None
    ttft_ms: float | None = None
    total_ms: float | None = None
    prompt: str | None = None
    spec_proposed: int | None = None  # speculative decoding (serve --prompt-lookup / --draft): left out when None
    spec_accepted: int | None = None
    spec_target_calls: int | None = None
    started: float = field(default_factory=time.perf_counter)

    def ran(self, run, timing: dict) -> None:
        """What a /v1 request's run made (serving.TextRun) and its batcher's timings."""
        self.completion_tokens, self.finish_reason = run.made, run.finish
        self.queue_ms = timing.get("x-attnzoo-queue-ms")
        self.ttft_ms = timing.get("x-attnzoo-ttft-ms")
        self.cached_tokens = timing.get("x-attnzoo-cached-tokens")
        self.speculated(timing)

    def speculated(self, timing: dict) -> None:
        """A speculating batcher's counts of the request (generate/speculating.py's x-attnzoo-spec-* timings)."""
        for name in ("proposed", "accepted", "target_calls"):
            value = timing.get(f"x-attnzoo-spec-{name.replace('_', '-')}")
            if value is not None:
                setattr(self, f"spec_{name}", value)


_CURRENT: contextvars.ContextVar[Access | None] = contextvars.ContextVar("attnzoo_access", default=None)


def current() -> Access:
    """The record of the request being handled (a throwaway one outside a request)."""
    return _CURRENT.get() or Access("-", "-", "-")


class AccessLog:
    """path: a file the lines are appended to, else the attnzoo.serve.access logger; prompts: log prompt text."""

    def __init__(self, path: str | None = None, prompts: bool = False, replica: str = "") -> None:
        self.path, self.prompts, self.replica = path, prompts, replica
        self.log = logging.getLogger("attnzoo.serve.access")
        for logger in (LOG, self.log):
            if not any(isinstance(f, WithRequestId) for f in logger.filters):
                logger.addFilter(WithRequestId())
        if not LOG.handlers:  # the replica's stderr, with the request's id on every line
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s request_id=%(request_id)s %(message)s"))
            LOG.addHandler(handler)
            LOG.setLevel(logging.INFO)

    def begin(self, request, route: str) -> Access:
        """A request's record, its id made current (contextvars: this task and what it awaits)."""
        rec = Access(request_id(request.headers), request.method, route)
        REQUEST_ID.set(rec.request_id)
        _CURRENT.set(rec)
        return rec

    def end(self, rec: Access, status: int) -> None:
        rec.status = status
        rec.total_ms = (time.perf_counter() - rec.started) * 1e3
        doc = {"ts": round(time.time(), 3), **asdict(rec), "replica": self.replica}
        doc.pop("started")
        if not self.prompts:
            doc.pop("prompt")
        for key in ("spec_proposed", "spec_accepted", "spec_target_calls"):
            if doc[key] is None:
                doc.pop(key)
        for key in ("queue_ms", "ttft_ms", "total_ms"):
            if doc[key] is not None:
                doc[key] = round(doc[key], 3)
        line = json.dumps(doc, ensure_ascii=False)
        if self.path:
            with open(self.path, "a", encoding="utf-8") as f:  # one write of one line
                f.write(line + "\n")
        else:
            self.log.info(line)


__all__ = ["HEADER", "LOG", "REQUEST_ID", "Access", "AccessLog", "WithRequestId", "current", "request_id"]
