"""The OpenAI routes of a whole-model replica (serve/generate/app.py): GET /v1/models, POST /v1/completions and
/v1/chat/completions, on continuous batching (serve/generate/continuous.py), as text, or streamed as server-sent
events. No Ray here: the replica hands its requests to `OpenAIFront.handle`.

Each request becomes one row of the running batch, followed by a `TextRun` (GenItem.decoder): it chooses the
row's tokens as `OnnxSession.generate` of that request alone does (the checkpoint's generation_config under
the request's knobs, export/sampling.py; a seed of its own, the request's or a fresh one reported in the
answer), stops at the checkpoint's eos ids, at `stop` strings (text ends before them) or at max_tokens, and
hands each piece of text to the request's stream. A stream whose client leaves marks its run cancelled: its
row is given back before the next step.

`logprobs` (completions: N; chat: true with top_logprobs N) lists each new token's log-probability and its N
most likely alternatives: the log-softmax of the model's own logits at that step, before the request's
temperature, top-k, top-p, min-p or repetition penalty (what OpenAI's API and vLLM's default return). Every
export the /v1 routes serve returns its logits each step (the continuous batch binds them), so every /v1
request can ask for them. Each token is named by the text it adds to the answer in context (RowText.peek: ""
for a token that ends inside a character, the token completing it carries it) and by its own bytes (chat), so
the texts join to the answer and the bytes to its UTF-8. The tokens listed are those made, an eos id that
ended the run excepted; after a stop string, those whose text is in the answer (the last cut where it ends).
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from runtime.chat import ChatTemplate, ChatTemplateError
from runtime.generation import generation_defaults, lm_vocab
from runtime.sampling import Sampler, log_softmax, resolve
from runtime.stopping import Codec, RowText, eos_ids
from zoo import AttnzooError

from .. import access
from ..generate.protocol import GenItem
from ..generate.rows import Busy, TimedOut
from ..schema import JSON
from .protocol import (
    CHAT,
    COMPLETIONS,
    DONE,
    EMBEDDINGS,
    MODELS,
    Answer,
    Ask,
    OpenAIError,
    TokenLogprob,
    error_chunk,
    max_body,
    models_list,
    parse,
    read_limited,
    usage,
)
from .tokenize import TOKENIZE, detokenize, tokenize

TEXT_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
EVENT_STREAM = "text/event-stream"


def text_files(source: str | Path) -> dict[str, bytes]:
    """The tokenizer and chat template a server of `source` reads, by their plain names, as they travel to the
    replicas: a checkpoint folder's own; for an .onnx, the copies its export wrote beside it (STEM.NAME, as
    `attnzoo generate` reads them), else the files of its folder."""
    source = Path(source)
    if source.is_dir():
        found = {name: source / name for name in TEXT_FILES}
    else:
        own = {name: source.with_name(f"{source.stem}.{name}") for name in TEXT_FILES}
        plain = {name: source.with_name(name) for name in TEXT_FILES}
        found = own if own["tokenizer.json"].is_file() else plain
    return {name: path.read_bytes() for name, path in found.items() if path.is_file()}


LOGPROB_FLOOR = -9999.0  # a logprob JSON can carry for a token of probability 0 (vLLM's value)


class TextRun:
    """One request's row in the continuous batch (the ContinuousBatcher calls choose, then add, per token)."""

    def __init__(
        self, sampler: Sampler, eos: tuple[int, ...], row: RowText, max_tokens: int, emit, logprobs: int | None = None
    ) -> None:
        self.sampler, self.eos, self.row, self.max_tokens = sampler, eos, row, max_tokens
        self.emit = emit  # emit(piece, finish_reason or None), from the batch's thread
        self.cancelled = False
        self.finish: str | None = None
        self.made = 0
        self.logprobs = logprobs  # alternatives per token, or None: no logprobs
        self.entries: list[TokenLogprob] = []  # one per token made (an ending eos excepted), when asked
        self.ready = 0  # entries a stream may send, never changed after (all, once the run has ended)
        self._ready_at = 0  # where the next entry's text starts in the answer
        self._pending = False  # the tokens since the last text began a character (their bytes are out)
        self._step_logprobs: np.ndarray | None = None

    @property
    def needs_logits(self) -> bool:
        """Whether choose reads the logits (a sampler, logprobs); else the argmax is all (a packed batch then
        reads no logits back: serve/generate/packed.py)."""
        return self.logprobs is not None or self.sampler.params.needs_logits

    def choose(self, logits: np.ndarray | None, argmax: np.ndarray) -> np.ndarray:
        if self.logprobs is not None:  # the model's distribution at this step, before any knob
            # JSON has no -inf or NaN: a token the model rules out (a -inf logit) is -9999.0, as vLLM writes it
            self._step_logprobs = np.nan_to_num(log_softmax(logits[0]), nan=LOGPROB_FLOOR, neginf=LOGPROB_FLOOR)
        return self.sampler.choose(logits) if self.sampler.params.needs_logits else argmax

    def _entry(self, token: int) -> TokenLogprob:
        """The token's entry, it and its alternatives named by the text each would add here, in context, and
        by the bytes each would add to the answer's UTF-8."""
        lp, n = self._step_logprobs, self.logprobs
        best = [int(i) for i in np.argsort(-lp, kind="stable")[:n]] if n else []
        texts = self.row.peek([token, *best])
        named = [
            (text, float(lp[t]), self._bytes(t, text, partial)) for t, (text, partial) in zip([token, *best], texts)
        ]
        (text, logprob, raw), partial = named[0], texts[0][1]
        if partial or text:  # a character begun: the token that completes it carries the character
            self._pending = partial
        return TokenLogprob(text, logprob, raw, tuple(named[1:]))

    def _bytes(self, token: int, text: str, partial: bool) -> bytes | None:
        """The bytes `token` adds to the answer: its own, except where they do not read as its text and no
        character is pending before it (a SentencePiece space the decoder strips at the answer's start, a
        special token left out of the text): there, its text's UTF-8. None where its own are unknown and its
        text is none of its own (it ends inside a character)."""
        own = self.row.codec.token_bytes(token)
        if own is not None and (partial or self._pending or own.decode("utf-8", "replace") == text):
            return own
        return None if partial else text.encode()

    def _settle(self) -> None:
        """At the end: the entries' texts made to join to the answer's text. An incomplete character released
        at the end (U+FFFD) goes to the last token; after a stop string, the tokens listed are those whose text
        is in the answer, the last cut where the answer ends (the stop string's tokens are left out)."""
        text = self.row.text
        joined = sum(len(e.token) for e in self.entries)
        if self.entries and joined < len(text):
            self.entries[-1] = replace(self.entries[-1], token=self.entries[-1].token + text[joined:])
        if self.row.stopped:
            kept, at = [], 0
            for e in self.entries:
                if at >= len(text):
                    break
                kept.append(e)
                at += len(e.token)
            if at > len(text):  # the last runs into the stop string: cut it, with the bytes of its character's
                start = at - len(kept[-1].token)  # tokens (the textless ones before it), none of them sent yet
                first = len(kept) - 1
                while first and not kept[first - 1].token:
                    first -= 1
                kept[-1] = replace(kept[-1], token=text[start:])
                raw = text[start:].encode()
                for i in range(first, len(kept)) if all(e.raw is not None for e in kept[first:]) else ():
                    cut = raw if i == len(kept) - 1 else raw[: len(kept[i].raw)]
                    kept[i], raw = replace(kept[i], raw=cut), raw[len(cut) :]
            self.entries = kept
        self.ready = len(self.entries)

    def _advance(self) -> None:
        """Count the entries a stream may send: up to a token whose text is all shown, with the textless ones
        before it (a character it completes: they go out together, so nothing sent is cut by a stop later)."""
        shown, i, at = self.row.shown, self.ready, self._ready_at
        while i < len(self.entries):
            token = self.entries[i].token
            if at + len(token) > shown:
                break
            i, at = i + 1, at + len(token)
            if token:
                self.ready, self._ready_at = i, at

    def expire(self) -> None:
        """The server's request timeout ended the run: finish_reason "length", its held text released (as
        llama.cpp's t_max_predict_ms ends a prediction)."""
        if self.finish is None:
            self.finish, piece = "length", self.row.finish()
            if self.logprobs is not None:
                self._settle()
            self.emit(piece, self.finish)

    def add(self, tokens: np.ndarray) -> bool:
        """As Generation's loop: an eos id ends the row (its text released), else the token's text; a stop
        string ends it too; at max_tokens it ends at its length."""
        token = int(tokens[0])
        self.made += 1
        self.sampler.observe(tokens)
        if self.logprobs is not None and token not in self.eos:
            self.entries.append(self._entry(token))
        if token in self.eos:
            self.finish, piece = "stop", self.row.finish()
        else:
            piece = self.row.add(token)
            if self.row.stopped:
                self.finish = "stop"
            elif self.made >= self.max_tokens:
                self.finish, piece = "length", piece + self.row.finish()
        if self.logprobs is not None:
            self._settle() if self.finish else self._advance()
        self.emit(piece, self.finish)
        return self.finish is not None


class OpenAIFront:
    """The /v1 routes over a session and the continuous batcher `batcher()` gives (made on first use).

    limits: max_new (most max_tokens), max_positions (prompt + max_tokens per request), capacity (the batch's
    cache slots: prompt + max_tokens - 1 must fit), server_max_body (bytes)."""

    def __init__(
        self,
        sess,
        batcher,
        name: str,
        fingerprint: str,
        files: dict[str, bytes],
        *,
        max_new: int,
        max_positions: int,
        capacity: int,
        server_max_body: int,
        unavailable: str | None = None,
    ) -> None:
        self.sess, self._batcher, self.name, self.fingerprint = sess, batcher, name, fingerprint
        self.max_new, self.max_positions, self.capacity = max_new, max_positions, capacity
        self.max_body = max_body(max_positions, server_max_body)
        self.unavailable = unavailable  # why continuous batching cannot serve this export, or None
        self.vocab = lm_vocab(sess)
        self.config = generation_defaults(sess)
        self.eos = eos_ids(self.config.get("eos_token_id"))
        self.created = int(time.time())
        self.codec, self.template = _load_text(files)

    def batchers(self) -> list:
        """The continuous batchers made so far (none before the first /v1 request, unless the server's own)."""
        return self._batcher(made=True)

    async def handle(self, request, path: str):
        from starlette.responses import Response

        try:
            if path.endswith(MODELS):
                if request.method != "GET":
                    raise OpenAIError(f"{MODELS} answers GET", 405)
                return Response(models_list(self.name, self.created), media_type=JSON)
            route = next((r for r in (CHAT, COMPLETIONS) if path.endswith(r)), None)
            if route is None:
                made = "text, not embeddings (a sentence encoder's server has /v1/embeddings)"
                what = (
                    f"runs the language model {self.name!r}, which makes {made}: " if path.endswith(EMBEDDINGS) else ""
                )
                raise OpenAIError(
                    f"no such path {path}; this server {what}POST {COMPLETIONS} or {CHAT}, GET {MODELS}", 404
                )
            if request.method != "POST":
                raise OpenAIError(f"{route} answers POST", 405)
            body = await read_limited(request, self.max_body)
            ask = parse(route, body, self.name)
            ids = self._prompt_ids(ask)
            return await self._run(ask, ids)
        except OpenAIError as e:
            return Response(e.body(), e.status, media_type=JSON, headers=getattr(e, "headers", None))

    async def tokens(self, request, path: str):
        """POST /tokenize or /detokenize (serve/openai/tokenize.py: vLLM's shapes)."""
        from starlette.responses import JSONResponse, Response

        try:
            if request.method != "POST":
                raise OpenAIError(f"{path} answers POST", 405)
            body = await read_limited(request, self.max_body)
            return JSONResponse((tokenize if path == TOKENIZE else detokenize)(self, body))
        except OpenAIError as e:
            return Response(e.body(), e.status, media_type=JSON)

    def _prompt_ids(self, ask: Ask) -> list[int]:
        if self.unavailable:
            raise OpenAIError(f"this export cannot run on continuous batching: {self.unavailable}", 400)
        if self.codec is None:
            raise OpenAIError("this server has no tokenizer (no tokenizer.json with its export); POST /generate")
        if ask.chat:
            if self.template is None:
                raise OpenAIError(f"{self.name} has no chat template; POST {COMPLETIONS}", param="messages")
            try:
                ids = self.codec.encode(self.template.render(ask.messages, add_generation_prompt=True))
            except ChatTemplateError as e:
                raise OpenAIError(str(e), param="messages") from None
        else:
            ids = ask.prompt_ids if ask.prompt is None else self.codec.encode(ask.prompt)
            bad = [i for i in ids if not 0 <= i < self.vocab]
            if bad:
                raise OpenAIError(f"token id {bad[0]} is outside the vocabulary of {self.vocab}", param="prompt")
        if not ids:
            raise OpenAIError("the prompt is empty once tokenized", param="prompt" if not ask.chat else "messages")
        t = len(ids)
        room = min(self.max_new, self.capacity - t + 1, self.max_positions - t)
        if ask.max_tokens is None:
            ask.max_tokens = room
        if ask.max_tokens > self.max_new:
            raise OpenAIError(
                f"max_tokens={ask.max_tokens}; this server makes at most {self.max_new} per request "
                "(attnzoo serve --max-new-tokens)",
                param="max_tokens",
            )
        if ask.max_tokens > room:
            raise OpenAIError(
                f"a prompt of {t} tokens and max_tokens={ask.max_tokens} need {t + ask.max_tokens} positions; this "
                f"server takes at most {min(self.capacity + 1, self.max_positions)} per request (a shorter prompt "
                "or fewer max_tokens)",
                param="max_tokens" if room > 0 else ("messages" if ask.chat else "prompt"),
                code="context_length_exceeded",
            )
        return ids

    async def _run(self, ask: Ask, ids: list[int]):
        from starlette.responses import Response, StreamingResponse

        prompt = np.asarray([ids], np.int64)
        try:
            params = resolve(ask.knobs, self.config)
            sampler = Sampler(params, prompt, None, self.vocab)
        except AttnzooError as e:  # the sampling knobs' own checks (zoo.ArgumentError)
            raise OpenAIError(str(e)) from None
        seed = sampler.seed if params.do_sample else ask.knobs.get("seed")
        answer = Answer(ask, self.name, self.fingerprint, seed)
        loop = asyncio.get_running_loop()
        pieces: asyncio.Queue = asyncio.Queue()

        def emit(piece: str, finish: str | None) -> None:
            if ask.stream:  # with the count of logprob entries it may send: the chunk takes those not yet sent
                loop.call_soon_threadsafe(pieces.put_nowait, (piece, finish, run.ready))

        row = RowText(self.codec, ask.stop, context=prompt[0], in_prompt=False)  # OpenAI's stop: the completion's
        run = TextRun(sampler, self.eos, row, ask.max_tokens, emit, ask.logprobs)
        item = GenItem(ids=prompt, max_new_tokens=ask.max_tokens, decoder=run)
        rec = access.current()
        rec.prompt_tokens, rec.prompt = len(ids), ask.prompt if ask.prompt is not None else self.codec.decode(ids)
        try:
            task = self._batcher().enqueue(item)
        except Busy as e:
            access.LOG.warning("refused: %s", e)
            raise Unavailable(f"this server is busy: {e}; retry after {e.retry_after} s", 429, e.retry_after) from None
        if not ask.stream:
            try:
                tokens, timing = await task
            except asyncio.CancelledError:  # the client left before its answer
                run.cancelled = True
                raise
            rec.ran(run, timing)
            if isinstance(tokens, Exception):
                raise failed(tokens)
            body = answer.whole(run.row.text, run.finish or "length", usage(len(ids), run.made), run.entries)
            return Response(body, media_type=JSON)

        async def events():
            sent = 0  # logprob entries already in a chunk
            try:
                yield answer.chunk("", first=True) if ask.chat else answer.chunk("")
                while True:
                    get = asyncio.ensure_future(pieces.get())
                    await asyncio.wait({get, task}, return_when=asyncio.FIRST_COMPLETED)
                    if not get.done():  # the batcher answered without a last piece: the run failed
                        get.cancel()
                        tokens, timing = task.result()
                        rec.ran(run, timing)
                        err = tokens if isinstance(tokens, Exception) else RuntimeError("the run ended early")
                        yield error_chunk(failed(err))
                        break
                    piece, finish, made = get.result()
                    if piece or finish:  # a token whose text is held back sends its logprobs with its text
                        yield answer.chunk(piece or None, finish, entries=run.entries[sent:made])
                        sent = made
                    if finish:  # the batcher answers right after the last piece: its timings to the access log
                        rec.ran(run, (await task)[1])
                        if ask.include_usage:
                            yield answer.usage_chunk(usage(len(ids), run.made))
                        break
                yield DONE
            finally:  # also when the client left mid-stream (the generator is closed or cancelled)
                if not task.done():
                    run.cancelled = True

        return StreamingResponse(events(), media_type=EVENT_STREAM, headers={"cache-control": "no-cache"})


class Unavailable(OpenAIError):
    """A request the server cannot take now: 429 (--max-waiting: OpenAI's rate-limit error) or 503 (it waited
    past --request-timeout), with Retry-After."""

    def __init__(self, message: str, status: int, retry_after: int = 1) -> None:
        super().__init__(message, status, code="rate_limit_exceeded" if status == 429 else "timeout")
        self.headers = {"retry-after": str(retry_after)}

    @property
    def kind(self) -> str:
        return "requests" if self.status == 429 else "server_error"


def failed(err: Exception) -> OpenAIError:
    """The OpenAI error of a run the batcher ended with an exception (logged with the request's id)."""
    if isinstance(err, TimedOut):
        access.LOG.warning("timed out: %s", err)
        return Unavailable(f"this server is busy: {err}", 503)
    access.LOG.error("the model run failed: %s: %s", type(err).__name__, err)
    return OpenAIError(f"the model run failed: {type(err).__name__}: {err}", 500)


def _load_text(files: dict[str, bytes]):
    """(Codec or None, ChatTemplate or None) from text_files' bytes."""
    if "tokenizer.json" not in files:
        return None, None
    from tokenizers import Tokenizer

    codec = Codec(Tokenizer.from_str(files["tokenizer.json"].decode()))
    folder = Path(tempfile.mkdtemp(prefix="attnzoo-text-"))
    try:
        for name, blob in files.items():
            (folder / name).write_bytes(blob)
        try:
            template = ChatTemplate.from_folder(folder)
        except ChatTemplateError:
            template = None
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return codec, template


__all__ = ["TEXT_FILES", "OpenAIFront", "TextRun", "Unavailable", "failed", "text_files"]
