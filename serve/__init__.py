"""Exported blocks behind Ray Serve: request decoding, padded dynamic batches, a client; and a
Triton repository writer and a load tester.

One request is one or more sequences: x (t, c) or (b, t, c), optional context (s, c_ctx) or
(b, s, c_ctx), mask (s,), (t, s) or (b, t, s) bool (True = may attend), head_mask (h,) or (b, h).
Bodies are JSON (`{"x": [[...]]}`, an array may also be `{"npy_b64": "..."}`), a `.npy` body
holding x alone (`application/x-npy`), or an `.npz` body with those names (`application/x-npz`).

`serve.batch` gathers requests; they are padded to one (b, t, s) batch whose key mask hides
the padding, run once, and each answer is cut back to its own (b_i, t_i). A model exported
without a mask input cannot hide padding, so its batches group requests of equal lengths.

Everything except `start`/`OnnxServer` works without Ray (the decoding and batching are plain
numpy, and `Client` uses the standard library only).

The package, split by job:

    schema.py    media types, fields, limits, errors, ModelInfo, Item
    bodies.py    reading a body (JSON, .npy, .npz) into arrays, headers checked first
    protocol.py  a request's checks, the answer's encoding
    batching.py  padded batches and decode groups
    app.py       the Ray Serve replica and `start`
    client.py    `Client` (standard library only)
    triton.py    a Triton model repository of zoo blocks
    loadtest.py  load, faults and checked answers against a running server
                 (load_pool.py: the requests sent; load_report.py: samples, levels, the table)

Depends on `zoo` and `export`.
"""

from .app import Deployment, OnnxServer, init_local_ray, replica_states, start
from .batching import length_groups, pad_batch, run_batch
from .client import Client, ClientError, ClientOptionError, Reply, decode_reply, parse_url
from .protocol import (
    JSON,
    NPY,
    NPZ,
    Item,
    ModelInfo,
    RequestError,
    ServeError,
    check_arrays,
    decode_request,
    encode_response,
)

__all__ = [
    "JSON",
    "NPY",
    "NPZ",
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
    "decode_reply",
    "decode_request",
    "encode_response",
    "init_local_ray",
    "length_groups",
    "pad_batch",
    "parse_url",
    "replica_states",
    "run_batch",
    "start",
]
