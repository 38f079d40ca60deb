"""The Ray Serve replica of a zoo block's export (OnnxServer): POST / or /predict, requests gathered by
serve.batch into padded runs (serve/blocks/batching.py), checked and answered by serve/blocks/protocol.py."""

from __future__ import annotations

import asyncio
import os
import time

import numpy as np

from ..auth import authorized, refusal
from ..replica import (
    answer_get,
    files_digest,
    open_session,
    read_body,
    replica_grpc_on_loopback,
    request_path,
    timing_headers,
)
from .batching import run_batch
from .protocol import (
    DEFAULT_MAX_BODY,
    DEFAULT_MAX_TOKENS,
    Item,
    ModelInfo,
    RequestError,
    decode_request,
    encode_response,
    failure_answer,
    rows_of,
)

# -- the replica ------------------------------------------------------------------


class OnnxServer:
    """A Ray Serve replica: one OnnxSession, requests gathered by serve.batch.

    GET /healthz -> "ok"; GET / or /metadata -> JSON; POST / or /predict -> the block's output.
    Timing headers: x-attnzoo-model-ms (the batch's ORT run), x-attnzoo-queue-ms (waiting for
    the batch to form and start), x-attnzoo-batch (rows in the batch), x-attnzoo-replica.
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
        key_digest: str | None = None,
    ) -> None:
        if loopback:  # before Serve starts this replica's own gRPC server, right after this __init__
            replica_grpc_on_loopback()
        self.key_digest = key_digest  # serve/auth.py: every route but /healthz asks for the key
        self.sess = open_session(files, provider, threads, tf32)
        self.info = ModelInfo.of(self.sess, max_tokens=max_tokens, max_rows=max_batch, max_body=max_body)
        self.max_body = max_body
        self.replica = f"{os.uname().nodename}:{os.getpid()}"
        self.meta = {
            "name": self.sess.metadata.get("attnzoo.name", name),
            "spec": self.sess.spec.to_dict(),
            "lowering": self.sess.metadata.get("attnzoo.lowering"),
            "dtype": self.sess.metadata.get("attnzoo.dtype"),
            "precision": self.sess.precision,
            "provider": self.sess.provider,
            # What a client sends: a static cache's past_len is the session's to bind, not the client's.
            "inputs": [n for n in self.sess.input_names if n != "past_len"],
            "cache": self.sess.cache,
            "max_len": self.info.max_len,  # a static cache's capacity: p + t past it is a 413
            "outputs": self.sess.output_names,
            "max_batch": max_batch,
            "batch_wait_ms": batch_wait_ms,
            "max_tokens": max_tokens,
            "sha256": files_digest(files),
        }
        from ray import serve

        # Built per replica (not as a class decorator) so the options are this server's and the
        # module imports without Ray. Batch size counts rows (sequences), not requests.
        self._batched = serve.batch(
            max_batch_size=max_batch, batch_wait_timeout_s=batch_wait_ms / 1000, batch_size_fn=rows_of
        )(self._run_items)

    async def __call__(self, request):
        from starlette.responses import PlainTextResponse, Response

        path = request_path(request)
        if not path.endswith("/healthz") and not authorized(request.headers, self.key_digest):
            return refusal(path)
        if request.method == "GET":
            return answer_get(path, self.meta, self.replica, "/predict")
        if request.method != "POST":
            return PlainTextResponse(f"method {request.method} is not served; POST a request", 405)
        if not (path == "/" or path.endswith("/predict")):
            return PlainTextResponse(f"no such path {path}; POST to / or /predict", 404)
        try:
            body = await read_body(request, self.max_body)
            item = decode_request(
                body, request.headers.get("content-type", ""), self.info, request.headers.get("accept", "")
            )
        except RequestError as e:
            return PlainTextResponse(str(e), e.status)
        item.enqueued = time.perf_counter()
        outputs, timing = await self._batched(item)
        if isinstance(outputs, Exception):  # this request's group failed; the batch's other groups did not
            return PlainTextResponse(*failure_answer(outputs))
        try:
            body, kind = encode_response(item, outputs, self.info.outputs)
        except RequestError as e:
            return PlainTextResponse(str(e), e.status)
        return Response(body, media_type=kind, headers=timing_headers(timing, self.replica))

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
