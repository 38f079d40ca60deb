"""The Ray Serve replica of a whole-model export: POST /generate (serve/generate/protocol.py), requests
gathered by a StaticBatcher and generated from as one left-padded batch (serve/generate/batching.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from pathlib import Path

from ..access import HEADER, LOG, AccessLog, current
from ..auth import authorized, refusal
from ..blocks.protocol import failure_answer
from ..metrics import TEXT_FORMAT, ReplicaMetrics
from ..openai.serving import OpenAIFront
from ..openai.tokenize import DETOKENIZE, TOKENIZE
from ..ops import ServeOps
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
from .rows import Busy, RowBatcher, TimedOut
from .speculating import ServeSpeculation, generate_options


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
    x-attnzoo-new-tokens (this answer's new tokens, all rows). ops (serve/ops.py): the continuous batch's
    admission control, request timeout and prefix cache, and the access log; GET /health, /ready and /metrics
    (serve/metrics.py) ask for no key, POST /tokenize and /detokenize (serve/openai/tokenize.py) do.
    speculation (generate/speculating.ServeSpeculation: prompt lookup or a draft's files): every generation, static
    or continuous, /generate or /v1, verifies candidates k at a time (exact); its counts in /metrics and in each
    continuously batched request's x-attnzoo-spec-* timings.
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
        ops: ServeOps | None = None,
        speculation: ServeSpeculation | None = None,
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
        # runtime/speculative's Speculation (its draft's session opened here), checked; its rounds' counts
        self.spec = speculation.open(self.sess, provider, threads) if speculation is not None else None
        self.tally: dict = {}
        if self.spec is not None and self.spec.draft is not None:  # the draft's rows hold the capacity too
            from runtime.generation import lm_max_len

            capacity = min(capacity, lm_max_len(self.spec.draft) or capacity)
        self.ops = ops or ServeOps()
        self.replica = f"{os.uname().nodename}:{os.getpid()}"
        self.access = AccessLog(self.ops.access_log, self.ops.log_prompts, self.replica)
        if batching == "continuous":  # one set of buffers of `capacity` slots: a request must fit in it
            capacity = min(capacity, self.info.max_len or capacity)
            self.info = dataclasses.replace(self.info, max_len=capacity)
            self._batcher = continuous_batcher(
                self.sess, max_batch, capacity, wait_s=batch_wait_ms / 1000, **self._batcher_options()
            )
        else:
            # Not serve.batch: it forms a batch before waiting for the running one (generate.batching.StaticBatcher).
            self._batcher = StaticBatcher(
                self._static_run,
                max_rows=max_batch,
                wait_s=batch_wait_ms / 1000,
                max_requests=per_run,
            )
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
            "speculation": speculation.describe() if speculation is not None else None,
        }
        self.meta["max_positions"] = max_tokens  # the same limit, by the name that never meets OpenAI's max_tokens
        # OpenAI's model id: the checkpoint folder's name its export recorded, else the file's stem
        label = md.get("attnzoo.name") or "DecoderLM"
        model_id = name if label == "DecoderLM" else Path(label).name
        self.tool_call_parser = tool_call_parser
        self.openai = self._openai(model_id, text or {}, batching, capacity, max_batch, batch_wait_ms, max_body)
        self.meta["openai"] = {"model": self.openai.name, "chat": self.openai.template is not None}
        self.metrics = ReplicaMetrics(self.openai.name, self.openai.batchers, self.tally if self.spec else None)
        self.meta["prefix_cache_mb"] = self.ops.prefix_cache_mb
        self.meta["max_waiting"], self.meta["request_timeout"] = self.ops.max_waiting, self.ops.request_timeout

    def _batcher_options(self) -> dict:
        """A continuous batcher's admission, timeout, prefix cache and metrics (serve/ops.py); the observer is
        looked up when a request leaves, so the metrics may be made after the batcher; speculating, the
        speculation and the tally its rounds count into."""
        options = self.ops.batcher_options(observer=self)
        if self.spec is not None:
            options.update(speculation=self.spec, tally=self.tally)
        return options

    def _static_run(self, items: list) -> list:
        """A static batch's run (generate.batching.run_generate_batch), speculating as the server does."""
        if self.spec is None:
            return run_generate_batch(self.sess, items)
        timings: dict = {}
        out = run_generate_batch(self.sess, items, timings, generate_options(self.spec))
        for name, n in timings.get("speculation", {}).items():
            if isinstance(n, int) and not isinstance(n, bool) and name != "k":
                self.tally[name] = self.tally.get(name, 0) + n
        return out

    def finished(self, run, now: float, reason: str) -> None:  # the batchers' observer: to the metrics
        self.metrics.finished(run, now, reason)

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
                wait = batch_wait_ms / 1000
                own.append(continuous_batcher(self.sess, max_batch, capacity, wait_s=wait, **self._batcher_options()))
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
        """Every route, its answer carrying the request's id (X-Request-Id) and one access-log line when it
        ends (a stream: at its last event)."""
        from starlette.responses import StreamingResponse

        path = request_path(request)
        rec = self.access.begin(request, path)
        try:
            response = await self._route(request, path)
        except asyncio.CancelledError:  # the client left before its answer (nginx's 499)
            self.access.end(rec, 499)
            raise
        except Exception:  # a fault of ours: logged with the request's id, then Ray Serve answers 500
            LOG.exception("%s %s failed", request.method, path)
            self.access.end(rec, 500)
            raise
        if HEADER not in request.headers:  # Ray Serve's proxy puts one in every request and returns it itself
            response.headers[HEADER] = rec.request_id
        if not isinstance(response, StreamingResponse):
            self.access.end(rec, response.status_code)
            return response
        events = response.body_iterator

        async def logged():
            try:
                async for event in events:
                    yield event
            finally:
                self.access.end(rec, response.status_code)

        response.body_iterator = logged()
        return response

    async def _route(self, request, path: str):
        from starlette.responses import JSONResponse, PlainTextResponse, Response

        if request.method == "GET" and path in ("/health", "/ready", "/metrics"):  # open, as /healthz
            if path == "/metrics":
                return Response(self.metrics.text(), media_type=TEXT_FORMAT)
            failed = [b.failed for b in self.openai.batchers() if b.failed]
            if path == "/ready" and failed:  # the model is loaded (this replica exists) but its last step failed
                return JSONResponse({"status": "failed", "model": self.openai.name, "error": failed[0]}, 503)
            return JSONResponse({"status": "ready" if path == "/ready" else "ok", "model": self.openai.name})
        if not path.endswith("/healthz") and not authorized(request.headers, self.key_digest):
            return refusal(path)
        if path.startswith("/v1/") or path == "/v1":
            return await self.openai.handle(request, path)
        if path in (TOKENIZE, DETOKENIZE):
            return await self.openai.tokens(request, path)
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
        rec = current()
        rec.prompt_tokens = int(item.ids.size if item.mask is None else item.mask.sum())
        try:
            tokens, timing = await self._batcher.submit(item)
        except Busy as e:
            LOG.warning("refused: %s", e)
            return PlainTextResponse(f"{e}; retry after {e.retry_after} s", 429, {"retry-after": str(e.retry_after)})
        except asyncio.CancelledError:  # the client left: its rows are given back at the next step
            item.cancelled = True
            raise
        rec.queue_ms, rec.ttft_ms = timing.get("x-attnzoo-queue-ms"), timing.get("x-attnzoo-ttft-ms")
        rec.speculated(timing)
        if isinstance(tokens, TimedOut):
            return PlainTextResponse(str(tokens), 503, {"retry-after": "1"})
        if isinstance(tokens, Exception):
            return PlainTextResponse(*failure_answer(tokens))
        rec.completion_tokens = item.rows * (tokens.shape[1] - item.t)
        headers = timing_headers(timing, self.replica)
        headers["x-attnzoo-new-tokens"] = str(item.rows * (tokens.shape[1] - item.t))
        return Response(encode_tokens(item, tokens), media_type=JSON, headers=headers)


__all__ = ["GenerateServer"]
