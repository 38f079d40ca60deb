"""The inputs of an exported model, checked before ONNX Runtime sees them: one module for the
sessions (OnnxSession.run, decode, generate_steps, the static cache) and the server.

A rule is written once and said to its audience (`Voice`): the Python API raises its own
error naming what it expected; a request's answer (serve/blocks/protocol.py) says what to send, with
shapes as the client sent them. The static cache's capacity rule is `zoo.limits.check_room`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

import zoo

from .io import CONTEXT, HEAD_MASK, KEY_MASK, MASK, PAST_KEY, PAST_VALUE, X
from .tensors import is_tensor, is_torch_dtype, loaded_torch, torch_dtype

NP_DTYPE = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(bool)": np.bool_}


class RunInputError(zoo.AttnzooError, ValueError):
    """An input given to OnnxSession.run does not fit the model's inputs."""


class DecodeInputError(zoo.AttnzooError, ValueError):
    """A decode call whose x, cache or key mask does not fit the model."""


@dataclass(frozen=True)
class Voice:
    """Who hears a refusal, and so how it is worded: the Python API names what it expected (and
    raises `refuse`); a request's answer (request=True) says what to send, with the shapes as sent,
    one_row when the request sent one row without its batch axis."""

    refuse: Callable[[str], Exception]
    request: bool = False
    one_row: bool = False


RUN, DECODE = Voice(RunInputError), Voice(DecodeInputError)


class Model(Protocol):
    """What the decode checks read of a session (runtime.core.RuntimeSession is one)."""

    path: Path
    spec: zoo.AttentionSpec | None

    @property
    def dtype(self) -> np.dtype: ...

    @property
    def input_names(self) -> list[str]: ...

    def check_size(self, b: int, t: int, s: int) -> None: ...


def np_of(dtype) -> np.dtype:
    """The numpy dtype of a numpy or torch dtype (np.void for a torch dtype no model takes)."""
    if is_torch_dtype(dtype):
        torch = loaded_torch()
        return np.dtype(
            {
                torch.float32: np.float32,
                torch.float16: np.float16,
                torch.bool: np.bool_,
                torch.float64: np.float64,
            }.get(dtype, np.void)
        )
    return np.dtype(dtype)


# -- rules the sessions and the server share ------------------------------------------------------


def broadcast_mask(mask, b: int, t: int, s: int, voice: Voice, *, shape: tuple | None = None):
    """`mask` (numpy or torch) broadcast to (b, t, s), a view; `shape` is the mask as given, for the message."""
    out = None
    if mask.ndim <= 3:
        try:
            out = np.broadcast_to(mask, (b, t, s)) if isinstance(mask, np.ndarray) else mask.expand(b, t, s)
        except (ValueError, RuntimeError):
            pass
    if out is None:
        fix = "; send (s,), (t, s) or (b, t, s)" if voice.request else ""
        shown = tuple(mask.shape) if shape is None else shape
        raise voice.refuse(f"mask of shape {shown} does not broadcast to (b, t, s) = {(b, t, s)}{fix}")
    return out


def check_past_pair(past_key, past_value, voice: Voice) -> None:
    """A cache is both of past_key and past_value, or neither (an empty cache: a prompt)."""
    if (past_key is None) != (past_value is None):
        if voice.request:
            raise voice.refuse("send past_key and past_value together (or neither, for a prompt)")
        raise voice.refuse("pass past_key and past_value together (or neither, for an empty cache)")


def check_past(name: str, past: np.ndarray, b: int, g: int, d: int, voice: Voice) -> np.ndarray:
    """One half of a cache shaped (b, g, p, d) (a request of one row may send (g, p, d))."""
    shown = tuple(past.shape)
    past = past[None] if voice.one_row and past.ndim == 3 else past
    if past.ndim != 4 or past.shape[0] != b or past.shape[1] != g or past.shape[3] != d:
        if voice.request:
            raise voice.refuse(f"{name} has shape {shown}; send ({'' if voice.one_row else f'{b}, '}{g}, p, {d})")
        raise voice.refuse(f"{name} has shape {shown}; expected (b={b}, g={g}, p, {d})")
    return past


def past_length(past_key: np.ndarray, past_value: np.ndarray, voice: Voice) -> int:
    """p, the positions both halves of a cache (b g p d) hold."""
    p = past_key.shape[2]
    if past_value.shape[2] != p:
        raise voice.refuse(f"past_key holds {p} positions but past_value {past_value.shape[2]}")
    return p


def check_key_mask(key_mask: np.ndarray, b: int, n: int, voice: Voice) -> np.ndarray:
    """A key mask of bool (b, n), n = p + t: the past and this call's positions (a request of one
    row may send (n,))."""
    shown = tuple(key_mask.shape)
    if not voice.request:
        if key_mask.dtype != np.bool_ or key_mask.shape != (b, n):
            raise voice.refuse(f"key_mask is {key_mask.dtype} {shown}; expected bool (b, p+t) = {(b, n)}")
        return key_mask
    if key_mask.dtype != np.bool_:
        raise voice.refuse(f"key_mask has dtype {key_mask.dtype}; send bool (True = a real key)")
    key_mask = key_mask[None] if voice.one_row and key_mask.ndim == 1 else key_mask
    if key_mask.shape != (b, n):
        raise voice.refuse(f"key_mask has shape {shown}; send (b, p+t) = {(b, n)}")
    return key_mask


# -- a full-sequence run (OnnxSession.run) ----------------------------------------------------------


def run_feeds(
    inputs: dict[str, Any], dtype: np.dtype, x, context, mask, head_mask, *, check_size: Callable[[int, int, int], None]
) -> dict[str, Any]:
    """The feeds of one run, checked against the model's `inputs` (ONNX Runtime's NodeArgs by
    name): x (b t c), context (b s c_ctx), mask (b t s) and head_mask (b h), each given or made,
    all torch or all numpy. `check_size(b, t, s)` runs before any mask of (b, t, s) is made."""
    given = {X.name: x, CONTEXT.name: context, MASK.name: mask, HEAD_MASK.name: head_mask}
    for name, value in given.items():
        if value is not None and name not in inputs:
            hint = {MASK.name: "--mask", HEAD_MASK.name: "--head-mask"}.get(name)
            fix = f"; re-export with {hint}" if hint else ""
            raise RunInputError(f"this model has no {name!r} input (inputs: {list(inputs)}){fix}")
        if value is not None and not (is_tensor(value) or isinstance(value, np.ndarray)):
            raise zoo.InputTypeError(f"{name} must be a torch.Tensor or numpy array, got {type(value).__name__}")
    if x is None:
        raise RunInputError("x is required")
    if CONTEXT.name in inputs and context is None:
        raise RunInputError("this is a cross-attention model: pass context (b, s, d_context)")
    lib = loaded_torch() if is_tensor(x) else np
    for name in (CONTEXT.name, MASK.name, HEAD_MASK.name):
        v = given[name]
        if v is not None and is_tensor(v) != (lib is not np):
            raise zoo.InputTypeError(
                f"x is a {'numpy array' if lib is np else 'torch tensor'} but {name} is not; pass one kind"
            )
    check_float(inputs, X.name, x, 3, dtype)
    b, t = x.shape[0], x.shape[1]
    if context is not None:
        check_float(inputs, CONTEXT.name, context, 3, dtype)
        if context.shape[0] != b:
            raise RunInputError(f"context has batch {context.shape[0]}, x has {b}")
    s_len = context.shape[1] if context is not None else t
    # ONNX Runtime's kernels are not all safe on empty axes (the decomposed graph's
    # Reshape divides by b: SIGFPE at b = 0), so an empty input never reaches them.
    if b == 0 or t == 0 or s_len == 0:
        axes = (("b", b), ("t", t)) + ((("s", s_len),) if context is not None else ())
        empty = ", ".join(f"{a}=0" for a, n in axes if n == 0)
        shapes = f"x {tuple(x.shape)}" + (f", context {tuple(context.shape)}" if context is not None else "")
        raise RunInputError(f"empty input ({empty}; {shapes}): every axis must be at least 1")
    check_size(b, t, s_len)
    feeds: dict[str, Any] = {X.name: x}
    if context is not None:
        feeds[CONTEXT.name] = context
    if MASK.name in inputs:
        feeds[MASK.name] = full_mask(mask, b, t, s_len, lib)
    if HEAD_MASK.name in inputs:
        feeds[HEAD_MASK.name] = full_head_mask(head_mask, inputs[HEAD_MASK.name].shape[1], b, lib, dtype)
    return feeds


def check_float(inputs: dict[str, Any], name: str, v, rank: int, want: np.dtype) -> None:
    """A float input of the model's rank, fixed dims and dtype."""
    node = inputs[name]
    shape = tuple(v.shape)
    if len(shape) != rank:
        raise RunInputError(f"{name} has shape {shape}; the model takes {list(node.shape)}")
    for got, dim in zip(shape, node.shape):
        if isinstance(dim, int) and got != dim:
            raise RunInputError(f"{name} has shape {shape}; the model takes {list(node.shape)}")
    if np_of(v.dtype) != want:
        raise zoo.InputTypeError(f"{name} has dtype {v.dtype}; this model takes {want} (convert with .astype/.to)")


def full_mask(mask, b: int, t: int, s: int, lib):
    """The bool mask (b, t, s) a run feeds: all True when none is given; a (b|1, 1, t, s) mask
    drops its head axis (the exported mask is shared by all heads)."""
    if mask is None:
        return lib.ones((b, t, s), dtype=lib.bool_ if lib is np else lib.bool)
    if np_of(mask.dtype) != np.bool_:
        raise zoo.InputTypeError(f"mask has dtype {mask.dtype}; the ONNX mask is bool (True = may attend)")
    shape = tuple(mask.shape)
    if len(shape) == 4:
        if shape[1] != 1:
            raise RunInputError(f"mask {shape}: the exported model takes one mask for all heads, (b, t, s)")
        mask = mask[:, 0]
    out = broadcast_mask(mask, b, t, s, RUN, shape=shape)
    return np.ascontiguousarray(out) if lib is np else out.contiguous()


def full_head_mask(hm, h: int, b: int, lib, dtype: np.dtype):
    """The head mask (b, h) a run feeds: all ones when none is given; (h,) and (1, h) broadcast."""
    if hm is None:
        return np.ones((b, h), dtype=dtype) if lib is np else lib.ones(b, h, dtype=torch_dtype(dtype.type))
    shape = tuple(hm.shape)
    if shape not in ((h,), (b, h), (1, h)):
        raise RunInputError(f"head_mask has shape {shape}; expected ({h},) or ({b}, {h})")
    if lib is np:
        return np.ascontiguousarray(np.broadcast_to(hm.astype(dtype), (b, h)))
    return hm.to(torch_dtype(dtype.type)).expand(b, h).contiguous()


# -- a decode call (sess.decode, generate_steps, the static cache) ----------------------------------


def as_numpy(name: str, v: Any, dtype: np.dtype | None) -> np.ndarray:
    """A torch tensor (on any device but meta) or numpy array as a contiguous numpy array of `dtype`
    (None: any)."""
    if is_tensor(v):
        if v.device.type == "meta":
            raise zoo.InputTypeError(f"{name} is a meta tensor (no data); pass a tensor on the CPU or a numpy array")
        if v.device.type != "cpu":
            v = v.cpu()
        v = v.detach().numpy()
    if not isinstance(v, np.ndarray):
        raise zoo.InputTypeError(f"{name} must be a torch.Tensor or numpy array, got {type(v).__name__}")
    if dtype is not None and v.dtype != dtype:
        raise zoo.InputTypeError(f"{name} has dtype {v.dtype}; this model takes {dtype} (convert with .astype/.to)")
    return np.ascontiguousarray(v)


def decode_spec(sess: Model) -> zoo.AttentionSpec:
    """The spec of a token-by-token model; DecodeInputError for a full-sequence one or a foreign file."""
    if PAST_KEY.name not in sess.input_names:
        raise DecodeInputError(
            f"{sess.path} is a full-sequence model (inputs {sess.input_names}); export one for token-by-token "
            f"runs with `attnzoo export NAME --decode` (export_onnx(..., decode=True))"
        )
    if sess.spec is None:
        raise DecodeInputError(f"{sess.path} carries no attnzoo spec metadata; export it with attnzoo")
    return sess.spec


def require_key_mask_input(sess: Model) -> None:
    """A key mask is given: the model must take one."""
    if KEY_MASK.name not in sess.input_names:
        raise DecodeInputError("this model has no key_mask input; re-export with --mask (with_mask=True)")


def check_x(sess: Model, x, *, batch: int | None = None) -> np.ndarray:
    """x of a decode call as a contiguous numpy array, checked against the model: a torch tensor or
    numpy array of the model's dtype, shaped (b >= 1, t >= 1, d_model), with b = `batch` when given
    (a static cache's bound buffers fix it). The one check of x that sess.decode, generate_steps
    and OrtStaticCache.step share; raises InputTypeError or DecodeInputError."""
    spec = decode_spec(sess)
    x = as_numpy(X.name, x, sess.dtype)
    if x.ndim != 3 or x.shape[-1] != spec.d_model or x.shape[0] == 0 or x.shape[1] == 0:
        raise DecodeInputError(f"x has shape {x.shape}; expected (b >= 1, t >= 1, c={spec.d_model})")
    if batch is not None and x.shape[0] != batch:
        raise DecodeInputError(
            f"x has shape {x.shape}, batch {x.shape[0]}; this cache was made for batch={batch}: "
            f"send (b={batch}, t, c={spec.d_model}), or make one with sess.static_cache({x.shape[0]})"
        )
    return x


def check_decode_inputs(sess: Model, x, past_key, past_value, key_mask, *, steps: int | None = None):
    """numpy x, past_key, past_value, key_mask (or None) checked against the spec; p."""
    spec = decode_spec(sess)
    dtype = sess.dtype
    x = check_x(sess, x)
    b = x.shape[0]
    g, dk, dv = spec.cache_widths_
    check_past_pair(past_key, past_value, DECODE)
    if past_key is None:
        past_key, past_value = np.zeros((b, g, 0, dk), dtype), np.zeros((b, g, 0, dv), dtype)
    past_key, past_value = as_numpy(PAST_KEY.name, past_key, dtype), as_numpy(PAST_VALUE.name, past_value, dtype)
    check_past(PAST_KEY.name, past_key, b, g, dk, DECODE)
    check_past(PAST_VALUE.name, past_value, b, g, dv, DECODE)
    p = past_length(past_key, past_value, DECODE)
    new = x.shape[1] if steps is None else steps
    if key_mask is not None:
        require_key_mask_input(sess)
        key_mask = check_key_mask(as_numpy(KEY_MASK.name, key_mask, None), b, p + new, DECODE)
    elif KEY_MASK.name in sess.input_names:
        key_mask = np.ones((b, p + new), dtype=np.bool_)
    sess.check_size(b, new, p + new)
    return x, past_key, past_value, key_mask, p


def check_cache_key_mask(sess: Model, key_mask, batch: int, p: int) -> np.ndarray | None:
    """A static cache's key mask: bool (batch, p + k) for the past and the k positions a run will
    add (k >= 0), or None (every key real)."""
    if key_mask is None:
        return None
    require_key_mask_input(sess)
    key_mask = np.ascontiguousarray(key_mask.numpy() if is_tensor(key_mask) else key_mask)
    if key_mask.dtype != np.bool_ or key_mask.ndim != 2 or key_mask.shape[0] != batch or key_mask.shape[1] < p:
        raise DecodeInputError(
            f"key_mask is {key_mask.dtype} {key_mask.shape}; expected bool (b={batch}, p + k >= {p})"
        )
    return key_mask


__all__ = [
    "DECODE",
    "RUN",
    "DecodeInputError",
    "Model",
    "RunInputError",
    "Voice",
    "as_numpy",
    "broadcast_mask",
    "check_cache_key_mask",
    "check_decode_inputs",
    "check_float",
    "check_key_mask",
    "check_past",
    "check_past_pair",
    "check_x",
    "decode_spec",
    "full_head_mask",
    "full_mask",
    "np_of",
    "past_length",
    "require_key_mask_input",
    "run_feeds",
]
