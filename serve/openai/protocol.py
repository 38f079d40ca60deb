"""OpenAI's API for a whole model: the bodies of POST /v1/completions and /v1/chat/completions checked into an
`Ask`, the answers and stream chunks built as OpenAI writes them, and errors in OpenAI's format. Plain Python:
no Ray, no torch.

    {"model": "llama", "prompt": "def main(", "max_tokens": 16, "temperature": 0, "stop": ["\\n"]}
    {"model": "llama", "messages": [{"role": "user", "content": "Hi"}], "stream": true, "seed": 7}

OpenAI's `max_tokens` (and chat's newer `max_completion_tokens`) counts new tokens. Every field of OpenAI's
request types has its fate in serve/openai/fields.py (applied, ignored, refused). A request is refused with
{"error": {"message", "type", "param", "code"}} and a 4xx: 400 for a field it cannot take (audio output, an
unknown field, a prompt too long for the server: code "context_length_exceeded"), 401 for a missing or wrong
API key, 404 for another model's name or path, 413 for a body past the endpoint's size limit.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field

from . import fields, tools
from .common import CHAT, COMPLETIONS, EMBEDDINGS, MODELS, OpenAIError, number

EXTRAS = ("top_k", "min_p", "repetition_penalty")  # beyond OpenAI's fields, as vLLM takes them (extra_body)
DEFAULT_COMPLETION_TOKENS = 16  # OpenAI's default max_tokens for /v1/completions; chat: as many as fit
MAX_LOGPROBS = {COMPLETIONS: 5, CHAT: 20}  # the most alternatives per token: OpenAI's limits
MAX_MESSAGES = 1024
BYTES_PER_POSITION = 128  # a token's text in JSON, escaped, is far below this: a body's size from the positions


def max_body(max_positions: int, server_max_body: int) -> int:
    """A /v1 body's size limit: what a prompt of max_positions tokens can take as JSON, within the server's."""
    return min(server_max_body, 64 * 1024 + BYTES_PER_POSITION * max_positions)


@dataclass
class Ask:
    """One checked /v1 request: its prompt (text, or token ids), the knobs, and how to answer."""

    route: str
    max_tokens: int | None  # None: the chat default (as many as fit)
    prompt: str | None = None  # /v1/completions' text (the first prompt's)
    prompt_ids: list[int] | None = None  # /v1/completions' token ids (the first prompt's)
    messages: list[dict] | None = None  # /v1/chat/completions
    knobs: dict = field(default_factory=dict)  # temperature, top_p, seed, top_k, min_p, repetition_penalty
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    logprobs: int | None = None  # the alternatives listed per token (0: the chosen one only); None: no logprobs
    n: int = 1  # choices per prompt
    best_of: int = 1  # candidates per prompt (completions), the best n returned
    prompts: list = field(default_factory=list)  # completions: (text or None, ids or None) per prompt
    echo: bool = False  # completions: the prompt's text before each choice's
    penalties: dict = field(default_factory=dict)  # frequency_penalty, presence_penalty, logit_bias
    response_format: dict | None = None  # OpenAI's, checked by runtime/constraints.schema_of
    tools: object | None = None  # serve/openai/tools.Tools
    variables: dict = field(default_factory=dict)  # chat template variables (reasoning_effort)

    @property
    def chat(self) -> bool:
        return self.route == CHAT


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
    doc = json_object(body, route, (*fields.FATES[route], "stream", *EXTRAS))
    check_model(doc, model)
    fields.check_refused(doc, route)
    stream = doc.get("stream") or False
    if not isinstance(stream, bool):
        raise OpenAIError(f"stream={stream!r} must be true or false", param="stream")
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
    if knobs["top_p"] == 0:  # keeps the most likely token only: greedy, as transformers' TopPLogitsWarper reads it
        knobs.update(top_p=None, do_sample=False)
    if knobs["repetition_penalty"] == 0:
        raise OpenAIError("repetition_penalty=0 must be > 0 (1 is off)", param="repetition_penalty")
    ask = Ask(
        route,
        max_tokens,
        knobs={k: v for k, v in knobs.items() if v is not None},
        stop=_stop(doc.get("stop")),
        stream=stream,
        include_usage=fields.stream_options(doc),
        logprobs=_logprobs(route, doc),
        penalties=fields.penalties(doc),
    )
    ask.n, ask.best_of = fields.choices(doc, route)
    if route == CHAT:
        ask.messages = _messages(doc.get("messages"))
        ask.tools = tools.check(doc)
        ask.response_format = _response_format(doc.get("response_format"), ask.tools)
        effort = doc.get("reasoning_effort")
        if effort is not None:
            if not isinstance(effort, str):
                raise OpenAIError(f"reasoning_effort={effort!r} must be a string", param="reasoning_effort")
            ask.variables["reasoning_effort"] = effort
    else:
        ask.prompts = _prompts(doc.get("prompt"))
        ask.prompt, ask.prompt_ids = ask.prompts[0]
        echo = doc.get("echo") or False
        if not isinstance(echo, bool):
            raise OpenAIError(f"echo={echo!r} must be true or false", param="echo")
        if echo and ask.logprobs is not None:
            raise OpenAIError("echo with logprobs needs the prompt's logprobs, which are not made here", param="echo")
        ask.echo = echo
    return ask


def _response_format(value, offered) -> dict | None:
    """OpenAI's response_format, checked (runtime/constraints.schema_of); json with a forced tool call is refused."""
    if value is None:
        return None
    from runtime.constraints import ConstraintError, schema_of

    try:
        wanted = schema_of(response_format=value)
    except ConstraintError as e:
        raise OpenAIError(str(e), param="response_format") from None
    if wanted is not None and offered is not None and offered.constrained:
        raise OpenAIError(
            "response_format asks for JSON content while tool_choice asks for a tool call; give one",
            param="response_format",
        )
    return value if wanted is not None else None


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


MAX_PROMPTS = 128


def _prompts(value) -> list[tuple[str | None, list[int] | None]]:
    """(text, None) or (None, ids) per prompt: a string, a list of ids, or a list of either (several prompts)."""
    many = value if isinstance(value, list) and value and all(isinstance(v, (str, list)) for v in value) else [value]
    if len(many) > MAX_PROMPTS:
        raise OpenAIError(f"{len(many)} prompts; at most {MAX_PROMPTS} per request", param="prompt")
    return [_prompt(v) for v in many]


def _prompt(value) -> tuple[str | None, list[int] | None]:
    if isinstance(value, str):
        if not value:
            raise OpenAIError("prompt is empty; give some text", param="prompt")
        return value, None
    if isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return None, value
    raise OpenAIError("prompt must be a non-empty string or list of token ids, or a list of those", param="prompt")


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
        calls = m.get("tool_calls")
        if calls:  # an assistant's calls, their arguments as the objects chat templates write (as vLLM passes them)
            out.append({**m, "content": content, "tool_calls": _history_calls(calls, i)})
        else:
            out.append({**m, "content": content or ""})
    return out


def _history_calls(calls, i: int) -> list[dict]:
    if not isinstance(calls, list):
        raise OpenAIError(f"messages[{i}].tool_calls must be a list", param="messages")
    out = []
    for call in calls:
        f = call.get("function") if isinstance(call, dict) else None
        if not isinstance(f, dict) or not isinstance(f.get("name"), str):
            raise OpenAIError(f"messages[{i}].tool_calls: each needs function {{name, arguments}}", param="messages")
        args = f.get("arguments", "{}")
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError:
                raise OpenAIError(
                    f"messages[{i}].tool_calls: arguments {args!r:.40} are not JSON", param="messages"
                ) from None
        out.append({**call, "function": {**f, "arguments": args}})
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
    """The ids, times and names one request's answer and chunks share; its choices by index."""

    def __init__(self, ask: Ask, model: str, fingerprint: str, seed: int | None) -> None:
        self.ask, self.model, self.fingerprint, self.seed = ask, model, fingerprint, seed
        self.id = ("chatcmpl-" if ask.chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.offsets: dict[int, int] = {}  # completions' text_offset per choice: where its next token's text starts

    def _logprobs(self, index: int, entries: list[TokenLogprob] | None) -> dict | None:
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
        offsets, at = [], self.offsets.get(index, 0)
        for e in entries:
            offsets.append(at)
            at += len(e.token)
        self.offsets[index] = at
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

    def choice(self, index: int, text, finish, entries=None, tool_calls=None) -> dict:
        """A whole answer's choice: completions' text, or chat's message (its tool_calls where it made some)."""
        logprobs = self._logprobs(index, entries)
        if not self.ask.chat:
            return {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish}
        message = {"role": "assistant", "content": text, "refusal": None}
        if tool_calls:
            message.update(self._calls(tool_calls))
        return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish}

    def _calls(self, calls: list[dict]) -> dict:
        """{"tool_calls": calls}, or for OpenAI's deprecated functions {"function_call": {name, arguments}}."""
        if self.ask.tools is not None and self.ask.tools.legacy:
            return {"function_call": calls[0]["function"]}
        return {"tool_calls": calls}

    def whole(self, choices: list[dict], usage: dict) -> bytes:
        return json.dumps({**self._head(False), "choices": choices, "usage": usage}).encode()

    def chunk(
        self,
        text: str | None,
        finish: str | None = None,
        first: bool = False,
        entries: list | None = None,
        index: int = 0,
        tool_calls: list | None = None,
    ) -> bytes:
        """One stream chunk of choice `index`: its piece of text (chat: or its tool_calls deltas) and the
        logprobs of the tokens made since its last chunk."""
        logprobs = None if first else self._logprobs(index, entries)
        if not self.ask.chat:
            choice = {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish}
        else:
            delta = {"role": "assistant", "content": text or ""} if first else ({"content": text} if text else {})
            if tool_calls:
                delta.update(self._calls(tool_calls))
            choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        doc = {**self._head(True), "choices": [choice]}
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
