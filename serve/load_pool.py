"""The requests a load test sends: a pool of pre-encoded good bodies with their expected
answers, and one malformed body of each kind (each must get a 4xx)."""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from zoo import AttnzooError

from .client import Client
from .protocol import JSON, NPY

BAD_KINDS = ("not-json", "wrong-width", "wrong-rank", "wrong-dtype", "too-large", "empty", "nan", "unknown-field")


class LoadTestError(AttnzooError, ValueError):
    """A load test that cannot run as asked (bad options, a server that is not there)."""


@dataclass
class Pool:
    """Pre-encoded request bodies: good ones with their expected answers, and malformed ones."""

    good: list[tuple[bytes, str, np.ndarray | None]]  # (body, content type, expected y or None)
    bad: dict[str, tuple[bytes, str]]


def build_pool(
    meta: dict[str, Any],
    *,
    seqs: list[int],
    batch: int = 1,
    size: int = 32,
    binary: bool = True,
    model: str | os.PathLike | None = None,
    seed: int = 0,
) -> Pool:
    """`size` well-formed inputs with T drawn from `seqs`, answers from `model` run alone."""
    spec = meta["spec"]
    c, c_ctx = spec["d_model"], spec.get("d_context")
    dtype = np.float16 if meta.get("dtype") == "float16" else np.float32
    sess = None
    if model is not None:
        from export.session import OnnxSession

        sess = OnnxSession(model, provider="cpu", verbose=False)
        import hashlib

        digest = hashlib.sha256(Path(model).read_bytes()).hexdigest()
        if meta.get("sha256") and digest != meta["sha256"]:
            raise LoadTestError(f"{model} is not the model this server runs (sha256 differs); give the served file")
    rng = np.random.default_rng(seed)
    client = Client("http://127.0.0.1/", binary=binary)  # used only to encode bodies
    good = []
    for i in range(size):
        t = seqs[i % len(seqs)]
        x = rng.standard_normal((batch, t, c)).astype(dtype)
        context = rng.standard_normal((batch, t + 3, c_ctx)).astype(dtype) if c_ctx else None
        body, kind = client.encode(x, context)
        want = None
        if sess is not None:
            # A decode model gets prompts (no past); its answer's y is checked.
            want = sess.decode(x) if "past_key" in sess.input_names else sess.run(x, context)
            want = want[0] if isinstance(want, tuple) else want
        good.append((body, kind, want))
    max_tokens = int(meta.get("max_tokens", 65_536))
    bad = {kind: bad_body(kind, c, dtype, max_tokens, rng) for kind in BAD_KINDS}
    return Pool(good, bad)


def _npy(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=False)
    return buf.getvalue()


def bad_body(kind: str, c: int, dtype, max_tokens: int, rng) -> tuple[bytes, str]:
    x = rng.standard_normal((1, 8, c)).astype(dtype)
    if kind == "not-json":
        return b'{"x": [[0.1, 0.2', JSON
    if kind == "wrong-width":
        return _npy(rng.standard_normal((1, 8, c + 1)).astype(dtype)), NPY
    if kind == "wrong-rank":
        return _npy(x[0, 0]), NPY
    if kind == "wrong-dtype":
        return _npy(x.astype(np.float64)), NPY
    if kind == "too-large":
        t = max_tokens + 1
        if t * c * 4 <= 32 * 2**20:
            return _npy(np.zeros((1, t, c), dtype)), NPY
        # A real body this size would only load the loopback: the header alone declares it, and
        # the server must refuse it from the header before reading data.
        head = io.BytesIO()
        np.lib.format.write_array_header_1_0(
            head, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": (1, t, c)}
        )
        return head.getvalue() + b"\0" * 64, NPY
    if kind == "empty":
        return _npy(np.zeros((1, 0, c), dtype)), NPY
    if kind == "nan":
        y = x.copy()
        y[0, 3, 1] = np.nan
        return _npy(y), NPY
    if kind == "unknown-field":
        return json.dumps({"x": x[0].tolist(), "y": [1]}).encode(), JSON
    raise LoadTestError(f"unknown malformed kind {kind!r}")
