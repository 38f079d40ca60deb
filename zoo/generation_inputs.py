"""The one check of a generation call's inputs, shared by eager `DecoderLM.generate`, ONNX Runtime's
`OnnxSession.generate` and the server's POST /generate (numpy only: a server replica has no torch).

The rule: token ids inside the vocabulary; max_new_tokens an integer >= 1; eos_token_id and pad_token_id
token ids or None (Python or numpy integers, never bools); attention_mask of input_ids' shape holding only
0 and 1 (ints or bools), and padded on the LEFT: each row's zeros come before its ones and its last prompt
token is real, so an all-padding row (nothing to continue) is refused too.
"""

from __future__ import annotations

import numbers

import numpy as np

from .errors import InputError, InputTypeError


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def new_token_count(value, name: str = "max_new_tokens") -> int:
    """max_new_tokens as a Python int: an integer (np.int64 too) >= 1."""
    if not _is_int(value):
        raise InputTypeError(f"{name}={value!r} must be an integer >= 1")
    if int(value) < 1:
        raise InputError(f"{name}={int(value)} must be an integer >= 1")
    return int(value)


def token_id(value, vocab: int, name: str) -> int | None:
    """eos_token_id / pad_token_id as a Python int inside the vocabulary, or None."""
    if value is None:
        return None
    if not _is_int(value):
        raise InputTypeError(f"{name}={value!r} must be a token id (an integer in 0..{vocab - 1}) or None")
    if not 0 <= int(value) < vocab:
        raise InputError(f"{name}={int(value)} is outside this model's vocabulary of {vocab} (0..{vocab - 1})")
    return int(value)


def check_token_ids(ids: np.ndarray, vocab: int) -> None:
    """ids (b t), an integer array: non-empty, every id in 0..vocab-1."""
    if ids.ndim != 2 or 0 in ids.shape:
        raise InputError(f"input_ids of shape {ids.shape} must be (batch, tokens) with at least one token per row")
    bad = (ids < 0) | (ids >= vocab)
    if bad.any():
        raise InputError(f"token id {int(ids[bad][0])} is outside this model's vocabulary of {vocab} (0..{vocab - 1})")


def left_padded_mask(mask, shape: tuple[int, int]) -> np.ndarray:
    """attention_mask (b t) of 0/1 (ints or bools), padded on the left, as bool: 1 = a real token."""
    mask = np.asarray(mask)
    if mask.shape != tuple(shape):
        raise InputError(f"attention_mask has shape {mask.shape}; it must be input_ids' shape {tuple(shape)}")
    if mask.dtype.kind not in "biu" or not np.isin(mask, (0, 1)).all():
        raise InputError(
            f"attention_mask holds values other than 0 and 1 ({mask.dtype}); send 0/1 or true/false "
            "(1 = a real token, 0 = padding)"
        )
    real = mask.astype(bool)
    ends = np.flatnonzero(~real[:, -1])
    if ends.size:
        r = int(ends[0])
        what = "is all padding" if not real[r].any() else "ends in padding"
        raise InputError(f"attention_mask row {r} {what}: pad on the left (every row's last prompt token must be real)")
    holes = np.flatnonzero((real[:, :-1] & ~real[:, 1:]).any(axis=1))
    if holes.size:
        raise InputError(
            f"attention_mask row {int(holes[0])} has padding after a real token: pad on the left "
            "(each row's zeros before its ones)"
        )
    return real


__all__ = ["check_token_ids", "left_padded_mask", "new_token_count", "token_id"]
