"""Structured output: decoding constrained to a grammar (a JSON schema, OpenAI's `response_format`) with
llguidance, the library onnxruntime-genai uses, over numpy masks (no torch). A logits processor as the others
(runtime/penalties.py): `proc(input_ids (b t) int64, scores (b v) float32) -> scores`, each row its own matcher.

    grammar = grammar_of(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    proc = GrammarConstraint(lltokenizer(tokenizer, vocab, eos_ids), grammar, rows=b, prompt_len=t)
    scores = proc(input_ids, scores)        # each row: the tokens its grammar takes next, the rest -inf

Each call first follows the tokens each row made since the last call (input_ids past prompt_len), then masks
what the row's matcher rules out. A row whose grammar is complete takes only an eos id next (`stopped(row)`
says so at once: a caller may end the row there, as the /v1 routes do). JSON is written compact (", " and
": " between items, no other whitespace: llguidance's whitespace_flexible off), so a model that would pad with
whitespace cannot run on; strings and numbers stay as long as the schema lets them (maxLength, enums bound
them).
"""

from __future__ import annotations

import json
from functools import lru_cache

import numpy as np

import zoo

JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
JSON_OBJECT = {"type": "object"}  # OpenAI's json_object mode: the answer is one JSON object


class ConstraintError(zoo.ArgumentError):
    """A response_format, schema or grammar llguidance cannot take (named, with its error)."""


def _llguidance():
    try:
        import llguidance
        import llguidance.numpy  # noqa: F401 - the mask helpers
    except ImportError:
        raise ConstraintError(
            "structured output needs llguidance (the text extra): pip install 'attnzoo[text]'"
        ) from None
    return llguidance


def schema_of(response_format=None, json_schema=None) -> dict | None:
    """The JSON schema a call asks for: `json_schema` (a dict, or its JSON text), or OpenAI's `response_format`
    ({"type": "text"} -> None, {"type": "json_object"} -> any object, {"type": "json_schema", "json_schema":
    {"name", "schema", "strict", "description"}} -> its schema); None for free text."""
    if json_schema is not None and response_format is not None:
        raise ConstraintError("give json_schema or response_format, not both")
    if json_schema is not None:
        if isinstance(json_schema, str):
            try:
                json_schema = json.loads(json_schema)
            except ValueError as e:
                raise ConstraintError(f"json_schema is not JSON ({e})") from None
        if not isinstance(json_schema, dict):
            raise ConstraintError(f"json_schema must be a JSON object (a schema), got {type(json_schema).__name__}")
        return json_schema
    if response_format is None:
        return None
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return dict(JSON_OBJECT)
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("name", ""), str):
            raise ConstraintError('response_format json_schema needs {"name": ..., "schema": {...}}')
        schema = spec.get("schema", {})
        if not isinstance(schema, dict):
            raise ConstraintError(f"response_format json_schema.schema must be an object, got {schema!r:.60}")
        return schema
    raise ConstraintError(
        f"response_format={response_format!r:.80}: give {{'type': 'text' | 'json_object' | 'json_schema'}}"
    )


def json_grammar(schema: dict) -> str:
    """llguidance's grammar of `schema`, compact JSON (JSON_OPTIONS)."""
    llg = _llguidance()
    try:
        return llg.LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=JSON_OPTIONS)
    except (ValueError, TypeError) as e:
        raise ConstraintError(f"the JSON schema is not usable: {e}") from None


def grammar_of(response_format=None, json_schema=None) -> str | None:
    schema = schema_of(response_format, json_schema)
    return None if schema is None else json_grammar(schema)


@lru_cache(maxsize=8)
def _tokenizer(text: str, vocab: int, eos: tuple[int, ...] | None):
    llg = _llguidance()
    try:
        return llg.LLTokenizer(text, n_vocab=vocab, eos_token=list(eos) if eos else None)
    except (ValueError, RuntimeError) as e:
        raise ConstraintError(f"llguidance cannot read this tokenizer: {e}") from None


def lltokenizer(tokenizer, vocab: int, eos=None):
    """llguidance's tokenizer over `tokenizer` (a tokenizers.Tokenizer, a transformers fast tokenizer, or the
    text of a tokenizer.json) for a model of `vocab` logits; eos: the ids that end a row (None: the
    tokenizer's own). Cached: a server builds it once."""
    if isinstance(tokenizer, str):
        text = tokenizer
    elif callable(getattr(tokenizer, "to_str", None)):
        text = tokenizer.to_str()
    elif hasattr(tokenizer, "backend_tokenizer"):
        text = tokenizer.backend_tokenizer.to_str()
    else:
        raise ConstraintError(f"structured output needs a tokenizers tokenizer, got {type(tokenizer).__name__}")
    eos = tuple(int(e) for e in eos) if eos else None
    return _tokenizer(text, int(vocab), eos)


def allowed(mask: np.ndarray, vocab: int) -> np.ndarray:
    """(b w) int32 bitmasks -> (b vocab) bool: token j is allowed where bit j%32 of word j//32 is set."""
    bits = np.unpackbits(np.ascontiguousarray(mask).view(np.uint8), axis=-1, bitorder="little")
    return bits[:, :vocab].astype(np.bool_)


class GrammarConstraint:
    """Each of `rows` rows decodes within `grammar` (json_grammar's, or any llguidance grammar)."""

    def __init__(self, tokenizer, grammar: str, rows: int = 1, prompt_len: int = 0) -> None:
        llg = _llguidance()
        self.tokenizer, self.prompt_len = tokenizer, int(prompt_len)
        self.eos = tuple(tokenizer.eos_tokens)
        self.matchers = [llg.LLMatcher(tokenizer, grammar, log_level=0) for _ in range(rows)]
        if self.matchers and self.matchers[0].is_error():
            raise ConstraintError(f"the grammar is not usable: {self.matchers[0].get_error()}")
        self.followed = [0] * rows  # tokens each row's matcher has taken
        self.mask = llg.numpy.allocate_token_bitmask(rows, tokenizer.vocab_size)

    def follow(self, input_ids: np.ndarray) -> None:
        """Each row's matcher takes the row's tokens it has not taken yet (none once stopped or failed: a row
        that ended is padded, and those pads are not its text)."""
        made = np.asarray(input_ids)[:, self.prompt_len :]
        for r, m in enumerate(self.matchers):
            for token in made[r, self.followed[r] :].tolist():
                if m.is_stopped() or m.is_error():
                    break
                m.consume_token(int(token))
            self.followed[r] = made.shape[1]

    def fork(self) -> GrammarConstraint:
        """A copy whose matchers go on apart from these (speculative decoding scores candidates on one: the
        row's own matchers take only the tokens kept)."""
        twin = object.__new__(GrammarConstraint)
        twin.tokenizer, twin.prompt_len, twin.eos = self.tokenizer, self.prompt_len, self.eos
        twin.matchers = [m.deep_copy() for m in self.matchers]
        twin.followed = list(self.followed)
        twin.mask = self.mask.copy()
        return twin

    def stopped(self, row: int = 0) -> bool:
        """The row's grammar is complete: only an eos id may follow."""
        return self.matchers[row].is_stopped() and not self.matchers[row].is_error()

    def accepting(self, row: int = 0) -> bool:
        return self.matchers[row].is_accepting()

    def error(self, row: int = 0) -> str | None:
        m = self.matchers[row]
        return m.get_error() if m.is_error() else None

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        llg = _llguidance()
        self.follow(input_ids)
        live = [r for r, m in enumerate(self.matchers) if not m.is_error()]
        if not live:
            return scores
        for r in live:
            llg.numpy.fill_next_token_bitmask(self.matchers[r], self.mask, r)
        v = scores.shape[-1]
        keep = np.ones(scores.shape, np.bool_)
        keep[live] = allowed(self.mask[live], v)
        return np.where(keep, scores, np.asarray(-np.inf, scores.dtype))


def row_constraint(json_schema, response_format, codec, vocab: int, eos, shape):
    """Generation's constraint (one matcher per row, past the prompt) for `json_schema` / `response_format`, or
    None for free text; needs the tokenizer (codec)."""
    grammar = grammar_of(response_format, json_schema)
    if grammar is None:
        return None
    if codec is None:
        raise ConstraintError("structured output reads the text: give the tokenizer too (tokenizer=...)")
    return GrammarConstraint(lltokenizer(codec.tok, vocab, eos or None), grammar, rows=shape[0], prompt_len=shape[1])


__all__ = [
    "JSON_OBJECT",
    "JSON_OPTIONS",
    "ConstraintError",
    "GrammarConstraint",
    "allowed",
    "grammar_of",
    "json_grammar",
    "lltokenizer",
    "row_constraint",
    "schema_of",
]
