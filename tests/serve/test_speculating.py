"""A speculating server (serve --prompt-lookup K / --draft FOLDER: serve/generate/speculating.py): its continuous
batch gives each request what the batch without speculation gives it (greedy: token for token, and transformers'
greedy; sampling: the rows of one speculating generate call with the same seed, whose accept rule
tests/runtime/test_speculative_sampling.py proves to keep the target's distribution), with stop strings, logprobs,
streaming, n > 1 and a JSON grammar on top, and counts that show candidates were both kept and rejected. Requests
are queued while the batcher is held (RowBatcher.hold), so they run together with nothing left to timing.

The target is tests/serve/openai_lm.py's random LLaMA exported with all_logits (spec_sess), the plain server's the
same model's ordinary export (sess, as `serve` exports it without the flags); drafts: the same model exported again
(lm_path: every greedy candidate kept) and another random model of its vocabulary (other_draft).
"""

from __future__ import annotations

import asyncio
import json

import numpy as np
import openai_asgi
import pytest
from openai_lm import MODEL

from runtime.generation import Generation
from runtime.speculative import Speculation
from serve.generate.continuous import ContinuousBatcher
from serve.generate.protocol import GenItem
from serve.generate.speculating import SPEC_HEADERS, ServeSpeculation, SpeculativeBatcher, check_speculating
from serve.schema import ServeError

LOOKUP = Speculation(4, 2)  # prompt lookup: at most 4 candidates, n-grams of at most 2


def _together(batcher, items: list[GenItem]) -> list:
    """Every item queued while the batcher is held, then let go: (tokens, timing) each."""

    async def main():
        batcher.hold()
        futures = [batcher.enqueue(it) for it in items]
        batcher.hold(False)
        return await asyncio.gather(*futures)

    return asyncio.run(main())


def _items(seed: int = 0) -> list[GenItem]:
    """Prompts of different lengths that repeat themselves (prompt lookup finds n-grams in them), one of two rows
    with its own left padding."""
    rng = np.random.default_rng(seed)
    out = []
    for t, new in ((13, 24), (5, 20), (22, 28), (1, 9)):
        motif = rng.integers(3, 259, max(1, t // 3)).tolist()
        out.append(GenItem(np.asarray([(motif * 4)[:t]], np.int64), new))
    two = np.asarray([[0, 0, 7, 8, 9, 7, 8, 9], [5, 6, 7, 5, 6, 7, 5, 6]], np.int64)
    out.append(GenItem(two, 12, mask=np.asarray([[0, 0] + [1] * 6, [1] * 8], np.bool_)))
    return out


def _counts(timing: dict) -> dict:
    return {name: timing[header] for name, header in SPEC_HEADERS.items()}


def test_greedy_requests_get_the_plain_batchers_tokens_with_candidates_kept_and_rejected(sess, spec_sess, hf_lm):
    items = _items()
    plain = _together(ContinuousBatcher(sess, max_rows=6, capacity=64), items)
    batcher = SpeculativeBatcher(spec_sess, max_rows=6, capacity=64, speculation=LOOKUP)
    answers = _together(batcher, items)
    for (tokens, timing), (want, _), it in zip(answers, plain, items):
        assert not isinstance(tokens, Exception), tokens
        np.testing.assert_array_equal(tokens, want)
        assert _counts(timing)["emitted"] == it.rows * (it.max_new_tokens - 1)  # the first token: the prompt's
    tally = batcher.tally
    assert 0 < tally["accepted"] < tally["proposed"], tally  # speculation ran: candidates kept and rejected
    assert tally["target_calls"] < tally["emitted"]  # fewer target calls than tokens
    assert sum(_counts(t)["proposed"] for _, t in answers) == tally["proposed"]
    assert batcher.used == 0 and not batcher.rounds  # every row given back

    import torch  # transformers' greedy, step by step, on the longest one-row prompt

    ids = items[2].ids[0].tolist()
    with torch.no_grad():
        for _ in range(items[2].max_new_tokens):
            ids.append(int(hf_lm(torch.tensor([ids])).logits[0, -1].argmax()))
    np.testing.assert_array_equal(answers[2][0][0], ids)


def test_a_plain_continuous_batch_serves_an_all_logits_export(sess, spec_sess):
    """The export a speculating server runs (all_logits: a chunk's every position) served without speculation:
    its prefill chunks bind logits of their own length (they failed on the (b, 1, v) buffer), the tokens are the
    ordinary export's."""
    items = _items()
    want = _together(ContinuousBatcher(sess, max_rows=6, capacity=64), items)
    got = _together(ContinuousBatcher(spec_sess, max_rows=6, capacity=64), items)
    for (tokens, _), (expected, _) in zip(got, want):
        assert not isinstance(tokens, Exception), tokens
        np.testing.assert_array_equal(tokens, expected)


@pytest.mark.parametrize("draft", ["same", "other"])
def test_a_draft_proposes_and_greedy_keeps_the_plain_tokens(sess, spec_sess, lm_path, other_draft, draft):
    """The target exported again as its own draft: every greedy candidate is kept; another random model's are
    often rejected. Either way the tokens are the batch's without speculation."""
    from runtime.session import OnnxSession

    session = OnnxSession(lm_path, provider="cpu", verbose=False) if draft == "same" else other_draft
    spec = Speculation(3, draft=session)
    items = _items(seed=1)
    plain = _together(ContinuousBatcher(sess, max_rows=6, capacity=64), items)
    batcher = SpeculativeBatcher(spec_sess, max_rows=6, capacity=64, speculation=spec)
    for (tokens, _), (want, _) in zip(_together(batcher, items), plain):
        np.testing.assert_array_equal(tokens, want)
    tally = batcher.tally
    assert tally["draft_calls"] >= tally["proposed"] > 0, tally
    if draft == "same":
        assert tally["accepted"] == tally["proposed"]
    else:
        assert tally["accepted"] < tally["proposed"]


def _front(sess, path, spec=None):
    def make(s, **kw):
        return SpeculativeBatcher(s, speculation=spec, **kw) if spec is not None else ContinuousBatcher(s, **kw)

    return openai_asgi.front(sess, path, make=make)


def _completions(front, **kw):
    async def main():
        return await openai_asgi.client(front).completions.create(model=MODEL, **kw)

    return asyncio.run(main())


@pytest.fixture(scope="module")
def fronts(sess, lm_path, spec_sess, spec_path):
    """(the /v1 routes without speculation, with prompt lookup over the all_logits export of the same model)."""
    return _front(sess, lm_path), _front(spec_sess, spec_path, LOOKUP)


PROMPT = "for i in range(10):\n    print(i)\nfor i in range(10):\n    print("


def test_v1_greedy_answers_stop_strings_and_logprobs_are_the_plain_servers(fronts):
    plain, spec = fronts
    kw = dict(prompt=[PROMPT, "abcabcabc"], max_tokens=24, temperature=0, logprobs=2, n=2)
    want, got = _completions(plain, **kw), _completions(spec, **kw)
    for a, b in zip(want.choices, got.choices):
        assert b.text == a.text and b.finish_reason == a.finish_reason
        assert b.logprobs.tokens == a.logprobs.tokens
        np.testing.assert_allclose(b.logprobs.token_logprobs, a.logprobs.token_logprobs, atol=1e-4)
    tally = spec.batchers()[0].tally
    assert 0 < tally["accepted"] < tally["proposed"], tally
    stop = next(c for c in want.choices[0].text[3:] if c.strip())  # a character the answer makes after a while
    kw = dict(prompt=PROMPT, max_tokens=24, temperature=0, stop=[stop], logprobs=1)
    want, got = _completions(plain, **kw), _completions(spec, **kw)
    assert got.choices[0].text == want.choices[0].text and got.choices[0].finish_reason == "stop"
    assert got.choices[0].logprobs.tokens == want.choices[0].logprobs.tokens

    async def streamed():
        chunks = await openai_asgi.client(spec).completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0, stream=True
        )
        return [c async for c in chunks]

    pieces = asyncio.run(streamed())
    whole = _completions(plain, prompt=PROMPT, max_tokens=24, temperature=0).choices[0].text
    assert "".join(c.choices[0].text for c in pieces) == whole and len(pieces) > 3


def test_v1_sampling_is_the_speculating_generate_calls_rows_with_the_seed(fronts, spec_sess, codec):
    """n choices with a seed are the rows of one speculating generate call of n copies (choice i draws from row
    i's stream), so a seed reproduces them."""
    _, spec = fronts
    got = _completions(spec, prompt=PROMPT, max_tokens=16, n=2, temperature=0.7, seed=11)
    ids = codec.encode(PROMPT)
    run = Generation(
        spec_sess, [ids] * 2, 16, tokenizer=codec.tok, temperature=0.7, seed=11, prompt_lookup_num_tokens=4
    )
    run.run()
    assert [c.text for c in got.choices] == run.texts and len(set(run.texts)) > 1
    assert run.timings["speculation"]["proposed"] > 0
    again = _completions(spec, prompt=PROMPT, max_tokens=16, n=2, temperature=0.7, seed=11)
    assert [c.text for c in again.choices] == run.texts


def test_v1_json_answers_are_the_plain_servers(fronts):
    """A response_format's grammar scores each candidate on a fork of the row's matcher: the same JSON."""
    plain, spec = fronts

    async def chat(front):
        return await openai_asgi.client(front).chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": 'say {"a": [1, 1, 1, 1]}'}],
            max_tokens=40,
            temperature=0,
            response_format={"type": "json_object"},
        )

    want, got = asyncio.run(chat(plain)), asyncio.run(chat(spec))
    assert got.choices[0].message.content == want.choices[0].message.content
    if want.choices[0].finish_reason == "stop":
        json.loads(got.choices[0].message.content)


def test_a_server_refuses_what_cannot_speculate_by_name(sess, tiny_lm, spec_sess):
    with pytest.raises(ServeError, match="prompt_lookup=K .* or a draft"):
        ServeSpeculation()
    with pytest.raises(ServeError, match="ngram"):
        ServeSpeculation(ngram=3, draft={"d.onnx": b""})
    with pytest.raises(ServeError, match="draft_tokens=0"):
        ServeSpeculation(draft={"d.onnx": b""}, draft_tokens=0)
    with pytest.raises(ServeError, match="all_logits=True"):  # the target must return every position's logits
        check_speculating(sess, LOOKUP)
    with pytest.raises(ServeError, match="vocabulary of .* a draft must share"):
        check_speculating(spec_sess, Speculation(2, draft=tiny_lm("left-ort-gqa")))


@pytest.mark.parametrize("batching", ["static", "continuous"])
def test_a_speculating_server_answers_generate_and_counts_in_metrics(spec_path, sess, batching):
    """GenerateServer with prompt lookup, through its routes: /generate's tokens are the plain generate's, its
    /metadata names the speculation, and /metrics counts the candidates proposed and kept."""
    import httpx2
    from starlette.requests import Request

    from serve.generate.app import GenerateServer
    from serve.openai.serving import text_files
    from serve.replica import model_files

    server = GenerateServer(
        model_files(spec_path),
        MODEL,
        batching=batching,
        capacity=96,
        text=text_files(spec_path),
        speculation=ServeSpeculation(prompt_lookup=4),
    )

    async def app(scope, receive, send):
        response = await server(Request(scope, receive))
        await response(scope, receive, send)

    items = _items(seed=2)

    async def main():
        transport = httpx2.ASGITransport(app=app)
        async with httpx2.AsyncClient(transport=transport, base_url="http://attnzoo.test") as http:
            posts = [
                http.post("/generate", json={"input_ids": it.ids.tolist(), "max_new_tokens": it.max_new_tokens})
                for it in items[:3]
            ]
            answers = await asyncio.gather(*posts)
            return answers, (await http.get("/metadata")).json(), (await http.get("/metrics")).text

    answers, meta, metrics = asyncio.run(main())
    for answer, it in zip(answers, items):
        assert answer.status_code == 200, answer.text
        want = sess.generate(it.ids, it.max_new_tokens, eos_token_id=[])
        assert answer.json()["tokens"] == want.tolist()
        if batching == "continuous":  # each request's own counts
            assert int(answer.headers["x-attnzoo-spec-emitted"]) == it.max_new_tokens - 1
    assert meta["speculation"] == {"kind": "prompt lookup", "k": 4, "ngram": 2}
    lines = [line for line in metrics.splitlines() if line.startswith("attnzoo:spec_decode")]
    counts = {line.split("{")[0].removeprefix("attnzoo:spec_decode_"): float(line.split()[-1]) for line in lines}
    assert 0 < counts["num_accepted_tokens_total"] < counts["num_draft_tokens_total"], counts
    assert 0 < counts["num_target_calls_total"] < counts["num_emitted_tokens_total"], counts
    assert 0 < counts["acceptance_rate"] < 1 and counts["tokens_per_target_call"] > 1, counts


def test_cli_serve_takes_the_speculation_flags_and_refuses_what_cannot_run(lm_path):
    from cli.common import CliError
    from cli.main import build_parser
    from cli.serve_model import serve_speculation

    def parsed(*flags):
        return build_parser().parse_args(["serve", "model.onnx", *flags])

    help_text = build_parser()._subparsers._group_actions[0].choices["serve"].format_help()
    for flag in ("--prompt-lookup K", "--ngram N", "--draft FOLDER|MODEL.onnx", "--draft-tokens K"):
        assert flag in help_text
    assert serve_speculation(parsed()) is None
    lookup = serve_speculation(parsed("--prompt-lookup", "4", "--ngram", "3"))
    assert lookup.describe() == {"kind": "prompt lookup", "k": 4, "ngram": 3}
    draft = serve_speculation(parsed("--draft", str(lm_path), "--draft-tokens", "2"))
    assert list(draft.draft) == [lm_path.name, lm_path.name + ".data"] and draft.k == 2
    with pytest.raises(CliError, match="--ngram sizes speculative decoding"):
        serve_speculation(parsed("--ngram", "3"))
    with pytest.raises(CliError, match="--provider cuda"):
        serve_speculation(parsed("--prompt-lookup", "4", "--provider", "cuda"))
    with pytest.raises(ServeError, match="one"):
        serve_speculation(parsed("--prompt-lookup", "4", "--draft", str(lm_path)))


@pytest.mark.slow
def test_a_traced_export_speculates_as_the_spliced_one(tmp_path, hf_lm, sess):
    """A left-padded traced export (positions counted over a row's real keys) under the speculating batcher: the
    plain batcher's tokens too, with prompt lookup and with a draft."""
    from export.lm_export import export_lm
    from peers.lm import lm_from_hf
    from runtime.session import OnnxSession

    out = export_lm(lm_from_hf(hf_lm).eval(), tmp_path / "traced.onnx", lowering="decomposed", all_logits=True).path
    traced = OnnxSession(out, provider="cpu", verbose=False)
    items = _items(seed=4)
    plain = _together(ContinuousBatcher(sess, max_rows=6, capacity=64), items)
    for spec in (LOOKUP, Speculation(2, draft=sess)):
        batcher = SpeculativeBatcher(traced, max_rows=6, capacity=64, speculation=spec)
        for (tokens, _), (want, _) in zip(_together(batcher, items), plain):
            np.testing.assert_array_equal(tokens, want)
        assert batcher.tally["proposed"] > 0
