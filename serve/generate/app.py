"""The Ray Serve replica of a whole-model export: POST /generate (serve/generate/protocol.py), requests
gathered by a StaticBatcher and generated from as one left-padded batch (serve/generate/batching.py)."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

from ..auth import authorized, refusal
from ..blocks.protocol import failure_answer
from ..openai.serving import OpenAIFront
from ..replica import (
    answer_get,
    files_digest,
    open_session,
    read_body,
    replica_grpc_on_loopback,
    request_path,
    timing_headers,
)
from ..schema import DEFAULT_MAX_BODY, DEFAULT_MAX_TOKENS, JSON, RequestError, ServeError, generate_body_limit
from .batching import StaticBatcher, run_generate_batch
from .continuous import DEFAULT_CAPACITY, check_continuous, continuous_batcher, shares_runs
from .protocol import (
    DEFAULT_MAX_NEW_TOKENS,
    GEN_ROUTE,
    GenInfo,
    decode_generate_request,
    encode_tokens,
)
from .rows import RowBatcher


class GenerateServer:
    """A Ray Serve replica over a whole-model export: one OnnxSession, static batches (StaticBatcher) or,
    with batching="continuous", requests joining the running batch at its next step (generate.continuous's
    continuous_batcher: left-padded or packed rows, as the export takes them; buffers of `capacity` slots).

    GET /healthz -> "ok"; GET / or /metadata -> JSON; POST /generate -> {"tokens": ...}; OpenAI's API under /v1
    (serve/openai/serving.py: text in and out with the export's tokenizer and chat template, `text`).
    key_digest: the sha256 of an API key every route but /healthz asks for (serve/auth.py). cuda_graph: a
    packed-rows export's decode steps captured per row count (OnnxSession(cuda_graph=True), serve/generate/packed.py).
    Timing headers as the block server's: x-attnzoo-model-ms (the batch's generate call),
    x-attnzoo-queue-ms, x-attnzoo-batch (rows in the batch), x-attnzoo-replica; and
    x-attnzoo-new-tokens (this answer's new tokens, all rows).
    """

    def __init__(
        self,
        files: dict[str, bytes],
        name: str,
        provider: str = "cpu",
        max_batch: int = 16,
        batch_wait_ms: float = 5.0,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        max_body: int = DEFAULT_MAX_BODY,
        threads: int | None = None,
        loopback: bool = False,
        tf32: bool = False,
        max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
        batching: str = "static",
        capacity: int = DEFAULT_CAPACITY,
        text: dict[str, bytes] | None = None,
        key_digest: str | None = None,
        cuda_graph: bool = False,
        tool_call_parser: str | None = None,
    ) -> None:
        if loopback:  # before Serve starts this replica's own gRPC server, right after this __init__
            replica_grpc_on_loopback()
        self.sess = open_session(files, provider, threads, tf32, cuda_graph)
        vocab = GenInfo.of(self.sess).vocab
        # No more than the largest valid generation request can need (a block's arrays can need far more).
        max_body = min(max_body, generate_body_limit(vocab, max_tokens))
        self.info = GenInfo.of(
            self.sess, max_rows=max_batch, max_tokens=max_tokens, max_new_tokens=max_new_tokens, max_body=max_body
        )
        per_run = None if shares_runs(self.sess) else 1  # longrope: one request a run
        if batching == "continuous":  # one set of buffers of `capacity` slots: a request must fit in it
            capacity = min(capacity, self.info.max_len or capacity)
            self.info = dataclasses.replace(self.info, max_len=capacity)
            self._batcher = continuous_batcher(self.sess, max_batch, capacity, wait_s=batch_wait_ms / 1000)
        else:
            # Not serve.batch: it forms a batch before waiting for the running one (generate.batching.StaticBatcher).
            self._batcher = StaticBatcher(
                lambda items: run_generate_batch(self.sess, items),
                max_rows=max_batch,
                wait_s=batch_wait_ms / 1000,
                max_requests=per_run,
            )
        self.replica = f"{os.uname().nodename}:{os.getpid()}"
        self.key_digest = key_digest  # serve/auth.py: every route but /healthz asks for the key
        md = self.sess.metadata
        self.meta = {
            "kind": "lm",
            "name": md.get("attnzoo.name", name),
            "route": GEN_ROUTE,
            "vocab": self.info.vocab,
            "layers": int(md.get("attnzoo.layers", "0") or 0),
            "lowering": md.get("attnzoo.lowering"),
            "dtype": md.get("attnzoo.dtype"),
            "precision": self.sess.precision,
            "provider": self.sess.provider,
            "batching": batching,
            # None: each batch's cache is sized to what it needs; continuous: the one batch's capacity
            "max_len": self.info.max_len,
            "max_batch": max_batch,
            # 1: requests never share a run (longrope: generate.continuous.shares_runs); None: any that fit
            "requests_per_run": per_run,
            "batch_wait_ms": batch_wait_ms,
            "max_tokens": max_tokens,
            "max_new_tokens": max_new_tokens,
            "sha256": files_digest(files),
        }
        self.meta["max_positions"] = max_tokens  # the same limit, by the name that never meets OpenAI's max_tokens
        # OpenAI's model id: the checkpoint folder's name its export recorded, else the file's stem
        label = md.get("attnzoo.name") or "DecoderLM"
        model_id = name if label == "DecoderLM" else Path(label).name
        self.tool_call_parser = tool_call_parser
        self.openai = self._openai(model_id, text or {}, batching, capacity, max_batch, batch_wait_ms, max_body)
        self.meta["openai"] = {"model": self.openai.name, "chat": self.openai.template is not None}

    def _openai(self, model_id, text, batching, capacity, max_batch, batch_wait_ms, max_body) -> OpenAIFront:
        """The /v1 routes (serve/openai/serving.py), on continuous batching: this server's batcher when it batches
        continuously, else one of their own, made on the first /v1 request (capacity: --capacity)."""
        unavailable = None
        try:
            check_continuous(self.sess, model_id)
        except ServeError as e:
            unavailable = str(e)
        capacity = min(capacity, self.info.max_len or capacity)
        own: list[RowBatcher] = []

        def batcher(made: bool = False):  # made=True: the list of those made so far
            if isinstance(self._batcher, RowBatcher):
                return [self._batcher] if made else self._batcher
            if made:
                return list(own)
            if not own:
                own.append(continuous_batcher(self.sess, max_batch, capacity, wait_s=batch_wait_ms / 1000))
            return own[0]

        return OpenAIFront(
            self.sess,
            batcher,
            model_id,
            "attnzoo-" + self.meta["sha256"][:12],
            text,
            max_new=self.info.max_new_tokens,
            max_positions=self.info.max_tokens,
            capacity=capacity,
            server_max_body=max_body,
            unavailable=unavailable,
            tool_call_parser=self.tool_call_parser,
        )

    async def __call__(self, request):
        from starlette.responses import PlainTextResponse, Response

        path = request_path(request)
        if not path.endswith("/healthz") and not authorized(request.headers, self.key_digest):
            return refusal(path)
        if path.startswith("/v1/") or path == "/v1":
            return await self.openai.handle(request, path)
        if request.method == "GET":  # with the rows running now, on each continuous batcher
            batchers = self.openai.batchers()
            live = {"rows_running": sum(b.used for b in batchers), "requests_left": sum(b.left for b in batchers)}
            return answer_get(path, {**self.meta, **live}, self.replica, GEN_ROUTE)
        if request.method != "POST":
            return PlainTextResponse(f"method {request.method} is not served; POST to {GEN_ROUTE}", 405)
        if not path.endswith(GEN_ROUTE):
            return PlainTextResponse(f"no such path {path}; this server runs a whole model: POST to {GEN_ROUTE}", 404)
        try:
            body = await read_body(request, self.info.max_body)
            item = decode_generate_request(body, request.headers.get("content-type", ""), self.info)
        except RequestError as e:
            return PlainTextResponse(str(e), e.status)
        item.enqueued = time.perf_counter()
        tokens, timing = await self._batcher.submit(item)
        if isinstance(tokens, Exception):
            return PlainTextResponse(*failure_answer(tokens))
        headers = timing_headers(timing, self.replica)
        headers["x-attnzoo-new-tokens"] = str(item.rows * (tokens.shape[1] - item.t))
        return Response(encode_tokens(item, tokens), media_type=JSON, headers=headers)


__all__ = ["GenerateServer"]
