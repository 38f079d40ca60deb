"""POST /generate: a whole-model export's requests (token ids in, greedy tokens out), checked before
anything runs. Plain numpy: no Ray.

    {"input_ids": [5, 6, 7], "max_new_tokens": 16}                         one row
    {"input_ids": [[0, 5, 6], [4, 5, 6]], "attention_mask": [[0, 1, 1], [1, 1, 1]],
     "max_new_tokens": 16, "eos_token_id": 2}                              several, left-padded

The answer is `{"tokens": ..., "prompt_len": t, "new_tokens": k}`: per row the prompt followed by the
greedy tokens, as `OnnxSession.generate` returns them for the request alone (one row: a flat list).
Every client mistake is a RequestError (4xx) with one line: an id outside the vocabulary, a
max_new_tokens past the server's limit, rows or positions past the server's limits, a prompt that
would not fit the export's max_len.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import numpy as np

from zoo import AttnzooError
from zoo.generation_inputs import check_token_ids, left_padded_mask, new_token_count, token_id

from ..schema import DEFAULT_MAX_BODY, DEFAULT_MAX_TOKENS, JSON, RequestError, ServeError

GEN_FIELDS = ("input_ids", "attention_mask", "max_new_tokens", "eos_token_id")
DEFAULT_MAX_NEW_TOKENS = 256  # per request; a larger one is a 413 (raise it with --max-new-tokens)
GEN_ROUTE = "/generate"


@dataclass(frozen=True)
class GenInfo:
    """What a /generate request is checked against: the export's vocabulary and capacity, and the
    server's limits."""

    vocab: int
    max_len: int | None  # the export's largest capacity (attnzoo.max_len); None: sized per call
    max_rows: int = 16
    max_tokens: int = DEFAULT_MAX_TOKENS  # rows * (prompt + max_new_tokens) per request
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    max_body: int = DEFAULT_MAX_BODY

    @classmethod
    def of(cls, sess, **limits) -> GenInfo:
        """From an `OnnxSession` over a whole-model export (export_onnx of a zoo.DecoderLM)."""
        from runtime.generation import lm_max_len, lm_vocab

        try:
            vocab = lm_vocab(sess)
        except AttnzooError:
            raise ServeError(
                f"{sess.path} is not a whole-model export (no attnzoo.vocab); "
                "make one with `attnzoo export --checkpoint DIR --whole -o lm.onnx`"
            ) from None
        return cls(vocab=vocab, max_len=lm_max_len(sess), **limits)


@dataclass
class GenItem:
    """One decoded /generate request: ids (r t) int64, mask (r t) bool or None."""

    ids: np.ndarray
    max_new_tokens: int
    mask: np.ndarray | None = None
    eos_token_id: int | None = None
    squeeze: bool = False  # input_ids came as one flat row: answer one flat row
    enqueued: float = field(default_factory=time.perf_counter)
    # None: greedy, the graph's next_token (POST /generate). Else what chooses and follows this request's
    # tokens under continuous batching (serve/openai/serving.TextRun: sampling, stop strings, streaming, a
    # client that left): choose(logits (r v), argmax (r,)) -> (r,); add(tokens (r,)) -> ended; cancelled.
    decoder: object | None = None
    cancelled: bool = False  # its client left (a /generate request; a decoder says so for itself)

    @property
    def rows(self) -> int:
        return self.ids.shape[0]

    @property
    def t(self) -> int:
        return self.ids.shape[1]


def is_lm(sess) -> bool:
    """Whether `sess` runs a whole-model export (served on /generate) rather than a block."""
    return sess.is_lm


def decode_generate_request(body: bytes, content_type: str, info: GenInfo) -> GenItem:
    """Parse and check one /generate body; raises RequestError (4xx) with one line."""
    kind = (content_type or "").split(";")[0].strip().lower()
    if kind not in ("", JSON, "text/json"):
        raise RequestError(f"content type {kind!r} is not served on {GEN_ROUTE}; send {JSON}", 415)
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RequestError(
            f"the body is not JSON ({type(e).__name__}: {str(e)[:80]}); send "
            '{"input_ids": [...], "max_new_tokens": N}'
        ) from None
    except RecursionError:
        raise RequestError("the JSON body nests too deeply; input_ids is at most 2 levels deep") from None
    if not isinstance(doc, dict):
        raise RequestError(f'the JSON body is a {type(doc).__name__}; send an object such as {{"input_ids": [1, 2]}}')
    extra = sorted(set(doc) - set(GEN_FIELDS))
    if extra:
        raise RequestError(f"unknown field(s) {extra}; a {GEN_ROUTE} request has {', '.join(GEN_FIELDS)}")
    if doc.get("input_ids") is None:
        raise RequestError("input_ids is required: a list of token ids, or a list of rows of them")
    ids = _ids(doc["input_ids"], "input_ids", info.vocab)
    squeeze = ids.ndim == 1
    ids = ids[None] if squeeze else ids
    if ids.ndim != 2 or 0 in ids.shape:
        raise RequestError(f"input_ids has shape {ids.shape}; send a non-empty list of ids or of equal-length rows")
    rows, t = ids.shape
    if doc.get("max_new_tokens") is None:
        raise RequestError("max_new_tokens is required: how many tokens to generate, e.g. 16")
    new = _shared(new_token_count, doc["max_new_tokens"])
    if new > info.max_new_tokens:
        raise RequestError(
            f"max_new_tokens={new}; this server generates at most {info.max_new_tokens} per request "
            "(attnzoo serve --max-new-tokens)",
            413,
        )
    if rows > info.max_rows:
        raise RequestError(f"input_ids has {rows} rows; this server takes at most {info.max_rows} (split it)", 413)
    if rows * (t + new) > info.max_tokens:
        raise RequestError(
            f"rows*(prompt+max_new_tokens) = {rows}*({t}+{new}) = {rows * (t + new)} positions; this server "
            f"takes at most {info.max_tokens} per request (split it)",
            413,
        )
    if info.max_len is not None and t + new - 1 > info.max_len:
        raise RequestError(
            f"a prompt of {t} tokens and {new} new ones write {t + new - 1} cache positions, past this server's "
            f"max_len {info.max_len} (GET /metadata: the export's --max-len, or --capacity when batching continuously)",
            413,
        )
    _shared(check_token_ids, ids, info.vocab)
    eos = _shared(token_id, doc.get("eos_token_id"), info.vocab, "eos_token_id")
    mask = None
    if doc.get("attention_mask") is not None:
        mask = _mask(doc["attention_mask"], squeeze, (rows, t))
    return GenItem(
        ids=np.ascontiguousarray(ids, np.int64), max_new_tokens=new, mask=mask, eos_token_id=eos, squeeze=squeeze
    )


def _shared(check, *args):
    """A check of zoo.generation_inputs (the rule eager and ONNX generate follow too), its refusal a 400."""
    try:
        return check(*args)
    except AttnzooError as e:
        raise RequestError(str(e)) from None


def _ids(value, name: str, vocab: int) -> np.ndarray:
    if not isinstance(value, list):
        raise RequestError(f"{name} is a {type(value).__name__}; send a list of token ids (integers)")
    for row in value:  # JSON's true/false would read as ids 1/0, and a 20-digit id would not fit int64
        for v in row if isinstance(row, list) else (row,):
            if isinstance(v, bool):
                raise RequestError(f"{name} holds {str(v).lower()}; token ids are integers")
            if isinstance(v, int) and not 0 <= v < vocab:
                raise RequestError(f"token id {v} is outside this model's vocabulary of {vocab} (0..{vocab - 1})")
    try:
        arr = np.asarray(value)
    except (ValueError, OverflowError):
        raise RequestError(f"{name} is a ragged list; every row must have the same length (left-pad them)") from None
    if arr.dtype == object:
        raise RequestError(f"{name} is a ragged or mixed list; send rows of equal length, of integers")
    if arr.size and arr.dtype.kind not in "iu":
        raise RequestError(f"{name} holds {arr.dtype} values; token ids are integers")
    if arr.ndim > 2:
        raise RequestError(f"{name} has shape {arr.shape}; send a list of ids, or a list of rows of them")
    return arr


def _mask(value, squeeze: bool, shape: tuple[int, int]) -> np.ndarray:
    if not isinstance(value, list):
        raise RequestError(f"attention_mask is a {type(value).__name__}; send a list of 0/1 like input_ids")
    try:
        arr = np.asarray(value)
    except (ValueError, OverflowError):
        raise RequestError("attention_mask is a ragged list; it must be input_ids' shape") from None
    arr = arr[None] if squeeze and arr.ndim == 1 else arr
    return _shared(left_padded_mask, arr, shape)


def encode_tokens(item: GenItem, tokens: np.ndarray) -> bytes:
    """The JSON answer for `item` from its rows' tokens (r, t + k)."""
    doc = {
        "tokens": (tokens[0] if item.squeeze else tokens).tolist(),
        "prompt_len": item.t,
        "new_tokens": int(tokens.shape[1] - item.t),
    }
    return json.dumps(doc).encode()


__all__ = [
    "DEFAULT_MAX_NEW_TOKENS",
    "GEN_FIELDS",
    "GEN_ROUTE",
    "GenInfo",
    "GenItem",
    "decode_generate_request",
    "encode_tokens",
    "is_lm",
]
