"""OpenAI's API for a whole model: the bodies of POST /v1/completions and /v1/chat/completions checked into an
`Ask`, the answers and stream chunks built as OpenAI writes them, and errors in OpenAI's format. Plain Python:
no Ray, no torch.

    {"model": "llama", "prompt": "def main(", "max_tokens": 16, "temperature": 0, "stop": ["\\n"]}
    {"model": "llama", "messages": [{"role": "user", "content": "Hi"}], "stream": true, "seed": 7}

OpenAI's `max_tokens` (and chat's newer `max_completion_tokens`) counts new tokens. A request is refused
with {"error": {"message", "type", "param", "code"}} and a 4xx: 400 for a field it cannot take (n other than
1, an unknown field, a prompt too long for the server: code "context_length_exceeded"), 401 for a missing or
wrong API key, 404 for another model's name or path, 413 for a body past the endpoint's size limit.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field

from zoo import AttnzooError

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
MODELS = "/v1/models"
EMBEDDINGS = "/v1/embeddings"  # a sentence encoder's server (serve/embeddings/protocol.py)
SAMPLING = ("temperature", "top_p", "seed")
EXTRAS = ("top_k", "min_p", "repetition_penalty")  # beyond OpenAI's fields, as vLLM takes them (extra_body)
COMMON = ("model", "max_tokens", "stop", "n", "stream", "stream_options", "user", *SAMPLING, *EXTRAS)
FIELDS = {
    COMPLETIONS: (*COMMON, "prompt", "echo", "logprobs", "best_of", "suffix"),
    CHAT: (*COMMON, "messages", "max_completion_tokens", "logprobs", "top_logprobs"),
}
DEFAULT_COMPLETION_TOKENS = 16  # OpenAI's default max_tokens for /v1/completions; chat: as many as fit
MAX_LOGPROBS = {COMPLETIONS: 5, CHAT: 20}  # the most alternatives per token: OpenAI's limits
MAX_MESSAGES = 1024
BYTES_PER_POSITION = 128  # a token's text in JSON, escaped, is far below this: a body's size from the positions


class OpenAIError(AttnzooError, ValueError):
    """A request answered with `status` and OpenAI's error body (type, param, code)."""

    def __init__(self, message: str, status: int = 400, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.param, self.code = status, param, code

    @property
    def kind(self) -> str:
        return {401: "authentication_error", 404: "not_found_error", 413: "invalid_request_error"}.get(
            self.status, "invalid_request_error" if self.status < 500 else "server_error"
        )

    def body(self) -> bytes:
        doc = {"error": {"message": str(self), "type": self.kind, "param": self.param, "code": self.code}}
        return json.dumps(doc).encode()


def max_body(max_positions: int, server_max_body: int) -> int:
    """A /v1 body's size limit: what a prompt of max_positions tokens can take as JSON, within the server's."""
    return min(server_max_body, 64 * 1024 + BYTES_PER_POSITION * max_positions)


@dataclass
class Ask:
    """One checked /v1 request: its prompt (text, or token ids), the knobs, and how to answer."""

    route: str
    max_tokens: int | None  # None: the chat default (as many as fit)
    prompt: str | None = None  # /v1/completions' text
    prompt_ids: list[int] | None = None  # /v1/completions' token ids
    messages: list[dict] | None = None  # /v1/chat/completions
    knobs: dict = field(default_factory=dict)  # temperature, top_p, seed, top_k, min_p, repetition_penalty
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    logprobs: int | None = None  # the alternatives listed per token (0: the chosen one only); None: no logprobs

    @property
    def chat(self) -> bool:
        return self.route == CHAT


def number(doc: dict, name: str, low: float, high: float | None = None, *, integer: bool = False):
    v = doc.get(name)
    if v is None:
        return None
    kinds = (int,) if integer else (int, float)
    if isinstance(v, bool) or not isinstance(v, kinds) or v < low or (high is not None and v > high):
        what = "an integer" if integer else "a number"
        span = f">= {low}" if high is None else f"in {low}..{high}"
        raise OpenAIError(f"{name}={v!r} must be {what} {span}", param=name)
    return v


def json_object(body: bytes, route: str, fields) -> dict:
    """A /v1 body as a JSON object holding only `fields`; OpenAIError (400) otherwise."""
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise OpenAIError(f"the body is not JSON ({type(e).__name__}: {str(e)[:80]})") from None
    except RecursionError:
        raise OpenAIError("the JSON body nests too deeply") from None
    if not isinstance(doc, dict):
        raise OpenAIError(f"the JSON body is a {type(doc).__name__}; send an object")
    extra = sorted(set(doc) - set(fields))
    if extra:
        raise OpenAIError(f"unknown field(s) {extra} for {route}", param=extra[0])
    return doc


def check_model(doc: dict, model: str) -> None:
    """A request's `model` must be the served one: 404 model_not_found for another name, 400 for none."""
    if doc.get("model") != model:
        raise OpenAIError(
            f"model={doc.get('model')!r}: this server runs {model!r} (GET /v1/models)",
            404 if isinstance(doc.get("model"), str) else 400,
            "model",
            "model_not_found",
        )


def parse(route: str, body: bytes, model: str) -> Ask:
    """Check one /v1 body for `route` (COMPLETIONS or CHAT) on the server of `model`; OpenAIError otherwise."""
    doc = json_object(body, route, FIELDS[route])
    check_model(doc, model)
    n = number(doc, "n", 1, integer=True)
    if n not in (None, 1):
        raise OpenAIError(f"n={n}: this server makes one choice per request (n=1)", param="n")
    if doc.get("best_of") not in (None, 1):
        raise OpenAIError(f"best_of={doc['best_of']!r}: only 1", param="best_of")
    if doc.get("echo") not in (None, False):
        raise OpenAIError(f"echo={doc['echo']!r} is not served here; leave it out", param="echo")
    if doc.get("suffix") is not None:
        raise OpenAIError("suffix is not served here; leave it out", param="suffix")
    stream = doc.get("stream") or False
    if not isinstance(stream, bool):
        raise OpenAIError(f"stream={stream!r} must be true or false", param="stream")
    options = doc.get("stream_options")
    if options is not None and (not isinstance(options, dict) or set(options) - {"include_usage"}):
        raise OpenAIError(f"stream_options={options!r}: only {{'include_usage': bool}}", param="stream_options")
    key = "max_completion_tokens" if doc.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = number(doc, key, 1, integer=True)
    if max_tokens is None and route == COMPLETIONS:
        max_tokens = DEFAULT_COMPLETION_TOKENS
    knobs = {
        "temperature": number(doc, "temperature", 0, 2),
        "top_p": number(doc, "top_p", 0, 1),
        "seed": number(doc, "seed", 0, 2**63 - 1, integer=True),
        "top_k": number(doc, "top_k", 0, integer=True),
        "min_p": number(doc, "min_p", 0, 1),
        "repetition_penalty": number(doc, "repetition_penalty", 0),
    }
    if knobs["top_p"] == 0:
        raise OpenAIError("top_p=0 keeps no token; give a value in (0, 1]", param="top_p")
    if knobs["repetition_penalty"] == 0:
        raise OpenAIError("repetition_penalty=0 must be > 0 (1 is off)", param="repetition_penalty")
    ask = Ask(
        route,
        max_tokens,
        knobs={k: v for k, v in knobs.items() if v is not None},
        stop=_stop(doc.get("stop")),
        stream=stream,
        include_usage=bool(options and options.get("include_usage")),
        logprobs=_logprobs(route, doc),
    )
    if route == CHAT:
        ask.messages = _messages(doc.get("messages"))
    else:
        ask.prompt, ask.prompt_ids = _prompt(doc.get("prompt"))
    return ask


def _logprobs(route: str, doc: dict) -> int | None:
    """How many alternatives to list per token, or None: completions' `logprobs` N (0..5), chat's `logprobs`
    true with `top_logprobs` N (0..20, only with it)."""
    most = MAX_LOGPROBS[route]
    if route == COMPLETIONS:
        return None if doc.get("logprobs") is False else number(doc, "logprobs", 0, most, integer=True)
    on = doc.get("logprobs")
    if on is not None and not isinstance(on, bool):  # 1 == True: a number is refused by its type
        raise OpenAIError(f"logprobs={on!r} must be true or false (top_logprobs N for alternatives)", param="logprobs")
    top = number(doc, "top_logprobs", 0, most, integer=True)
    if top is not None and not on:
        raise OpenAIError("top_logprobs needs logprobs=true", param="top_logprobs")
    return (top or 0) if on else None


def _stop(value) -> tuple[str, ...]:
    if value is None:
        return ()
    many = [value] if isinstance(value, str) else value
    if not isinstance(many, list) or len(many) > 4 or not all(isinstance(s, str) and s for s in many):
        raise OpenAIError(f"stop={value!r}: give a non-empty string or a list of up to 4", param="stop")
    return tuple(many)


def _prompt(value) -> tuple[str | None, list[int] | None]:
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
        value = value[0]  # one prompt in a list
    if isinstance(value, str):
        if not value:
            raise OpenAIError("prompt is empty; give some text", param="prompt")
        return value, None
    if isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return None, value
    raise OpenAIError(
        "prompt must be one non-empty string or one list of token ids (one prompt per request)", param="prompt"
    )


def _messages(value) -> list[dict]:
    if not isinstance(value, list) or not value:
        raise OpenAIError("messages must be a non-empty list of {role, content}", param="messages")
    if len(value) > MAX_MESSAGES:
        raise OpenAIError(f"{len(value)} messages; at most {MAX_MESSAGES} per request", param="messages")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise OpenAIError(f"messages[{i}] must be an object with a role", param="messages")
        content = m.get("content")
        if isinstance(content, list):  # content parts: the text ones, joined (as a text-only model reads them)
            if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
                raise OpenAIError(f"messages[{i}].content: only text parts are served", param="messages")
            content = "".join(str(p.get("text", "")) for p in content)
        if content is not None and not isinstance(content, str):
            raise OpenAIError(f"messages[{i}].content must be a string", param="messages")
        out.append({**m, "content": content or ""})
    return out


# -- answers ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenLogprob:
    """One new token's log-probability and its most likely alternatives (text, logprob, bytes), best first.

    `token` is the text the token adds to the answer in context and `raw` the bytes it adds to the answer's
    UTF-8 (chat's `bytes`; None where unknown): the entries' texts join to the answer's text, their bytes to
    its UTF-8."""

    token: str
    logprob: float
    raw: bytes | None = None
    top: tuple[tuple[str, float, bytes | None], ...] = ()


def _chat_entry(text: str, logprob: float, raw: bytes | None) -> dict:
    return {"token": text, "logprob": logprob, "bytes": None if raw is None else list(raw)}


class Answer:
    """The ids, times and names one request's answer and chunks share."""

    def __init__(self, ask: Ask, model: str, fingerprint: str, seed: int | None) -> None:
        self.ask, self.model, self.fingerprint, self.seed = ask, model, fingerprint, seed
        self.id = ("chatcmpl-" if ask.chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.offset = 0  # completions' text_offset: where the next token's text starts in the answer

    def _logprobs(self, entries: list[TokenLogprob] | None) -> dict | None:
        """OpenAI's logprobs object for these tokens (None where the request asked for none)."""
        if self.ask.logprobs is None:
            return None
        entries = entries or []
        if self.ask.chat:
            content = [
                {**_chat_entry(e.token, e.logprob, e.raw), "top_logprobs": [_chat_entry(*t) for t in e.top]}
                for e in entries
            ]
            return {"content": content, "refusal": None}
        offsets = []
        for e in entries:
            offsets.append(self.offset)
            self.offset += len(e.token)
        return {
            "tokens": [e.token for e in entries],
            "token_logprobs": [e.logprob for e in entries],
            # the N most likely and always the chosen one, as OpenAI lists them (up to N + 1), keyed by their
            # text: two tokens with the same text share one key (OpenAI's format, and vLLM's)
            "top_logprobs": [{**{t: lp for t, lp, _ in e.top}, e.token: e.logprob} for e in entries],
            "text_offset": offsets,
        }

    def _head(self, chunk: bool) -> dict:
        kind = "chat.completion" if self.ask.chat else "text_completion"
        head = {"id": self.id, "object": kind + (".chunk" if chunk and self.ask.chat else ""), "created": self.created}
        head.update(model=self.model, system_fingerprint=self.fingerprint)
        if self.seed is not None:
            head["seed"] = self.seed  # the request's, or the fresh one drawn for it: rerun it with this
        return head

    def _choice(self, text, finish, chunk: bool, first: bool = False, entries=None) -> dict:
        logprobs = None if first else self._logprobs(entries)
        if not self.ask.chat:
            return {"index": 0, "text": text or "", "logprobs": logprobs, "finish_reason": finish}
        if chunk:
            delta = {"role": "assistant", "content": text or ""} if first else ({"content": text} if text else {})
            return {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        message = {"role": "assistant", "content": text, "refusal": None}
        return {"index": 0, "message": message, "logprobs": logprobs, "finish_reason": finish}

    def whole(self, text: str, finish: str, usage: dict, entries: list[TokenLogprob] | None = None) -> bytes:
        doc = {**self._head(False), "choices": [self._choice(text, finish, False, entries=entries)], "usage": usage}
        return json.dumps(doc).encode()

    def chunk(
        self, text: str | None, finish: str | None = None, first: bool = False, entries: list | None = None
    ) -> bytes:
        """One stream chunk: its piece of text and the logprobs of the tokens made since the last chunk."""
        doc = {**self._head(True), "choices": [self._choice(text, finish, True, first, entries)]}
        if self.ask.include_usage:
            doc["usage"] = None
        return b"data: " + json.dumps(doc).encode() + b"\n\n"

    def usage_chunk(self, usage: dict) -> bytes:
        return b"data: " + json.dumps({**self._head(True), "choices": [], "usage": usage}).encode() + b"\n\n"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    total = prompt_tokens + completion_tokens
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": total}


async def read_limited(request, limit: int) -> bytes:
    """A /v1 request's body, refused (413) past `limit` bytes: by its declared length first, then as read."""
    declared = request.headers.get("content-length") or "0"
    if declared.isdigit() and int(declared) > limit:
        raise OpenAIError(f"the body is {declared} bytes; this endpoint takes at most {limit}", 413)
    body = await request.body()
    if len(body) > limit:
        raise OpenAIError(f"the body is {len(body)} bytes; this endpoint takes at most {limit}", 413)
    return body


def error_chunk(e: OpenAIError) -> bytes:
    return b"data: " + e.body() + b"\n\n"


DONE = b"data: [DONE]\n\n"


def models_list(model: str, created: int) -> bytes:
    entry = {"id": model, "object": "model", "created": created, "owned_by": "attnzoo"}
    return json.dumps({"object": "list", "data": [entry]}).encode()


__all__ = [
    "CHAT",
    "COMPLETIONS",
    "DONE",
    "EMBEDDINGS",
    "MODELS",
    "Answer",
    "Ask",
    "OpenAIError",
    "TokenLogprob",
    "check_model",
    "error_chunk",
    "json_object",
    "max_body",
    "models_list",
    "number",
    "parse",
    "read_limited",
    "usage",
]
