"""Where a row stops, and its text as it grows (no torch): a list of eos ids, stop strings matched on the
decoded text across token boundaries, and the call's `max_time`.

A row's text is decoded incrementally (`RowText`), as vLLM and text-generation-inference do: the new
tokens are decoded with one token of context before them and only the part past that context's text is
new; a piece ending in U+FFFD (a multi-byte character cut between tokens) is held back until the next
token completes it, so a character never splits. With stop strings a row's text is released only up to
where a stop string could still begin, so text outputs end before the stop string (OpenAI's `stop`),
while the tokens keep it (transformers' `stop_strings`).
"""

from __future__ import annotations

import os
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


def _held_back(text: str, stops: tuple[str, ...]) -> int:
    """How many characters at the end of `text` could begin a stop string (the longest such suffix)."""
    longest = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), longest, -1):
            if text.endswith(s[:n]):
                longest = n
                break
    return longest


class RowText:
    """One row's new tokens as text, decoded as they come; `add(token)` returns the text now safe to show
    (possibly ""), and `stopped` turns True once a stop string appears (its text then ends before it)."""

    def __init__(self, codec: Codec, stops: tuple[str, ...] = ()) -> None:
        self.codec, self.stops = codec, stops
        self.ids: list[int] = []
        self.prefix = self.read = 0  # token offsets: the context decoded before, and what is text already
        self.text = ""  # every character decoded so far
        self.shown = 0  # characters of `text` released
        self.stopped = False
        self._longest = max((len(s) for s in stops), default=0)

    def add(self, token: int) -> str:
        if self.stopped:
            return ""
        self.ids.append(int(token))
        before = self.codec.decode(self.ids[self.prefix : self.read])
        after = self.codec.decode(self.ids[self.prefix :])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            start = max(0, len(self.text) - self._longest + 1)
            self.text += after[len(before) :]
            self.prefix, self.read = self.read, len(self.ids)
            hits = [i for i in (self.text.find(s, start) for s in self.stops) if i >= 0]
            if hits:
                self.stopped = True
                self.text = self.text[: min(hits)]
        return self._release(final=self.stopped)

    def finish(self) -> str:
        """What is left at the end (held-back characters; an incomplete character as U+FFFD)."""
        if not self.stopped and self.read < len(self.ids):
            before = self.codec.decode(self.ids[self.prefix : self.read])
            self.text += self.codec.decode(self.ids[self.prefix :])[len(before) :]
            self.read = len(self.ids)
            hits = [i for i in (self.text.find(s) for s in self.stops) if i >= 0]
            if hits:
                self.stopped, self.text = True, self.text[: min(hits)]
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        end = len(self.text) if final else len(self.text) - _held_back(self.text, self.stops)
        piece = self.text[self.shown : max(end, self.shown)]
        self.shown = max(end, self.shown)
        return piece


__all__ = ["Codec", "RowText", "eos_ids", "stop_strings"]
