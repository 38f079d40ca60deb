"""OpenAI's API on a whole-model server: the request checks (plain), each request's text through continuous
batching equal to `Generation` of the request alone (greedy and seeded, with stop strings and an eos id), a
stream that leaves giving its row back, then the real `openai` client against a real `attnzoo serve` app:
models, completions, chat (the export's chat template), streaming, bad requests, a wrong key, /healthz open.

One export (a random LLaMA over tiny-stdlib-llama's byte tokenizer, vocabulary 259, with a chat template of
our own) and one Ray Serve app serve the whole module. Its generation_config has no eos id, so a run goes on
to its max_tokens unless a stop string ends it (an eos id is tested on the batcher).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from helpers import REPO, free_port, served
from runtime.chat import ChatTemplate
from runtime.generation import Generation, lm_vocab
from runtime.sampling import Sampler, resolve
from runtime.session import OnnxSession
from runtime.stopping import Codec, RowText
from serve.generate.continuous import ContinuousBatcher
from serve.generate.protocol import GenItem
from serve.openai.protocol import CHAT, COMPLETIONS, OpenAIError, max_body, parse
from serve.openai.serving import TextRun, text_files

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "peers"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import lm_cases  # noqa: E402 - randomize: every parameter random
from ops_http import check_operations  # noqa: E402 - tests/serve: the operations through HTTP

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # Ray Serve's pydantic models
TEMPLATE = (  # our own: a role tag per message, the assistant's tag as the generation prompt
    "{{ bos_token }}{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
MODEL = "chat"
KEY = "test-key-0123"


@pytest.fixture(scope="module")
def hf_lm():
    """The random LLaMA the server runs, in transformers (the eager reference for logprobs)."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=259,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    config._attn_implementation = "eager"
    return lm_cases.randomize(transformers.LlamaForCausalLM(config), seed=0).eval()


@pytest.fixture(scope="module")
def lm_path(tmp_path_factory, hf_lm) -> Path:
    """chat.onnx with its chat.tokenizer.json and chat.tokenizer_config.json beside it (as export --whole
    writes them)."""
    from export.lm_export import export_lm
    from peers.lm import lm_from_hf

    hf = hf_lm
    folder = tmp_path_factory.mktemp("openai")
    out = folder / f"{MODEL}.onnx"
    export_lm(lm_from_hf(hf).eval(), out, generation_config={"pad_token_id": 258})
    shutil.copy(REPO / "models" / "tiny-stdlib-llama" / "tokenizer.json", folder / f"{MODEL}.tokenizer.json")
    config_doc = {"bos_token": "<s>", "eos_token": "</s>", "chat_template": TEMPLATE}
    (folder / f"{MODEL}.tokenizer_config.json").write_text(json.dumps(config_doc))
    return out


@pytest.fixture(scope="module")
def sess(lm_path):
    return OnnxSession(lm_path, provider="cpu", verbose=False)


@pytest.fixture(scope="module")
def codec(lm_path):
    return Codec(str(lm_path.with_name(f"{MODEL}.tokenizer.json")))


def _alone(sess, codec, ids, max_tokens, stop=(), **knobs):
    """(text, finish_reason, tokens made) of the request run alone by OnnxSession's Generation."""
    run = Generation(sess, [ids], max_tokens, tokenizer=codec.tok, stop=list(stop) or None, **knobs)
    run.run()
    return run.texts[0], run.finish_reason[0], run.made


# -- requests ------------------------------------------------------------------------------------

BAD = [
    (b"{not json", 400, None, None),
    (b"[]", 400, None, None),
    (b'{"model": "other", "prompt": "a"}', 404, "model", "model_not_found"),
    (b'{"prompt": "a"}', 400, "model", "model_not_found"),
    (b'{"model": "chat", "prompt": "a", "n": 2}', 400, "n", None),
    (b'{"model": "chat", "prompt": "a", "max_tokens": 0}', 400, "max_tokens", None),
    (b'{"model": "chat", "prompt": "a", "max_tokens": true}', 400, "max_tokens", None),
    (b'{"model": "chat", "prompt": "a", "temperature": 3}', 400, "temperature", None),
    (b'{"model": "chat", "prompt": "a", "top_p": 0}', 400, "top_p", None),
    (b'{"model": "chat", "prompt": "a", "seed": -1}', 400, "seed", None),
    (b'{"model": "chat", "prompt": "a", "stop": ""}', 400, "stop", None),
    (b'{"model": "chat", "prompt": "a", "stop": ["a", "b", "c", "d", "e"]}', 400, "stop", None),
    (b'{"model": "chat", "prompt": "a", "stream": "yes"}', 400, "stream", None),
    (b'{"model": "chat", "prompt": "a", "logprobs": 6}', 400, "logprobs", None),
    (b'{"model": "chat", "prompt": "a", "logprobs": true}', 400, "logprobs", None),
    (b'{"model": "chat", "prompt": "a", "echo": true}', 400, "echo", None),
    (b'{"model": "chat", "prompt": "a", "frequency_penalty": 1}', 400, "frequency_penalty", None),
    (b'{"model": "chat", "prompt": ["a", "b"]}', 400, "prompt", None),
    (b'{"model": "chat", "prompt": ""}', 400, "prompt", None),
    (b'{"model": "chat", "messages": [{"role": "user", "content": "a"}]}', 400, "messages", None),
]
BAD_CHAT = [
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


@pytest.mark.parametrize("body,status,param,code", BAD, ids=[b[0].decode()[:40] for b in BAD])
def test_a_bad_completions_request_is_an_openai_error(body, status, param, code):
    with pytest.raises(OpenAIError) as e:
        parse(COMPLETIONS, body, MODEL)
    doc = json.loads(e.value.body())["error"]
    assert e.value.status == status and doc["param"] == param and doc["code"] == code, doc
    assert doc["type"] in ("invalid_request_error", "not_found_error") and "\n" not in doc["message"]


@pytest.mark.parametrize("body,status,param", BAD_CHAT, ids=[b[0].decode()[:40] for b in BAD_CHAT])
def test_a_bad_chat_request_is_an_openai_error(body, status, param):
    with pytest.raises(OpenAIError) as e:
        parse(CHAT, body, MODEL)
    assert e.value.status == status and e.value.param == param, str(e.value)


def test_a_request_parses_to_its_fields():
    body = b'{"model": "chat", "prompt": ["hi"], "stop": "\\n", "seed": 4, "temperature": 0.5}'
    ask = parse(COMPLETIONS, body, MODEL)
    assert (ask.prompt, ask.max_tokens, ask.stop, ask.knobs) == ("hi", 16, ("\n",), {"seed": 4, "temperature": 0.5})
    assert parse(COMPLETIONS, b'{"model": "chat", "prompt": [5, 6]}', MODEL).prompt_ids == [5, 6]
    doc = {"model": "chat", "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}]}
    doc.update(max_completion_tokens=7, stream=True, stream_options={"include_usage": True})
    ask = parse(CHAT, json.dumps(doc).encode(), MODEL)
    assert ask.messages[0]["content"] == "a" and ask.max_tokens == 7 and ask.stream and ask.include_usage
    assert parse(CHAT, b'{"model": "chat", "messages": [{"role": "user", "content": "a"}]}', MODEL).max_tokens is None
    assert max_body(1000, 10**9) == 64 * 1024 + 128 * 1000 and max_body(10**6, 5000) == 5000
    # logprobs: the alternatives per token, None for none (completions: N; chat: true, with top_logprobs N)
    user = '"messages": [{"role": "user", "content": "a"}]'
    for route, fields, want in [
        (COMPLETIONS, '"prompt": "a"', None),
        (COMPLETIONS, '"prompt": "a", "logprobs": 0', 0),
        (COMPLETIONS, '"prompt": "a", "logprobs": 5', 5),
        (COMPLETIONS, '"prompt": "a", "logprobs": false', None),
        (CHAT, user + ', "logprobs": false', None),
        (CHAT, user + ', "logprobs": true', 0),
        (CHAT, user + ', "logprobs": true, "top_logprobs": 20', 20),
    ]:
        assert parse(route, ('{"model": "chat", ' + fields + "}").encode(), MODEL).logprobs == want, fields


def test_text_files_are_the_exports_own_copies_else_the_folders(lm_path, tmp_path):
    assert set(text_files(lm_path)) == {"tokenizer.json", "tokenizer_config.json"}
    assert set(text_files(REPO / "models" / "tiny-stdlib-llama")) == {"tokenizer.json", "tokenizer_config.json"}
    assert text_files(tmp_path / "none.onnx") == {}


# -- continuous batching, no Ray -----------------------------------------------------------------


def _submit_all(batcher, runs):
    async def main():
        return await asyncio.gather(*(batcher.submit(it) for it in runs))

    return asyncio.run(main())


def _text_item(sess, codec, ids, max_tokens, stop=(), eos=(), logprobs=None, **knobs):
    params = resolve(knobs, {"pad_token_id": 258})
    pieces: list[str] = []
    sampler = Sampler(params, np.asarray([ids]), None, 259)
    emit = lambda piece, finish: pieces.append(piece)  # noqa: E731
    run = TextRun(sampler, eos, RowText(codec, stop), max_tokens, emit, logprobs)
    return GenItem(ids=np.asarray([ids], np.int64), max_new_tokens=max_tokens, decoder=run), pieces


def test_each_text_request_in_a_batch_gets_its_text_alone(sess, codec):
    """Greedy, seeded (two seeds) and with a stop string taken from the greedy text, side by side in one
    continuous batch: each request's text, finish reason and token count equal its Generation alone, and its
    streamed pieces join to its text."""
    prompts = [codec.encode(p) for p in ("def main(", "import os\n", "x = [1, 2")]
    greedy, _, _ = _alone(sess, codec, prompts[0], 24)
    stop = greedy[5:8]
    cases = [
        (prompts[0], 24, (), {}),
        (prompts[1], 20, (), {"temperature": 0.9, "seed": 11}),
        (prompts[2], 16, (), {"temperature": 1.0, "top_p": 0.9, "seed": 5}),
        (prompts[0], 24, (stop,), {}),
    ]
    items = [_text_item(sess, codec, ids, n, stop, **knobs) for ids, n, stop, knobs in cases]
    answers = _submit_all(ContinuousBatcher(sess, max_rows=3, capacity=64), [it for it, _ in items])
    for (ids, n, stop, knobs), (it, pieces), (tokens, _) in zip(cases, items, answers):
        text, finish, made = _alone(sess, codec, ids, n, stop, **knobs)
        run = it.decoder
        assert (run.row.text, run.finish, run.made) == (text, finish, made), (knobs, stop)
        assert "".join(pieces) == text and tokens.shape[1] == len(ids) + made
    assert items[3][0].decoder.finish == "stop" and items[0][0].decoder.finish == "length"


def _eager_logprobs(hf_lm, ids: list[int], new: list[int]) -> np.ndarray:
    """(new vocab): transformers' log_softmax of its logits at each new token's step (float64)."""
    import torch

    with torch.no_grad():
        logits = hf_lm(torch.tensor([ids + new])).logits[0].double()
    return torch.log_softmax(logits, -1)[len(ids) - 1 : len(ids) - 1 + len(new)].numpy()


def _check_logprobs(hf_lm, text, ids, new, chosen, top=None, n=0):
    """chosen[i] (text, logprob) and top[i] [(text, logprob)] of each new token against transformers'; the
    chosen tokens' texts (each read in context) join to the answer's `text`."""
    want = _eager_logprobs(hf_lm, ids, new)
    assert len(chosen) == len(new) and "".join(t for t, _ in chosen) == text, (chosen, text)
    for i, token in enumerate(new):
        assert abs(chosen[i][1] - want[i, token]) < 1e-4, (i, chosen[i], want[i, token])
        if top is None:
            continue
        best = np.sort(want[i])[::-1][:n]
        assert len(top[i]) == n and np.allclose([lp for _, lp in top[i]], best, atol=1e-4, rtol=0), (top[i], best)


def test_logprobs_are_the_models_log_softmax_before_the_knobs(sess, codec, hf_lm):
    """Sampled at temperature 1.3 with top_k, in a batch beside another request: each token's logprob and its
    three alternatives are transformers' log_softmax of the model's logits (the knobs change the draw, not
    the logprobs); an eos that ends the run is not listed."""
    ids = codec.encode("def main(")
    sampled, _ = _text_item(sess, codec, ids, 8, logprobs=3, temperature=1.3, top_k=40, seed=3)
    beside, _ = _text_item(sess, codec, codec.encode("import os\n"), 12)
    tokens, _ = _submit_all(ContinuousBatcher(sess, max_rows=2, capacity=64), [sampled, beside])[0]
    new = tokens[0, len(ids) :].tolist()
    run = sampled.decoder
    chosen, top = [(e.token, e.logprob) for e in run.entries], [e.top for e in run.entries]
    _check_logprobs(hf_lm, run.row.text, ids, new, chosen, [[t[:2] for t in e] for e in top], 3)
    assert beside.decoder.entries == []  # asked for none

    ends, _ = _text_item(sess, codec, ids, 8, eos=(new[2],), logprobs=0, temperature=1.3, top_k=40, seed=3)
    _submit_all(ContinuousBatcher(sess, max_rows=1, capacity=64), [ends])
    assert ends.decoder.made == 3 and len(ends.decoder.entries) == 2
    assert "".join(e.token for e in ends.decoder.entries) == ends.decoder.row.text
    assert all(e.top == () for e in ends.decoder.entries)


def test_a_ruled_out_tokens_logprob_is_a_number_json_can_carry(sess, codec):
    """A -inf logit (a token the model rules out) has logprob -inf, which JSON cannot write: it is -9999.0, as
    vLLM writes it, in the token's entry and among the alternatives."""
    import json

    from serve.openai.serving import LOGPROB_FLOOR

    it, _ = _text_item(sess, codec, codec.encode("def main("), 4, logprobs=5)
    logits = np.zeros((1, lm_vocab(sess)), np.float32)
    logits[0, 7:] = -np.inf
    it.decoder.choose(logits, np.array([0]))
    entry = it.decoder._entry(9)
    assert entry.logprob == LOGPROB_FLOOR and all(np.isfinite(lp) for _, lp, _ in entry.top)
    json.dumps([entry.logprob, *(lp for _, lp, _ in entry.top)], allow_nan=False)


def test_an_eos_id_ends_a_text_request(sess, codec):
    ids = codec.encode("def main(")
    want = Generation(sess, [ids], 12).run()[0, len(ids) :]
    eos = int(want[4])
    it, _ = _text_item(sess, codec, ids, 12, eos=(eos,))
    _submit_all(ContinuousBatcher(sess, max_rows=2, capacity=32), [it])
    assert it.decoder.finish == "stop" and it.decoder.made == int(np.argmax(want == eos)) + 1


def test_a_cancelled_request_gives_its_row_back_at_the_next_step(sess, codec):
    """A stream whose client left (decoder.cancelled) leaves the batch before the next step; the request
    beside it goes on to its own text."""
    ids = codec.encode("def main(")
    gone, _ = _text_item(sess, codec, ids, 40)
    stays, _ = _text_item(sess, codec, ids, 30)
    batcher = ContinuousBatcher(sess, max_rows=2, capacity=64)
    emit = gone.decoder.emit

    def leave_after_three(piece, finish):
        emit(piece, finish)
        if gone.decoder.made == 3:
            gone.decoder.cancelled = True

    gone.decoder.emit = leave_after_three
    (left, _), (tokens, _) = _submit_all(batcher, [gone, stays])
    assert left.shape[1] == len(ids) + 3 and gone.decoder.finish is None
    assert stays.decoder.row.text == _alone(sess, codec, ids, 30)[0] and tokens.shape[1] == len(ids) + 30
    assert batcher.used == 0 and not batcher.running and batcher.left == 1


# -- the real openai client against a real server ---------------------------------------------------


@pytest.fixture(scope="module")
def server(lm_path):
    """`attnzoo serve chat.onnx` in a process group of its own (as a terminal runs it), its key from the
    environment, the old --max-tokens spelling, a bounded queue and an access log beside the model (ops_http.py);
    yields (url, process). Killed at the end if still running."""
    pytest.importorskip("openai")
    pytest.importorskip("ray")
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "ATTNZOO_API_KEY": KEY}
    flags = ["--port", str(port), "--max-batch", "4", "--max-new-tokens", "3000", "--capacity", "3072"]
    flags += ["--max-waiting", "2", "--request-timeout", "600", "--access-log", str(lm_path.with_name("access.log"))]
    cmd = [sys.executable, "-m", "cli", "serve", str(lm_path), *flags, "--threads", "1", "--max-tokens", "9000"]
    yield from served(cmd, env, port)


def test_the_openai_client_against_a_server(server, sess, codec, lm_path, hf_lm, capsys, monkeypatch):
    """One test for the one server (pytest-xdist keeps it on one worker): models, completions and chat equal to
    each request alone, streaming (the pieces join to the text, usage last), a bad request and a wrong key as
    the client's own exceptions, an open /healthz, a stream that leaves giving its row back long before its
    max_tokens; then Ctrl-C to the server's process group, as a terminal sends it: a quiet, clean stop."""
    import openai

    from cli.main import main
    from serve import Client
    from serve.loadtest.chat import chat_loadtest

    monkeypatch.setenv("ATTNZOO_API_KEY", KEY)  # for `attnzoo loadtest --chat`
    url, proc, started = server
    assert started[0].startswith("starting Ray Serve") and started[-1].startswith(f"ready: serving {lm_path}")
    client = openai.OpenAI(base_url=url + "v1", api_key=KEY, max_retries=0)
    assert [m.id for m in client.models.list().data] == [MODEL]

    ids = codec.encode("def main(")
    text, finish, made = _alone(sess, codec, ids, 12)
    got = client.completions.create(model=MODEL, prompt="def main(", max_tokens=12, temperature=0)
    assert (got.choices[0].text, got.choices[0].finish_reason) == (text, finish)
    assert (got.usage.prompt_tokens, got.usage.completion_tokens) == (len(ids), made)
    got = client.completions.create(model=MODEL, prompt=ids, max_tokens=12, stop=[text[3:6]])
    assert got.choices[0].text == text[: text.index(text[3:6])] and got.choices[0].finish_reason == "stop"
    # OpenAI's stop looks at the completion alone: one begun in the prompt (its last character and the first new
    # one, found nowhere in the completion) does not end it; generate's, as transformers' stop_strings, ends after
    # the first token
    run = Generation(sess, [ids], 12).run()[0].tolist()
    for at in range(len(ids), len(run)):  # the first such pair of printable bytes
        longer, spanning = run[:at], bytes(run[at - 1 : at + 1]).decode("latin-1")
        whole = _alone(sess, codec, longer, 8)[0]
        if all(32 <= t < 127 for t in run[at - 1 : at + 1]) and spanning not in whole:
            break
    else:
        pytest.fail(f"no stop string to try in {run}")
    got = client.completions.create(model=MODEL, prompt=longer, max_tokens=8, stop=[spanning]).choices[0]
    assert (got.text, got.finish_reason) == (whole, "length")
    assert _alone(sess, codec, longer, 8, stop=[spanning])[1:] == ("stop", 1)

    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    rendered = ChatTemplate(TEMPLATE, {"bos_token": "<s>"}).render(messages)
    chat_ids = codec.encode(rendered)
    want = _alone(sess, codec, chat_ids, 10, temperature=0.8, seed=7)
    got = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, temperature=0.8, seed=7)
    assert (got.choices[0].message.content, got.choices[0].finish_reason) == want[:2]
    assert got.usage.prompt_tokens == len(chat_ids) and got.model_extra["seed"] == 7
    fresh = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, temperature=0.8)
    reseeded = _alone(sess, codec, chat_ids, 10, temperature=0.8, seed=fresh.model_extra["seed"])
    assert fresh.choices[0].message.content == reseeded[0]  # the fresh seed it reports reproduces it

    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=10, temperature=0.8, seed=7, stream=True,
            stream_options={"include_usage": True},
        )
    )  # fmt: skip
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[-1].usage.completion_tokens == want[2]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want[0]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == want[1]
    pieces = [c.choices[0].text for c in client.completions.create(model=MODEL, prompt=ids, max_tokens=12, stream=True)]
    assert "".join(pieces) == text

    # logprobs: transformers' log_softmax of the logits (to 1e-4), the chosen token always listed
    new = Generation(sess, [ids], 6).run()[0, len(ids) :].tolist()
    choice = client.completions.create(model=MODEL, prompt=ids, max_tokens=6, temperature=0, logprobs=2).choices[0]
    lp = choice.logprobs
    _check_logprobs(hf_lm, choice.text, ids, new, list(zip(lp.tokens, lp.token_logprobs)))
    assert all(top[t] == v and len(top) <= 3 for top, t, v in zip(lp.top_logprobs, lp.tokens, lp.token_logprobs))
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    cut = client.completions.create(model=MODEL, prompt=ids, max_tokens=12, stop=[text[3:6]], logprobs=0).choices[0]
    assert "".join(cut.logprobs.tokens) == cut.text == text[: text.index(text[3:6])]  # the stop's tokens left out
    sampled = Generation(sess, [chat_ids], 10, temperature=0.8, seed=7).run()[0, len(chat_ids) :].tolist()
    stream = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=10, temperature=0.8, seed=7, stream=True, logprobs=True,
        top_logprobs=2,
    )  # fmt: skip
    chunks = [c.choices[0] for c in stream if c.choices]
    entries = [e for c in chunks if c.logprobs for e in c.logprobs.content]
    top = [[(t.token, t.logprob) for t in e.top_logprobs] for e in entries]
    content = "".join(c.delta.content or "" for c in chunks)
    _check_logprobs(hf_lm, content, chat_ids, sampled, [(e.token, e.logprob) for e in entries], top, 2)
    # each token's own bytes, joined, read as the content (a random model's bytes need not be valid UTF-8)
    assert b"".join(bytes(e.bytes) for e in entries).decode("utf-8", "replace") == content
    assert client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2).choices[0].logprobs is None

    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=messages, n=2)
    assert e.value.status_code == 400 and e.value.body["param"] == "n"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt=ids * 400, max_tokens=10)
    assert e.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4o", prompt="a")
    with pytest.raises(openai.NotFoundError) as e:  # a sentence encoder's route on a language model's server
        client.embeddings.create(model=MODEL, input="a")
    assert "language model" in e.value.body["message"] and "/v1/completions" in e.value.body["message"]
    with pytest.raises(openai.AuthenticationError) as e:
        openai.OpenAI(base_url=url + "v1", api_key="wrong", max_retries=0).models.list()
    assert e.value.body["code"] == "invalid_api_key"

    plain = Client(url)
    assert plain.health()  # /healthz needs no key
    assert plain.request("GET", "/metadata").status == 401
    auth = {"Authorization": f"Bearer {KEY}"}
    meta = json.loads(plain.request("GET", "/metadata", None, auth).body)
    assert meta["openai"] == {"model": MODEL, "chat": True} and meta["rows_running"] == 0

    # A stream of 3000 tokens (seconds of steps) whose client leaves after its first pieces: its row is
    # given back at the next step, long before its max_tokens.
    stream = client.completions.create(model=MODEL, prompt=ids, max_tokens=3000, stream=True)
    for i, _ in enumerate(stream):
        if i == 3:
            break
    stream.close()
    ends = time.monotonic() + 60
    while json.loads(plain.request("GET", "/metadata", None, auth).body)["rows_running"] and time.monotonic() < ends:
        time.sleep(0.05)
    meta = json.loads(plain.request("GET", "/metadata", None, auth).body)
    assert meta["rows_running"] == 0 and meta["requests_left"] == 1  # dropped, not run to its end
    assert meta["max_positions"] == 9000  # --max-tokens, the old spelling, still sets it
    plain.close()

    # /health, /ready, /metrics, /tokenize, request ids, the prefix cache, a burst past --max-waiting, the
    # access log (tests/serve/ops_http.py)
    check_operations(
        url, KEY, MODEL, codec, lambda ids, n: _alone(sess, codec, ids, n), lm_path.with_name("access.log")
    )

    # `attnzoo loadtest --chat`: streamed chat requests at a stated concurrency, tokens/s and time to first token
    capsys.readouterr()
    assert main(["loadtest", url, "--chat", "--concurrency", "2", "--requests", "4", "--new-tokens", "8"]) == 0
    table = capsys.readouterr().out
    assert "POST /v1/chat/completions" in table and "tokens/s" in table and "TTFT p50/p95 ms" in table, table
    report = chat_loadtest(url, concurrency=[2], requests=4, max_tokens=8, api_key=KEY, warmup=0)
    (level,) = report["levels"]
    assert (level["ok"], level["errors"], level["completion_tokens"]) == (4, 0, 32), level
    assert level["tokens_per_s"] > 0 and 0 < level["ttft_p50_ms"] <= level["latency_p50_ms"], level

    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and out.splitlines()[-2:] == ["stopping", "stopped"], (out, err)
    assert err.splitlines() == [
        "attnzoo serve: --max-tokens is now --max-positions (the most b*t positions per request); "
        "the old spelling will go"
    ], err  # nothing of Ray's: no token notice, no Serve INFO lines, no "(raylet) ... killed by ray.kill"
