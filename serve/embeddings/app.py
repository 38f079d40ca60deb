"""The Ray Serve replica of a sentence encoder's export (`export_encoder`, attnzoo.kind "sentence_encoder"):
OpenAI's POST /v1/embeddings (serve/embeddings/protocol.py) and GET /v1/models, requests gathered across clients
by a StaticBatcher into padded runs (serve/embeddings/batching.py); GET /healthz and /metadata as every replica's.
The routes of a language model's server (/v1/completions, /v1/chat/completions, /generate) are a 404 here
that names what this server serves."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from pathlib import Path

from ..auth import authorized, refusal
from ..generate.batching import StaticBatcher
from ..openai.protocol import CHAT, COMPLETIONS, EMBEDDINGS, MODELS, OpenAIError, models_list, read_limited
from ..openai.protocol import max_body as body_limit
from ..replica import answer_get, files_digest, replica_grpc_on_loopback, request_path, timing_headers
from ..schema import DEFAULT_MAX_BODY, DEFAULT_MAX_TOKENS, JSON, ServeError
from .batching import EmbedItem, id_rows, run_embed_batch, text_rows
from .protocol import MAX_INPUTS, embeddings_answer, parse_embeddings

KIND = "sentence_encoder"


def is_sentence_encoder(sess) -> bool:
    return sess.metadata.get("attnzoo.kind") == KIND


def embed_files(path: Path) -> dict[str, bytes]:
    """The tokenizer a server of the export `path` reads, as it travels to the replicas: the MODEL.tokenizer.json
    its export wrote beside it, else a tokenizer.json in its folder; ServeError when there is none."""
    from runtime.embedding import tokenizer_beside

    for tok in (tokenizer_beside(path), path.with_name("tokenizer.json")):
        if tok.is_file():
            return {"tokenizer.json": tok.read_bytes()}
    raise ServeError(
        f"{path} has no tokenizer beside it ({tokenizer_beside(path).name}); `attnzoo export --checkpoint FOLDER "
        f"--whole -o {path.name}` writes it, or serve the model's folder"
    )


def open_embedding(files: dict[str, bytes], text: dict[str, bytes], provider: str, threads: int | None, tf32: bool):
    """An EmbeddingSession over an export's files (replica.model_files) and its tokenizer (embed_files), from
    their bytes; the temporary files are gone once ONNX Runtime and the tokenizer hold them."""
    from runtime.embedding import EmbeddingSession

    folder = Path(tempfile.mkdtemp(prefix="attnzoo-serve-"))
    try:
        for name, blob in {**files, **text}.items():
            (folder / name).write_bytes(blob)
        path = folder / next(iter(files))
        return EmbeddingSession(
            path, provider, tokenizer=folder / "tokenizer.json", threads=threads, verbose=False, tf32=tf32
        )
    finally:
        shutil.rmtree(folder, ignore_errors=True)


class EmbeddingServer:
    """A Ray Serve replica over a sentence encoder: one EmbeddingSession; the rows of the requests waiting when
    a run ends (up to `max_batch` rows, waiting up to `batch_wait_ms` for more) run as padded batches.

    Limits: MAX_INPUTS inputs a request; a text truncated at the model's max_seq_length, a token-id list longer
    than it refused; at most `max_tokens` (--max-positions) tokens a request (413); a body of at most 64 KiB +
    128 bytes a position of max_tokens, within `max_body` (413). Timing headers as the block server's."""

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
        text: dict[str, bytes] | None = None,
    ) -> None:
        if loopback:  # before Serve starts this replica's own gRPC server, right after this __init__
            replica_grpc_on_loopback()
        self.sess = open_embedding(files, text or {}, provider, threads, tf32)
        self.key_digest = key_digest
        self.max_tokens, self.max_body = max_tokens, body_limit(max_tokens, max_body)
        self.batcher = StaticBatcher(
            lambda items: run_embed_batch(self.sess, items, max_batch), max_rows=max_batch, wait_s=batch_wait_ms / 1000
        )
        md = self.sess.metadata
        label = md.get("attnzoo.name") or "SentenceEncoder"
        self.model = name if label == "SentenceEncoder" else Path(label).name  # OpenAI's model id
        self.vocab = int(md.get("attnzoo.vocab") or self.sess.tokenizer.tok.get_vocab_size(with_added_tokens=True))
        self.created = int(time.time())
        self.replica = f"{os.uname().nodename}:{os.getpid()}"
        self.meta = {
            "kind": KIND,
            "name": label,
            "route": EMBEDDINGS,
            "openai": {"model": self.model},
            "dim": self.sess.dim,
            "max_seq_length": self.sess.max_seq_length,
            "prompts": self.sess.prompts,
            "default_prompt_name": self.sess.default_prompt_name,
            "lowering": md.get("attnzoo.lowering"),
            "dtype": md.get("attnzoo.dtype"),
            "precision": md.get("attnzoo.precision", "fp32"),
            "provider": self.sess.provider,
            "max_batch": max_batch,
            "batch_wait_ms": batch_wait_ms,
            "max_inputs": MAX_INPUTS,
            "max_positions": max_tokens,
            "max_body": self.max_body,
            "sha256": files_digest(files),
        }

    async def __call__(self, request):
        from starlette.responses import PlainTextResponse, Response

        path = request_path(request)
        if not path.endswith("/healthz") and not authorized(request.headers, self.key_digest):
            return refusal(path)
        if path == "/v1" or path.startswith("/v1/"):
            try:
                return await self._openai(request, path)
            except OpenAIError as e:
                return Response(e.body(), e.status, media_type=JSON)
        if request.method == "GET":
            return answer_get(path, self.meta, self.replica, EMBEDDINGS)
        return PlainTextResponse(
            f"no such path {path}; this server runs the sentence encoder {self.model!r}: POST {EMBEDDINGS}", 404
        )

    async def _openai(self, request, path: str):
        from starlette.responses import Response

        if path.endswith(MODELS):
            if request.method != "GET":
                raise OpenAIError(f"{MODELS} answers GET", 405)
            return Response(models_list(self.model, self.created), media_type=JSON)
        if not path.endswith(EMBEDDINGS):
            made = "embeddings, not text" if path.endswith((COMPLETIONS, CHAT)) else "embeddings"
            raise OpenAIError(
                f"no such path {path}; this server runs the sentence encoder {self.model!r}, which makes {made}: "
                f"POST {EMBEDDINGS}, GET {MODELS}",
                404,
            )
        if request.method != "POST":
            raise OpenAIError(f"{EMBEDDINGS} answers POST", 405)
        body = await read_limited(request, self.max_body)
        sess = self.sess
        ask = parse_embeddings(
            body, self.model, dim=sess.dim, vocab=self.vocab, max_len=sess.max_seq_length, prompts=sess.prompts
        )
        if ask.ids is not None:
            seqs = id_rows(ask.ids)
        else:  # the tokenizer releases the GIL: requests keep arriving meanwhile
            seqs = await asyncio.to_thread(text_rows, sess, ask.texts, ask.prompt_name)
        item = EmbedItem(seqs, enqueued=time.perf_counter())
        if item.tokens > self.max_tokens:
            raise OpenAIError(
                f"the inputs hold {item.tokens} tokens; this server takes at most {self.max_tokens} per request "
                "(attnzoo serve --max-positions): send fewer inputs a request",
                413,
                param="input",
            )
        vectors, timing = await self.batcher.submit(item)
        if isinstance(vectors, Exception):
            raise OpenAIError(f"the model run failed: {type(vectors).__name__}: {vectors}", 500)
        answer = embeddings_answer(vectors, ask.encoding_format, self.model, item.tokens)
        return Response(answer, media_type=JSON, headers=timing_headers(timing, self.replica))


__all__ = ["EmbeddingServer", "embed_files", "is_sentence_encoder", "open_embedding"]
