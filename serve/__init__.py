"""Exported blocks behind Ray Serve: request decoding, padded dynamic batches, a client; and a
Triton repository writer and a load tester.

One request is one or more sequences: x (t, c) or (b, t, c), optional context (s, c_ctx) or
(b, s, c_ctx), mask (s,), (t, s) or (b, t, s) bool (True = may attend), head_mask (h,) or (b, h).
Bodies are JSON (`{"x": [[...]]}`, an array may also be `{"npy_b64": "..."}`), a `.npy` body
holding x alone (`application/x-npy`), or an `.npz` body with those names (`application/x-npz`).

`serve.batch` gathers requests; they are padded to one (b, t, s) batch whose key mask hides
the padding, run once, and each answer is cut back to its own (b_i, t_i). A model exported
without a mask input cannot hide padding, so its batches group requests of equal lengths.

A whole-model export (export_onnx of a zoo.DecoderLM) is served on POST /generate instead: JSON
`{"input_ids": [...], "max_new_tokens": N}` in, the prompt and its greedy tokens out, equal to
`OnnxSession.generate` of the request alone; the requests of a window are one left-padded batch (one
request a run for an export with longrope layers, whose runs requests cannot share). The same server speaks
OpenAI's API under /v1 (completions and chat, streamed or not), on continuous batching.

A sentence encoder's export (export_encoder) is served on OpenAI's POST /v1/embeddings: texts or token ids in,
the embeddings out (float or base64), equal to SentenceTransformer.encode; the requests of a window are run
together in length-sorted padded runs.

Everything except `start`/`OnnxServer`/`GenerateServer`/`EmbeddingServer` works without Ray (the decoding and
batching are plain numpy, and `Client` uses the standard library only).

The package, a folder per job (as vLLM's entrypoints/openai/ keeps one per route):

    app.py       starting a deployment (`start`): the replica a model takes, Ray on loopback or a cluster
    schema.py    media types, fields, limits, errors, ModelInfo, Item (what every route shares)
    replica.py   what every replica does first (its session from the model's bytes, gRPC on loopback)
    auth.py      the optional API key (a Bearer token, compared in constant time)
    ops.py       a whole model's operations settings (ServeOps: --max-waiting, --request-timeout,
                 --prefix-cache-mb, --access-log, --log-prompts)
    access.py    request ids (X-Request-Id) and the access log, one JSON line per request
    metrics.py   GET /metrics: Prometheus' text format, vLLM's names under attnzoo:, one registry per replica
    client.py    `Client` (standard library only)
    triton.py    a Triton model repository of zoo blocks
    blocks/      a zoo block's export: bodies.py (JSON, .npy, .npz read, headers first), protocol.py (checks,
                 answers), batching.py (padded runs, decode groups), app.py (OnnxServer, the replica)
    generate/    a whole model's export: protocol.py (/generate requests checked: GenInfo, GenItem),
                 batching.py (left-padded static batches, StaticBatcher), rows.py (what both continuous batchers
                 share: admission control, timeouts), continuous.py (ContinuousBatcher over a left-padded export;
                 continuous_batcher picks one), packed.py (PackedBatcher over a packed-rows export), prefix.py
                 (the prefix cache both read), app.py (GenerateServer: also /health, /ready, /metrics)
    openai/      OpenAI's API: protocol.py (/v1 requests checked, answers, chunks, errors in its format),
                 serving.py (the /v1 routes on continuous batching: OpenAIFront, TextRun), tokenize.py
                 (POST /tokenize, /detokenize in vLLM's shapes)
    embeddings/  /v1/embeddings: protocol.py (EmbedAsk, answers), batching.py (rows, length-sorted padded runs
                 across requests), app.py (EmbeddingServer)
    loadtest/    load, faults and checked answers against a running server (__init__.py); pool.py (the requests
                 sent), report.py (samples, levels, the table), chat.py (streamed /v1/chat/completions)

Depends on `zoo` and `export`.
"""

from .app import Deployment, OnnxServer, check_options, check_port_free, init_local_ray, replica_states, start
from .blocks.batching import length_groups, pad_batch, run_batch
from .blocks.protocol import (
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
from .client import Client, ClientError, ClientOptionError, Reply, decode_reply, parse_url
from .embeddings.app import EmbeddingServer
from .generate.app import GenerateServer
from .generate.batching import StaticBatcher, run_generate_batch
from .generate.continuous import ContinuousBatcher, PackedBatcher, continuous_batcher
from .generate.protocol import GenInfo, GenItem, decode_generate_request

__all__ = [
    "JSON",
    "NPY",
    "NPZ",
    "Client",
    "ClientError",
    "ClientOptionError",
    "ContinuousBatcher",
    "PackedBatcher",
    "Deployment",
    "EmbeddingServer",
    "GenInfo",
    "GenItem",
    "GenerateServer",
    "Item",
    "ModelInfo",
    "OnnxServer",
    "Reply",
    "RequestError",
    "ServeError",
    "StaticBatcher",
    "check_arrays",
    "check_options",
    "check_port_free",
    "continuous_batcher",
    "decode_generate_request",
    "decode_reply",
    "decode_request",
    "encode_response",
    "init_local_ray",
    "length_groups",
    "pad_batch",
    "parse_url",
    "replica_states",
    "run_batch",
    "run_generate_batch",
    "start",
]
