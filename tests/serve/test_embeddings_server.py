"""OpenAI's POST /v1/embeddings on a sentence encoder's server: the request checks (plain), the batch planner,
requests batched together equal to each alone (no Ray), then the real `openai` client against one real
`attnzoo serve FOLDER` of a tiny random sentence-transformers folder: equal to SentenceTransformer.encode,
eight concurrent clients equal to their answers one by one, token ids, prompts, bad requests, a wrong key, and
the language model's routes answered with a 404 naming what the server serves.

The folder is exported once (cli.cmd_embed.exported_encoder, into a cache folder of the module's own), and
the server, given the folder, finds that export there.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from helpers import REPO, free_port, served
from runtime.embedding import EmbeddingSession
from serve.embeddings.batching import EmbedItem, id_rows, plan_runs, run_embed_batch, text_rows
from serve.embeddings.protocol import MAX_INPUTS, embeddings_answer, parse_embeddings
from serve.generate.batching import StaticBatcher
from serve.openai.protocol import OpenAIError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "peers"))
import encoder_cases as cases  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # Ray Serve's pydantic models
MODEL = "tiny-st"  # the folder's name: the served model id
KEY = "embed-key-0123"
ATOL = 1e-5
TEXTS = [*cases.TEXTS, "the dog sat", "blue mat on a big red cat", "world", "a small query passage is here"]
MAX_POSITIONS = 1000  # --max-positions: tokens per request, and the body limit (64 KiB + 128 bytes a position)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return cases.sentence_folder(tmp_path_factory.mktemp("st") / MODEL, "bert", "mean", prompts={"query": "query "})


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def onnx_path(folder, cache) -> Path:
    from cli.cmd_embed import exported_encoder

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ATTNZOO_CACHE", str(cache))
        return exported_encoder(str(folder))


@pytest.fixture(scope="module")
def encode(folder):
    """SentenceTransformer(folder).encode, the model loaded once."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(folder), device="cpu")
    return lambda texts, **kw: model.encode(list(texts), **kw)


@pytest.fixture(scope="module")
def sess(onnx_path):
    return EmbeddingSession(onnx_path, "cpu", verbose=False)


# -- requests ------------------------------------------------------------------------------------


def _parse(doc, **kw):
    body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    return parse_embeddings(body, MODEL, dim=32, vocab=24, max_len=12, prompts={"query": "q "}, **kw)


BAD = [
    (b"{nope", 400, None, None),
    ({"input": "a"}, 400, "model", "model_not_found"),
    ({"model": "other", "input": "a"}, 404, "model", "model_not_found"),
    ({"model": MODEL}, 400, "input", None),
    ({"model": MODEL, "input": ""}, 400, "input", None),
    ({"model": MODEL, "input": []}, 400, "input", None),
    ({"model": MODEL, "input": ["a", ""]}, 400, "input", None),
    ({"model": MODEL, "input": ["a", 5]}, 400, "input", None),
    ({"model": MODEL, "input": [[1, 2], []]}, 400, "input", None),
    ({"model": MODEL, "input": [True, 2]}, 400, "input", None),
    ({"model": MODEL, "input": {"text": "a"}}, 400, "input", None),
    ({"model": MODEL, "input": [2, 24]}, 400, "input", None),
    ({"model": MODEL, "input": [2, -1]}, 400, "input", None),
    ({"model": MODEL, "input": [2] * 13}, 400, "input", "context_length_exceeded"),
    ({"model": MODEL, "input": ["a"] * (MAX_INPUTS + 1)}, 400, "input", None),
    ({"model": MODEL, "input": "a", "encoding_format": "int8"}, 400, "encoding_format", None),
    ({"model": MODEL, "input": "a", "dimensions": 16}, 400, "dimensions", None),
    ({"model": MODEL, "input": "a", "dimensions": "32"}, 400, "dimensions", None),
    ({"model": MODEL, "input": "a", "user": 7}, 400, "user", None),
    ({"model": MODEL, "input": "a", "prompt_name": "passage"}, 400, "prompt_name", None),
    ({"model": MODEL, "input": [2, 3], "prompt_name": "query"}, 400, "prompt_name", None),
    ({"model": MODEL, "input": "a", "n": 2}, 400, "n", None),
]


@pytest.mark.parametrize("doc,status,param,code", BAD, ids=[str(b[0])[:48] for b in BAD])
def test_a_bad_embeddings_request_is_an_openai_error(doc, status, param, code):
    with pytest.raises(OpenAIError) as e:
        _parse(doc)
    err = json.loads(e.value.body())["error"]
    assert (e.value.status, err["param"], err["code"]) == (status, param, code), err
    assert "\n" not in err["message"]


def test_an_embeddings_request_parses_to_its_inputs():
    ask = _parse({"model": MODEL, "input": "hi", "user": "u1", "dimensions": 32, "prompt_name": "query"})
    assert (ask.texts, ask.ids, ask.encoding_format, ask.prompt_name) == (["hi"], None, "float", "query")
    assert _parse({"model": MODEL, "input": [2, 5, 3], "encoding_format": "base64"}).ids == [[2, 5, 3]]
    assert _parse({"model": MODEL, "input": [[2, 3], [2] * 12]}).count == 2
    assert _parse({"model": MODEL, "input": ["a", "b"], "encoding_format": None}).encoding_format == "float"


def test_an_answer_is_openais_list_in_either_encoding():
    v = np.arange(6, dtype=np.float32).reshape(2, 3) / 7
    doc = json.loads(embeddings_answer(v, "float", MODEL, 9))
    assert doc["object"] == "list" and doc["model"] == MODEL and doc["usage"] == {"prompt_tokens": 9, "total_tokens": 9}
    assert [(d["object"], d["index"]) for d in doc["data"]] == [("embedding", 0), ("embedding", 1)]
    assert np.array_equal(np.asarray([d["embedding"] for d in doc["data"]], np.float32), v)
    doc = json.loads(embeddings_answer(v, "base64", MODEL, 9))
    back = np.stack([np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in doc["data"]])
    assert np.array_equal(back, v)
    with pytest.raises(OpenAIError) as e:
        embeddings_answer(v * np.nan, "float", MODEL, 9)
    assert e.value.status == 422


@pytest.mark.parametrize("max_rows", [1, 3, 16])
def test_runs_hold_each_row_once_within_max_rows_and_twice_the_shortest(max_rows):
    lengths = [int(v) for v in np.random.default_rng(0).integers(1, 40, 50)]
    runs = plan_runs(lengths, max_rows)
    assert sorted(i for run in runs for i in run) == list(range(len(lengths)))
    for run in runs:
        longest, shortest = max(lengths[i] for i in run), min(lengths[i] for i in run)
        assert len(run) <= max_rows and longest <= 2 * shortest, run


# -- batching across requests, no Ray ----------------------------------------------------------------


def test_requests_batched_together_get_their_embeddings_alone(sess, encode):
    """Requests of one to all texts, with and without a prompt and as token ids, gathered by the
    StaticBatcher into padded runs of at most 3 rows: each equals its texts encoded alone and
    SentenceTransformer.encode."""
    asks = [(TEXTS[i : i + 1], None) for i in range(len(TEXTS))] + [(TEXTS, None), (TEXTS[:3], "query")]
    items = [EmbedItem(text_rows(sess, texts, name)) for texts, name in asks]
    ids = sess.tokenizer(TEXTS[:2])
    items.append(EmbedItem(id_rows([list(row[m == 1]) for row, m in zip(ids["input_ids"], ids["attention_mask"])])))
    batcher = StaticBatcher(lambda its: run_embed_batch(sess, its, 3), max_rows=3, wait_s=0.05)

    async def main():
        return await asyncio.gather(*(batcher.submit(it) for it in items))

    answers = asyncio.run(main())
    assert max(timing["x-attnzoo-batch"] for _, timing in answers) > 1  # requests shared runs
    for (texts, name), (got, _) in zip(asks, answers):
        alone = sess.encode(texts, prompt_name=name, batch_size=1)
        assert np.abs(got - alone).max() <= ATOL, (texts, name)
    ref = encode(TEXTS)
    assert np.abs(answers[len(TEXTS)][0] - ref).max() <= ATOL
    assert np.abs(answers[-1][0] - ref[:2]).max() <= ATOL  # token ids: the tokenizer's own, as texts give them


# -- the real openai client against a real server -------------------------------------------------


@pytest.fixture(scope="module")
def server(folder, cache, onnx_path):
    """`attnzoo serve FOLDER` (the export found in the module's cache) in a process group of its own, its key
    from the environment; yields (url, process, the lines up to its readiness line)."""
    pytest.importorskip("openai")
    pytest.importorskip("ray")
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "ATTNZOO_API_KEY": KEY, "ATTNZOO_CACHE": str(cache)}
    flags = ["--port", str(port), "--max-batch", "8", "--batch-wait-ms", "100", "--threads", "1"]
    cmd = [sys.executable, "-m", "cli", "serve", str(folder), *flags, "--max-positions", str(MAX_POSITIONS)]
    yield from served(cmd, env, port)


def _vectors(reply) -> np.ndarray:
    return np.asarray([d.embedding for d in sorted(reply.data, key=lambda d: d.index)], np.float32)


def test_the_openai_client_against_an_embeddings_server(server, encode, onnx_path, sess):
    """One test for the one server: equal to encode (float and base64, prompts, token ids), eight concurrent
    clients equal to their answers one by one (and batched together), bad requests and a wrong key as the
    client's own exceptions, the language model's routes a 404; then Ctrl-C: a quiet, clean stop."""
    import openai

    from serve import Client

    url, proc, started = server
    assert not any(line.startswith("exporting") for line in started), started  # found in the cache
    assert started[-1].startswith(f"ready: serving {onnx_path}")
    client = openai.OpenAI(base_url=url + "v1", api_key=KEY, max_retries=0)
    assert [m.id for m in client.models.list().data] == [MODEL]

    ref = encode(TEXTS)
    got = client.embeddings.create(model=MODEL, input=TEXTS)  # the client asks for base64 by default
    assert got.model == MODEL and np.abs(_vectors(got) - ref).max() <= ATOL
    tokens = int(sess.tokenizer(TEXTS)["attention_mask"].sum())
    assert got.usage.prompt_tokens == got.usage.total_tokens == tokens  # texts truncated at max_seq_length 12
    one = client.embeddings.create(model=MODEL, input=TEXTS[1], encoding_format="float", user="someone")
    assert np.abs(_vectors(one) - ref[1:2]).max() <= ATOL
    query = client.embeddings.create(model=MODEL, input=TEXTS[:2], extra_body={"prompt_name": "query"})
    assert np.abs(_vectors(query) - encode(TEXTS[:2], prompt_name="query")).max() <= ATOL
    ids = sess.tokenizer.tok.encode(TEXTS[0]).ids
    assert np.abs(_vectors(client.embeddings.create(model=MODEL, input=[ids])) - ref[:1]).max() <= ATOL

    # Eight clients at once, each its own inputs: the same answers as one by one, and runs shared across them
    asks = [TEXTS[i : i + 1 + i % 3] for i in range(8)]
    together: list = [None] * 8
    barrier = threading.Barrier(8)

    def send(i: int) -> None:
        barrier.wait()
        together[i] = client.embeddings.with_raw_response.create(model=MODEL, input=asks[i])

    threads = [threading.Thread(target=send, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rows = [int(raw.headers["x-attnzoo-batch"]) for raw in together]
    assert max(r - len(a) for r, a in zip(rows, asks)) > 0, rows  # some request shared its run
    for ask, raw in zip(asks, together):
        alone = _vectors(client.embeddings.create(model=MODEL, input=ask))
        assert np.abs(_vectors(raw.parse()) - alone).max() <= ATOL
        assert np.abs(alone - encode(ask)).max() <= ATOL

    for bad in ([], "", ["a", 3], ["a"] * (MAX_INPUTS + 1), [[99]]):
        with pytest.raises(openai.BadRequestError) as e:
            client.embeddings.create(model=MODEL, input=bad)
        assert e.value.status_code == 400 and e.value.body["param"] == "input", bad
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model=MODEL, input="a", dimensions=8)
    assert e.value.body["param"] == "dimensions"
    with pytest.raises(openai.APIStatusError) as e:  # past --max-positions tokens a request
        client.embeddings.create(model=MODEL, input=["hello world the cat"] * 300)
    assert e.value.status_code == 413
    with pytest.raises(openai.APIStatusError) as e:  # past the body limit, 64 KiB + 128 bytes a position
        client.embeddings.create(model=MODEL, input="a " * 100_000)
    assert e.value.status_code == 413
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="text-embedding-3-small", input="a")
    with pytest.raises(openai.NotFoundError) as e:  # a language model's route on an encoder's server
        client.completions.create(model=MODEL, prompt="a")
    assert "/v1/embeddings" in e.value.body["message"] and "sentence encoder" in e.value.body["message"]
    with pytest.raises(openai.AuthenticationError) as e:
        openai.OpenAI(base_url=url + "v1", api_key="wrong", max_retries=0).embeddings.create(model=MODEL, input="a")
    assert e.value.body["code"] == "invalid_api_key"

    plain = Client(url)
    assert plain.health()  # /healthz needs no key
    auth = {"Authorization": f"Bearer {KEY}"}
    assert plain.request("GET", "/metadata").status == 401
    meta = json.loads(plain.request("GET", "/metadata", None, auth).body)
    assert (meta["kind"], meta["route"], meta["dim"], meta["max_seq_length"]) == (
        "sentence_encoder",
        "/v1/embeddings",
        32,
        12,
    )
    reply = plain.request("POST", "/generate", b"{}", {**auth, "Content-Type": "application/json"})
    assert reply.status == 404 and b"/v1/embeddings" in reply.body
    plain.close()

    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and out.splitlines()[-2:] == ["stopping", "stopped"], (out, err)
    assert f"{url}v1/embeddings" in out and err == "", (out, err)  # the readiness line's example, no Ray chatter
