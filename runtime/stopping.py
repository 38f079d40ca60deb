"""Where a row stops, and its text as it grows (no torch): a list of eos ids, stop strings matched on the
decoded text across token boundaries, and the call's `max_time`.

Where a stop string may begin differs between the two references, so a row says which it follows:
transformers' `stop_strings` (`StopStringCriteria`) checks the whole sequence, prompt included, and stops
where a new token ends a stop string, even one that begins inside the prompt (stop "lon" after the prompt
"hello" stops at a first new token "n"), never at one that lies wholly in the prompt; OpenAI's `stop`
looks at the completion alone. `OnnxSession.generate`/`stream` (and `attnzoo generate --stop`) follow
transformers (`row_texts(..., in_prompt=True)`); the server's `stop` follows OpenAI (a `RowText`'s default).
Either way a text output ends where the stop string begins ("" where it began in the prompt).

A row's text is decoded incrementally (`RowText`), as vLLM and text-generation-inference do: the new
tokens are decoded with one token of context before them and only the part past that context's text is
new; a piece ending in U+FFFD (a multi-byte character cut between tokens) is held back until the next
token completes it, so a character never splits. With stop strings a row's text is released only up to
where a stop string could still begin, so text outputs end before the stop string (OpenAI's `stop`),
while the tokens keep it (transformers' `stop_strings`). `RowText.peek` gives the text a token would add
in the same context (what a logprob entry names it by) without adding it, and `Codec.token_bytes` a token's
own bytes, read from the vocabulary (for a token that ends inside a character, whose text is not its own).
"""

from __future__ import annotations

import json
import os
import re
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

import zoo


def eos_ids(value) -> tuple[int, ...]:
    """An eos_token_id (None, an int, or several) as a tuple of ints."""
    if value is None:
        return ()
    many = value if isinstance(value, (list, tuple, np.ndarray)) else [value]
    out = []
    for v in many:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
            raise zoo.InputTypeError(f"eos_token_id={value!r} must be a token id (an integer >= 0) or a list of them")
        out.append(int(v))
    return tuple(out)


def stop_strings(value) -> tuple[str, ...]:
    """`stop`: None, one string or several, none empty."""
    if value is None:
        return ()
    many = [value] if isinstance(value, str) else value
    if not isinstance(many, (list, tuple)) or not all(isinstance(s, str) and s for s in many):
        raise zoo.ArgumentError(f"stop={value!r}: give a non-empty string or a list of them")
    return tuple(many)


class Codec:
    """encode(text) -> ids and decode(ids) -> text over a `tokenizers.Tokenizer`, a tokenizer.json path,
    or any object with those two methods (a transformers tokenizer)."""

    def __init__(self, tokenizer: Any) -> None:
        if isinstance(tokenizer, (str, os.PathLike)):
            from tokenizers import Tokenizer

            path = Path(tokenizer)
            if not path.is_file():
                raise zoo.MissingFileError(f"tokenizer={str(path)!r}: no such file; give a tokenizer.json")
            tokenizer = Tokenizer.from_file(str(path))
        if not (callable(getattr(tokenizer, "encode", None)) and callable(getattr(tokenizer, "decode", None))):
            raise zoo.InputTypeError(
                f"tokenizer={type(tokenizer).__name__} has no encode/decode; give a tokenizers.Tokenizer or a path"
            )
        self.tok = tokenizer
        self._fast = type(tokenizer).__module__.startswith("tokenizers")

    def encode(self, text: str) -> list[int]:
        if self._fast:
            return self.tok.encode(text, add_special_tokens=False).ids
        ids = self.tok.encode(text, add_special_tokens=False)
        return list(getattr(ids, "ids", ids))

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=True)

    def token_bytes(self, token: int) -> bytes | None:
        """A token's own bytes, from its piece in the vocabulary: byte-level BPE's pieces through GPT-2's
        byte-to-character map inverted, a byte-fallback piece "<0xNN>" as that byte, a SentencePiece "▁" as
        a space, else the piece's UTF-8; None where the tokenizer shows no vocabulary (not a `tokenizers` one,
        nor a transformers tokenizer over one)."""
        if self._pieces is None:
            return None
        piece = self._pieces[0].id_to_token(int(token))
        if piece is None:
            return None
        byte_level, fallback, metaspace = self._pieces[1:]
        if byte_level and all(c in _BYTE_OF for c in piece):
            return bytes(_BYTE_OF[c] for c in piece)
        hit = _BYTE_PIECE.fullmatch(piece) if fallback else None
        if hit:
            return bytes([int(hit.group(1), 16)])
        return (piece.replace("\u2581", " ") if metaspace else piece).encode()

    @cached_property
    def _pieces(self):
        """(the `tokenizers.Tokenizer`, byte-level?, byte fallback?, "▁" a space?) or None; read once."""
        tok = self.tok if self._fast else getattr(self.tok, "backend_tokenizer", None)
        if not callable(getattr(tok, "to_str", None)):
            return None
        doc = json.loads(tok.to_str())
        parts = json.dumps([doc.get("decoder"), doc.get("pre_tokenizer")])
        byte_level = '"type": "ByteLevel"' in parts
        fallback = bool((doc.get("model") or {}).get("byte_fallback")) or '"ByteFallback"' in parts
        return tok, byte_level, fallback, '"Metaspace"' in parts or "\\u2581" in parts


def _gpt2_bytes() -> dict[str, int]:
    """GPT-2's map of bytes to printable characters (bytes_to_unicode), inverted: character -> byte."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1), *range(ord("\xae"), 256)]
    moved = [b for b in range(256) if b not in kept]
    return {**{chr(b): b for b in kept}, **{chr(256 + i): b for i, b in enumerate(moved)}}


_BYTE_OF = _gpt2_bytes()
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _held_back(text: str, stops: tuple[str, ...]) -> int:
    """How many characters at the end of `text` could begin a stop string (the longest such suffix)."""
    longest = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), longest, -1):
            if text.endswith(s[:n]):
                longest = n
                break
    return longest


CONTEXT = 4  # prompt tokens a row's new text is decoded after (vLLM's incremental detokenizer starts 5 back)


def row_texts(codec: Codec, stops: tuple[str, ...], ids, attention_mask=None, *, in_prompt=False) -> list[RowText]:
    """One RowText per prompt row of `ids` (b t), each read after its own real tokens (left padding skipped);
    `in_prompt`: a stop string may begin in that row's prompt (transformers' `stop_strings`)."""
    ids = np.asarray(ids)
    real = np.ones(ids.shape, np.bool_) if attention_mask is None else np.asarray(attention_mask) != 0
    return [RowText(codec, stops, context=row[keep], in_prompt=in_prompt) for row, keep in zip(ids, real)]


class RowText:
    """One row's new tokens as text, decoded as they come; `add(token)` returns the text now safe to show
    (possibly ""), and `stopped` turns True once a new token ends a stop string (its text then ends before it).
    A stop string is looked for in the new text alone (OpenAI's `stop`), or with `in_prompt` in the prompt's
    text and the new text together (transformers' `stop_strings`): the prompt's last characters are `before`."""

    def __init__(self, codec: Codec, stops: tuple[str, ...] = (), context=(), *, in_prompt: bool = False) -> None:
        self.codec, self.stops = codec, stops
        self.ids: list[int] = self._seed(context)  # the prompt's last tokens, then the new ones
        self.prefix, self.read = 0, len(self.ids)  # token offsets: the context decoded before, and what is text already
        self.text = ""  # every character decoded so far
        self.shown = 0  # characters of `text` released
        self.stopped = False
        self._longest = max((len(s) for s in stops), default=0)
        self.before = self._prompt_tail(context) if in_prompt and self._longest > 1 else ""

    def _seed(self, context) -> list[int]:
        """The prompt's last CONTEXT tokens, which the first new ones are read after: a SentencePiece "▁Paris"
        after a prompt adds " Paris", as in the whole text's decode (alone, its decoder strips that space). None
        where they end inside a character (its rest would be read as the new text's)."""
        tail = [int(t) for t in list(context)[-CONTEXT:]]
        return tail if tail and not self.codec.decode(tail).endswith("\ufffd") else []

    def _prompt_tail(self, context) -> str:
        """The prompt's last characters a stop string may begin in (one fewer than the longest stop string's);
        a character the prompt ends inside is left out (the new tokens' text completes it)."""
        text = self.codec.decode([int(t) for t in context]).rstrip("\ufffd")
        return text[len(text) - self._longest + 1 :] if len(text) >= self._longest else text

    def peek(self, tokens) -> list[tuple[str, bool]]:
        """For each of `tokens`, as if it came next: (the text it would add, whether it ends inside a character).
        The text is read in context, so a SentencePiece "▁word" keeps its space and the token completing a
        multi-byte character carries the whole character; one ending inside a character adds "" (yet)."""
        before = self.codec.decode(self.ids[self.prefix : self.read])
        return [self._new_text(before, self.codec.decode([*self.ids[self.prefix :], int(t)])) for t in tokens]

    @staticmethod
    def _new_text(before: str, after: str) -> tuple[str, bool]:
        if after.endswith("\ufffd"):
            return "", True
        return (after[len(before) :] if len(after) > len(before) else ""), False

    def add(self, token: int) -> str:
        if self.stopped:
            return ""
        self.ids.append(int(token))
        before = self.codec.decode(self.ids[self.prefix : self.read])
        new, _ = self._new_text(before, self.codec.decode(self.ids[self.prefix :]))
        if new:
            old = len(self.text)
            self.text += new
            self.prefix, self.read = self.read, len(self.ids)
            self._match(old)
        return self._release(final=self.stopped)

    def _match(self, old: int) -> None:
        """Stop where a stop string ends past the first `old` characters of the text (in what was just added),
        beginning in it, before it or, with `before`, in the prompt; the text then ends where it begins."""
        seen, full = len(self.before) + old, self.before + self.text
        hits = [i for i in (full.find(s, max(0, seen - len(s) + 1)) for s in self.stops) if i >= 0]
        if hits:
            self.stopped = True
            self.text = self.text[: max(0, min(hits) - len(self.before))]

    def finish(self) -> str:
        """What is left at the end (held-back characters; an incomplete character as U+FFFD)."""
        if not self.stopped and self.read < len(self.ids):
            before, old = self.codec.decode(self.ids[self.prefix : self.read]), len(self.text)
            self.text += self.codec.decode(self.ids[self.prefix :])[len(before) :]
            self.read = len(self.ids)
            self._match(old)
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        held = min(_held_back(self.before + self.text, self.stops), len(self.text))  # a stop begun in the prompt too
        end = len(self.text) if final else len(self.text) - held
        piece = self.text[self.shown : max(end, self.shown)]
        self.shown = max(end, self.shown)
        return piece


__all__ = ["Codec", "RowText", "eos_ids", "row_texts", "stop_strings"]
