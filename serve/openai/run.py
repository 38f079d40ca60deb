"""One /v1 request's row in the continuous batch (serve/openai/serving.py makes them): `TextRun` chooses the
row's tokens (the request's logits processors, runtime/penalties.py and runtime/constraints.py, then its
Sampler), follows its text (stop strings, eos ids, a grammar that is complete) and lists its logprobs.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from runtime.sampling import Sampler, log_softmax
from runtime.stopping import RowText

from .protocol import TokenLogprob

LOGPROB_FLOOR = -9999.0  # a logprob JSON can carry for a token of probability 0 (vLLM's value)


class TextRun:
    """One request's row in the continuous batch (the ContinuousBatcher calls choose, then add, per token)."""

    def __init__(
        self,
        sampler: Sampler,
        eos: tuple[int, ...],
        row: RowText,
        max_tokens: int,
        emit,
        logprobs: int | None = None,
        *,
        prompt=(),
        processors=(),
        constraint=None,
        score: bool = False,
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
        # the request's logits processors, in order (proc(input_ids (1 t), scores (1 v)) -> scores, over the
        # prompt and the tokens made), before the sampler; the constraint (runtime/constraints.py) masks last
        self.processors = [p for p in processors if getattr(p, "active", True)]
        self.constraint = constraint
        if constraint is not None:
            self.processors.append(constraint)
        self.ids = [int(t) for t in prompt]  # the prompt, then each token made
        self.scored = score  # sum the model's logprob of each token made (best_of ranks the candidates by it)
        self.score = 0.0

    @property
    def needs_logits(self) -> bool:
        """Whether choose reads the logits (a sampler, logprobs); else the argmax is all (a packed batch then
        reads no logits back: serve/generate/packed.py)."""
        return self.logprobs is not None or self.scored or self.sampler.params.needs_logits or bool(self.processors)

    def took(self, logits: np.ndarray) -> None:
        """The model's logits (1 v) at the token about to be added: its logprobs, when asked (a speculating
        batcher chose the token itself: serve/generate/speculating.py)."""
        if self.logprobs is not None or self.scored:  # the model's distribution at this step, before any knob
            # JSON has no -inf or NaN: a token the model rules out (a -inf logit) is -9999.0, as vLLM writes it
            self._step_logprobs = np.nan_to_num(log_softmax(logits[0]), nan=LOGPROB_FLOOR, neginf=LOGPROB_FLOOR)

    def choose(self, logits: np.ndarray | None, argmax: np.ndarray) -> np.ndarray:
        self.took(logits)
        if self.processors:  # on the model's logits, then the sampler's own (repetition penalty, warpers)
            ids, scores = np.asarray([self.ids], np.int64), np.asarray(logits, np.float32)
            for proc in self.processors:
                scores = proc(ids, scores)
            logits = scores
            if not self.sampler.params.needs_logits:
                return logits.argmax(-1)
        return self.sampler.choose(logits) if self.sampler.params.needs_logits else argmax

    def scores_for(self, cand: np.ndarray, logits: np.ndarray):
        """scores(j) -> (v,): the model's logits at candidate position j (logits (m+1 v): after the row's last
        token and cand[:j]) through what choose applies (this request's processors, then its sampler's), as if
        cand[:j] were made: runtime/speculative.verdict reads them. The grammar scores on a fork of its matcher
        (the row's own follows only the tokens kept)."""
        grammar = self.constraint.fork() if self.constraint is not None else None
        procs = [grammar if p is self.constraint else p for p in self.processors]
        sampler = self.sampler

        def scores(j: int) -> np.ndarray:
            made = np.asarray(cand[:j], np.int64)[None]
            out = np.asarray(logits[j : j + 1], np.float32)
            if procs:
                ids = np.concatenate([np.asarray([self.ids], np.int64), made], 1)
                for proc in procs:
                    out = proc(ids, out)
            if sampler.params.needs_logits:
                out = sampler.processors(np.concatenate([sampler.input_ids, made], 1), out)
            return out[0]

        return scores

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
        string ends it too, and so does a grammar that is complete; at max_tokens it ends at its length."""
        token = int(tokens[0])
        self.made += 1
        self.ids.append(token)
        self.sampler.observe(tokens)
        grammar = self.constraint
        ends = token in self.eos or (grammar is not None and token in grammar.eos)
        if self.logprobs is not None and not ends:
            self.entries.append(self._entry(token))
        if self.scored and not ends:
            self.score += float(self._step_logprobs[token])
        if ends:
            self.finish, piece = "stop", self.row.finish()
        else:
            piece = self.row.add(token)
            if grammar is not None:
                grammar.follow(np.asarray([self.ids], np.int64))
            if self.row.stopped:
                self.finish = "stop"
            elif grammar is not None and grammar.stopped():  # the grammar is complete: nothing may follow
                self.finish, piece = "stop", piece + self.row.finish()
            elif self.made >= self.max_tokens:
                self.finish, piece = "length", piece + self.row.finish()
        if self.logprobs is not None:
            self._settle() if self.finish else self._advance()
        self.emit(piece, self.finish)
        return self.finish is not None


__all__ = ["LOGPROB_FLOOR", "TextRun"]
