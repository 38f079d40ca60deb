"""Reading a request body into named arrays: JSON (lists, or `{"npy_b64": ...}` per array), one
.npy array, or an .npz archive. Every .npy header is read and checked against the limits before
any data is loaded or inflated. The arrays' shapes and widths are checked by `protocol`."""

from __future__ import annotations

import base64
import io
import json
import math
import zipfile
from typing import Any

import numpy as np

from ..schema import FIELDS, NPY, NPZ, ModelInfo, RequestError


def read_json(body: bytes, info: ModelInfo) -> tuple[dict[str, np.ndarray], set[str]]:
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
            out[name] = read_npy(raw, name, info.max_tokens if name == "x" else None)
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
    read = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
    try:
        version = np.lib.format.read_magic(f)
        if version in read:
            shape, _, dtype = read[version](f)
    except Exception as e:  # noqa: BLE001 - numpy raises ValueError/EOFError/...
        raise RequestError(f"{what} is not a .npy array ({type(e).__name__}: {str(e)[:80]})") from None
    if version not in read:
        raise RequestError(
            f"{what} is not a .npy array (ValueError: format version {version[0]}.{version[1]} is not read here; "
            "write it with np.save)"
        )
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


def read_npy(raw: bytes, what: str, max_positions: int | None) -> np.ndarray:
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


def read_npz(raw: bytes, info: ModelInfo) -> dict[str, np.ndarray]:
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
