"""The OpenAI routes of a whole-model replica (serve/generate/app.py): GET /v1/models, POST /v1/completions and
/v1/chat/completions, on continuous batching (serve/generate/continuous.py), as text, or streamed as server-sent
events. No Ray here: the replica hands its requests to `OpenAIFront.handle`.

Each choice of a request (n per prompt) becomes one row of the running batch, followed by a `TextRun`
(serve/openai/run.py, GenItem.decoder): it chooses the row's tokens as `OnnxSession.generate` of that request alone
does (every key of the checkpoint's generation_config under the request's knobs, runtime/sampling.py and its
processors; choice i seeded as row i of n, SeedSequence([seed, i]), the request's seed or a fresh one reported in
the answer), after the request's logits processors (frequency/presence penalties and logit_bias:
runtime/penalties.py; the grammar of its response_format or forced tool calls: runtime/constraints.py), stops at the
checkpoint's eos ids, at `stop` strings (text ends before them), where its grammar is complete, or at max_tokens,
and hands each piece of text to the request's stream (serve/openai/streams.py; chat's tool calls parsed by
serve/openai/tools.py). A stream whose client leaves marks its runs cancelled: their rows are given back before the
next step.

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
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np

from runtime.chat import ChatTemplate, ChatTemplateError
from runtime.constraints import ConstraintError, GrammarConstraint, grammar_of, lltokenizer
from runtime.generation import generation_defaults, lm_vocab
from runtime.generation_keys import unapplied
from runtime.penalties import LogitBias, OpenAIPenalties
from runtime.sampling import Sampler, resolve
from runtime.stopping import Codec, RowText, eos_ids
from zoo import AttnzooError

from .. import access
from ..generate.protocol import GenItem
from ..generate.rows import Busy, TimedOut
from ..schema import JSON
from .protocol import (
    CHAT,
    COMPLETIONS,
    EMBEDDINGS,
    MODELS,
    Answer,
    Ask,
    OpenAIError,
    max_body,
    models_list,
    parse,
    read_limited,
    usage,
)
from .run import LOGPROB_FLOOR, TextRun
from .streams import ChoiceStreams
from .tokenize import TOKENIZE, detokenize, tokenize
from .tools import PARSERS, as_call, finish_reason, parser_for

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
        tool_call_parser: str | None = None,
    ) -> None:
        self.sess, self._batcher, self.name, self.fingerprint = sess, batcher, name, fingerprint
        self.max_new, self.max_positions, self.capacity = max_new, max_positions, capacity
        self.max_body = max_body(max_positions, server_max_body)
        self.unavailable = unavailable  # why continuous batching cannot serve this export, or None
        self.vocab = lm_vocab(sess)
        self.config = generation_defaults(sess)
        self.eos = eos_ids(self.config.get("eos_token_id"))
        # the checkpoint's keys not applied here, said once where the server's log reads them (never dropped)
        notes = unapplied(self.config)
        if (self.config.get("num_return_sequences") or 1) > 1:
            notes.append(f"num_return_sequences={self.config['num_return_sequences']} (each request is one choice)")
        self.note = "; ".join(notes) or None
        if self.note:
            warnings.warn(f"the generation_config's {self.note}: not applied", UserWarning, stacklevel=2)
        self.created = int(time.time())
        self.codec, self.template = _load_text(files)
        # the tool-call format: serve --tool-call-parser, else the one the chat template teaches (tools.parser_for)
        if tool_call_parser is not None and tool_call_parser not in PARSERS:
            raise AttnzooError(f"tool_call_parser={tool_call_parser!r}: one of {', '.join(PARSERS)}")
        self.tool_parser = tool_call_parser or parser_for(self.template.source if self.template else None)
        self.template_eos = self.template.special.get("eos_token") if self.template else None
        self._lltokenizer = None  # llguidance's, built on the first constrained request

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
            ids = await asyncio.to_thread(self._prompt_ids, ask)  # a chat template's rendering: off the loop
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

    def _prompt_ids(self, ask: Ask) -> list[list[int]]:
        """Each prompt's ids (chat: the rendered messages, with the tools), checked against the server's room."""
        if self.unavailable:
            raise OpenAIError(f"this export cannot run on continuous batching: {self.unavailable}", 400)
        if self.codec is None:
            raise OpenAIError("this server has no tokenizer (no tokenizer.json with its export); POST /generate")
        if ask.chat:
            if self.template is None:
                raise OpenAIError(f"{self.name} has no chat template; POST {COMPLETIONS}", param="messages")
            # tool_choice none still shows the tools to the model (vLLM's default; OpenAI's model sees them too) and
            # parses no call from its answer
            offered = ask.tools.offered() if ask.tools is not None else None
            if offered and ask.tools.choice != "none" and self.tool_parser is None:
                raise OpenAIError(
                    f"{self.name}'s chat template names no tool-call format: serve it with --tool-call-parser "
                    f"({', '.join(PARSERS)})",
                    param="tools",
                )
            try:
                text = self.template.render(ask.messages, add_generation_prompt=True, tools=offered, **ask.variables)
            except ChatTemplateError as e:
                raise OpenAIError(str(e), param="messages") from None
            prompts = [self.codec.encode(text)]
        else:
            prompts = [ids if text is None else self.codec.encode(text) for text, ids in ask.prompts]
            for ids in prompts:
                bad = [i for i in ids if not 0 <= i < self.vocab]
                if bad:
                    raise OpenAIError(f"token id {bad[0]} is outside the vocabulary of {self.vocab}", param="prompt")
        t = max(len(ids) for ids in prompts)
        if min(len(ids) for ids in prompts) == 0:
            raise OpenAIError("the prompt is empty once tokenized", param="prompt" if not ask.chat else "messages")
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
        return prompts

    def _grammar(self, ask: Ask, parser) -> str | None:
        """The request's grammar (llguidance's): its response_format's, or its forced tool calls'."""
        try:
            if ask.tools is not None and ask.tools.constrained:
                return parser.grammar(ask.tools)
            return grammar_of(response_format=ask.response_format) if ask.response_format else None
        except ConstraintError as e:
            raise OpenAIError(str(e), param="tools" if ask.tools is not None else "response_format") from None

    def _constraint(self, grammar: str | None, prompt_len: int):
        if grammar is None:
            return None
        try:
            if self._lltokenizer is None:
                ends = self.eos or eos_ids(self.codec.tok.token_to_id(self.template_eos) if self.template_eos else None)
                self._lltokenizer = lltokenizer(self.codec.tok, self.vocab, ends or None)
            return GrammarConstraint(self._lltokenizer, grammar, rows=1, prompt_len=prompt_len)
        except ConstraintError as e:
            raise OpenAIError(str(e), param="response_format") from None

    async def _run(self, ask: Ask, prompts: list[list[int]]):
        from starlette.responses import Response, StreamingResponse

        try:
            params = resolve(ask.knobs, {**self.config, "num_return_sequences": 1})
            if params.do_sample and params.seed is None:  # one fresh seed for the request: choice i's is (seed, i)
                params = replace(params, seed=int(np.random.SeedSequence().entropy % (2**63)))
            bias = LogitBias(ask.penalties.get("logit_bias") or {}, self.vocab)  # ids past the vocabulary refused
        except AttnzooError as e:  # the sampling knobs' own checks (zoo.ArgumentError)
            raise OpenAIError(str(e), param="logit_bias" if "logit_bias" in str(e) else None) from None
        tools = ask.tools if ask.tools is not None and ask.tools.choice != "none" else None
        parser = PARSERS[self.tool_parser]([f["name"] for f in tools.functions]) if tools else None
        grammar = self._grammar(ask, parser)
        answer = Answer(ask, self.name, self.fingerprint, params.seed)
        loop = asyncio.get_running_loop()
        pieces: asyncio.Queue = asyncio.Queue()
        runs = []
        for p, ids in enumerate(prompts):
            prompt = np.asarray([ids], np.int64)
            for j in range(ask.best_of):  # n choices, or best_of candidates of which the best n are answered
                index = p * ask.best_of + j
                sampler = Sampler(params, prompt, None, self.vocab, eos=self.eos, max_new_tokens=ask.max_tokens)
                if params.do_sample:  # choice j draws as row j of a batch of n copies of the prompt, one seed
                    sampler.rngs = [np.random.Generator(np.random.PCG64(np.random.SeedSequence((params.seed, j))))]

                def emit(piece: str, finish: str | None, index=index) -> None:
                    if ask.stream:  # with the count of logprob entries it may send: the chunk takes those not sent
                        loop.call_soon_threadsafe(pieces.put_nowait, (index, piece, finish, runs[index].ready))

                run = TextRun(
                    sampler,
                    self.eos,
                    RowText(
                        self.codec, ask.stop, context=prompt[0], in_prompt=False
                    ),  # OpenAI's stop: the completion's
                    ask.max_tokens,
                    emit,
                    ask.logprobs,
                    prompt=ids,
                    processors=[OpenAIPenalties(len(ids), *_penalty_pair(ask)), bias],
                    constraint=self._constraint(grammar, len(ids)),
                    score=ask.best_of > ask.n,
                )
                runs.append(run)
        items = [GenItem(ids=np.asarray([r.ids], np.int64), max_new_tokens=ask.max_tokens, decoder=r) for r in runs]
        echoes = [self.codec.decode(ids) if ask.echo else "" for ids in prompts for _ in range(ask.best_of)]
        used = usage(sum(len(ids) for ids in prompts), 0)
        rec = access.current()
        rec.prompt_tokens = used["prompt_tokens"]
        rec.prompt = ask.prompt if ask.prompt is not None else self.codec.decode(prompts[0])
        batcher, tasks = self._batcher(), []
        try:
            for it in items:
                tasks.append(batcher.enqueue(it))
        except Busy as e:  # the choices queued already leave with the request
            for run in runs:
                run.cancelled = True
            access.LOG.warning("refused: %s", e)
            raise Unavailable(f"this server is busy: {e}; retry after {e.retry_after} s", 429, e.retry_after) from None
        if not ask.stream:
            try:
                results = await asyncio.gather(*tasks)
            except asyncio.CancelledError:  # the client left before its answer
                for run in runs:
                    run.cancelled = True
                raise
            rec.ran(runs[0], results[0][1])
            rec.completion_tokens = sum(run.made for run in runs)
            err = next((tokens for tokens, _ in results if isinstance(tokens, Exception)), None)
            if err is not None:
                raise failed(err)
            best = _best(runs, ask.n, ask.best_of)
            choices = [self._choice(answer, i, runs[r], echoes[r], parser, tools) for i, r in enumerate(best)]
            used = usage(used["prompt_tokens"], sum(run.made for run in runs))  # every candidate's tokens
            return Response(answer.whole(choices, used), media_type=JSON)
        stream = ChoiceStreams(answer, runs, echoes, parser, tools, failed=failed, rec=rec)
        events = stream.events(pieces, tasks, used["prompt_tokens"])
        return StreamingResponse(events, media_type=EVENT_STREAM, headers={"cache-control": "no-cache"})

    @staticmethod
    def _choice(answer: Answer, index: int, run: TextRun, echo: str, parser, tools) -> dict:
        text, finish = echo + run.row.text, run.finish or "length"
        calls = None
        if parser is not None:
            content, found = parser.parse(text)
            found = found if tools.parallel else found[:1]
            if found:
                text, calls = content, [as_call(name, args) for name, args in found]
                finish = finish_reason(tools)
        return answer.choice(index, text, finish, run.entries, calls)


def _best(runs: list[TextRun], n: int, best_of: int) -> list[int]:
    """The runs answered, in order: all, or per prompt the n of best_of with the highest mean log-probability
    per token (OpenAI's best_of), best first."""
    if best_of == n:
        return list(range(len(runs)))
    out = []
    for start in range(0, len(runs), best_of):
        group = range(start, start + best_of)
        out += sorted(group, key=lambda r: -runs[r].score / max(runs[r].made, 1))[:n]
    return out


def _penalty_pair(ask: Ask) -> tuple[float, float]:
    return ask.penalties.get("frequency_penalty", 0.0), ask.penalties.get("presence_penalty", 0.0)


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


__all__ = ["LOGPROB_FLOOR", "TEXT_FILES", "OpenAIFront", "TextRun", "Unavailable", "failed", "text_files"]
