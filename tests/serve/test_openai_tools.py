"""Tool calling and structured output on /v1/chat/completions, with the real `openai` client against the routes
in this process (tests/serve/openai_asgi.py: an OpenAIFront over a continuous batcher, no Ray) on a random model
that would never write JSON by itself: every JSON-schema and forced tool-call answer parses and validates,
alone and among concurrent clients, streamed and not. The tool formats' parsers (whole and streamed) and the
tools and tool history as Qwen2.5's and Llama 3.2's templates render them, against transformers'."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import openai_asgi
import pytest
from openai_lm import MODEL

from helpers import REPO
from runtime.chat import ChatTemplate
from runtime.constraints import GrammarConstraint, lltokenizer
from serve.openai.protocol import CHAT, parse
from serve.openai.tools import PARSERS, CallStream, Tools, parser_for

pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("openai")
TEMPLATES = REPO / "tests" / "runtime" / "chat_templates"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 10}, "unit": {"enum": ["C", "F"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "integer", "minimum": -12, "maximum": 14}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
HISTORY = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather in Oslo?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "unit": "C"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": -3}'},
    {"role": "user", "content": "And the time there?"},
]


# -- the parsers -----------------------------------------------------------------------------------

PARSED = [
    (
        "hermes",
        '<tool_call>\n{"name": "get_time", "arguments": {"zone": 1}}\n</tool_call>',
        None,
        [("get_time", '{"zone": 1}')],
    ),
    (
        "hermes",
        'Sure.\n<tool_call>\n{"name": "get_time", "arguments": {"zone": 1}}\n</tool_call>\n<tool_call>\n'
        '{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "C"}}\n</tool_call>',
        "Sure.",
        [("get_time", '{"zone": 1}'), ("get_weather", '{"city": "Oslo", "unit": "C"}')],
    ),
    ("hermes", "<tool_call>\n{not json}\n</tool_call>", "<tool_call>\n{not json}\n</tool_call>", []),
    ("hermes", "no call here", "no call here", []),
    ("llama3_json", '{"name": "get_time", "parameters": {"zone": -2}}', None, [("get_time", '{"zone": -2}')]),
    (
        "llama3_json",
        '<|python_tag|>{"name": "get_time", "parameters": {"zone": 3}}; '
        '{"name": "get_time", "parameters": {"zone": 4}}',
        None,
        [("get_time", '{"zone": 3}'), ("get_time", '{"zone": 4}')],
    ),
    ("llama3_json", '{"weather": "nice"}', '{"weather": "nice"}', []),
    ("mistral", '[TOOL_CALLS][{"name": "get_time", "arguments": {"zone": 5}}]', None, [("get_time", '{"zone": 5}')]),
    ("mistral", "[1, 2]", "[1, 2]", []),
    ("mistral", "It is sunny.", "It is sunny.", []),
]


@pytest.mark.parametrize("name,text,content,calls", PARSED, ids=[f"{p[0]}-{i}" for i, p in enumerate(PARSED)])
def test_a_parser_reads_its_formats_calls_whole_and_streamed(name, text, content, calls):
    parser = PARSERS[name](PARAMS)
    assert parser.parse(text) == (content, calls)
    tools = Tools((WEATHER["function"], TIME["function"]), "auto")
    for size in (1, 3, 7, len(text)):  # the same events however the text is cut
        stream = CallStream(parser, tools)
        events = [e for i in range(0, len(text), size) for e in stream.feed(text[i : i + size])] + stream.end()
        got_calls = [(e[1], e[2]) for e in events if e[0] == "call"]
        got_text = "".join(e[1] for e in events if e[0] == "content")
        assert got_calls == calls, (size, events)
        assert got_text.strip() == (content or "").strip() if calls else got_text == text, (size, events)


def test_the_parser_is_chosen_from_the_template():
    assert parser_for((TEMPLATES / "qwen2.5-instruct.jinja").read_text()) == "hermes"
    assert parser_for((TEMPLATES / "llama3.2-instruct.jinja").read_text()) == "llama3_json"
    assert parser_for("{{ messages }}[TOOL_CALLS]") == "mistral"
    assert parser_for((TEMPLATES / "chatml-openhermes.jinja").read_text()) is None


@pytest.mark.parametrize("name", sorted(PARSERS))
@pytest.mark.parametrize("choice", ["required", "function", "required-single"])
def test_a_forced_call_under_random_logits_always_parses_and_validates(name, choice):
    """The grammar of required / a named function, over random logits (never a call by themselves): what comes
    out parses into calls of the offered functions whose arguments validate against their schemas."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(REPO / "models" / "tiny-stdlib-llama" / "tokenizer.json"))
    functions = (WEATHER["function"], TIME["function"])
    if choice == "function":
        tools = Tools(functions[1:], "function", "get_time", False)
    else:
        tools = Tools(functions, "required", None, parallel=choice == "required")
    parser = PARSERS[name]([f["name"] for f in tools.functions])
    constraint = GrammarConstraint(lltokenizer(tok, 259, [257]), parser.grammar(tools), rows=1, prompt_len=0)
    rng = np.random.default_rng(len(name) + len(choice))
    for _ in range(3):
        constraint = GrammarConstraint(constraint.tokenizer, parser.grammar(tools), rows=1, prompt_len=0)
        ids = np.zeros((1, 0), np.int64)
        for _ in range(600):
            token = constraint(ids, rng.standard_normal((1, 259)).astype(np.float32) * 3).argmax(-1)
            if token[0] == 257:
                break
            ids = np.concatenate([ids, token[:, None]], 1)
            constraint.follow(ids)
            if constraint.stopped():
                break
        text = tok.decode(ids[0].tolist())
        content, calls = parser.parse(text)
        assert calls and content is None, text
        assert len(calls) == 1 or tools.parallel
        for fname, args in calls:
            assert fname in [f["name"] for f in tools.functions]
            jsonschema.validate(json.loads(args), PARAMS[fname])


# -- the templates ---------------------------------------------------------------------------------


@pytest.mark.parametrize("template", ["qwen2.5-instruct", "llama3.2-instruct"])
def test_tools_and_the_tool_history_render_as_transformers_renders_them(template):
    """The request's tools reach the template as apply_chat_template(tools=...) passes them, and its history
    (an assistant's tool_calls, their arguments parsed from OpenAI's JSON text, and the tool's answer) renders as
    transformers renders the same messages."""
    from transformers import PreTrainedTokenizerFast

    source = (TEMPLATES / f"{template}.jinja").read_text()
    body = {"model": MODEL, "messages": HISTORY, "tools": [WEATHER, TIME], "tool_choice": "auto"}
    ask = parse(CHAT, json.dumps(body).encode(), MODEL)
    special = {"bos_token": "<s>", "eos_token": "</s>"}
    extra = {"date_string": "26 Jul 2024"}  # the Llama template's date, fixed for both
    ours = ChatTemplate(source, special).render(ask.messages, tools=ask.tools.offered(), **extra)
    hf = PreTrainedTokenizerFast(
        tokenizer_file=str(REPO / "models" / "tiny-stdlib-llama" / "tokenizer.json"), **special
    )
    theirs = hf.apply_chat_template(
        ask.messages, tools=[WEATHER, TIME], chat_template=source, tokenize=False, add_generation_prompt=True, **extra
    )
    assert ours == theirs
    assert '"name": "get_weather"' in ours and "get_time" in ours  # the tools are in the prompt
    assert ask.messages[2]["tool_calls"][0]["function"]["arguments"] == {"city": "Oslo", "unit": "C"}


# -- the routes, with the openai client --------------------------------------------------------------


@pytest.fixture(scope="module")
def routes(sess, lm_path):
    return openai_asgi.front(sess, lm_path, capacity=2048)


def _run(coro):
    return asyncio.run(coro)


async def _chat(client, stream: bool, **kw):
    """(content, [(name, arguments)], finish_reason) per choice, streamed or whole."""
    if not stream:
        got = await client.chat.completions.create(model=MODEL, **kw)
        return [
            (
                c.message.content,
                [(t.function.name, t.function.arguments) for t in c.message.tool_calls or []],
                c.finish_reason,
            )
            for c in got.choices
        ]
    chunks = [c async for c in await client.chat.completions.create(model=MODEL, stream=True, **kw)]
    out = {}
    for chunk in chunks:
        for c in chunk.choices:
            content, calls, finish = out.get(c.index, ("", [], None))
            content += c.delta.content or ""
            for t in c.delta.tool_calls or []:
                assert t.id.startswith("call_") and t.type == "function" and t.index == len(calls)
                calls = [*calls, (t.function.name, t.function.arguments)]
            out[c.index] = (content, calls, c.finish_reason or finish)
    return [out[i] for i in sorted(out)]


USER = [{"role": "user", "content": "Give me a person."}]
FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
KNOBS = [
    {},
    {"temperature": 1.0, "seed": 3, "presence_penalty": -1.0},
    {"temperature": 0.8, "top_p": 0.9, "seed": 4, "frequency_penalty": 0.5, "logit_bias": {"34": -5}},
    {"temperature": 1.5, "seed": 5, "extra_body": {"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.3}},
]


def test_json_schema_answers_parse_and_validate_alone_and_among_concurrent_clients(routes):
    """Each request with its own knobs, streamed and not, n=2, all at once on one continuous batch (each row its
    own constraint): every choice is a JSON document valid under the schema, finished by the grammar."""

    async def main():
        client = openai_asgi.client(routes)
        asks = [
            _chat(client, stream, messages=USER, response_format=FORMAT, max_tokens=120, n=2, **knobs)
            for stream in (False, True)
            for knobs in KNOBS
        ]
        # json_object: any object, which a random model writes without end (its keys are free text); a logit_bias
        # towards '"' and '}' (ids 34, 125) shortens them, composed with the grammar, which still decides
        short = {"34": 6, "125": 6}
        asks.append(
            _chat(
                client, False, messages=USER, response_format={"type": "json_object"}, max_tokens=320, logit_bias=short
            )
        )
        return await asyncio.gather(*asks)

    answers = _run(main())
    for choices in answers[:-1]:
        assert len(choices) == 2
        for content, calls, finish in choices:
            jsonschema.validate(json.loads(content), PERSON)
            assert finish == "stop" and not calls
    ((content, _, finish),) = answers[-1]
    assert finish == "stop" and isinstance(json.loads(content), dict), (finish, content)


@pytest.mark.parametrize("stream", [False, True])
def test_forced_tool_calls_parse_and_validate_streamed_or_not(routes, stream):
    """required (parallel and not) and a named function: every answer is tool calls of the offered functions,
    arguments valid under their schemas; auto leaves a random model's text as content."""

    async def main():
        client = openai_asgi.client(routes)
        tools = [WEATHER, TIME]
        named = {"type": "function", "function": {"name": "get_weather"}}
        asks = [
            _chat(client, stream, messages=HISTORY, tools=tools, tool_choice="required", max_tokens=200, **knobs)
            for knobs in KNOBS
        ]
        asks.append(
            _chat(
                client,
                stream,
                messages=HISTORY,
                tools=tools,
                tool_choice="required",
                parallel_tool_calls=False,
                max_tokens=200,
                seed=9,
                temperature=1.0,
            )
        )
        asks.append(
            _chat(
                client,
                stream,
                messages=HISTORY,
                tools=tools,
                tool_choice=named,
                max_tokens=200,
                n=2,
                seed=1,
                temperature=1.0,
            )
        )
        asks.append(_chat(client, stream, messages=HISTORY, tools=tools, max_tokens=8))
        return await asyncio.gather(*asks)

    *required, single, forced, auto = _run(main())
    for choices in [*required, single, forced]:
        for content, calls, _ in choices:
            assert calls and not content, (content, calls)
            for name, args in calls:
                jsonschema.validate(json.loads(args), PARAMS[name])
    assert all(len(c[1]) == 1 for c in single)
    assert all(c[2] == "tool_calls" for choices in [*required, single] for c in choices)
    assert len(forced) == 2 and all(c[1][0][0] == "get_weather" and c[2] == "stop" for c in forced)
    ((content, calls, finish),) = auto
    assert not calls and content and finish == "length"


def test_tool_choice_none_shows_the_tools_and_parses_no_call(routes):
    """tool_choice none: the prompt holds the tools as auto's does (vLLM's default: its
    exclude_tools_when_tool_choice_none is off), so it is as long as auto's and longer than the same messages
    without tools; the answer is content, never a call."""

    async def main():
        client = openai_asgi.client(routes)
        asks = [{"tools": [WEATHER, TIME], "tool_choice": c} for c in ("none", "auto")] + [{}]
        return await asyncio.gather(
            *(client.chat.completions.create(model=MODEL, messages=HISTORY, max_tokens=4, **kw) for kw in asks)
        )

    none, auto, bare = _run(main())
    assert none.usage.prompt_tokens == auto.usage.prompt_tokens > bare.usage.prompt_tokens
    assert none.choices[0].message.tool_calls is None and none.choices[0].message.content


def test_the_tool_call_parser_can_be_named(sess, lm_path):
    """serve --tool-call-parser: llama3_json over Qwen2.5's template, which teaches hermes; a forced call is then
    written and read in Llama 3.1's JSON."""
    routes = openai_asgi.front(sess, lm_path, capacity=2048, tool_call_parser="llama3_json")
    assert routes.tool_parser == "llama3_json" and openai_asgi.front(sess, lm_path).tool_parser == "hermes"

    async def main():
        client = openai_asgi.client(routes)
        return await _chat(client, False, messages=HISTORY, tools=[TIME], tool_choice="required", max_tokens=80)

    ((content, calls, finish),) = _run(main())
    assert content is None and calls[0][0] == "get_time" and finish == "tool_calls"
    jsonschema.validate(json.loads(calls[0][1]), PARAMS["get_time"])


@pytest.mark.parametrize("stream", [False, True])
def test_openais_deprecated_functions_answer_as_a_function_call(routes, stream):
    """functions and function_call (OpenAI's older form of tools): the same forced call, answered as
    message.function_call (a stream's delta.function_call), finish_reason function_call, or stop when named."""

    async def main():
        client = openai_asgi.client(routes)
        kw = {"model": MODEL, "messages": HISTORY, "functions": [TIME["function"]], "max_tokens": 120}
        named = await client.chat.completions.create(function_call={"name": "get_time"}, stream=stream, **kw)
        return [c async for c in named] if stream else named

    got = _run(main())
    if stream:
        calls = [c.choices[0].delta.function_call for c in got if c.choices and c.choices[0].delta.function_call]
        finish = [c.choices[0].finish_reason for c in got if c.choices][-1]
        assert len(calls) == 1 and not any(c.choices[0].delta.tool_calls for c in got if c.choices)
        call = calls[0]
    else:
        message, finish = got.choices[0].message, got.choices[0].finish_reason
        assert message.tool_calls is None and message.content is None
        call = message.function_call
    assert call.name == "get_time" and finish == "stop"
    jsonschema.validate(json.loads(call.arguments), PARAMS["get_time"])
    auto = parse(
        CHAT, json.dumps({"model": MODEL, "messages": HISTORY, "functions": [TIME["function"]]}).encode(), MODEL
    )
    assert auto.tools.legacy and auto.tools.choice == "auto" and not auto.tools.parallel
