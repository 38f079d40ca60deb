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

The package, split by job:

    schema.py    media types, fields, limits, errors, ModelInfo, Item
    bodies.py    reading a body (JSON, .npy, .npz) into arrays, headers checked first
    protocol.py  a request's checks, the answer's encoding
    batching.py  padded batches and decode groups
    app.py       the Ray Serve replica and `start`
    replica.py   what every replica does first (its session from the model's bytes, gRPC on loopback)
    gen_protocol.py  a whole model's /generate requests, checked (GenInfo, GenItem)
    gen_batching.py  left-padded static batches of them, and the StaticBatcher that forms them
    gen_rows.py  what both continuous batchers share: the exports they serve, the thread, answers
    gen_continuous.py  the ContinuousBatcher over a left-padded export: requests join the running batch
                 at its next step; continuous_batcher picks the batcher an export takes
    gen_packed.py  the PackedBatcher over a packed-rows export (a CUDA export's): rows on the device
    gen_app.py   the Ray Serve replica of a whole model
    openai_protocol.py  OpenAI's API: /v1 request checks (Ask), answers, chunks, errors in its format
    openai_run.py  the /v1 routes of a whole model on continuous batching (OpenAIFront, TextRun)
    embed_protocol.py  /v1/embeddings requests checked (EmbedAsk) and answered, in OpenAI's format
    embed_batching.py  their rows (tokenized, truncated), length-sorted padded runs across requests
    embed_app.py  the Ray Serve replica of a sentence encoder (EmbeddingServer)
    auth.py      the optional API key (a Bearer token, compared in constant time)
    client.py    `Client` (standard library only)
    triton.py    a Triton model repository of zoo blocks
    loadtest.py  load, faults and checked answers against a running server
                 (load_pool.py: the requests sent; load_report.py: samples, levels, the table;
                 load_chat.py: streamed /v1/chat/completions, tokens/s and time to first token)

Depends on `zoo` and `export`.
"""

from .app import Deployment, OnnxServer, check_options, check_port_free, init_local_ray, replica_states, start
from .batching import length_groups, pad_batch, run_batch
from .client import Client, ClientError, ClientOptionError, Reply, decode_reply, parse_url
from .embed_app import EmbeddingServer
from .gen_app import GenerateServer
from .gen_batching import StaticBatcher, run_generate_batch
from .gen_continuous import ContinuousBatcher, PackedBatcher, continuous_batcher
from .gen_protocol import GenInfo, GenItem, decode_generate_request
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
