"""A /v1 stream's chunks: each choice's pieces as its run makes them (serve/openai/run.TextRun), chat's tool
calls as OpenAI's deltas (serve/openai/tools.CallStream), the usage last where asked, then [DONE].
"""

from __future__ import annotations

import asyncio

from .protocol import DONE, Answer, OpenAIError, error_chunk, usage
from .tools import CallStream, as_call, finish_reason


class ChoiceStreams:
    """The chunks of one streamed request's choices (runs[i] is choice i), as server-sent events."""

    def __init__(self, answer: Answer, runs: list, echoes: list[str], parser, tools, *, failed=None, rec=None) -> None:
        self.answer, self.runs, self.echoes, self.parser, self.tools = answer, runs, echoes, parser, tools
        # failed(err) -> the OpenAIError of a run the batcher ended with an exception; rec: the access record
        self.failed = failed or (lambda err: OpenAIError(f"the model run failed: {err}", 500))
        self.rec = rec
        self.sent = [0] * len(runs)  # logprob entries already in a chunk, per choice
        self.calls = [CallStream(parser, tools) if parser is not None else None for _ in runs]
        self.made_calls = [0] * len(runs)

    def _chunks(self, index: int, piece: str, finish: str | None, ready: int) -> list[bytes]:
        answer, run, calls = self.answer, self.runs[index], self.calls[index]
        entries = run.entries[self.sent[index] : ready]
        self.sent[index] = ready
        if calls is None:
            if piece or finish:  # a token whose text is held back sends its logprobs with its text
                return [answer.chunk(piece or None, finish, entries=entries, index=index)]
            self.sent[index] -= len(entries)
            return []
        events = calls.feed(piece) + (calls.end() if finish else [])
        out = []
        for event in events:
            if event[0] == "content":
                out.append(answer.chunk(event[1], entries=entries, index=index))
            else:
                call = as_call(event[1], event[2], self.made_calls[index])
                self.made_calls[index] += 1
                out.append(answer.chunk(None, entries=entries, index=index, tool_calls=[call]))
            entries = []
        if entries:  # held text: its tokens' logprobs go out now, with no text
            out.append(answer.chunk(None, entries=entries, index=index))
        if finish:
            if self.made_calls[index] and finish != "length":
                finish = finish_reason(self.tools)
            out.append(answer.chunk(None, finish, index=index))
        return out

    async def events(self, pieces: asyncio.Queue, tasks: list, prompt_tokens: int):
        answer, chat, runs = self.answer, self.answer.ask.chat, self.runs
        left = set(range(len(runs)))
        try:
            for i in range(len(runs)):
                yield answer.chunk("", first=True, index=i) if chat else answer.chunk(self.echoes[i], index=i)
            while left:
                get = asyncio.ensure_future(pieces.get())
                running = {tasks[i] for i in left}
                await asyncio.wait({get, *running}, return_when=asyncio.FIRST_COMPLETED)
                if not get.done():  # a batcher answered without a last piece: its run failed
                    get.cancel()
                    if not pieces.empty():  # its last piece came before its answer: read it first
                        continue
                    ended = next(t for t in running if t.done())
                    tokens, timing = ended.result()
                    if self.rec is not None:
                        self.rec.ran(runs[tasks.index(ended)], timing)
                    err = tokens if isinstance(tokens, Exception) else RuntimeError("the run ended early")
                    yield error_chunk(self.failed(err))
                    return
                index, piece, finish, ready = get.result()
                for chunk in self._chunks(index, piece, finish, ready):
                    yield chunk
                if finish:
                    left.discard(index)
            if self.rec is not None:  # the batchers answer right after the last pieces: their timings to the log
                self.rec.ran(runs[0], (await tasks[0])[1])
                self.rec.completion_tokens = sum(run.made for run in runs)
            if answer.ask.include_usage:
                yield answer.usage_chunk(usage(prompt_tokens, sum(run.made for run in runs)))
            yield DONE
        finally:  # also when the client left mid-stream (the generator is closed or cancelled)
            for task, run in zip(tasks, runs):
                if not task.done():
                    run.cancelled = True


__all__ = ["ChoiceStreams"]
