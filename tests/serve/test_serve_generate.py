"""Serving a whole model on POST /generate: the request checks (plain), static batches that give each
request exactly the tokens `OnnxSession.generate` gives it alone (left padding, several rows, its own
max_new_tokens and eos), concurrent requests through the StaticBatcher (asyncio, no Ray), then the
same through Ray Serve on 127.0.0.1 with HTTP clients and the load test's generation mode.

One whole-model export of lm_cases' tiny random LLaMA serves every test of the module (~25 CPU-seconds);
the Ray Serve test is under -m slow.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from export import export_onnx
from helpers import free_port, local_ray, submit_concurrently
from runtime.session import OnnxSession
from serve import Client, RequestError, ServeError, start
from serve.generate.batching import StaticBatcher, end_at_eos, left_pad, run_generate_batch
from serve.generate.continuous import ContinuousBatcher
from serve.generate.protocol import GEN_ROUTE, GenInfo, GenItem, decode_generate_request
from serve.loadtest import loadtest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "peers"))
import lm_cases  # noqa: E402 - the small random transformers models of the whole-model tests

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # Ray Serve's pydantic models
VOCAB = lm_cases.VOCAB


@pytest.fixture(scope="module")
def lm_path(tmp_path_factory):
    """The whole-model export (fp32, static cache) of lm_cases' random LLaMA, made once."""
    from peers.lm import lm_from_hf

    lm = lm_from_hf(lm_cases.hf_model("llama")).eval()
    return export_onnx(lm, tmp_path_factory.mktemp("serve_lm") / "llama.onnx").path


@pytest.fixture(scope="module")
def sess(lm_path):
    return OnnxSession(lm_path, provider="cpu", verbose=False)


def _item(ids, new, mask=None, eos=None) -> GenItem:
    """A GenItem through the request decoder (as a server gets it)."""
    doc = {"input_ids": ids, "max_new_tokens": new, "attention_mask": mask, "eos_token_id": eos}
    return decode_generate_request(json.dumps({k: v for k, v in doc.items() if v is not None}).encode(), "", INFO)


INFO = GenInfo(vocab=VOCAB, max_len=None, max_rows=8, max_tokens=400, max_new_tokens=40)


# -- requests ------------------------------------------------------------------------------------


def test_a_request_decodes_to_rows_of_ids():
    one = _item([5, 6, 7], 4)
    assert one.squeeze and one.ids.dtype == np.int64 and one.ids.shape == (1, 3) and one.mask is None
    two = _item([[0, 5, 6], [4, 5, 6]], 3, mask=[[0, 1, 1], [1, 1, 1]], eos=2)
    assert not two.squeeze and two.rows == 2 and two.t == 3 and two.eos_token_id == 2
    np.testing.assert_array_equal(two.mask, [[False, True, True], [True, True, True]])
    assert _item([[1, 2]], 1, mask=[[True, True]]).mask.all()


BAD = [
    (b"{not json", 400, "not JSON"),
    (b"[1, 2]", 400, "send an object"),
    (b'{"max_new_tokens": 4}', 400, "input_ids is required"),
    (b'{"input_ids": [1, 2], "temperature": 0.5, "max_new_tokens": 4}', 400, "unknown field"),
    (b'{"input_ids": [1, 2]}', 400, "max_new_tokens is required"),
    (b'{"input_ids": [1, 2], "max_new_tokens": 0}', 400, "must be an integer >= 1"),
    (b'{"input_ids": [1, 2], "max_new_tokens": 2.5}', 400, "must be an integer"),
    (b'{"input_ids": [1, 2], "max_new_tokens": true}', 400, "must be an integer"),
    (b'{"input_ids": [1, 2], "max_new_tokens": 41}', 413, "at most 40"),
    (b'{"input_ids": [1, 100], "max_new_tokens": 4}', 400, "token id 100 is outside this model's vocabulary of 100"),
    (b'{"input_ids": [-1, 2], "max_new_tokens": 4}', 400, "token id -1"),
    (b'{"input_ids": [1.5, 2], "max_new_tokens": 4}', 400, "token ids are integers"),
    (b'{"input_ids": [[1, 2], [3]], "max_new_tokens": 4}', 400, "ragged"),
    (b'{"input_ids": [], "max_new_tokens": 4}', 400, "non-empty"),
    (b'{"input_ids": [[[1]]], "max_new_tokens": 4}', 400, "shape (1, 1, 1)"),
    (b'{"input_ids": "1 2", "max_new_tokens": 4}', 400, "send a list"),
    (json.dumps({"input_ids": [[1, 2]] * 9, "max_new_tokens": 4}).encode(), 413, "at most 8"),
    (json.dumps({"input_ids": [[1] * 90] * 4, "max_new_tokens": 20}).encode(), 413, "at most 400"),
    (b'{"input_ids": [1, 2], "max_new_tokens": 4, "eos_token_id": 100}', 400, "eos_token_id=100"),
    (b'{"input_ids": [[5, 6]], "attention_mask": [[1, 0]], "max_new_tokens": 4}', 400, "pad on the left"),
    (b'{"input_ids": [[5, 6]], "attention_mask": [[1, 2]], "max_new_tokens": 4}', 400, "other than 0 and 1"),
    (b'{"input_ids": [[5, 6]], "attention_mask": [[1]], "max_new_tokens": 4}', 400, "input_ids' shape"),
    (b'{"input_ids": [true, 6], "max_new_tokens": 4}', 400, "input_ids holds true; token ids are integers"),
    (b'{"input_ids": [[5, false]], "max_new_tokens": 4}', 400, "input_ids holds false"),
    (b'{"input_ids": [12345678901234567890123], "max_new_tokens": 4}', 400, "token id 12345678901234567890123 is"),
    (b'{"input_ids": [1, 2], "max_new_tokens": 4, "eos_token_id": true}', 400, "eos_token_id=True must be"),
    (b'{"input_ids": [[5, 6]], "attention_mask": [[0.5, 1]], "max_new_tokens": 4}', 400, "other than 0 and 1"),
    (b'{"input_ids": [[5, 6]], "attention_mask": [[0, 0]], "max_new_tokens": 4}', 400, "row 0 is all padding"),
    (b'{"input_ids": [[4, 5, 6]], "attention_mask": [[1, 0, 1]], "max_new_tokens": 4}', 400, "after a real token"),
]


@pytest.mark.parametrize("body,status,words", BAD, ids=[b[2] for b in BAD])
def test_bad_requests_get_one_line_and_a_4xx(body, status, words):
    with pytest.raises(RequestError) as e:
        decode_generate_request(body, "application/json", INFO)
    assert e.value.status == status and words in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_a_request_past_a_capped_export_or_not_json_is_refused():
    capped = GenInfo(vocab=VOCAB, max_len=16)
    with pytest.raises(RequestError, match="max_len 16") as e:
        decode_generate_request(b'{"input_ids": [1, 2, 3, 4, 5, 6, 7, 8], "max_new_tokens": 10}', "", capped)
    assert e.value.status == 413
    decode_generate_request(b'{"input_ids": [1, 2, 3, 4, 5, 6, 7, 8], "max_new_tokens": 9}', "", capped)  # fits
    with pytest.raises(RequestError) as e:
        decode_generate_request(b"x", "application/x-npy", INFO)
    assert e.value.status == 415


def test_only_a_whole_model_export_gets_a_gen_info():
    class Block:  # a block export's session: no attnzoo.vocab
        metadata: dict = {}
        path = Path("block.onnx")

    with pytest.raises(ServeError, match="not a whole-model export"):
        GenInfo.of(Block())


def test_start_refuses_bad_batching_options_before_starting_ray(lm_path):
    with pytest.raises(ServeError, match="batching='dynamic' is not one of static, continuous"):
        start(lm_path, batching="dynamic")
    with pytest.raises(ServeError, match="capacity=0 must be a positive integer"):
        start(lm_path, batching="continuous", capacity=0)
    with pytest.raises(ServeError, match="max_new_tokens=0"):
        start(lm_path, max_new_tokens=0)


def _longrope_copy(lm_path: Path) -> Path:
    """lm_path's export whose recorded layer specs say longrope, as a Phi-3 long-context
    export's do: what the serving guards read."""
    import onnx

    model = onnx.load(lm_path)
    props = {p.key: p for p in model.metadata_props}
    specs = json.loads(props["attnzoo.layer_specs"].value)
    for spec in specs:
        spec.update(rope_scaling="longrope", rope_original_max=8)
    props["attnzoo.layer_specs"].value = json.dumps(specs)
    out = lm_path.parent / "longrope.onnx"
    if not out.is_file():  # the weights beside it, as an export writes them (PATH.data)
        onnx.save(model, out, save_as_external_data=True, location=out.name + ".data")
    return out


def test_a_longrope_export_serves_one_request_a_run(lm_path, sess):
    """longrope picks its frequency set by a whole run's largest position, so requests of a longrope export
    never share a run: continuous batching is refused (before Ray starts) and static batches hold one
    request; other exports share runs."""
    from serve.generate.continuous import shares_runs

    longrope = OnnxSession(_longrope_copy(lm_path), provider="cpu", verbose=False)
    assert shares_runs(sess) and not shares_runs(longrope)
    for refuse in (lambda: start(longrope.path, batching="continuous"), lambda: ContinuousBatcher(longrope, 4, 48)):
        with pytest.raises(ServeError, match="longrope layers.*--batching static"):
            refuse()
    import time

    items = _requests(sess)[:4]
    # max_requests 1 with a 900 s window: a run per request at once (waiting for more would take 900 s a run)
    for max_requests, wait_s, most in ((1, 900.0, 1), (None, 0.05, len(items))):
        runs: list[int] = []

        def run(batch, runs=runs):
            runs.append(len(batch))
            return [it.ids for it in batch]

        started = time.perf_counter()
        answers = submit_concurrently(
            StaticBatcher(run, max_rows=8, wait_s=wait_s, max_requests=max_requests), items, 0.0
        )
        assert time.perf_counter() - started < 600  # a ceiling far under one window: no run waited for more
        assert max(runs) == most and sum(runs) == len(items), runs
        for (tokens, _), it in zip(answers, items):
            np.testing.assert_array_equal(tokens, it.ids)
    from serve.generate.app import GenerateServer
    from serve.replica import model_files

    for path, limit in ((lm_path, None), (longrope.path, 1)):  # the server's static batcher follows the export
        server = GenerateServer(model_files(path), path.stem, max_batch=8)
        assert server._batcher.max_requests == limit and server.meta["requests_per_run"] == limit
    with pytest.raises(ServeError, match="max_requests=0 must be a positive integer"):
        StaticBatcher(lambda items: items, max_rows=8, wait_s=0.0, max_requests=0)


def test_a_left_padded_bf16_export_is_refused_by_continuous_batching_in_one_line(sess):
    """The left-padded batcher's numpy buffers hold no bfloat16 (a packed-rows export's device buffers do:
    tests/serve/test_generate_packed.py): refused before serving, pointing at static batching."""
    from serve.generate.continuous import check_continuous

    class Bf16Caches:  # the session's interface, its caches declared bfloat16
        def __getattr__(self, name):
            return getattr(sess, name)

        class _sess:  # noqa: N801 - stands in for the onnxruntime session
            @staticmethod
            def get_inputs():
                return [
                    type("Arg", (), {"name": x.name, "type": "tensor(bfloat16)"})() for x in sess._sess.get_inputs()
                ]

    with pytest.raises(
        ServeError, match=r"left-padded and takes bfloat16 caches.*; serve it with --batching static"
    ) as e:
        check_continuous(Bf16Caches())
    assert "\n" not in str(e.value)
    check_continuous(sess)


def _longrope_folder(folder: Path) -> Path:
    """lm_cases' Phi-3 checkpoint, its config turned long-context (longrope past 32 positions)."""
    path = lm_cases.saved("phi3", folder)
    config = json.loads((path / "config.json").read_text())
    half = config["hidden_size"] // config["num_attention_heads"] // 2
    config["rope_scaling"] = {"type": "longrope", "short_factor": [1.0] * half, "long_factor": [2.0] * half}
    config["original_max_position_embeddings"] = 32
    (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.mark.parametrize(
    "kind, flags, words",
    [
        ("longrope", ["--batching", "continuous"], "longrope layers"),
        ("llama", ["--route-prefix", "api"], "--route-prefix api must start with '/'"),
        ("llama", ["--batch-wait-ms", "20000"], "--batch-wait-ms 20000.0 must be between 0 and 10000"),
        ("llama", ["--provider", "cuda"], "--provider cuda: "),
        ("llama", ["--port", "BUSY"], "pick another --port"),
    ],
)
def test_cli_serve_refuses_a_folder_before_exporting_it(kind, flags, words, tmp_path, capsys, monkeypatch):
    """What serving would refuse is refused before a checkpoint folder's export (minutes for a big model)."""
    from cli.main import main
    from runtime.session import cuda_status

    if "cuda" in flags and cuda_status()[0]:
        pytest.skip("CUDA works here: --provider cuda is served, not refused")
    folder = _longrope_folder(tmp_path) if kind == "longrope" else lm_cases.saved(kind, tmp_path)
    monkeypatch.setenv("ATTNZOO_CACHE", str(tmp_path / "cache"))
    capsys.readouterr()  # transformers' progress bars while saving the folder
    with socket.socket() as taken:  # a port something else listens on
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        flags = [str(taken.getsockname()[1]) if f == "BUSY" else f for f in flags]
        assert main(["serve", str(folder), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1, err
    assert not list(tmp_path.glob("cache/**/*.onnx")), "exported before the refusal"


# -- static batches ------------------------------------------------------------------------------


@pytest.mark.parametrize("new", [10**9, 2**62])
def test_a_generation_past_the_machine_is_refused_before_allocating(sess, new):
    """(The served export has no max_len, so a call sizes its cache itself.) Refused from the sizes, before
    the key mask or the tokens' array is allocated (2**62 positions: numpy's MemoryError otherwise)."""
    import zoo

    with pytest.raises(zoo.ResourceError, match="ask for a smaller size") as e:
        sess.generate(np.array([[1, 2, 3]]), new)
    assert "\n" not in str(e.value)


def test_left_pad_right_aligns_every_row():
    ids, mask = left_pad([_item([5, 6, 7], 2), _item([[0, 8], [9, 9]], 2, mask=[[0, 1], [1, 1]])])
    np.testing.assert_array_equal(ids, [[5, 6, 7], [0, 0, 8], [0, 9, 9]])
    np.testing.assert_array_equal(mask, [[1, 1, 1], [0, 0, 1], [0, 1, 1]])


def test_end_at_eos_is_what_generate_does_with_eos(sess):
    ids = lm_cases.prompt(batch=2, t=5, seed=3).numpy()
    free = sess.generate(ids, 12)
    eos = int(free[0, 5 + 3])  # a token row 0 makes at its 4th step
    want = sess.generate(ids, 12, eos_token_id=eos)
    np.testing.assert_array_equal(end_at_eos(free, 5, eos), want)
    np.testing.assert_array_equal(end_at_eos(free[:1], 5, eos), sess.generate(ids[:1], 12, eos_token_id=eos))
    assert end_at_eos(free, 5, None) is free


def _requests(sess, seed: int = 0) -> list[GenItem]:
    """Requests of different prompt lengths, rows, left padding of their own, max_new_tokens and eos
    (an eos some of them reach: a token the model makes for them alone)."""
    rng = np.random.default_rng(seed)
    items = []
    for k, (rows, t, new) in enumerate([(1, 3, 9), (2, 7, 4), (1, 12, 14), (2, 5, 6), (1, 1, 11), (1, 9, 2)]):
        ids = rng.integers(3, VOCAB, (rows, t)).tolist()
        mask = None
        if rows == 2:  # the request's own left padding: its first row is shorter
            mask = [[0] * 2 + [1] * (t - 2), [1] * t]
            ids[0][:2] = [0, 0]
        eos = None
        if k in (2, 3):
            eos = int(sess.generate(np.array(ids), new, attention_mask=mask)[0, t + 1])
        items.append(_item(ids if rows > 1 else ids[0], new, mask=mask, eos=eos))
    return items


def _alone(sess, it: GenItem) -> np.ndarray:
    out = sess.generate(it.ids, it.max_new_tokens, attention_mask=it.mask, eos_token_id=it.eos_token_id)
    return out


def test_one_padded_batch_gives_each_request_its_own_tokens(sess):
    items = _requests(sess)
    wants = [_alone(sess, it) for it in items]
    assert any(w.shape[1] < it.t + it.max_new_tokens for it, w in zip(items, wants)), "no request ended at eos"
    timings: dict = {}
    got = run_generate_batch(sess, items, timings)
    assert timings == {"rows": 8, "prompt": 12, "new": 14}
    for g, w in zip(got, wants):
        assert g.dtype == np.int64 and g.shape == w.shape, (g.shape, w.shape)
        np.testing.assert_array_equal(g, w)  # bit-equal: token ids


def test_a_failing_run_fails_every_request_of_it(sess):
    class Broken:
        def generate(self, *args, **kwargs):
            raise MemoryError("no room")

    items = _requests(sess)[:2]
    assert [type(r) for r in run_generate_batch(Broken(), items)] == [MemoryError, MemoryError]


def test_concurrent_requests_are_batched_and_each_gets_its_own_tokens(sess):
    """Requests arriving from many tasks at once: the batcher runs a few batches (each of several
    requests, up to max_rows rows), and every answer is bit-equal to the request's run alone."""
    items = _requests(sess, seed=1) * 2
    wants = [_alone(sess, it) for it in items]
    runs: list[int] = []

    def run(batch):
        runs.append(sum(it.rows for it in batch))
        return run_generate_batch(sess, batch)

    answers = submit_concurrently(StaticBatcher(run, max_rows=6, wait_s=0.05), items, gap_s=0.002)
    assert len(runs) < len(items) and max(runs) <= 6 and sum(runs) == sum(it.rows for it in items), runs
    for (tokens, timing), want in zip(answers, wants):
        np.testing.assert_array_equal(tokens, want)
        assert timing["x-attnzoo-batch"] >= 1 and timing["x-attnzoo-model-ms"] > 0


def test_continuous_batching_gives_each_request_its_own_tokens(sess):
    """Requests join the running batch at its next step (their prompts run alone, their keys copied into
    free rows at the write index): each answer is bit-equal to the request's run alone, and requests
    ran beside others that started before them."""
    import time

    items = _requests(sess, seed=3) * 2
    wants = [_alone(sess, it) for it in items]

    class Paced:  # each step takes at least 5 ms, so that requests sent 3 ms apart overlap on any machine
        def __getattr__(self, name):
            return getattr(sess, name)

        def run_with_iobinding(self, binding):
            time.sleep(0.005)
            return sess.run_with_iobinding(binding)

    batcher = ContinuousBatcher(sess, max_rows=5, capacity=48, wait_s=0.0)
    batcher.sess = Paced()
    answers = submit_concurrently(batcher, items, gap_s=0.003)
    for (tokens, _), want in zip(answers, wants):
        assert not isinstance(tokens, Exception), tokens
        np.testing.assert_array_equal(tokens, want)
    assert max(timing["x-attnzoo-batch"] for _, timing in answers) > 2
    assert batcher.used == 0 and not batcher.running  # every row given back


def test_a_joining_row_runs_its_prompt_in_chunks(sess, monkeypatch):
    """A joining request's prompt runs one row at a time in chunks of PREFILL_CHUNK, each after the ones
    before and after the masked slots before P, as OnnxSession.generate runs it alone: the same tokens, and
    ceil(t / chunk) prefill calls per row (one call for a batch of rows joining at P = t). The first request
    has the longest prompt, so the others join at P > t, one of them with two rows."""
    import time

    from runtime import generation

    monkeypatch.setattr(generation, "PREFILL_CHUNK", 3)
    rng = np.random.default_rng(5)
    items = [_item(rng.integers(3, VOCAB, t).tolist(), new) for t, new in ((12, 14), (7, 9), (10, 5), (1, 8))]
    padded = rng.integers(3, VOCAB, 8).tolist()
    padded[:3] = [0, 0, 0]
    items.append(_item(padded, 7, mask=[0, 0, 0] + [1] * 5))  # one row with its own left padding
    two = rng.integers(3, VOCAB, (2, 7)).tolist()
    two[0][:2] = [0, 0]
    items.append(_item(two, 6, mask=[[0, 0] + [1] * 5, [1] * 7]))  # two rows, the first padded
    wants = [_alone(sess, it) for it in items]
    batcher = ContinuousBatcher(sess, max_rows=4, capacity=48)
    prefills, joins = [], []

    class Paced:  # steps of at least 5 ms, so that the later requests join a running batch
        def __getattr__(self, name):
            return getattr(sess, name)

        def run_with_iobinding(self, binding):
            if binding not in batcher.batch._bindings.values():
                prefills.append(binding)
            time.sleep(0.005)
            return sess.run_with_iobinding(binding)

    join = batcher._join

    def recorded(it, done):
        joins.append((batcher.write, it.t, it.rows))
        return join(it, done)

    batcher.sess, batcher._join = Paced(), recorded
    answers = submit_concurrently(batcher, items, gap_s=0.003)
    for (tokens, _), want in zip(answers, wants):
        assert not isinstance(tokens, Exception), tokens
        np.testing.assert_array_equal(tokens, want)
    assert any(p > t > 3 and rows == 1 for p, t, rows in joins), joins  # chunks after masked slots
    assert any(p > t and rows == 2 for p, t, rows in joins), joins  # row by row, each in chunks
    calls = [rows * -(-t // 3) if p > t or rows == 1 else 1 for p, t, rows in joins]
    assert len(joins) == len(items) and len(prefills) == sum(calls), (joins, len(prefills))


def test_a_failing_continuous_step_fails_its_requests_and_the_next_ones_run(sess):
    items = _requests(sess, seed=4)[:3]
    batcher = ContinuousBatcher(sess, max_rows=4, capacity=48)
    real = batcher.sess

    class FailsOnce:
        failed = False

        def __getattr__(self, name):
            return getattr(real, name)

        def run_with_iobinding(self, binding):
            if binding in batcher.batch._bindings.values() and not FailsOnce.failed:
                FailsOnce.failed = True
                raise RuntimeError("step failed")
            return real.run_with_iobinding(binding)

    batcher.sess = FailsOnce()
    first = submit_concurrently(batcher, items, gap_s=0.0)
    assert any(isinstance(tokens, RuntimeError) for tokens, _ in first)
    batcher.sess = real
    for (tokens, _), it in zip(submit_concurrently(batcher, items, gap_s=0.0), items):
        np.testing.assert_array_equal(tokens, _alone(sess, it))


# -- through Ray Serve ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(lm_path, request):
    local_ray(request)
    return start(
        lm_path, port=free_port(), max_batch=8, batch_wait_ms=20, max_new_tokens=40, app="test-generate", threads=1
    )


@pytest.mark.slow  # a Ray of its own (~20 CPU-seconds): the default run proves the batchers above, without HTTP
def test_through_ray_serve(server, sess, lm_path):
    """One test (pytest-xdist keeps it on one worker), for static batches and then for continuous ones
    beside them: metadata, concurrent HTTP requests each answered with its own tokens, client mistakes as
    one-line 4xx, then the load test's generation mode."""
    _serves_each_request_its_own_tokens(server.url, sess, lm_path, "static")
    port = int(server.url.rsplit(":", 1)[1].split("/")[0])
    beside = start(
        lm_path,
        port=port,
        max_batch=8,
        max_new_tokens=40,
        app="test-generate-cb",
        route_prefix="/cb",
        batching="continuous",
        capacity=64,
        threads=1,
    )
    _serves_each_request_its_own_tokens(beside.url, sess, lm_path, "continuous")


def _serves_each_request_its_own_tokens(url: str, sess, lm_path, batching: str) -> None:
    client = Client(url)
    meta = client.metadata()
    assert (meta["kind"], meta["route"], meta["vocab"], meta["max_new_tokens"]) == ("lm", GEN_ROUTE, VOCAB, 40)
    assert meta["batching"] == batching and meta["max_len"] == (64 if batching == "continuous" else None)

    items = _requests(sess, seed=2)
    wants = [_alone(sess, it) for it in items]
    answers: list = [None] * len(items)

    def one(i: int) -> None:
        it = items[i]
        doc = {"input_ids": it.ids[0].tolist() if it.squeeze else it.ids.tolist(), "max_new_tokens": it.max_new_tokens}
        if it.mask is not None:
            doc["attention_mask"] = it.mask.astype(int).tolist()
        if it.eos_token_id is not None:
            doc["eos_token_id"] = it.eos_token_id
        with Client(url) as c:
            answers[i] = c.request("POST", GEN_ROUTE, json.dumps(doc).encode(), {"Content-Type": "application/json"})

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(items))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    batches = []
    for it, reply, want in zip(items, answers, wants):
        assert reply.status == 200, reply.body
        doc = json.loads(reply.body)
        got = np.asarray(doc["tokens"], np.int64)
        np.testing.assert_array_equal(got[None] if it.squeeze else got, want)
        assert doc["prompt_len"] == it.t and doc["new_tokens"] == want.shape[1] - it.t
        assert int(reply.headers["x-attnzoo-new-tokens"]) == it.rows * (want.shape[1] - it.t)
        batches.append(int(reply.headers["x-attnzoo-batch"]))
    assert max(batches) > max(it.rows for it in items), batches  # some requests shared a run

    for body, status, words in [BAD[9], BAD[8], BAD[0]]:
        reply = client.request("POST", GEN_ROUTE, body, {"Content-Type": "application/json"})
        text = reply.body.decode()
        assert reply.status == status and words in text and "\n" not in text.strip(), text
    assert client.request("POST", "/predict", b"{}").status == 404
    it = items[1]  # the Client's own call: a request of two rows, left-padded
    np.testing.assert_array_equal(client.generate(it.ids, it.max_new_tokens, attention_mask=it.mask), wants[1])
    assert client.health()  # the replica lives on

    report = loadtest(
        url,
        concurrency=[1, 4],
        requests=12,
        seqs=[3, 8],
        new_tokens=6,
        bad_fraction=0.25,
        model=lm_path,
        warmup=2,
    )
    assert report["mode"] == "generate" and report["new_tokens"] == 6
    for lv in report["levels"]:
        assert lv["good"] == 9 and lv["good_ok"] == 9 and lv["good_checked"] == 9 and lv["good_wrong"] == 0, lv
        assert lv["bad"] == 3 and lv["bad_4xx"] == 3 and lv["5xx"] == 0
        assert lv["new_tokens"] == 9 * 6 and lv["tokens_per_s"] > 0
    client.close()


# -- the HTTP front of a replica, without Ray: bodies' size and time limits -------------------------


@pytest.fixture(scope="module")
def plain_http(lm_path):
    """A GenerateServer replica behind uvicorn in a thread (Ray Serve's own HTTP stack, minus Ray), with
    the body time limit cut to 1 s (schema.BODY_SECONDS; BODY_RATE so fast a declared size adds nothing)."""
    import time

    import uvicorn

    from serve import schema
    from serve.generate.app import GenerateServer
    from serve.replica import model_files

    server = GenerateServer(model_files(lm_path), lm_path.stem, max_batch=8, max_new_tokens=40, threads=1)

    async def app(scope, receive, send):
        from starlette.requests import Request

        if scope["type"] == "http":
            response = await server(Request(scope, receive))
            await response(scope, receive, send)

    saved = schema.BODY_SECONDS, schema.BODY_RATE
    schema.BODY_SECONDS, schema.BODY_RATE = 1.0, 2**40
    port = free_port()
    http = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical", lifespan="off"))
    thread = threading.Thread(target=http.run, daemon=True)
    thread.start()
    while not http.started:
        time.sleep(0.02)
    yield server, port
    http.should_exit = True
    thread.join(10)
    schema.BODY_SECONDS, schema.BODY_RATE = saved


def _raw(port: int, head: bytes, body: bytes = b"", *, read: bool = True) -> socket.socket | bytes:
    """Send a request's head and (part of) its body on a fresh socket; the answer's status line, or the
    socket still open when read=False."""
    s = socket.create_connection(("127.0.0.1", port), timeout=300)  # a ceiling against a hang on a loaded host
    s.sendall(head + body)
    if not read:
        return s
    with s:
        return s.recv(65536).split(b"\r\n", 1)[0]


def _post(length: int) -> bytes:
    head = "POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    return f"{head}Content-Length: {length}\r\n\r\n".encode()


def test_a_generate_body_is_limited_to_what_a_valid_request_can_be(plain_http):
    from serve.schema import DEFAULT_MAX_BODY, generate_body_limit

    server, port = plain_http
    limit = server.info.max_body
    assert limit == generate_body_limit(VOCAB, server.meta["max_tokens"]) < DEFAULT_MAX_BODY // 100
    biggest = {"input_ids": [[VOCAB - 1] * 4095] * 16, "attention_mask": [[False] + [True] * 4094] * 16}
    assert len(json.dumps({**biggest, "max_new_tokens": 1}, indent=2)) < limit  # every valid request fits
    assert b" 413 " in _raw(port, _post(limit + 1))  # refused by its declared length, before reading
    body = json.dumps({"input_ids": [1, 2, 3], "max_new_tokens": 2}).encode()
    assert b" 200 " in _raw(port, _post(len(body)), body)


def test_stalled_uploads_time_out_and_give_their_slots_back(plain_http):
    """Clients that declare a body and send one byte of it are answered 408 once the body's time is up,
    and the server answers others meanwhile."""
    _, port = plain_http
    stalled = [_raw(port, _post(100_000), b"{", read=False) for _ in range(4)]
    body = json.dumps({"input_ids": [1, 2, 3], "max_new_tokens": 2}).encode()
    assert b" 200 " in _raw(port, _post(len(body)), body)
    for s in stalled:  # answered by the server's body timer (1 s here), not by this socket's own timeout
        with s:
            assert s.recv(65536).split(b"\r\n", 1)[0].endswith(b"408 Request Timeout")
