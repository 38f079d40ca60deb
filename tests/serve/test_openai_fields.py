"""Every field of OpenAI's completions and chat requests has an answer (serve/openai/fields.py), listed from the
`openai` package's own request types, and docs/serving.md prints the table; the fields applied here do what
OpenAI documents, through the real client against the routes in this process (tests/serve/openai_asgi.py): n
choices (with a seed, choice i is row i of one generate call of n copies), several prompts, echo, top_p 0 as
greedy, frequency/presence penalties against OpenAI's formula on transformers' logits, logit_bias."""

from __future__ import annotations

import asyncio
import json
import typing

import numpy as np
import openai_asgi
import pytest
from openai_lm import MODEL

from helpers import REPO
from runtime.generation import Generation
from serve.openai.fields import FATES, IGNORED, REFUSED, markdown_table
from serve.openai.protocol import CHAT, COMPLETIONS, OpenAIError, parse

openai = pytest.importorskip("openai")


def _openai_fields(route: str) -> set[str]:
    """The fields of the openai package's request types for `route` (its streaming variant adds `stream`)."""
    if route == CHAT:
        from openai.types.chat import completion_create_params as params
    else:
        from openai.types import completion_create_params as params
    fields = set(typing.get_type_hints(params.CompletionCreateParamsBase))
    return fields | set(typing.get_type_hints(params.CompletionCreateParamsStreaming))


@pytest.mark.parametrize("route", [COMPLETIONS, CHAT])
def test_every_field_of_openais_request_types_has_a_fate(route):
    fields = _openai_fields(route)
    assert "stream" in fields and ("messages" in fields) == (route == CHAT)
    missing = sorted(fields - set(FATES[route]) - {"stream"})
    assert not missing, f"fields of openai's {route} request with no answer in serve/openai/fields.py: {missing}"
    stale = sorted(set(FATES[route]) - fields)
    assert not stale, f"fields.py answers fields openai's {route} request does not have: {stale}"


def test_the_docs_print_the_fields_table():
    assert markdown_table() in (REPO / "docs" / "serving.md").read_text()


IGNORED_VALUES = {
    "user": "u-1",
    "metadata": {"k": "v"},
    "store": True,
    "service_tier": "flex",
    "prediction": {"type": "content", "content": "x"},
    "prompt_cache_key": "k",
    "prompt_cache_options": {"mode": "implicit"},
    "prompt_cache_retention": "24h",
    "safety_identifier": "s",
    "verbosity": "low",
}
REFUSED_VALUES = {
    "suffix": "b",
    "audio": {"voice": "alloy", "format": "wav"},
    "web_search_options": {},
    "moderation": {"model": "omni-moderation-latest"},
}


@pytest.mark.parametrize("route", [COMPLETIONS, CHAT])
def test_ignored_fields_are_accepted_and_refused_ones_name_themselves(route):
    base = {"model": MODEL, **({"messages": [{"role": "user", "content": "a"}]} if route == CHAT else {"prompt": "a"})}
    for name, fate in FATES[route].items():
        if fate[0] == IGNORED:
            parse(route, json.dumps({**base, name: IGNORED_VALUES[name]}).encode(), MODEL)
        elif fate[0] == REFUSED:
            with pytest.raises(OpenAIError) as e:
                parse(route, json.dumps({**base, name: REFUSED_VALUES[name]}).encode(), MODEL)
            assert e.value.param == name and e.value.status == 400
            parse(route, json.dumps({**base, name: None}).encode(), MODEL)  # null asks for nothing
    if route == CHAT:
        parse(
            route,
            json.dumps({**base, "modalities": ["text"], "stream_options": {"include_obfuscation": False}}).encode(),
            MODEL,
        )
        ask = parse(route, json.dumps({**base, "top_p": 0, "temperature": 0.9}).encode(), MODEL)
        assert ask.knobs == {"temperature": 0.9, "do_sample": False}  # top_p 0 keeps one token: greedy


USER = b'"model": "chat", "messages": [{"role": "user", "content": "a"}]'
TOOL = b'{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}'
BAD_CHAT = [
    (b"{" + USER + b', "modalities": ["text", "audio"]}', 400, "modalities"),
    (b"{" + USER + b', "audio": {"voice": "alloy", "format": "wav"}}', 400, "audio"),
    (b"{" + USER + b', "web_search_options": {}}', 400, "web_search_options"),
    (b"{" + USER + b', "functions": [{"name": "f"}], "tools": [' + TOOL + b"]}", 400, "functions"),
    (b"{" + USER + b', "function_call": {"name": "f"}}', 400, "function_call"),
    (b"{" + USER + b', "tools": [{"type": "custom", "custom": {"name": "g"}}]}', 400, "tools"),
    (b"{" + USER + b', "tools": [' + TOOL + b", " + TOOL + b"]}", 400, "tools"),
    (b"{" + USER + b', "tool_choice": "required"}', 400, "tool_choice"),
    (b"{" + USER + b', "tools": [' + TOOL + b'], "tool_choice": "sometimes"}', 400, "tool_choice"),
    (
        b"{" + USER + b', "tools": [' + TOOL + b'], "tool_choice": {"type": "function", "function": {"name": "g"}}}',
        400,
        "tool_choice",
    ),
    (
        b"{"
        + USER
        + b', "tools": ['
        + TOOL
        + b'], "tool_choice": "required", "response_format": {"type": "json_object"}}',
        400,
        "response_format",
    ),
    (b"{" + USER + b', "parallel_tool_calls": "no"}', 400, "parallel_tool_calls"),
    (b"{" + USER + b', "response_format": {"type": "xml"}}', 400, "response_format"),
    (
        b"{" + USER + b', "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": 5}}}',
        400,
        "response_format",
    ),
    (b"{" + USER + b', "reasoning_effort": 3}', 400, "reasoning_effort"),
    (b'{"model": "chat", "messages": []}', 400, "messages"),
    (b'{"model": "chat", "messages": [{"content": "a"}]}', 400, "messages"),
    (b'{"model": "chat", "messages": [{"role": "user", "content": 5}]}', 400, "messages"),
    (b'{"model": "chat", "prompt": "a", "messages": []}', 400, "prompt"),
    (b'{"model": "chat", "messages": [{"role": "user", "content": "a"}], "logprobs": 1}', 400, "logprobs"),
    (b'{"model": "chat", "messages": [{"role": "user", "content": "a"}], "top_logprobs": 2}', 400, "top_logprobs"),
    (
        b'{"model": "chat", "messages": [{"role": "user", "content": "a"}], "logprobs": true, "top_logprobs": 21}',
        400,
        "top_logprobs",
    ),
]


@pytest.mark.parametrize("body,status,param", BAD_CHAT, ids=[b[0].decode()[:40] for b in BAD_CHAT])
def test_a_bad_chat_request_is_an_openai_error(body, status, param):
    with pytest.raises(OpenAIError) as e:
        parse(CHAT, body, MODEL)
    assert e.value.status == status and e.value.param == param, str(e.value)


# -- applied, through the client ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def routes(sess, lm_path):
    return openai_asgi.front(sess, lm_path)


def _completions(routes, **kw):
    async def main():
        return await openai_asgi.client(routes).completions.create(model=MODEL, **kw)

    return asyncio.run(main())


def test_n_choices_with_a_seed_are_the_rows_of_one_generate_call(routes, sess, codec):
    ids = codec.encode("def main(")
    got = _completions(routes, prompt="def main(", max_tokens=10, n=3, temperature=0.9, seed=7)
    run = Generation(sess, [ids] * 3, 10, tokenizer=codec.tok, temperature=0.9, seed=7)
    run.run()
    assert [c.index for c in got.choices] == [0, 1, 2] and got.model_extra["seed"] == 7
    assert [c.text for c in got.choices] == run.texts and len(set(run.texts)) > 1
    one = _completions(routes, prompt="def main(", max_tokens=10, temperature=0.9, seed=7)
    assert one.choices[0].text == run.texts[0]  # choice 0 is the n=1 answer
    assert got.usage.completion_tokens == 30 and got.usage.prompt_tokens == len(ids)


def test_several_prompts_echo_and_top_p_zero(routes, sess, codec):
    prompts = ["def main(", "import os\n"]
    got = _completions(routes, prompt=prompts, max_tokens=6, n=2, echo=True, top_p=0, temperature=1.0)
    for i, choice in enumerate(got.choices):
        ids = codec.encode(prompts[i // 2])
        greedy = Generation(sess, [ids], 6, tokenizer=codec.tok)
        greedy.run()
        assert choice.index == i and choice.text == prompts[i // 2] + greedy.texts[0]  # echo; top_p 0 is greedy
    assert got.model_extra.get("seed") is None  # greedy: no seed drawn

    async def streamed():
        chunks = await openai_asgi.client(routes).completions.create(
            model=MODEL, prompt=prompts, max_tokens=6, echo=True, temperature=0, stream=True
        )
        return [c async for c in chunks]

    pieces = asyncio.run(streamed())
    for i in (0, 1):  # streamed: the prompt's text first, then the answer's pieces
        joined = "".join(c.choices[0].text for c in pieces if c.choices[0].index == i)
        assert joined == got.choices[2 * i].text


def _penalized_greedy(hf_lm, ids, steps, frequency, presence, bias=None):
    """Greedy under OpenAI's formula, step by step on transformers' logits of the same random LLaMA."""
    import torch

    out = list(ids)
    for _ in range(steps):
        with torch.no_grad():
            logits = hf_lm(torch.tensor([out])).logits[0, -1].double().numpy()
        made = out[len(ids) :]
        for j in set(made):
            logits[j] -= made.count(j) * frequency + presence
        for j, b in (bias or {}).items():
            logits[int(j)] += b
        out.append(int(np.argmax(logits)))
    return out[len(ids) :]


@pytest.mark.parametrize("frequency,presence", [(1.5, 0.0), (0.8, -0.5)])  # presence alone: test_penalties.py
def test_penalties_follow_openais_formula_on_the_models_logits(routes, codec, hf_lm, frequency, presence):
    ids = codec.encode("x = [1, 2")
    got = _completions(
        routes, prompt=ids, max_tokens=12, temperature=0, frequency_penalty=frequency, presence_penalty=presence
    )
    want = _penalized_greedy(hf_lm, ids, 12, frequency, presence)
    assert got.choices[0].text == codec.decode(want)
    plain = _completions(routes, prompt=ids, max_tokens=12, temperature=0)
    assert plain.choices[0].text != got.choices[0].text  # the penalties changed the answer


def test_logit_bias_moves_the_choice(routes, codec, hf_lm):
    ids = codec.encode("def main(")
    bias = {"65": 100}  # "A"
    got = _completions(routes, prompt=ids, max_tokens=5, temperature=1.0, seed=1, logit_bias=bias)
    assert got.choices[0].text == "AAAAA"
    banned = {str(t): -100 for t in _penalized_greedy(hf_lm, ids, 1, 0, 0)}
    got = _completions(routes, prompt=ids, max_tokens=4, temperature=0, logit_bias=banned)
    assert got.choices[0].text == codec.decode(_penalized_greedy(hf_lm, ids, 4, 0, 0, banned))


def test_best_of_answers_the_candidates_of_highest_mean_logprob(routes, sess, codec, hf_lm):
    """best_of 4, n 2: the candidates are the rows of one generate call of 4 copies (seeded); the two answered are
    those of highest mean log-probability per token under transformers' logits of the same model, best first."""
    import torch

    ids = codec.encode("def main(")
    got = _completions(routes, prompt="def main(", max_tokens=8, n=2, best_of=4, temperature=1.2, seed=11)
    run = Generation(sess, [ids] * 4, 8, tokenizer=codec.tok, temperature=1.2, seed=11)
    rows = run.run()[:, len(ids) :].tolist()
    means = []
    for new in rows:
        with torch.no_grad():
            logits = hf_lm(torch.tensor([ids + new])).logits[0].double()
        lp = torch.log_softmax(logits, -1)[len(ids) - 1 : -1]
        means.append(float(lp[torch.arange(len(new)), torch.tensor(new)].mean()))
    order = sorted(range(4), key=lambda r: -means[r])
    assert [c.text for c in got.choices] == [run.texts[r] for r in order[:2]], (means, run.texts)
    assert [c.index for c in got.choices] == [0, 1] and got.usage.completion_tokens == 32  # every candidate's
