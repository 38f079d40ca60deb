"""Tool calling on /v1/chat/completions, as OpenAI defines it: `tools`, `tool_choice` (none, auto, required, a
named function, allowed_tools) and `parallel_tool_calls` checked; the model's text parsed into `tool_calls`
(ids, names, JSON arguments) by the parser of the format its chat template teaches, whole or as a stream; and
for `required` or a named function, the grammar that constrains decoding to calls whose arguments validate
against the function's parameter schema (runtime/constraints.py). Plain Python: no Ray, no torch.

The formats (vLLM's parsers of the same names):

    hermes       <tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>   (Qwen2.5, Qwen3, Hermes)
    llama3_json  {"name": "f", "parameters": {...}}, several joined by "; "        (Llama 3.1, 3.2, 3.3)
    mistral      [TOOL_CALLS][{"name": "f", "arguments": {...}}, ...]               (Mistral, Mixtral)

`parser_for(template source)` picks one from what the template writes (`serve --tool-call-parser` overrides).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, replace

from runtime.constraints import JSON_OPTIONS

from .common import OpenAIError

CHOICES = ("none", "auto", "required")


@dataclass(frozen=True)
class Tools:
    """A request's checked tools: the function definitions, what it asks of them, and the parser."""

    functions: tuple[dict, ...]  # {"name", "description"?, "parameters"?, "strict"?}
    choice: str  # none, auto, required, or "function" (the one named in `named`)
    named: str | None = None
    parallel: bool = True
    legacy: bool = False  # given as OpenAI's deprecated functions / function_call: answered as function_call

    @property
    def constrained(self) -> bool:
        """required or a named function: decoding is constrained to calls."""
        return self.choice in ("required", "function")

    def offered(self) -> list[dict]:
        """The tools as apply_chat_template(tools=...) takes OpenAI's: {"type": "function", "function": {...}}."""
        return [{"type": "function", "function": f} for f in self.functions]


def check(doc: dict) -> Tools | None:
    """tools, tool_choice and parallel_tool_calls of a chat body (or OpenAI's deprecated functions and
    function_call, as the tools they stand for, one call an answer); None where no tool is offered."""
    if doc.get("functions") or doc.get("function_call") not in (None, "none", "auto"):
        return _legacy(doc)
    tools, choice = doc.get("tools"), doc.get("tool_choice")
    parallel = doc.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise OpenAIError(f"parallel_tool_calls={parallel!r} must be true or false", param="parallel_tool_calls")
    if tools is None or tools == []:
        if choice not in (None, "none"):
            raise OpenAIError(f"tool_choice={choice!r} needs tools", param="tool_choice")
        return None
    if not isinstance(tools, list):
        raise OpenAIError("tools must be a list of {type: function, function: {name, parameters}}", param="tools")
    functions = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
            raise OpenAIError(f"tools[{i}] is a {kind!r} tool; only function tools are served", param="tools")
        f = tool.get("function")
        if not isinstance(f, dict) or not isinstance(f.get("name"), str) or not f["name"]:
            raise OpenAIError(f"tools[{i}].function needs a name", param="tools")
        if not isinstance(f.get("parameters", {}), dict):
            raise OpenAIError(f"tools[{i}].function.parameters must be a JSON schema object", param="tools")
        functions.append(f)
    names = [f["name"] for f in functions]
    if len(set(names)) != len(names):
        raise OpenAIError(f"tools name a function twice: {names}", param="tools")
    choice = "auto" if choice is None else choice
    if isinstance(choice, str):
        if choice not in CHOICES:
            raise OpenAIError(f"tool_choice={choice!r}: none, auto, required, or a named function", param="tool_choice")
        return Tools(tuple(functions), choice, None, parallel)
    if isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        allowed = choice.get("allowed_tools") or {}
        mode, listed = allowed.get("mode"), allowed.get("tools")
        if mode not in ("auto", "required") or not isinstance(listed, list):
            raise OpenAIError("tool_choice allowed_tools needs mode auto|required and tools", param="tool_choice")
        keep = {_named(t) for t in listed}
        if keep - set(names):
            raise OpenAIError(f"tool_choice allows {sorted(keep - set(names))}, not among tools", param="tool_choice")
        return Tools(tuple(f for f in functions if f["name"] in keep), mode, None, parallel)
    name = _named(choice)
    if name not in names:
        raise OpenAIError(f"tool_choice names {name!r}, which is not among tools {names}", param="tool_choice")
    return Tools(tuple(f for f in functions if f["name"] == name), "function", name, False)


def _legacy(doc: dict) -> Tools | None:
    functions, call = doc.get("functions"), doc.get("function_call")
    if doc.get("tools") or doc.get("tool_choice") is not None:
        raise OpenAIError(
            "give tools and tool_choice, or the deprecated functions and function_call", param="functions"
        )
    if not isinstance(functions, list) or not functions:
        raise OpenAIError(f"function_call={call!r:.60} needs functions", param="function_call")
    if isinstance(call, dict):
        if not isinstance(call.get("name"), str):
            raise OpenAIError(f"function_call={call!r:.60}: give {{name}}", param="function_call")
        call = {"type": "function", "function": {"name": call["name"]}}
    body = {"tools": [{"type": "function", "function": f} for f in functions], "tool_choice": call}
    found = check({**body, "parallel_tool_calls": False})
    return None if found is None else replace(found, legacy=True)


def _named(choice) -> str:
    f = choice.get("function") if isinstance(choice, dict) and choice.get("type") == "function" else None
    if not isinstance(f, dict) or not isinstance(f.get("name"), str):
        raise OpenAIError(
            f"tool_choice={choice!r:.80}: give {{type: function, function: {{name}}}}", param="tool_choice"
        )
    return f["name"]


def finish_reason(tools: Tools) -> str:
    """An answer of calls: "tool_calls" (OpenAI's deprecated functions: "function_call"); a named one "stop"."""
    return "stop" if tools.choice == "function" else ("function_call" if tools.legacy else "tool_calls")


def call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def as_call(name: str, arguments: str, index: int | None = None) -> dict:
    """One of OpenAI's tool_calls (a stream delta's carries its index)."""
    call = {"id": call_id(), "type": "function", "function": {"name": name, "arguments": arguments}}
    return call if index is None else {"index": index, **call}


# -- the formats ------------------------------------------------------------------------------------


def _call_of(doc, names, key: str) -> tuple[str, str] | None:
    """(name, arguments as JSON text) of one parsed call object, or None where it is not one."""
    if not isinstance(doc, dict) or not isinstance(doc.get("name"), str):
        return None
    args = doc.get(key, doc.get("arguments", doc.get("parameters", {})))
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict) or (names and doc["name"] not in names):
        return None
    return doc["name"], json.dumps(args, ensure_ascii=False)


def _json_values(text: str) -> list | None:
    """The JSON values of `text`, one after another, separated by whitespace or ";"; None if anything else."""
    decoder, out, at = json.JSONDecoder(), [], 0
    while True:
        while at < len(text) and text[at] in " \t\r\n;":
            at += 1
        if at == len(text):
            return out
        try:
            value, at = decoder.raw_decode(text, at)
        except ValueError:
            return None
        out.append(value)


def _schema(f: dict, key: str) -> dict:
    params = f.get("parameters") or {"type": "object"}
    props = {"name": {"const": f["name"]}, key: params}
    return {"type": "object", "properties": props, "required": ["name", key], "additionalProperties": False}


class Parser:
    """A format: `parse(text) -> (content or None, [(name, arguments)])`; `grammar(tools)` (lark for
    llguidance) for required / a named function; `opens(text)` whether a stream's text so far may be a call."""

    name = ""
    key = "arguments"

    def __init__(self, names=()) -> None:
        self.names = set(names)

    def calls_schema(self, tools: Tools) -> dict:
        return {"anyOf": [_schema(f, self.key) for f in tools.functions], "x-guidance": JSON_OPTIONS}

    def _json(self, schema: dict) -> str:
        return "%json " + json.dumps(schema)


class Hermes(Parser):
    name, OPEN, CLOSE = "hermes", "<tool_call>", "</tool_call>"

    def parse(self, text: str):
        calls, content, at = [], [], 0
        while (i := text.find(self.OPEN, at)) >= 0:
            j = text.find(self.CLOSE, i)
            body = text[i + len(self.OPEN) : j if j >= 0 else len(text)]
            values = _json_values(body)
            call = _call_of(values[0], self.names, self.key) if values and len(values) == 1 else None
            if call is None:
                break
            content.append(text[at:i])
            calls.append(call)
            at = len(text) if j < 0 else j + len(self.CLOSE)
        content.append(text[at:])
        rest = "".join(content)
        return (rest.strip() or None) if calls else text, calls

    def grammar(self, tools: Tools) -> str:
        call = '"<tool_call>\\n" ' + self._json(self.calls_schema(tools)) + ' "\\n</tool_call>"'
        more = ' ("\\n" call)*' if tools.parallel else ""
        return f"start: call{more}\ncall: {call}\n"

    def opens(self, text: str) -> bool:
        return any(text.endswith(self.OPEN[:k]) for k in range(1, len(self.OPEN) + 1)) or self.OPEN in text


class Llama3Json(Parser):
    name, key, TAG = "llama3_json", "parameters", "<|python_tag|>"

    def parse(self, text: str):
        body = text.strip()
        body = body[len(self.TAG) :] if body.startswith(self.TAG) else body
        values = _json_values(body) if body.startswith("{") else None
        calls = [_call_of(v, self.names, self.key) for v in values or []]
        if not values or None in calls:
            return text, []
        return None, calls

    def grammar(self, tools: Tools) -> str:
        more = ' ("; " call)*' if tools.parallel else ""
        return f"start: call{more}\ncall: {self._json(self.calls_schema(tools))}\n"

    def opens(self, text: str) -> bool:
        body = text.lstrip()
        return body == "" or body.startswith("{") or self.TAG.startswith(body) or body.startswith(self.TAG)


class Mistral(Parser):
    name, TAG = "mistral", "[TOOL_CALLS]"

    def parse(self, text: str):
        body = text.strip()
        body = body[len(self.TAG) :].lstrip() if body.startswith(self.TAG) else body
        values = _json_values(body) if body.startswith("[") else None
        items = values[0] if values and len(values) == 1 and isinstance(values[0], list) else None
        calls = [_call_of(v, self.names, self.key) for v in items or []]
        if not calls or None in calls:
            return text, []
        return None, calls

    def grammar(self, tools: Tools) -> str:
        schema = {"type": "array", "items": self.calls_schema(tools), "minItems": 1, "x-guidance": JSON_OPTIONS}
        if not tools.parallel:
            schema["maxItems"] = 1
        return f'start: "{self.TAG}" {self._json(schema)}\n'

    def opens(self, text: str) -> bool:
        body = text.lstrip()
        return body == "" or body.startswith("[") or self.TAG.startswith(body)


PARSERS = {p.name: p for p in (Hermes, Llama3Json, Mistral)}


def parser_for(template: str | None) -> str | None:
    """The parser a chat template's text asks for (what it tells the model to write), or None."""
    source = template or ""
    if "<tool_call>" in source:
        return "hermes"
    if "[TOOL_CALLS]" in source:
        return "mistral"
    if "<|python_tag|>" in source or '"parameters": dictionary of argument name' in source:
        return "llama3_json"
    return None


class CallStream:
    """A chat stream's text split into content and tool calls as it comes: `feed(piece)` and `end()` return
    events, ("content", text) or ("call", name, arguments). Text that may open a call is held until it does
    (a call is sent whole, once parsed) or cannot."""

    def __init__(self, parser: Parser, tools: Tools) -> None:
        self.parser, self.tools = parser, tools
        self.text, self.sent, self.calls = "", 0, 0  # all text so far; how much went out as content

    def feed(self, piece: str) -> list[tuple]:
        self.text += piece
        if isinstance(self.parser, Hermes):
            return self._hermes(final=False)
        if self.parser.opens(self.text):
            return []
        return self._content(len(self.text))

    def end(self) -> list[tuple]:
        if isinstance(self.parser, Hermes):
            return self._hermes(final=True)
        content, calls = self.parser.parse(self.text[self.sent :])
        if not calls:
            return self._content(len(self.text))
        return [("call", n, a) for n, a in self._cap(calls)] + ([("content", content)] if content else [])

    def _cap(self, calls):
        keep = calls if self.tools.parallel else calls[: max(0, 1 - self.calls)]
        self.calls += len(keep)
        return keep

    def _content(self, upto: int) -> list[tuple]:
        piece, self.sent = self.text[self.sent : upto], max(self.sent, upto)
        return [("content", piece)] if piece else []

    def _hermes(self, final: bool) -> list[tuple]:
        p, out = self.parser, []
        while True:
            rest = self.text[self.sent :]
            i = rest.find(p.OPEN)
            if i < 0:
                hold = 0 if final else next((k for k in range(len(p.OPEN) - 1, 0, -1) if rest.endswith(p.OPEN[:k])), 0)
                return out + self._content(len(self.text) - hold)
            start = self.sent + i
            if rest[:i].strip() or not self.calls:  # whitespace between calls is not content
                out += self._content(start)
            self.sent = start
            rest = self.text[start:]
            i = 0
            j = rest.find(p.CLOSE, i)
            if j < 0 and not final:
                return out
            end = len(rest) if j < 0 else j + len(p.CLOSE)
            _, calls = p.parse(rest[i:end])
            if not calls:
                return out + self._content(len(self.text)) if final or j >= 0 else out
            out += [("call", n, a) for n, a in self._cap(calls)]
            self.sent += end


__all__ = [
    "PARSERS",
    "CallStream",
    "Hermes",
    "Llama3Json",
    "Mistral",
    "Tools",
    "as_call",
    "check",
    "finish_reason",
    "parser_for",
]
