"""Exported blocks behind Ray Serve: request decoding, padded dynamic batches, a client.

One request is one or more sequences: x (t, c) or (b, t, c), optional context (s, c_ctx) or
(b, s, c_ctx), mask (s,), (t, s) or (b, t, s) bool (True = may attend), head_mask (h,) or (b, h).
Bodies are JSON (`{"x": [[...]]}`, an array may also be `{"npy_b64": "..."}`), a `.npy` body
holding x alone (`application/x-npy`), or an `.npz` body with those names (`application/x-npz`).

`serve.batch` gathers requests; they are padded to one (b, t, s) batch whose key mask hides
the padding, run once, and each answer is cut back to its own (b_i, t_i). A model exported
without a mask input cannot hide padding, so its batches group requests of equal lengths.

Everything except `start`/`OnnxServer` works without Ray (the decoding and batching are plain
numpy, and `Client` uses the standard library only).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import http.client
import io
import json
import math
import os
import shutil
import tempfile
import time
import urllib.parse
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from zoo import AttnzooError

NPY = "application/x-npy"
NPZ = "application/x-npz"
JSON = "application/json"
FIELDS = ("x", "context", "mask", "head_mask", "past_key", "past_value", "key_mask")
DECODE_FIELDS = ("past_key", "past_value", "key_mask")
DEFAULT_MAX_TOKENS = 65_536  # b*t per request; 64 x 1024 is a large but sane single request
DEFAULT_MAX_BODY = 256 * 2**20
PAD_FACTOR = 2.0  # a request is padded to at most twice its length (see length_groups)


class ServeError(AttnzooError, ValueError):
    """A serving setup that cannot work (bad options, a model this server cannot serve)."""


class RequestError(AttnzooError, ValueError):
    """A bad request: answered with `status` (4xx) and this one-line message."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class ModelInfo:
    """What a request is checked against: widths, dtype and inputs of the served model."""

    d_model: int
    d_context: int | None  # None: self-attention
    heads: int
    dtype: np.dtype
    has_mask: bool
    has_head_mask: bool
    outputs: tuple[str, ...]
    max_tokens: int = DEFAULT_MAX_TOKENS
    max_rows: int = 1024
    max_body: int = DEFAULT_MAX_BODY  # bytes of a body, and of the arrays an .npz unpacks to
    # A decode (KV-cache) model: x, past_key (b g p dk), past_value (b g p dv) [, key_mask (b s)].
    decode: bool = False
    kv_heads: int = 0
    d_k: int = 0
    d_v: int = 0
    has_key_mask: bool = False

    @classmethod
    def of(
        cls, sess, *, max_tokens: int = DEFAULT_MAX_TOKENS, max_rows: int = 1024, max_body: int = DEFAULT_MAX_BODY
    ) -> ModelInfo:
        """From an `OnnxSession` over an attnzoo export (its spec metadata is required)."""
        spec = sess.spec
        if spec is None:
            raise ServeError(f"{sess.path} carries no attnzoo spec metadata; serve a model written by `attnzoo export`")
        decode = "past_key" in sess.input_names
        if decode and "past_value" not in sess.input_names:
            raise ServeError(f"{sess.path} has past_key but no past_value input; export it with attnzoo --decode")
        return cls(
            d_model=spec.d_model,
            d_context=spec.d_context,
            heads=spec.heads,
            dtype=np.dtype(sess.dtype),
            has_mask="mask" in sess.input_names,
            has_head_mask="head_mask" in sess.input_names,
            outputs=tuple(sess.output_names),
            max_tokens=max_tokens,
            max_rows=max_rows,
            max_body=max_body,
            decode=decode,
            kv_heads=spec.kv_heads_,
            d_k=spec.d_k_,
            d_v=spec.d_v_,
            has_key_mask="key_mask" in sess.input_names,
        )


@dataclass
class Item:
    """One decoded request, every array batched: x (b t c), context (b s c_ctx), mask (b t s)."""

    x: np.ndarray
    context: np.ndarray | None = None
    mask: np.ndarray | None = None
    head_mask: np.ndarray | None = None
    past_key: np.ndarray | None = None  # decode models: (b g p dk), (b g p dv), key_mask (b p+t)
    past_value: np.ndarray | None = None
    key_mask: np.ndarray | None = None
    squeeze: bool = False  # x came as (t, c): answer (t, c)
    binary: bool = False  # answer as .npy/.npz
    enqueued: float = field(default_factory=time.perf_counter)

    @property
    def rows(self) -> int:
        return self.x.shape[0]

    @property
    def t(self) -> int:
        return self.x.shape[1]

    @property
    def s(self) -> int:
        return self.context.shape[1] if self.context is not None else self.x.shape[1]

    @property
    def p(self) -> int:
        """Cached positions a decode request brings (0 for a prompt, or any full-sequence model)."""
        return self.past_key.shape[2] if self.past_key is not None else 0


# -- decoding ----------------------------------------------------------------------------------


def decode_request(body: bytes, content_type: str, info: ModelInfo, accept: str = "") -> Item:
    """Parse and check one request body; raises RequestError (4xx) with one line."""
    kind = (content_type or "").split(";")[0].strip().lower()
    loose: set[str] = set()
    if kind in ("", JSON, "text/json"):
        arrays, loose = _from_json(body, info)
        binary = False
    elif kind in (NPY, "application/octet-stream"):
        arrays, binary = {"x": _load_npy(body, "the body", info.max_tokens)}, True
    elif kind == NPZ:
        arrays, binary = _from_npz(body, info), True
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


def _from_json(body: bytes, info: ModelInfo) -> tuple[dict[str, np.ndarray], set[str]]:
    """(arrays, names given as JSON lists): those take the model's dtype; npy_b64 ones must match."""
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RequestError(
            f"the body is not JSON ({e.__class__.__name__}: {str(e)[:80]}); send {{'x': [[...]]}}"
        ) from None
    except RecursionError:  # e.g. 100000 nested '[': the parser's own depth limit
        raise RequestError("the JSON body nests too deeply; an array is at most 4 levels deep") from None
    if not isinstance(doc, dict):
        raise RequestError(f"the JSON body is a {type(doc).__name__}; send an object such as {{'x': [[...]]}}")
    extra = sorted(set(doc) - set(FIELDS))
    if extra:
        raise RequestError(f"unknown field(s) {extra}; a request has {', '.join(FIELDS)}")
    out, loose = {}, set()
    for name, value in doc.items():
        if value is None:
            continue
        if isinstance(value, dict):
            if set(value) != {"npy_b64"} or not isinstance(value["npy_b64"], str):
                raise RequestError(f"{name}: an object value must be {{'npy_b64': '<base64 of a .npy file>'}}")
            try:
                raw = base64.b64decode(value["npy_b64"], validate=True)
            except ValueError:
                raise RequestError(f"{name}: npy_b64 is not valid base64") from None
            out[name] = _load_npy(raw, name, info.max_tokens if name == "x" else None)
        else:
            out[name] = _json_array(name, value)
            loose.add(name)
    return out, loose


def _json_array(name: str, value: Any) -> np.ndarray:
    try:
        arr = np.asarray(value)
    except RecursionError:
        raise RequestError(f"{name} nests too deeply; an array is at most 4 levels deep") from None
    except ValueError:
        raise RequestError(f"{name} is a ragged list; every row must have the same length") from None
    if arr.dtype == object:
        raise RequestError(f"{name} is a ragged or mixed list; send a rectangular list of numbers")
    if name in ("mask", "key_mask"):
        if arr.dtype.kind in "iu" and arr.size and not np.isin(arr, (0, 1)).all():
            raise RequestError("mask must be true/false (or 0/1), True = may attend")
        if arr.dtype.kind not in "biu":
            raise RequestError(f"mask has {arr.dtype.kind!r} values; send true/false (True = may attend)")
        return arr.astype(bool)
    if arr.dtype.kind not in "iuf":
        raise RequestError(f"{name} holds {arr.dtype} values; send numbers")
    # JSON numbers carry no width: they become the model's dtype in check_arrays.
    return arr.astype(np.float64)


_NPY_MAGIC = b"\x93NUMPY"
_ZIP_MAGIC = b"PK\x03\x04"


def _npy_header(f, what: str) -> tuple[tuple[int, ...], np.dtype, int]:
    """(shape, dtype, bytes of data the header declares) of the .npy at f's position; f is left
    after the header. Reads the header only (a few hundred bytes), never the data."""
    try:
        version = np.lib.format.read_magic(f)
        read = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
        if version not in read:
            raise ValueError(f"format version {version[0]}.{version[1]} is not read here; write it with np.save")
        shape, _, dtype = read[version](f)
    except Exception as e:  # noqa: BLE001 - numpy raises ValueError/EOFError/...
        raise RequestError(f"{what} is not a .npy array ({type(e).__name__}: {str(e)[:80]})") from None
    if dtype.hasobject:
        raise RequestError(f"{what} holds Python objects ({dtype}); send numbers")
    return tuple(shape), dtype, math.prod(shape) * dtype.itemsize


def _check_positions(what: str, shape: tuple[int, ...], max_positions: int | None) -> None:
    if max_positions is not None and len(shape) >= 2 and math.prod(shape[:-1]) > max_positions:
        raise RequestError(
            f"{what} declares shape {shape}: {math.prod(shape[:-1])} positions; "
            f"this server takes at most {max_positions} per request (split it)",
            413,
        )


def _load_npy(raw: bytes, what: str, max_positions: int | None) -> np.ndarray:
    """A .npy body; with max_positions, one whose header declares more b*t is refused unread.
    Its data must be exactly what the header declares: bytes beyond it are refused, not ignored."""
    if raw[:4] == _ZIP_MAGIC:
        raise RequestError(f"{what} is an .npz archive; send it as {NPZ}")
    f = io.BytesIO(raw)
    shape, dtype, nbytes = _npy_header(f, what)
    _check_positions(what, shape, max_positions)
    carried = len(raw) - f.tell()
    if carried != nbytes:
        raise RequestError(
            f"{what}: its header declares shape {shape} {dtype} ({nbytes} bytes of data) but it carries "
            f"{carried} bytes; send exactly the array (np.save)"
        )
    f.seek(0)
    try:
        arr = np.load(f, allow_pickle=False)
    except Exception as e:  # noqa: BLE001 - numpy raises ValueError/EOFError/UnpicklingError...
        raise RequestError(f"{what} is not a .npy array ({type(e).__name__}: {str(e)[:80]})") from None
    return arr


def _from_npz(raw: bytes, info: ModelInfo) -> dict[str, np.ndarray]:
    """An .npz body. Every member's .npy header is read first (streamed: no member is inflated):
    names, shapes, dtypes and sizes are checked against the limits before any array is unpacked,
    so a small archive that would inflate to gigabytes is refused having cost a few kilobytes."""
    if raw[: len(_NPY_MAGIC)] == _NPY_MAGIC:
        raise RequestError(f"the body is a single .npy array; send it as {NPY}")
    try:
        with zipfile.ZipFile(io.BytesIO(raw)) as z:
            members, total = {}, 0
            for m in z.infolist():
                name = m.filename[:-4] if m.filename.endswith(".npy") else m.filename
                if name not in FIELDS:
                    raise RequestError(f"unknown array {name!r} in the .npz; a request has {', '.join(FIELDS)}")
                if name in members:
                    raise RequestError(f"the .npz holds {name} twice")
                what = f"{name} in the .npz"
                with z.open(m) as f:
                    shape, dtype, nbytes = _npy_header(f, what)
                    header = f.tell()
                if name == "x":
                    _check_positions(what, shape, info.max_tokens)
                if m.file_size != header + nbytes:
                    raise RequestError(
                        f"{what}: its header declares shape {shape} {dtype} ({nbytes} bytes of data) but the "
                        f"archive says it unpacks to {m.file_size - header}; send arrays written by np.savez"
                    )
                total += nbytes
                if total > info.max_body:
                    raise RequestError(
                        f"the .npz's arrays declare {total}+ bytes unpacked; this server takes at most "
                        f"{info.max_body} (split the request)",
                        413,
                    )
                members[name] = m
            out = {}
            for name, m in members.items():
                with z.open(m) as f:
                    out[name] = np.lib.format.read_array(f, allow_pickle=False)
            return out
    except RequestError:
        raise
    except Exception as e:  # noqa: BLE001 - zipfile.BadZipFile, EOFError, zlib.error, ValueError...
        raise RequestError(f"the body is not an .npz archive ({type(e).__name__}: {str(e)[:80]})") from None


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
        try:
            if mask.ndim > 3:
                raise ValueError
            mask = np.broadcast_to(mask, (b, t, s))
        except ValueError:
            raise RequestError(
                f"mask of shape {tuple(mask.shape)} does not broadcast to (b, t, s) = {(b, t, s)}; "
                "send (s,), (t, s) or (b, t, s)"
            ) from None
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
    pk, pv = arrays.get("past_key"), arrays.get("past_value")
    if (pk is None) != (pv is None):
        raise RequestError("send past_key and past_value together (or neither, for a prompt)")
    past = {}
    for name, a, d in (("past_key", pk, info.d_k), ("past_value", pv, info.d_v)):
        want = f"({'' if squeeze else f'{b}, '}{info.kv_heads}, p, {d})"
        if a is None:
            past[name] = np.zeros((b, info.kv_heads, 0, d), info.dtype)
            continue
        a = a[None] if squeeze and a.ndim == 3 else a
        if a.ndim != 4 or a.shape[0] != b or a.shape[1] != info.kv_heads or a.shape[3] != d:
            raise RequestError(f"{name} has shape {tuple(arrays[name].shape)}; send {want}")
        past[name] = _float(a, name, info.dtype, name in loose)
    p = past["past_key"].shape[2]
    if past["past_value"].shape[2] != p:
        raise RequestError(f"past_key holds {p} positions but past_value {past['past_value'].shape[2]}")
    if b * (p + t) > info.max_tokens:
        raise RequestError(
            f"b*(p+t) = {b}*{p + t} cached and new positions; at most {info.max_tokens} per request", 413
        )
    key_mask = arrays.get("key_mask")
    if key_mask is not None:
        if not info.has_key_mask:
            raise RequestError("this model takes no key_mask (it was exported without --mask)")
        if key_mask.dtype != np.bool_:
            raise RequestError(f"key_mask has dtype {key_mask.dtype}; send bool (True = a real key)")
        km = key_mask[None] if squeeze and key_mask.ndim == 1 else key_mask
        if km.shape != (b, p + t):
            raise RequestError(f"key_mask has shape {tuple(key_mask.shape)}; send (b, p+t) = {(b, p + t)}")
        key_mask = km
    return Item(x=x, past_key=past["past_key"], past_value=past["past_value"], key_mask=key_mask, squeeze=squeeze)


def _float(a: np.ndarray, name: str, dtype: np.dtype, loose: bool) -> np.ndarray:
    if not loose and a.dtype != dtype:
        raise RequestError(f"{name} has dtype {a.dtype}; this model takes {dtype} (convert with .astype)")
    out = np.ascontiguousarray(a, dtype=dtype)
    if not np.isfinite(out).all():
        raise RequestError(f"{name} holds NaN or infinite values (or numbers too large for {dtype})")
    return out


# -- batching ----------------------------------------------------------------------------------


def run_batch(sess, items: list[Item], info: ModelInfo) -> list[tuple[np.ndarray, ...] | Exception]:
    """Run `items` as few padded batches as the model allows; each item's outputs, cut back.

    Returns, per item, (y (b_i t_i c),) or (y, attn (b_i h t_i s_i)) when the model outputs weights
    ((y, present_key, present_value) for a decode model). Each group of items that shares a run
    succeeds or fails alone: the items of a group whose run raised get that exception in their
    place, and the other groups' answers stand.
    """
    out: list[tuple[np.ndarray, ...] | Exception | None] = [None] * len(items)
    if info.decode:
        # A cache cannot be padded without shifting positions: equal (t, p) share a run.
        same: dict[tuple[int, int], list[int]] = {}
        for i, it in enumerate(items):
            same.setdefault((it.t, it.p), []).append(i)
        groups, run = list(same.values()), _run_decode
    else:
        groups, run = length_groups(items, has_mask=info.has_mask), _run_padded
    for idx in groups:
        try:
            results: list = run(sess, [items[i] for i in idx], info)
        except Exception as e:  # noqa: BLE001 - this group's requests get it; the others run on
            results = [e] * len(idx)
        for i, res in zip(idx, results):
            out[i] = res
    return out  # type: ignore[return-value]


def _run_decode(sess, items: list[Item], info: ModelInfo) -> list[tuple[np.ndarray, ...]]:
    """Items of equal (t, p) as one `sess.decode` call: (y, present_key, present_value) each."""
    key_mask = None
    if info.has_key_mask:
        key_mask = np.concatenate(
            [it.key_mask if it.key_mask is not None else np.ones((it.rows, it.p + it.t), bool) for it in items]
        )
    y, pk, pv = sess.decode(
        np.concatenate([it.x for it in items]),
        np.concatenate([it.past_key for it in items]),
        np.concatenate([it.past_value for it in items]),
        key_mask,
    )
    results, r = [], 0
    for it in items:
        rows = slice(r, r + it.rows)
        results.append((y[rows], pk[rows], pv[rows]))
        r += it.rows
    return results


def length_groups(items: list[Item], *, has_mask: bool, pad_factor: float = PAD_FACTOR) -> list[list[int]]:
    """Indices of `items` that share one model run.

    Without a mask input, padding would change the answer: only equal (t, s) share a run. With
    one, lengths within `pad_factor` of each other do: padding a 16-position request to 128
    would cost 8x its projections (and 64x its scores), more than a second run costs.
    """
    if not has_mask:
        same: dict[tuple[int, int], list[int]] = {}
        for i, it in enumerate(items):
            same.setdefault((it.t, it.s), []).append(i)
        return list(same.values())
    groups: list[list[int]] = []
    t_min = s_min = s_max = 0
    for i in sorted(range(len(items)), key=lambda k: (items[k].t, items[k].s)):
        it = items[i]
        s_lo, s_hi = (min(s_min, it.s), max(s_max, it.s)) if groups else (it.s, it.s)
        if groups and it.t <= pad_factor * t_min and s_hi <= pad_factor * s_lo:
            groups[-1].append(i)
            s_min, s_max = s_lo, s_hi
        else:
            groups.append([i])
            t_min, s_min, s_max = it.t, it.s, it.s
    return groups


def pad_batch(items: list[Item], info: ModelInfo) -> dict[str, np.ndarray]:
    """One feed dict for `items`: x (B T c), context (B S c_ctx), mask (B T S), head_mask (B h).

    Padded keys are masked out; a padded query row attends to its item's real keys, so no row
    is empty under any lowering, and padded rows are cut away afterwards.
    """
    bsz = sum(it.rows for it in items)
    tmax = max(it.t for it in items)
    smax = max(it.s for it in items)
    same = all(it.t == tmax and it.s == smax for it in items)
    x = np.zeros((bsz, tmax, info.d_model), dtype=info.dtype)
    context = np.zeros((bsz, smax, info.d_context), dtype=info.dtype) if info.d_context else None
    mask = np.zeros((bsz, tmax, smax), dtype=bool) if info.has_mask else None
    head_mask = np.ones((bsz, info.heads), dtype=info.dtype) if info.has_head_mask else None
    r = 0
    for it in items:
        rows = slice(r, r + it.rows)
        x[rows, : it.t] = it.x
        if context is not None:
            context[rows, : it.s] = it.context
        if mask is not None:
            mask[rows, :, : it.s] = True  # padded query rows: see the docstring
            if it.mask is not None:
                mask[rows, : it.t, : it.s] = it.mask
        if head_mask is not None and it.head_mask is not None:
            head_mask[rows] = it.head_mask
        r += it.rows
    if not same and mask is None:
        raise ValueError("requests of different lengths need the model's mask input to share a batch")
    feeds = {"x": x}
    if context is not None:
        feeds["context"] = context
    if mask is not None:
        feeds["mask"] = mask
    if head_mask is not None:
        feeds["head_mask"] = head_mask
    return feeds


def _run_padded(sess, items: list[Item], info: ModelInfo) -> list[tuple[np.ndarray, ...]]:
    feeds = pad_batch(items, info)
    outs = sess.run(feeds["x"], feeds.get("context"), feeds.get("mask"), feeds.get("head_mask"))
    outs = outs if isinstance(outs, tuple) else (outs,)
    results, r = [], 0
    for it in items:
        rows = slice(r, r + it.rows)
        cut = [outs[0][rows, : it.t]]
        if len(outs) > 1:  # attn (b h t s)
            cut.append(outs[1][rows, :, : it.t, : it.s])
        results.append(tuple(np.ascontiguousarray(o) for o in cut))
        r += it.rows
    return results


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


def _rows(items: list[Item]) -> int:
    return sum(it.rows for it in items)


# -- the Ray Serve deployment ------------------------------------------------------------------


class OnnxServer:
    """A Ray Serve replica: one OnnxSession, requests gathered by serve.batch.

    GET /healthz -> "ok"; GET / or /metadata -> JSON; POST / or /predict -> the block's output.
    Timing headers: x-attnzoo-model-ms (the batch's ORT run), x-attnzoo-queue-ms (waiting for
    the batch to form and start), x-attnzoo-batch (rows in the batch), x-attnzoo-replica.
    """

    def __init__(
        self,
        model_bytes: bytes,
        name: str,
        provider: str = "cpu",
        max_batch: int = 16,
        batch_wait_ms: float = 5.0,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        max_body: int = DEFAULT_MAX_BODY,
        threads: int | None = None,
        loopback: bool = False,
    ) -> None:
        from .session import OnnxSession

        if loopback:  # before Serve starts this replica's own gRPC server, right after this __init__
            _replica_grpc_on_loopback()

        # Replicas may run on other machines: the model travels as bytes, not as a path.
        folder = Path(tempfile.mkdtemp(prefix="attnzoo-serve-"))
        path = folder / f"{name}.onnx"
        path.write_bytes(model_bytes)
        try:
            self.sess = OnnxSession(path, provider=provider, threads=threads, verbose=False)
        finally:
            # ONNX Runtime holds the model in memory now; replicas come and go, their files need not.
            shutil.rmtree(folder, ignore_errors=True)
        self.info = ModelInfo.of(self.sess, max_tokens=max_tokens, max_rows=max_batch, max_body=max_body)
        self.max_body = max_body
        self.replica = f"{os.uname().nodename}:{os.getpid()}"
        self.meta = {
            "name": self.sess.metadata.get("attnzoo.name", name),
            "spec": self.sess.spec.to_dict(),
            "lowering": self.sess.metadata.get("attnzoo.lowering"),
            "dtype": self.sess.metadata.get("attnzoo.dtype"),
            "provider": self.sess.provider,
            "inputs": self.sess.input_names,
            "outputs": self.sess.output_names,
            "max_batch": max_batch,
            "batch_wait_ms": batch_wait_ms,
            "max_tokens": max_tokens,
            "sha256": hashlib.sha256(model_bytes).hexdigest(),
        }
        from ray import serve

        # Built per replica (not as a class decorator) so the options are this server's and the
        # module imports without Ray. Batch size counts rows (sequences), not requests.
        self._batched = serve.batch(
            max_batch_size=max_batch, batch_wait_timeout_s=batch_wait_ms / 1000, batch_size_fn=_rows
        )(self._run_items)

    async def __call__(self, request):
        from starlette.responses import JSONResponse, PlainTextResponse, Response

        # Below a route prefix ("/decode"), Serve passes the prefix as the ASGI root_path.
        path = request.url.path
        root = (request.scope.get("root_path") or "").rstrip("/")
        if root and path.startswith(root):
            path = path[len(root) :]
        path = path.rstrip("/") or "/"
        if request.method == "GET":
            if path.endswith("/healthz"):
                return PlainTextResponse("ok")
            if path == "/" or path.endswith("/metadata"):
                return JSONResponse({**self.meta, "replica": self.replica})
            return PlainTextResponse(f"no such path {path}; GET /healthz or /metadata, POST /predict", 404)
        if request.method != "POST":
            return PlainTextResponse(f"method {request.method} is not served; POST a request", 405)
        if not (path == "/" or path.endswith("/predict")):
            return PlainTextResponse(f"no such path {path}; POST to / or /predict", 404)
        try:
            declared = request.headers.get("content-length") or "0"
            size = int(declared) if declared.isdigit() else 0  # a bad header: the body's length decides
            if size > self.max_body:
                raise RequestError(f"the body is {size} bytes; this server takes at most {self.max_body}", 413)
            body = await request.body()
            if len(body) > self.max_body:
                raise RequestError(f"the body is {len(body)} bytes; this server takes at most {self.max_body}", 413)
            item = decode_request(
                body, request.headers.get("content-type", ""), self.info, request.headers.get("accept", "")
            )
        except RequestError as e:
            return PlainTextResponse(str(e), e.status)
        item.enqueued = time.perf_counter()
        outputs, timing = await self._batched(item)
        if isinstance(outputs, AttnzooError):  # e.g. the padded batch would not fit in memory: try again later
            return PlainTextResponse(f"the server cannot run this batch now: {outputs}", 503)
        if isinstance(outputs, Exception):  # this request's group failed; the batch's other groups did not
            first = (str(outputs).strip().splitlines() or [""])[0][:300]
            return PlainTextResponse(f"the model run failed: {type(outputs).__name__}: {first}", 500)
        try:
            body, kind = encode_response(item, outputs, self.info.outputs)
        except RequestError as e:
            return PlainTextResponse(str(e), e.status)
        headers = {k: f"{v:.3f}" if isinstance(v, float) else str(v) for k, v in timing.items()}
        headers["x-attnzoo-replica"] = self.replica
        return Response(body, media_type=kind, headers=headers)

    async def _run_items(self, items: list[Item]) -> list[tuple[tuple[np.ndarray, ...] | Exception, dict[str, float]]]:
        started = time.perf_counter()
        # The ORT run releases the GIL: in a thread, the replica keeps reading requests meanwhile.
        results = await asyncio.to_thread(run_batch, self.sess, items, self.info)
        model_ms = (time.perf_counter() - started) * 1e3
        rows = sum(it.rows for it in items)
        return [
            (
                res,
                {
                    "x-attnzoo-model-ms": model_ms,
                    "x-attnzoo-queue-ms": (started - it.enqueued) * 1e3,
                    "x-attnzoo-batch": rows,
                },
            )
            for it, res in zip(items, results)
        ]


# -- starting a deployment ---------------------------------------------------------------------


@dataclass
class Deployment:
    """A running deployment: its URL and how it was asked for."""

    url: str
    app: str
    replicas: int
    provider: str
    model: Path
    started_ray: bool  # this process connected to Ray in `start`
    own_cluster: bool = False  # ...and the cluster is its own (embedded), not one it joined

    def shutdown(self) -> None:
        """Delete the application; stop Serve and Ray when they are this process's own (a joined
        cluster keeps running, with its other applications)."""
        import ray
        from ray import serve

        serve.delete(self.app)
        if self.own_cluster:
            serve.shutdown()
        if self.started_ray:
            ray.shutdown()


def start(
    model: str | os.PathLike,
    *,
    replicas: int = 1,
    provider: str = "cpu",
    max_batch: int = 16,
    batch_wait_ms: float = 5.0,
    port: int = 8000,
    host: str = "127.0.0.1",
    address: str | None = None,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    max_body: int = DEFAULT_MAX_BODY,
    threads: int | None = None,
    cpus_per_replica: float = 1.0,
    app: str = "attnzoo",
    route_prefix: str = "/",
) -> Deployment:
    """Serve the .onnx file `model` with Ray Serve at http://host:port{route_prefix} and return at once.

    address None: start Ray on this machine (or use the Ray this process already joined);
    otherwise join that cluster ("auto", or "HOST:6379"). With provider "cuda" each replica asks
    Ray for one GPU; "auto" means cuda when ONNX Runtime's CUDA provider works on this machine.
    """
    from .session import PROVIDERS, OnnxSession, cuda_status

    if provider not in PROVIDERS:
        raise ServeError(f"provider={provider!r} is not one of {', '.join(PROVIDERS)}")
    for name, v in (("replicas", replicas), ("max_batch", max_batch), ("max_tokens", max_tokens), ("port", port)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ServeError(f"{name}={v!r} must be a positive integer")
    if port > 65535:
        raise ServeError(f"port={port} is not a TCP port; give one in 1..65535")
    if not 0 <= batch_wait_ms <= 10_000:
        raise ServeError(f"batch_wait_ms={batch_wait_ms!r} must be between 0 and 10000")
    if cpus_per_replica < 0:
        raise ServeError(f"cpus_per_replica={cpus_per_replica!r} must be >= 0")
    path = Path(model)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file; export one with `attnzoo export NAME --mask -o {path}`")
    if Path(str(path) + ".data").exists():
        raise ServeError(f"{path} keeps its weights in an external file; serving sends one file to each replica")
    # Check here, in one process, what every replica would otherwise fail on.
    probe = OnnxSession(path, provider="cpu", verbose=False)
    ModelInfo.of(probe, max_tokens=max_tokens, max_rows=max_batch)
    del probe
    if not route_prefix.startswith("/"):
        raise ServeError(f"route_prefix={route_prefix!r} must start with '/'")
    import ray
    from ray import serve

    if address is None:
        # Embedded: everything runs here, so what would only fail (or hang) later is checked now.
        if provider == "cuda" and not cuda_status()[0]:
            raise ServeError(f"provider='cuda' asked for, but {cuda_status()[1]}; use --provider cpu")
        if not ray.is_initialized():  # else Serve may already listen there, for another application
            _check_port_free(host, port)
    if provider == "auto":
        provider = "cuda" if cuda_status()[0] else "cpu"

    started_ray = False
    if not ray.is_initialized():
        # "local": a Ray of our own, never a stray cluster that ray.init() would otherwise find.
        try:
            if address is None:
                init_local_ray()
            else:
                ray.init(address=address, include_dashboard=False, log_to_driver=False)
        except ConnectionError as e:
            raise ServeError(f"cannot join the Ray cluster at {address!r}: {str(e).splitlines()[0]}") from None
        started_ray = True
    own_cluster = started_ray and address is None
    try:
        if provider == "cuda" and ray.cluster_resources().get("GPU", 0) < 1:
            raise ServeError("provider='cuda' asks one GPU per replica, but this Ray cluster has no GPU")
        serve.start(http_options={"host": host, "port": port})
        options: dict[str, Any] = {"num_cpus": cpus_per_replica}
        if provider == "cuda":
            options["num_gpus"] = 1
        deployment = serve.deployment(
            OnnxServer,
            name="onnx",
            num_replicas=replicas,
            ray_actor_options=options,
            # Room for a full batch waiting while another runs, per replica.
            max_ongoing_requests=max(2 * max_batch, 8),
            health_check_period_s=2,
        )
        handle = deployment.bind(
            path.read_bytes(),
            path.stem,
            provider=provider,
            max_batch=max_batch,
            batch_wait_ms=batch_wait_ms,
            max_tokens=max_tokens,
            max_body=max_body,
            threads=threads,
            loopback=ray_on_loopback(),
        )
        try:
            serve.run(handle, name=app, route_prefix=route_prefix, blocking=False)
        except Exception as e:  # noqa: BLE001 - Ray reports a replica that failed to start this way
            lines = [ln for ln in str(e).splitlines() if ln.strip()]
            raise ServeError(f"the deployment did not start: {lines[-1] if lines else type(e).__name__}") from e
    except BaseException:
        if started_ray:
            if own_cluster:
                serve.shutdown()
            ray.shutdown()
        raise
    url = f"http://{host}:{port}{route_prefix.rstrip('/')}/"
    return Deployment(url, app, replicas, provider, path, started_ray, own_cluster)


_RAY_CLUSTER_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def init_local_ray(**options: Any) -> None:
    """ray.init a Ray of this process's own that listens on loopback only, without a dashboard.

    Ray 2.60 binds its gRPC servers (GCS, raylet, workers) to all interfaces unless the node's
    address is 127.0.0.1, and it rewrites a 127.0.0.1 given to ray.init to the machine's network
    address unless clusters are turned off (ray_constants.ENABLE_RAY_CLUSTER, read from the
    environment variable RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER). So for the length of ray.init they
    are turned off, in this process and in the environment that Ray's daemons (and, through the
    raylet, every worker) inherit: the node is 127.0.0.1, and its gRPC servers, agents and
    Prometheus endpoints listen there. `options` go to ray.init (num_cpus=..., ...).
    """
    import ray
    from ray._private import ray_constants

    had_env, had_flag = os.environ.get(_RAY_CLUSTER_ENV), getattr(ray_constants, "ENABLE_RAY_CLUSTER", None)
    os.environ[_RAY_CLUSTER_ENV] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        ray.init(
            address="local",
            _node_ip_address="127.0.0.1",
            include_dashboard=False,
            log_to_driver=False,
            **options,
        )
    finally:
        if had_env is None:
            os.environ.pop(_RAY_CLUSTER_ENV, None)
        else:
            os.environ[_RAY_CLUSTER_ENV] = had_env
        if had_flag is not None:
            ray_constants.ENABLE_RAY_CLUSTER = had_flag


def ray_on_loopback() -> bool:
    """Whether the Ray this process is connected to runs on a loopback address (init_local_ray)."""
    import ipaddress

    import ray

    try:
        return ipaddress.ip_address(ray.util.get_node_ip_address()).is_loopback
    except ValueError:
        return False


def _replica_grpc_on_loopback() -> None:
    """Ray Serve 2.60 binds each replica's inter-deployment gRPC server to [::]:0 whatever the
    node's address; on a loopback-only Ray, bind it to 127.0.0.1 instead (called in the replica's
    process, before Serve starts that server). A Serve without that hook is left as it is."""
    try:
        from ray.serve._private import replica
    except ImportError:
        return
    real = getattr(replica, "add_port_to_grpc_server", None)
    if real is None or getattr(real, "attnzoo_loopback", False):
        return

    def add_port(server, address: str, *args, **kwargs):
        host, _, port = address.rpartition(":")
        if host in ("[::]", "0.0.0.0", ""):
            address = f"127.0.0.1:{port}"
        return real(server, address, *args, **kwargs)

    add_port.attnzoo_loopback = True  # type: ignore[attr-defined]
    replica.add_port_to_grpc_server = add_port


def _check_port_free(host: str, port: int) -> None:
    import socket

    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError as e:
            raise ServeError(f"cannot listen on {host}:{port} ({e.strerror}); pick another --port") from None


def replica_states(app: str = "attnzoo") -> dict[str, int]:
    """{state: count} for the app's replicas, from the Serve controller (e.g. {"RUNNING": 2})."""
    from ray import serve

    status = serve.status()
    if app not in status.applications:
        return {}
    out: dict[str, int] = {}
    for dep in status.applications[app].deployments.values():
        for state, n in dep.replica_states.items():
            if not n:
                continue
            key = getattr(state, "value", str(state))
            out[key] = out.get(key, 0) + n
    return out


# -- the client --------------------------------------------------------------------------------


@dataclass
class Reply:
    """One HTTP answer: status, headers (lower-case), body, and the client-side seconds."""

    status: int
    headers: dict[str, str]
    body: bytes
    seconds: float

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def timing(self, key: str) -> float | None:
        v = self.headers.get(f"x-attnzoo-{key}")
        return float(v) if v is not None else None


class ClientError(AttnzooError, RuntimeError):
    """The server answered a request with an error status (the server's line is the message)."""

    def __init__(self, reply: Reply) -> None:
        super().__init__(f"HTTP {reply.status}: {reply.body.decode(errors='replace').strip()[:300]}")
        self.reply = reply


class ClientOptionError(AttnzooError, ValueError):
    """A Client asked for with a URL or an option it cannot use."""


def parse_url(url: str) -> tuple[str, int, str]:
    """(host, port, path prefix) of an http URL such as http://127.0.0.1:8000/; ClientOptionError
    (one line naming the URL) for anything else: another scheme, no host, a port out of 1..65535."""
    fix = "give an http URL such as http://127.0.0.1:8000/"
    if not isinstance(url, str):
        raise ClientOptionError(f"url={url!r} is not a string; {fix}")
    try:
        u = urllib.parse.urlsplit(url)
        port = u.port
    except ValueError as e:  # "Port out of range 0-65535", "Port could not be cast to integer value"...
        raise ClientOptionError(f"url={url!r}: {e}; {fix}") from None
    if u.scheme != "http" or not u.hostname:
        raise ClientOptionError(f"url={url!r}: {fix}")
    if port == 0:
        raise ClientOptionError(f"url={url!r}: port 0 is no server's port; {fix}")
    return u.hostname, port or 80, u.path.rstrip("/")


class Client:
    """A small client over the standard library: one keep-alive connection (one per thread).

        c = Client("http://127.0.0.1:8000/")
        y = c.predict(x)        # x (t c) or (b t c) numpy -> y of the same shape

    binary: send .npy/.npz (real sizes) rather than JSON. retries: how many times a request that
    failed on the connection or with a 5xx is sent again (4xx answers are final).
    """

    def __init__(self, url: str, *, binary: bool = True, timeout: float = 60.0, retries: int = 1) -> None:
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ClientOptionError(f"retries={retries!r} must be an integer >= 0")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ClientOptionError(f"timeout={timeout!r} must be positive (seconds)")
        self.host, self.port, self.prefix = parse_url(url)
        self.binary = binary
        self.timeout = timeout
        self.retries = retries
        self.retried = 0  # requests sent again after a failure, over this client's life
        self._conn: http.client.HTTPConnection | None = None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def request(
        self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
    ) -> Reply:
        """One request, retried on a connection failure or a 5xx up to `retries` times."""
        last: Reply | Exception | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                self.retried += 1
            try:
                reply = self._send(method, path, body, headers or {})
            except (OSError, http.client.HTTPException) as e:
                self.close()
                last = e
                continue
            if reply.status < 500:
                return reply
            last = reply
        if isinstance(last, Reply):
            return last
        raise ConnectionError(f"{method} {self.prefix}{path} on {self.host}:{self.port} failed: {last}")

    def _send(self, method: str, path: str, body: bytes | None, headers: dict[str, str]) -> Reply:
        if self._conn is None:
            self._conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        t0 = time.perf_counter()
        self._conn.request(method, self.prefix + path, body=body, headers=headers)
        resp = self._conn.getresponse()
        data = resp.read()
        seconds = time.perf_counter() - t0
        if resp.will_close:
            self.close()
        return Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, data, seconds)

    def health(self) -> bool:
        try:
            return self.request("GET", "/healthz").ok
        except ConnectionError:
            return False

    def metadata(self) -> dict[str, Any]:
        reply = self.request("GET", "/metadata")
        if not reply.ok:
            raise ClientError(reply)
        return json.loads(reply.body)

    def encode(self, x, context=None, mask=None, head_mask=None, **cache) -> tuple[bytes, str]:
        """(body, content type) of one request in this client's format; `cache` holds a decode
        model's past_key, past_value and key_mask."""
        unknown = sorted(set(cache) - set(DECODE_FIELDS))
        if unknown:
            raise TypeError(f"unknown request field(s) {unknown}; a request has {', '.join(FIELDS)}")
        given = {"x": x, "context": context, "mask": mask, "head_mask": head_mask, **cache}
        arrays = {k: np.asarray(v) for k, v in given.items() if v is not None}
        if not self.binary:
            return json.dumps({k: v.tolist() for k, v in arrays.items()}).encode(), JSON
        buf = io.BytesIO()
        if list(arrays) == ["x"]:
            np.save(buf, arrays["x"], allow_pickle=False)
            return buf.getvalue(), NPY
        np.savez(buf, **arrays)
        return buf.getvalue(), NPZ

    def predict_reply(self, x, context=None, mask=None, head_mask=None) -> Reply:
        body, kind = self.encode(x, context, mask, head_mask)
        return self.request("POST", "/predict", body, {"Content-Type": kind})

    def decode(self, x, past_key=None, past_value=None, key_mask=None):
        """A decode model's step: x (t c) or (b t c) and the cache from the last answer (None for a
        prompt) -> (y, present_key, present_value); pass the presents back as the next past."""
        body, kind = self.encode(x, past_key=past_key, past_value=past_value, key_mask=key_mask)
        reply = self.request("POST", "/predict", body, {"Content-Type": kind})
        if not reply.ok:
            raise ClientError(reply)
        return decode_reply(reply)

    def predict(self, x, context=None, mask=None, head_mask=None):
        """y like x ((t c) or (b t c)); (y, attn) when the model outputs weights. Raises ClientError."""
        reply = self.predict_reply(x, context, mask, head_mask)
        if not reply.ok:
            raise ClientError(reply)
        return decode_reply(reply)


def decode_reply(reply: Reply):
    """The arrays of a successful answer: y, or (y, attn)."""
    kind = reply.headers.get("content-type", "").split(";")[0]
    if kind == NPY:
        return np.load(io.BytesIO(reply.body), allow_pickle=False)
    if kind == NPZ:
        with np.load(io.BytesIO(reply.body), allow_pickle=False) as z:
            outs = tuple(z[k] for k in z.files)
        return outs[0] if len(outs) == 1 else outs
    doc = json.loads(reply.body)
    outs = tuple(np.asarray(v, dtype=np.float32) for v in doc.values())
    return outs[0] if len(outs) == 1 else outs


__all__ = [
    "Client",
    "ClientError",
    "ClientOptionError",
    "Deployment",
    "Item",
    "ModelInfo",
    "OnnxServer",
    "Reply",
    "RequestError",
    "ServeError",
    "check_arrays",
    "decode_request",
    "init_local_ray",
    "encode_response",
    "length_groups",
    "pad_batch",
    "parse_url",
    "replica_states",
    "run_batch",
    "start",
]
