"""The request protocol: what a body may hold (JSON, .npy, .npz), the checks made before any
data is inflated or run, and the answer's encoding. Plain numpy: no Ray.

Split by job: the vocabulary (media types, fields, limits, errors, `ModelInfo`, `Item`) in
`schema.py`, reading bodies in `bodies.py`, and here decoding a request (`decode_request`,
`check_arrays`: the rules it shares with the sessions, the cache's and the mask's, are
runtime/feeds.py's, said as a request's answer) and encoding the answer. Every name stays
importable from `serve.blocks.protocol`."""

from __future__ import annotations

import io
import json

import numpy as np

from runtime.feeds import Voice, broadcast_mask, check_key_mask, check_past, check_past_pair, past_length
from zoo import AttnzooError, CacheFullError
from zoo.limits import check_room

from ..schema import (
    DECODE_FIELDS,
    DEFAULT_MAX_BODY,
    DEFAULT_MAX_TOKENS,
    FIELDS,
    JSON,
    NPY,
    NPZ,
    PAD_FACTOR,
    Item,
    ModelInfo,
    RequestError,
    ServeError,
)
from .bodies import read_json, read_npy, read_npz

# -- decoding ----------------------------------------------------------------------------------


def decode_request(body: bytes, content_type: str, info: ModelInfo, accept: str = "") -> Item:
    """Parse and check one request body; raises RequestError (4xx) with one line."""
    kind = (content_type or "").split(";")[0].strip().lower()
    loose: set[str] = set()
    if kind in ("", JSON, "text/json"):
        arrays, loose = read_json(body, info)
        binary = False
    elif kind in (NPY, "application/octet-stream"):
        arrays, binary = {"x": read_npy(body, "the body", info.max_tokens)}, True
    elif kind == NPZ:
        arrays, binary = read_npz(body, info), True
    else:
        raise RequestError(f"content type {kind!r} is not served; send {JSON}, {NPY} or {NPZ}", 415)
    accept = (accept or "").lower()
    if NPY in accept or NPZ in accept:
        binary = True
    elif JSON in accept:
        binary = False
    item = check_arrays(arrays, info, loose=loose)
    item.binary = binary
    return item


def check_arrays(arrays: dict[str, np.ndarray], info: ModelInfo, *, loose: set[str] | frozenset = frozenset()) -> Item:
    """Shapes, widths, dtypes and size of one request against the model -> a batched Item.

    Names in `loose` came as JSON numbers and take the model's dtype; binary arrays must match it.
    """
    if "x" not in arrays:
        raise RequestError("x is required: (t, c) or (b, t, c)")
    x = arrays["x"]
    squeeze = x.ndim == 2
    if x.ndim not in (2, 3):
        raise RequestError(f"x has shape {tuple(x.shape)}; send (t, {info.d_model}) or (b, t, {info.d_model})")
    x = x[None] if squeeze else x
    b, t, c = x.shape
    if c != info.d_model:
        raise RequestError(f"x has width {c}; this model takes d_model={info.d_model} (shape {tuple(x.shape)})")
    if b == 0 or t == 0:
        raise RequestError(f"x has shape {tuple(x.shape)}: an empty batch or sequence has nothing to answer")
    if b * t > info.max_tokens or b > info.max_rows:
        raise RequestError(
            f"x has b*t = {b}*{t} = {b * t} positions; this server takes at most {info.max_tokens} "
            f"and {info.max_rows} rows per request (split it)",
            413,
        )
    x = _float(x, "x", info.dtype, "x" in loose)
    if info.decode:
        return _check_decode(arrays, info, x, squeeze, loose)
    given = sorted(k for k in DECODE_FIELDS if arrays.get(k) is not None)
    if given:
        raise RequestError(f"{', '.join(given)}: this is a full-sequence model; a KV cache needs a decode export")
    context = arrays.get("context")
    if info.d_context is None:
        if context is not None:
            raise RequestError("this is a self-attention model: send no context")
        s = t
    else:
        if context is None:
            raise RequestError(f"this is a cross-attention model: send context (s, {info.d_context}) too")
        context = context[None] if context.ndim == 2 and squeeze else context
        if context.ndim != 3 or context.shape[0] != b or context.shape[2] != info.d_context or context.shape[1] == 0:
            raise RequestError(
                f"context has shape {tuple(context.shape)}; send ({'' if squeeze else f'{b}, '}s, {info.d_context})"
            )
        s = context.shape[1]
        if b * s > info.max_tokens:
            raise RequestError(f"context has b*s = {b * s} positions; at most {info.max_tokens} per request", 413)
        context = _float(context, "context", info.dtype, "context" in loose)
    mask = arrays.get("mask")
    if mask is not None:
        if not info.has_mask:
            raise RequestError("this model takes no mask (it was exported without --mask)")
        if mask.dtype != np.bool_:
            raise RequestError(f"mask has dtype {mask.dtype}; send bool (True = may attend)")
        mask = broadcast_mask(mask, b, t, s, Voice(RequestError, request=True))
    head_mask = arrays.get("head_mask")
    if head_mask is not None:
        if not info.has_head_mask:
            raise RequestError("this model takes no head_mask (it was exported without --head-mask)")
        if tuple(head_mask.shape) not in ((info.heads,), (b, info.heads)):
            raise RequestError(
                f"head_mask has shape {tuple(head_mask.shape)}; send ({info.heads},) or ({b}, {info.heads})"
            )
        head_mask = np.broadcast_to(_float(head_mask, "head_mask", info.dtype, "head_mask" in loose), (b, info.heads))
    return Item(x=x, context=context, mask=mask, head_mask=head_mask, squeeze=squeeze)


def _check_decode(arrays: dict[str, np.ndarray], info: ModelInfo, x: np.ndarray, squeeze: bool, loose) -> Item:
    """A decode request: x (b t c) and its cache past_key/past_value ((g p d) or (b g p d); none
    for a prompt) and key_mask ((s,) or (b, s), s = p + t)."""
    given = sorted(k for k in ("context", "mask", "head_mask") if arrays.get(k) is not None)
    if given:
        raise RequestError(f"{', '.join(given)}: a decode model takes x, past_key, past_value and key_mask")
    b, t, _ = x.shape
    voice = Voice(RequestError, request=True, one_row=squeeze)
    pk, pv = arrays.get("past_key"), arrays.get("past_value")
    check_past_pair(pk, pv, voice)
    past = {}
    for name, a, d in (("past_key", pk, info.d_k), ("past_value", pv, info.d_v)):
        if a is None:
            past[name] = np.zeros((b, info.kv_heads, 0, d), info.dtype)
            continue
        a = check_past(name, a, b, info.kv_heads, d, voice)
        past[name] = _float(a, name, info.dtype, name in loose)
    p = past_length(past["past_key"], past["past_value"], voice)
    if info.max_len is not None:  # can never succeed: a 4xx, not "try later"
        try:
            check_room(info.max_len, p, t, fix="keep p+t within max_len (GET /metadata), or serve a larger --max-len")
        except CacheFullError as e:
            raise RequestError(f"p+t = {p}+{t} = {p + t} past and new positions: {e}", 413) from None
    if b * (p + t) > info.max_tokens:
        raise RequestError(
            f"b*(p+t) = {b}*{p + t} cached and new positions; at most {info.max_tokens} per request", 413
        )
    key_mask = arrays.get("key_mask")
    if key_mask is not None:
        if not info.has_key_mask:
            raise RequestError("this model takes no key_mask (it was exported without --mask)")
        key_mask = check_key_mask(key_mask, b, p + t, voice)
    return Item(x=x, past_key=past["past_key"], past_value=past["past_value"], key_mask=key_mask, squeeze=squeeze)


def _float(a: np.ndarray, name: str, dtype: np.dtype, loose: bool) -> np.ndarray:
    if not loose and a.dtype != dtype:
        raise RequestError(f"{name} has dtype {a.dtype}; this model takes {dtype} (convert with .astype)")
    out = np.ascontiguousarray(a, dtype=dtype)
    if not np.isfinite(out).all():
        raise RequestError(f"{name} holds NaN or infinite values (or numbers too large for {dtype})")
    return out


# -- encoding ----------------------------------------------------------------------------------


def encode_response(item: Item, outputs: tuple[np.ndarray, ...], names: tuple[str, ...]) -> tuple[bytes, str]:
    """(body, content type): .npy for y alone, .npz for y and attn, or JSON. An output that is not
    finite raises RequestError (422): JSON has no NaN, and no format should carry one as an answer."""
    outs = [o[0] if item.squeeze else o for o in outputs]
    for name, o in zip(names, outs):
        if o.dtype.kind == "f" and not np.isfinite(o).all():
            # NaN is not JSON, and an answer of NaNs is no answer in any format.
            raise RequestError(
                f"the output is not finite ({name} holds NaN or infinite values, e.g. from inputs too large for "
                f"{o.dtype}); scale the input down",
                422,
            )
    if item.binary:
        buf = io.BytesIO()
        if len(outs) == 1:
            np.save(buf, outs[0], allow_pickle=False)
            return buf.getvalue(), NPY
        np.savez(buf, **dict(zip(names, outs)))
        return buf.getvalue(), NPZ
    doc = {n: o.tolist() for n, o in zip(names, outs)}
    return json.dumps(doc).encode(), JSON


def failure_answer(error: Exception) -> tuple[str, int]:
    """(one line, HTTP status) for a batch group whose run raised `error`. A request past a static
    cache's capacity is the client's (413: it can never succeed, so a client must not retry it);
    another attnzoo refusal (the padded batch would not fit in memory now) is 503, try again later;
    anything else is the model run failing, 500."""
    first = (str(error).strip().splitlines() or [""])[0][:300]
    if isinstance(error, CacheFullError):
        return first, 413
    if isinstance(error, AttnzooError):
        return f"the server cannot run this batch now: {first}", 503
    return f"the model run failed: {type(error).__name__}: {first}", 500


def rows_of(items: list[Item]) -> int:
    return sum(it.rows for it in items)


__all__ = [
    "DECODE_FIELDS",
    "DEFAULT_MAX_BODY",
    "DEFAULT_MAX_TOKENS",
    "FIELDS",
    "JSON",
    "NPY",
    "NPZ",
    "PAD_FACTOR",
    "Item",
    "ModelInfo",
    "RequestError",
    "ServeError",
    "check_arrays",
    "decode_request",
    "encode_response",
    "failure_answer",
    "read_json",
    "read_npy",
    "read_npz",
    "rows_of",
]
