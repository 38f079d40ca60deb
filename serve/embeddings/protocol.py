"""OpenAI's POST /v1/embeddings on a sentence encoder's server: a body checked into an `EmbedAsk`, and the
answer written as OpenAI writes it. Plain Python and numpy: no Ray, no torch.

    {"model": "tiny-st", "input": ["hello world", "the cat sat"], "encoding_format": "float"}

`input` is one string, a list of strings, one list of token ids, or a list of such lists. Token ids are the
model's own tokenizer's, special tokens included (what its tokenizer.json gives for a text): they are fed as
they are, so a list longer than the model's max_seq_length is refused (400, code "context_length_exceeded").
A text is truncated at max_seq_length, as sentence-transformers' encode truncates it; `usage` counts the
tokens the model read. `encoding_format` "float" (lists of numbers) or "base64" (little-endian float32
bytes, what the `openai` client asks for by default); `dimensions` only as the model's own width (the model
is not trained to be shortened); `user` is taken and ignored; `prompt_name` (beyond OpenAI's fields, the
`openai` client's extra_body) puts one of the model's prompts before each text, as encode(prompt_name=...)
does, else the model's default prompt applies. Mistakes: 400 (OpenAI's error format), 404 for another model.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass

import numpy as np

from ..openai.protocol import EMBEDDINGS, OpenAIError, check_model, json_object, number

FIELDS = ("model", "input", "encoding_format", "dimensions", "user", "prompt_name")
ENCODINGS = ("float", "base64")
MAX_INPUTS = 2048  # inputs per request, as OpenAI's API takes at most
SHAPES = "a string, a list of strings, a list of token ids, or a list of such lists"


@dataclass
class EmbedAsk:
    """One checked /v1/embeddings request: its texts or its token-id lists (one of the two), and how to answer."""

    texts: list[str] | None
    ids: list[list[int]] | None
    encoding_format: str = "float"
    prompt_name: str | None = None

    @property
    def count(self) -> int:
        return len(self.texts if self.texts is not None else self.ids)


def parse_embeddings(
    body: bytes,
    model: str,
    *,
    dim: int,
    vocab: int,
    max_len: int | None,
    prompts: dict[str, str] | None = None,
    max_inputs: int = MAX_INPUTS,
) -> EmbedAsk:
    """Check one /v1/embeddings body on the server of `model` (embeddings of `dim`, token ids below `vocab`,
    token-id lists of at most `max_len` ids, the model's `prompts`); OpenAIError otherwise."""
    doc = json_object(body, EMBEDDINGS, FIELDS)
    check_model(doc, model)
    fmt = doc.get("encoding_format")
    if fmt is None:
        fmt = "float"
    if fmt not in ENCODINGS:
        raise OpenAIError(f"encoding_format={fmt!r} is not one of {', '.join(ENCODINGS)}", param="encoding_format")
    dims = number(doc, "dimensions", 1, integer=True)
    if dims is not None and dims != dim:
        raise OpenAIError(
            f"dimensions={dims}: this model's embeddings have {dim} and are not shortened; leave it out",
            param="dimensions",
        )
    if doc.get("user") is not None and not isinstance(doc["user"], str):
        raise OpenAIError(f"user={doc['user']!r} must be a string", param="user")
    name = doc.get("prompt_name")
    if name is not None and (not isinstance(name, str) or name not in (prompts or {})):
        known = ", ".join(sorted(prompts or {})) or "none"
        raise OpenAIError(f"prompt_name={name!r} is not one of the model's prompts ({known})", param="prompt_name")
    texts, ids = _inputs(doc.get("input"), max_inputs)
    if ids is not None:
        if name is not None:
            raise OpenAIError("prompt_name applies to texts; token ids are fed as they are", param="prompt_name")
        for i, row in enumerate(ids):
            bad = [v for v in row if not 0 <= v < vocab]
            if bad:
                raise OpenAIError(f"input[{i}]: token id {bad[0]} is outside the vocabulary of {vocab}", param="input")
            if max_len is not None and len(row) > max_len:
                raise OpenAIError(
                    f"input[{i}] holds {len(row)} token ids; this model reads at most {max_len} (its "
                    "max_seq_length; a text is truncated there, token ids are not)",
                    param="input",
                    code="context_length_exceeded",
                )
    return EmbedAsk(texts, ids, fmt, name)


def _is_id(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _inputs(value, max_inputs: int) -> tuple[list[str] | None, list[list[int]] | None]:
    if value is None:
        raise OpenAIError(f"input is missing; give {SHAPES}", param="input")
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value:
        raise OpenAIError(f"input must be {SHAPES}, not empty", param="input")
    if len(value) > max_inputs:
        raise OpenAIError(f"input holds {len(value)} inputs; at most {max_inputs} per request", param="input")
    if all(isinstance(v, str) for v in value):
        empty = next((i for i, v in enumerate(value) if not v), None)
        if empty is not None:
            raise OpenAIError(f"input[{empty}] is an empty string; give some text", param="input")
        return value, None
    if all(_is_id(v) for v in value):
        return None, [value]
    if all(isinstance(v, list) and v and all(_is_id(x) for x in v) for v in value):
        return None, value
    raise OpenAIError(f"input must be {SHAPES} (non-empty, not mixed)", param="input")


def embeddings_answer(vectors: np.ndarray, encoding_format: str, model: str, tokens: int) -> bytes:
    """OpenAI's answer for `vectors` (n e): {"object": "list", "data": [...], "model", "usage"}."""
    if not np.isfinite(vectors).all():
        raise OpenAIError("the model's output is not finite for this input", 422)
    vectors = np.ascontiguousarray(vectors, dtype="<f4")
    if encoding_format == "base64":
        rows = [base64.b64encode(v.tobytes()).decode("ascii") for v in vectors]
    else:
        rows = vectors.tolist()
    data = [{"object": "embedding", "index": i, "embedding": e} for i, e in enumerate(rows)]
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    return json.dumps({"object": "list", "data": data, "model": model, "usage": usage}).encode()


__all__ = ["ENCODINGS", "FIELDS", "MAX_INPUTS", "EmbedAsk", "embeddings_answer", "parse_embeddings"]
