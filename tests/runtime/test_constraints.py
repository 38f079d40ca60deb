"""Structured output (runtime/constraints.py): llguidance's masks over random logits (a model that would never
write JSON by itself) give answers that parse and validate, each row its own matcher; the bit unpacking equals
llguidance's own numpy apply; bad schemas and formats are ConstraintErrors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from helpers import REPO
from runtime.constraints import (
    ConstraintError,
    GrammarConstraint,
    allowed,
    grammar_of,
    lltokenizer,
    schema_of,
)

pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")
VOCAB = 259  # tiny-stdlib-llama's byte tokenizer
EOS = 257
SCHEMAS = [
    {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "maximum": 120}},
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 1, "maxItems": 4},
    {
        "type": "object",
        "properties": {
            "ok": {"type": "boolean"},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}, "maxItems": 3},
        },
        "required": ["ok", "tags"],
        "additionalProperties": False,  # else a random model may add keys without end
    },
]


@pytest.fixture(scope="module")
def tok():
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(REPO / "models" / "tiny-stdlib-llama" / "tokenizer.json"))


def _decode(constraint, tok, rows: int, seed: int, steps: int = 400, temperature: float = 0.0):
    """Random logits, masked, argmax (or sampled); each row stops at its eos or when its grammar completes."""
    rng = np.random.default_rng(seed)
    ids = np.zeros((rows, 1), np.int64)
    done = np.zeros(rows, bool)
    for _ in range(steps):
        scores = constraint(ids, rng.standard_normal((rows, VOCAB)).astype(np.float32) * 3)
        if temperature:
            p = np.exp(scores - scores.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            token = np.array([rng.choice(VOCAB, p=row) for row in p])
        else:
            token = scores.argmax(-1)
        token = np.where(done, EOS, token)
        ids = np.concatenate([ids, token[:, None]], 1)
        constraint.follow(ids)
        done |= (token == EOS) | np.array([constraint.stopped(r) for r in range(rows)])
        if done.all():
            break
    assert done.all(), "a row never completed its grammar"
    return [tok.decode([t for t in row[1:].tolist() if t != EOS]) for row in ids]


@pytest.mark.parametrize("schema", SCHEMAS, ids=["object", "enum-array", "nested"])
def test_random_logits_under_a_schema_always_validate(tok, schema):
    llt = lltokenizer(tok, VOCAB, [EOS])
    grammar = grammar_of(json_schema=schema)
    for seed in range(4):
        texts = _decode(GrammarConstraint(llt, grammar, rows=3, prompt_len=1), tok, 3, seed, temperature=seed % 2)
        for text in texts:
            jsonschema.validate(json.loads(text), schema)


def test_json_object_mode_gives_an_object_and_rows_are_independent(tok):
    llt = lltokenizer(tok, VOCAB, [EOS])
    grammar = grammar_of(response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMAS[0]}})
    together = _decode(GrammarConstraint(llt, grammar, rows=2, prompt_len=1), tok, 2, seed=5)
    rng = np.random.default_rng(5)
    logits = [rng.standard_normal((2, VOCAB)).astype(np.float32) * 3 for _ in range(400)]
    # row 1 alone, fed the same logits row by row, writes the same text
    alone = GrammarConstraint(llt, grammar, rows=1, prompt_len=1)
    ids = np.zeros((1, 1), np.int64)
    for step in logits:
        token = alone(ids, step[1:2]).argmax(-1)
        if token[0] == EOS:
            break
        ids = np.concatenate([ids, token[:, None]], 1)
        alone.follow(ids)
        if alone.stopped():
            break
    assert tok.decode(ids[0, 1:].tolist()) == together[1]
    obj = grammar_of(response_format={"type": "json_object"})
    for text in _decode(GrammarConstraint(llt, obj, rows=2, prompt_len=1), tok, 2, seed=2, steps=3000):
        assert isinstance(json.loads(text), dict)


def test_the_mask_bits_equal_llguidances_own_apply():
    import llguidance.numpy as lln

    rng = np.random.default_rng(0)
    mask = rng.integers(-(2**31), 2**31, (3, 9), dtype=np.int64).astype(np.int32)
    logits = rng.standard_normal((3, VOCAB)).astype(np.float32)
    want = logits.copy()
    lln.apply_token_bitmask_inplace(want, mask)
    got = np.where(allowed(mask, VOCAB), logits, -np.inf)
    assert np.array_equal(got, want)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"response_format": {"type": "xml"}},
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": []}}},
        {"json_schema": "{not json"},
        {"json_schema": {"type": "object"}, "response_format": {"type": "json_object"}},
    ],
)
def test_a_bad_format_is_a_constraint_error(kwargs):
    with pytest.raises(ConstraintError):
        schema_of(**kwargs)


def test_a_schema_llguidance_cannot_take_is_a_constraint_error(tok):
    llt = lltokenizer(tok, VOCAB, [EOS])
    with pytest.raises(ConstraintError):
        GrammarConstraint(llt, grammar_of(json_schema={"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}))
    assert schema_of(response_format={"type": "text"}) is None


def test_generate_with_a_json_schema_gives_each_padded_row_a_valid_document(tmp_path, tok):
    """OnnxSession.generate's json_schema on a random LLaMA over the byte tokenizer, two left-padded rows,
    sampled: each row's text validates, and each row ended at the eos its grammar allowed."""
    import torch
    import transformers

    import zoo
    from export import OnnxSession, export_onnx
    from runtime.generation import Generation

    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2,
    )  # fmt: skip
    torch.manual_seed(0)
    export_onnx(zoo.lm_from_hf(transformers.LlamaForCausalLM(cfg).eval()), tmp_path / "lm.onnx")
    sess = OnnxSession(tmp_path / "lm.onnx", provider="cpu", verbose=False)
    ids = [[258, 258] + tok.encode("x = ").ids, tok.encode("def f(").ids]
    mask = [[0, 0] + [1] * (len(ids[0]) - 2), [1] * len(ids[1])]
    run = Generation(sess, ids, 120, mask, tokenizer=tok, json_schema=SCHEMAS[0], temperature=1.0, seed=2)
    run.run()
    for text, finish in zip(run.texts, run.finish_reason):
        jsonschema.validate(json.loads(text), SCHEMAS[0])
        assert finish == "stop"
    with pytest.raises(ConstraintError):  # the text is what is constrained: a tokenizer is needed
        Generation(sess, ids[1:], 4, json_schema=SCHEMAS[0])
