"""A whole-model server's operations, without Ray: request ids and the access log (serve/access.py), the
Prometheus metrics (serve/metrics.py, parsed by prometheus_client's own parser), /tokenize and /detokenize in
vLLM's shapes (serve/openai/tokenize.py) and the settings' checks (serve/ops.py). Through HTTP, on the shared
server of tests/serve/test_openai.py: tests/serve/ops_http.py."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from helpers import REPO
from runtime.chat import ChatTemplate
from runtime.stopping import Codec
from serve.access import LOG, AccessLog, current, request_id
from serve.generate.rows import Running
from serve.openai.protocol import OpenAIError
from serve.openai.tokenize import detokenize, tokenize
from serve.ops import ServeOps
from serve.schema import ServeError


def test_a_request_keeps_its_own_usable_id_else_gets_a_fresh_one():
    assert request_id({"x-request-id": "abc-123_x.y:z"}) == "abc-123_x.y:z"
    assert request_id({"x-request-id": "4cd6f180-f17d-4aeb-880d-94aa76bd1856"}).count("-") == 4  # Ray Serve's
    for bad in ("", "a b", "x" * 257, "é", "a\nb"):
        fresh = request_id({"x-request-id": bad})
        assert len(fresh) == 32 and int(fresh, 16) >= 0, bad
    assert request_id({}) != request_id({})


def test_an_access_line_has_the_id_tokens_and_timings_and_the_prompt_only_when_asked(tmp_path):
    import logging

    seen = []
    handler = logging.Handler()
    handler.emit = seen.append
    for prompts in (False, True):
        path = tmp_path / f"access-{prompts}.log"
        log = AccessLog(str(path), prompts=prompts, replica="host:1")
        request = SimpleNamespace(headers={"x-request-id": "req-7"}, method="POST")
        rec = log.begin(request, "/v1/completions")
        assert current() is rec
        rec.prompt_tokens, rec.prompt = 5, "secret prompt"
        rec.ran(SimpleNamespace(made=3, finish="length"), {"x-attnzoo-queue-ms": 1.5, "x-attnzoo-ttft-ms": 4.25})
        log.end(rec, 200)
        (line,) = path.read_text().splitlines()
        doc = json.loads(line)
        assert doc["request_id"] == "req-7" and doc["route"] == "/v1/completions" and doc["status"] == 200
        assert (doc["prompt_tokens"], doc["completion_tokens"], doc["finish_reason"]) == (5, 3, "length")
        assert doc["ttft_ms"] == 4.25 and doc["total_ms"] >= 0 and doc["replica"] == "host:1"
        assert ("prompt" in doc) == prompts and ("secret" in line) == prompts
        LOG.addHandler(handler)
        try:
            LOG.warning("refused: busy")  # any other line about the request carries its id
        finally:
            LOG.removeHandler(handler)
        assert seen[-1].request_id == "req-7" and seen[-1].getMessage() == "refused: busy"


class _Batcher:
    """What ReplicaMetrics reads of a continuous batcher."""

    def __init__(self) -> None:
        self.running, self.queued, self.used, self.max_rows = [], 3, 2, 8
        self.refused, self.timed_out = 4, 1
        self.prefix = SimpleNamespace(queries=100, hits=48, bytes=4096)


def _families(text: bytes) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    return {f.name: f for f in text_string_to_metric_families(text.decode())}


def _value(families, name, suffix="", **labels):
    family = families[name]
    return sum(
        s.value
        for s in family.samples
        if s.name == name + suffix and all(s.labels.get(k) == v for k, v in labels.items())
    )


def test_the_metrics_are_vllms_names_by_model_and_move_as_requests_leave():
    from serve.generate.protocol import GenItem
    from serve.metrics import ReplicaMetrics

    batcher = _Batcher()
    metrics = ReplicaMetrics("chat", lambda: [batcher])
    before = _families(metrics.text())
    for name in ("time_to_first_token_seconds", "time_per_output_token_seconds", "e2e_request_latency_seconds"):
        assert before["attnzoo:" + name].type == "histogram"
    assert _value(before, "attnzoo:num_requests_waiting", model_name="chat") == 3
    assert _value(before, "attnzoo:kv_cache_usage_perc") == 0.25
    assert _value(before, "attnzoo:prefix_cache_hits", "_total") == 48
    assert _value(before, "attnzoo:prefix_cache_queries", "_total") == 100
    assert _value(before, "attnzoo:num_requests_refused", "_total") == 4

    item = GenItem(ids=np.zeros((1, 7), np.int64), max_new_tokens=5)
    item.enqueued = 10.0
    run = Running(item, [0], None, admitted=10.5, tokens=[np.zeros(1)] * 5, first_at=11.0)
    metrics.finished(run, 13.0, "length")
    after = _families(metrics.text())
    assert _value(after, "attnzoo:prompt_tokens", "_total", model_name="chat") == 7
    assert _value(after, "attnzoo:generation_tokens", "_total") == 5
    assert _value(after, "attnzoo:request_success", "_total", finished_reason="length") == 1
    assert _value(after, "attnzoo:time_to_first_token_seconds", "_sum") == pytest.approx(1.0)
    assert _value(after, "attnzoo:e2e_request_latency_seconds", "_sum") == pytest.approx(3.0)
    assert _value(after, "attnzoo:time_per_output_token_seconds", "_sum") == pytest.approx(0.5)  # 2 s / 4 gaps
    assert _value(after, "attnzoo:request_queue_time_seconds", "_count") == 1


TEMPLATE = (
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}<|a|>{% endif %}"
)


@pytest.fixture(scope="module")
def front():
    codec = Codec(str(REPO / "models" / "tiny-stdlib-llama" / "tokenizer.json"))
    template = ChatTemplate(TEMPLATE, {})
    return SimpleNamespace(name="chat", codec=codec, template=template, capacity=63, max_positions=100, vocab=259)


def test_tokenize_and_detokenize_answer_in_vllms_shapes(front):
    got = tokenize(front, b'{"model": "chat", "prompt": "def main("}')
    ids = front.codec.encode("def main(")
    assert got == {"count": len(ids), "max_model_len": 64, "tokens": ids, "token_strs": None}
    strs = tokenize(front, b'{"prompt": "ab", "return_token_strs": true}')["token_strs"]
    assert strs == [front.codec.tok.id_to_token(i) for i in front.codec.encode("ab")]
    messages = [{"role": "user", "content": "hi"}]
    chat = tokenize(front, json.dumps({"messages": messages}).encode())
    assert chat["tokens"] == front.codec.encode(front.template.render(messages, add_generation_prompt=True))
    bare = tokenize(front, json.dumps({"messages": messages, "add_generation_prompt": False}).encode())
    assert bare["count"] < chat["count"]
    assert detokenize(front, json.dumps({"tokens": ids}).encode()) == {"prompt": "def main("}
    for body, status, param in [
        (b'{"model": "other", "prompt": "a"}', 404, "model"),
        (b'{"prompt": 5}', 400, "prompt"),
        (b'{"prompt": "a", "add_special_tokens": "yes"}', 400, "add_special_tokens"),
        (b"[1]", 400, None),
    ]:
        with pytest.raises(OpenAIError) as e:
            tokenize(front, body)
        assert (e.value.status, e.value.param) == (status, param), body
    for body in (b'{"tokens": [1, 999]}', b'{"tokens": "ab"}', b'{"tokens": [1.5]}'):
        with pytest.raises(OpenAIError) as e:
            detokenize(front, body)
        assert e.value.param == "tokens"


@pytest.mark.parametrize(
    "field,value",
    [("max_waiting", 0), ("max_waiting", True), ("request_timeout", 0), ("request_timeout", -1.0),
     ("prefix_cache_mb", -1), ("prefix_cache_mb", float("nan"))],
)  # fmt: skip
def test_bad_operations_settings_are_refused_in_one_line(field, value):
    with pytest.raises(ServeError) as e:
        ServeOps(**{field: value})
    assert field in str(e.value) and "\n" not in str(e.value)


def test_the_clis_prefix_cache_default_is_the_servers():
    import cli.serve_ops

    assert cli.serve_ops.DEFAULT_PREFIX_CACHE_MB == ServeOps().prefix_cache_mb
