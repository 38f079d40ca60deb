"""The request protocol: what a body may hold (JSON, .npy, .npz), the checks made before any
data is inflated or run, and the answer's encoding. Plain numpy: no Ray."""

from __future__ import annotations

import base64
import io
import json
import math
import time
import zipfile
from dataclasses import dataclass, field
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


def rows_of(items: list[Item]) -> int:
    return sum(it.rows for it in items)
