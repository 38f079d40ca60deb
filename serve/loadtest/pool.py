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

from ..blocks.protocol import JSON, NPY
from ..client import Client

BAD_KINDS = ("not-json", "wrong-width", "wrong-rank", "wrong-dtype", "too-large", "empty", "nan", "unknown-field")
# A whole model's malformed /generate bodies, each a client mistake (4xx).
GEN_BAD_KINDS = (
    "not-json",
    "id-past-vocab",
    "too-many-new-tokens",
    "empty",
    "unknown-field",
    "float-ids",
    "ragged",
    "no-max-new-tokens",
)


class LoadTestError(AttnzooError, ValueError):
    """A load test that cannot run as asked (bad options, a server that is not there)."""


@dataclass
class Pool:
    """Pre-encoded request bodies: good ones with their expected answers, and malformed ones."""

    good: list[tuple[bytes, str, np.ndarray | None]]  # (body, content type, expected y or None)
    bad: dict[str, tuple[bytes, str]]
    route: str = "/predict"  # a whole model's pool: "/generate"
    exact: bool = False  # answers are token ids: checked for equality, not within a tolerance


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
    sess = _served_session(meta, model)
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


def _served_session(meta: dict[str, Any], model: str | os.PathLike | None):
    """An OnnxSession over `model` when given, checked to be the file the server runs (its sha256)."""
    if model is None:
        return None
    from runtime.session import OnnxSession

    from ..replica import files_digest, model_files

    digest = files_digest(model_files(Path(model)))
    if meta.get("sha256") and digest != meta["sha256"]:
        raise LoadTestError(f"{model} is not the model this server runs (sha256 differs); give the served file")
    return OnnxSession(model, provider="cpu", verbose=False)


def build_gen_pool(
    meta: dict[str, Any],
    *,
    seqs: list[int],
    new_tokens: int,
    batch: int = 1,
    size: int = 32,
    model: str | os.PathLike | None = None,
    seed: int = 0,
) -> Pool:
    """A whole model's pool: `size` prompts of random ids (T drawn from `seqs`, `batch` rows each) asking
    `new_tokens` tokens; each answer computed with `OnnxSession.generate` on that request alone."""
    vocab = int(meta["vocab"])
    sess = _served_session(meta, model)
    rng = np.random.default_rng(seed)
    good = []
    for i in range(size):
        ids = rng.integers(0, vocab, (batch, seqs[i % len(seqs)]), dtype=np.int64)
        body = json.dumps({"input_ids": ids.tolist(), "max_new_tokens": new_tokens}).encode()
        good.append((body, JSON, sess.generate(ids, new_tokens) if sess is not None else None))
    limit = int(meta.get("max_new_tokens", 256))
    bad = {kind: (gen_bad_body(kind, vocab, limit), JSON) for kind in GEN_BAD_KINDS}
    return Pool(good, bad, route="/generate", exact=True)


def gen_bad_body(kind: str, vocab: int, max_new_tokens: int) -> bytes:
    """One malformed /generate body of `kind` (GEN_BAD_KINDS)."""
    doc: dict[str, Any] = {"input_ids": [[1, 2, 3]], "max_new_tokens": 4}
    if kind == "not-json":
        return b'{"input_ids": [1, 2'
    if kind == "id-past-vocab":
        doc["input_ids"] = [[1, vocab, 3]]
    elif kind == "too-many-new-tokens":
        doc["max_new_tokens"] = max_new_tokens + 1
    elif kind == "empty":
        doc["input_ids"] = [[]]
    elif kind == "unknown-field":
        doc["temperature"] = 0.7
    elif kind == "float-ids":
        doc["input_ids"] = [[1.5, 2.0]]
    elif kind == "ragged":
        doc["input_ids"] = [[1, 2, 3], [4]]
    elif kind == "no-max-new-tokens":
        del doc["max_new_tokens"]
    else:
        raise LoadTestError(f"unknown malformed kind {kind!r}")
    return json.dumps(doc).encode()


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
