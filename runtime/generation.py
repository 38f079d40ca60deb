"""Generation under ONNX Runtime from a whole-model export (export/lm_export.py): greedy, or sampled
(runtime/sampling.py), stopped per row at eos ids, stop strings or max_time (runtime/stopping.py), streamed.

    tokens = OnnxSession("lm.onnx").generate(input_ids, max_new_tokens=64)     # (b, t + 64) int64

The per-layer buffers (b g n d), sized to the call (prompt + new tokens, rounded up to ROUND, at most
the exported max_len), are bound ONCE, each as past_key_values.i.* and as present.i.*, so every step
writes its keys in place. The step's other inputs (input_ids (b 1), past_len) and outputs (logits
(b 1 v), next_token (b)) are preallocated arrays bound once too: a step writes a token id and a
position into them and reads b int64 back; nothing of the cache's size is allocated or copied. A packed-rows
export (docs/generation.md, "The padding rule") is fed each row from slot 0 with its length, everything on the
session's device, its decode step replayable as a CUDA graph (runtime/device_decode.py: both drivers).

Left padding: attention_mask (b t) marks the real prompt tokens; it becomes the key mask over the
capacity, and each row's positions count its real tokens only (DecoderLM.step), so a row's tokens
are its own. eos_token_id: a row that produced it is padded (pad_token_id, default eos) while the
others go on; the loop stops when every row has ended, as transformers' generate does.
"""

from __future__ import annotations

import json
import time
import warnings
from typing import TYPE_CHECKING

import numpy as np

import zoo
from zoo.generation_inputs import check_token_ids, left_padded_mask, new_token_count, token_id
from zoo.spec_fields import rope_switch_at

from .beam_search import beam_settings, split_beam_options, without_beams
from .constraints import row_constraint
from .device_decode import LeftRows, PackedRows, is_packed
from .generation_keys import unapplied
from .io import LM_PAST, NEXT_TOKEN
from .kv_buffers import buffer_bytes
from .sampling import Sampler, resolve
from .speculative import SpeculativeRows, check_target, speculation
from .stopping import Codec, eos_ids, row_texts, stop_strings
from .tensors import from_numpy, is_tensor

if TYPE_CHECKING:
    from .core import RuntimeSession

ROUND = 32  # a call's capacity is prompt + new tokens rounded up to this (each step reads all of it)
# One row's prompt runs in calls of at most this many tokens, each after the ones before: ONNX Runtime's
# CPU GroupQueryAttention scores every query against every key up to the call's last one (no causal skip),
# so chunks leave out most of the masked half, and each call's scores are a chunk's, not the prompt's.
# Measured on the random LLaMA at prompt 1024 (AVX-512 Xeon, 2 threads, best of 4): prefill 615 ms in one
# call, 467 / 455 / 493 ms in chunks of 256 / 128 / 64 (fp32); 666 against 499 / 490 / 507 ms (int4).
PREFILL_CHUNK = 128


def _as_ids(sess: RuntimeSession, input_ids) -> np.ndarray:
    if is_tensor(input_ids):
        input_ids = input_ids.detach().cpu().numpy()
    if isinstance(input_ids, (list, tuple)):
        input_ids = np.asarray(input_ids)
    if not isinstance(input_ids, np.ndarray) or input_ids.dtype.kind not in "iu" or input_ids.ndim != 2:
        what = getattr(input_ids, "dtype", type(input_ids).__name__)
        raise zoo.InputTypeError(
            f"input_ids must be a (batch, tokens) integer tensor or array, got {what} "
            f"of shape {getattr(input_ids, 'shape', '?')}"
        )
    check_token_ids(input_ids, lm_vocab(sess))
    return np.ascontiguousarray(input_ids, np.int64)


def _numpy(x):
    return x.detach().cpu().numpy() if is_tensor(x) else np.asarray(x)


def lm_vocab(sess: RuntimeSession) -> int:
    raw = sess.metadata.get("attnzoo.vocab", "")
    if not (raw.isascii() and raw.isdigit()):
        raise zoo.InputError(f"{sess.path} is not a whole-model export (no attnzoo.vocab); export one with --whole")
    return int(raw)


def positions_needed(prompt: int, max_new_tokens: int) -> int:
    """Cache positions a generation of `max_new_tokens` after a prompt of `prompt` tokens writes: the last
    new token is not fed back."""
    return prompt + max_new_tokens - 1


def lm_max_len(sess: RuntimeSession) -> int | None:
    raw = sess.metadata.get("attnzoo.max_len")
    return int(raw) if raw and raw.isascii() and raw.isdigit() else None


def one_call_prompt_len(sess: RuntimeSession) -> int | None:
    """The longest prompt that may run in chunks, or None for any: a longrope layer picks its frequencies
    by the call's largest position, so a prompt past its rope_original_max rotates every key with the long
    set in one call (as eager and transformers do) but its first chunks with the short set."""
    specs = json.loads(sess.metadata.get("attnzoo.layer_specs", "[]"))
    return longrope_switch((s.get("rope_scaling"), s.get("rope_original_max")) for s in specs)


def recompute_at(sess: RuntimeSession) -> int | None:
    """The cache length at which generate re-runs the whole sequence as one call (zoo.lm.LMSpec.recompute_at:
    transformers' Phi-3 generate drops its cache at the first step past a longrope switch), or None."""
    raw = sess.metadata.get("attnzoo.recompute_at", "")
    return int(raw) if raw.isascii() and raw.isdigit() else None


def position_dependent(sess: RuntimeSession) -> bool:
    """Whether a call's rotary frequencies depend on its positions (longrope layers: one_call_prompt_len,
    recompute_at): speculative decoding refuses such an export (runtime/speculative.check_target)."""
    return recompute_at(sess) is not None or one_call_prompt_len(sess) is not None


def longrope_switch(layers) -> int | None:
    """The first prompt length at which a layer's longrope switches frequency sets, over (rope_scaling,
    rope_original_max) pairs, one per layer; None when no layer switches."""
    limits = [rope_switch_at(kind, original_max) for kind, original_max in layers]
    return min((n for n in limits if n is not None), default=None)


def prefill_chunk(sess: RuntimeSession, rows: int, t: int) -> int:
    """The positions of a prompt of `rows` x `t` tokens per prefill call: PREFILL_CHUNK for one row, each
    chunk after the ones before (ORT's CPU GroupQueryAttention scores every query against every key up to
    the call's last, so chunks skip most of the masked half); the whole prompt for a batch (the op takes a
    chunk after a past for one row only) and for a prompt whose longrope frequencies depend on its length
    (one_call_prompt_len)."""
    longest = one_call_prompt_len(sess)
    return PREFILL_CHUNK if rows == 1 and (longest is None or t <= longest) else t


def generation_defaults(sess: RuntimeSession) -> dict:
    """The checkpoint's generation_config.json as its export recorded it (attnzoo.generation_config), or {}."""
    raw = sess.metadata.get("attnzoo.generation_config")
    return json.loads(raw) if raw else {}


class Generation:
    """One call, step by step: iterating yields each step's (b,) int64 tokens (a row that ended gets the
    pad id) as they are made; then `tokens` (b, t + made), `finish_reason` per row ("stop" at an eos id or a
    stop string, "length" at max_new_tokens or max_time) and, with a tokenizer, `texts` (each row's new
    text, ending before a stop string) and `pieces` (each row's text released by the last step).

    Knobs (runtime/sampling.py) and eos_token_id / pad_token_id left None come from `generation_config`
    (default: the checkpoint's, recorded in the export); eos_token_id=[] stops at no token. `json_schema` (a
    schema) or `response_format` (OpenAI's) constrains each row's text to it (runtime/constraints.py; needs
    the tokenizer): a row whose document is complete ends at an eos id."""

    def __init__(
        self,
        sess: RuntimeSession,
        input_ids,
        max_new_tokens: int,
        attention_mask=None,
        eos_token_id=None,
        pad_token_id=None,
        *,
        stop=None,
        tokenizer=None,
        max_time: float | None = None,
        generation_config: dict | None = None,
        json_schema=None,
        response_format=None,
        prompt_lookup_num_tokens: int | None = None,
        max_matching_ngram_size: int | None = None,
        assistant_model=None,
        num_assistant_tokens: int | None = None,
        **knobs,
    ) -> None:
        self.sess = sess
        self.as_torch = is_tensor(input_ids)
        self.ids = _as_ids(sess, input_ids)
        vocab = lm_vocab(sess)
        self.max_new_tokens = max_new_tokens = new_token_count(max_new_tokens)
        config = generation_defaults(sess) if generation_config is None else generation_config
        if not isinstance(config, dict):
            raise zoo.InputTypeError(f"generation_config must be a dict (a generation_config.json), got {config!r}")
        # every other key of the config: applied by the sampler's processors, or said here (generation_keys.py)
        stop = knobs.pop("stop_strings", None) if stop is None else stop  # transformers' name for it
        self.params = resolve(knobs, config)
        self.note = "; ".join(unapplied(config, knobs)) or None
        if self.note:
            warnings.warn(f"the generation_config's {self.note}: not applied", UserWarning, stacklevel=3)
        prompt = self.ids
        copies = self.params.num_return_sequences  # transformers' expansion: each row repeated, in place
        if copies > 1:
            self.ids = np.repeat(self.ids, copies, 0)
            attention_mask = None if attention_mask is None else np.repeat(_numpy(attention_mask), copies, 0)
        stop = config.get("stop_strings") if stop is None else stop
        max_time = config.get("max_time") if max_time is None else max_time
        self.eos = eos_ids(config.get("eos_token_id") if eos_token_id is None else eos_token_id)
        for e in self.eos:
            token_id(e, vocab, "eos_token_id")
        pad = token_id(config.get("pad_token_id") if pad_token_id is None else pad_token_id, vocab, "pad_token_id")
        self.pad = pad if pad is not None else (self.eos[0] if self.eos else None)
        if max_time is not None and (
            isinstance(max_time, bool) or not isinstance(max_time, (int, float)) or max_time <= 0
        ):
            raise zoo.ArgumentError(f"max_time={max_time!r} must be a number of seconds > 0")
        self.max_time = max_time
        stops = stop_strings(stop)
        if stops and tokenizer is None:
            raise zoo.ArgumentError(f"stop={stop!r} is matched on text: give the tokenizer too (tokenizer=...)")
        b = self.ids.shape[0]
        if stops and self.pad is None and b > 1:
            raise zoo.ArgumentError("stop strings in a batch pad the rows that stopped: give pad_token_id")
        self.codec = Codec(tokenizer) if tokenizer is not None else None
        self.rows = row_texts(self.codec, stops, self.ids, attention_mask, in_prompt=True) if self.codec else None
        # runtime/speculative.py: candidates from the text so far or a draft, verified k at a time
        self.speculation = speculation(
            prompt_lookup_num_tokens, max_matching_ngram_size, assistant_model, num_assistant_tokens
        )
        if self.speculation is not None:
            check_target(sess, self.speculation, position_dependent)
        self.mask = attention_mask
        self.sampler = Sampler(
            self.params,
            self.ids,
            self._prompt_mask(),
            vocab,
            eos=self.eos,
            max_new_tokens=max_new_tokens,
            encoder_ids=prompt,
        )
        self.seed = self.sampler.seed
        # structured output (runtime/constraints.py): each row's logits masked to its grammar before the choice
        self.constraint = row_constraint(json_schema, response_format, self.codec, vocab, self.eos, self.ids.shape)
        if self.constraint is not None and self.speculation is not None:
            raise zoo.ArgumentError(
                "json_schema / response_format with speculative decoding (prompt lookup, a draft): not done here; "
                "leave one out"
            )
        if self.constraint is not None:
            self.eos = tuple(dict.fromkeys((*self.eos, *self.constraint.eos)))  # a row whose grammar is complete ends
            self.pad = self.eos[0] if self.pad is None else self.pad
        self.finish_reason = [None] * b
        self.pieces = [""] * b if self.rows else None
        self.made = 0
        self.timings: dict = {}
        self.n = self._room()  # before anything of the call's size is allocated
        if self.speculation is not None and self.speculation.draft is not None:
            self._room(self.speculation.draft)
        self._out = np.empty((b, self.ids.shape[1] + max_new_tokens), np.int64)
        self._out[:, : self.ids.shape[1]] = self.ids

    def _prompt_mask(self):
        am = self.mask
        if am is None:
            return None
        return left_padded_mask(_numpy(am), self.ids.shape)  # zoo.generation_inputs: the one rule for every generate

    def _room(self, sess=None) -> int:
        """The cache positions n this call binds, checked against the export's max_len and the memory
        free (the cache, the key mask and the tokens out) before any of them is allocated (sess: a draft's)."""
        sess, (b, t), max_new_tokens = sess or self.sess, self.ids.shape, self.max_new_tokens
        need = positions_needed(t, max_new_tokens)
        cap = lm_max_len(sess)
        if cap is not None and need > cap:
            raise zoo.ArgumentError(
                f"a prompt of {t} token{'s' * (t != 1)} and {max_new_tokens} new ones write {need} cache positions "
                f"(the last new token is not fed back), past this export's max_len {cap}: export it with "
                f"max_len={need} (CLI: --max-len {need}) or more"
            )
        n = -(-need // ROUND) * ROUND
        n = min(n, cap) if cap is not None else n
        if sess.cuda_graph and cap is not None:  # one capacity, so one captured graph per batch size
            n = cap
        from zoo.limits import check_fits

        prefix = LM_PAST.split("{", 1)[0]  # "past_key_values."
        # each buffer in its input's dtype and axes: (b g n d) fp32, or int8 + scales (export/kv_int8.py)
        need_bytes = buffer_bytes(sess._sess.get_inputs(), b, n, prefix)
        need_bytes += b * n + b * (t + max_new_tokens) * 8  # the key mask and the tokens out
        check_fits(need_bytes, f"a cache of {b} rows x {n} positions for {sess.path.name}")
        return n

    @property
    def tokens(self):
        """(b, t + made) int64: the prompt then the new tokens (torch when the prompt was torch)."""
        out = self._out[:, : self.ids.shape[1] + self.made]
        return from_numpy(out.copy()) if self.as_torch else out

    @property
    def texts(self) -> list[str] | None:
        return [r.text for r in self.rows] if self.rows else None

    def __iter__(self):
        sess, ids, max_new_tokens = self.sess, self.ids, self.max_new_tokens
        b, t = ids.shape
        # the graph's argmax is the token unless the choice reads the logits (sampling, a repetition penalty)
        argmax = NEXT_TOKEN.name in sess.output_names and not self.params.needs_logits and self.constraint is None
        choose = self.sampler.choose if self.constraint is None else self._constrained
        # runtime/device_decode.py: what the prompt and each step bind and run
        spec = self.speculation
        if spec is not None:
            vocabs = (lm_vocab(spec.draft) if spec.draft is not None else lm_vocab(sess), lm_vocab(sess))
            mask = self._prompt_mask()
            driver = SpeculativeRows(sess, b, t, self.n, mask, argmax, self.sampler, spec, self.eos, vocabs)
        elif is_packed(sess):
            driver = PackedRows(sess, b, self.n, self._prompt_mask(), argmax, choose)
        else:
            driver = LeftRows(sess, b, t, self.n, self._prompt_mask(), argmax, choose)

        out, eos, pad, rows = self._out, np.array(self.eos, np.int64), self.pad, self.rows
        # A step's own work is a few small numpy calls: run after the graph has streamed ~100 MB of weights
        # through the caches, each call's code and data come back from memory (tens of us a step, measured:
        # docs/benchmarks.md "One decode step"), so the rare paths (a row ended) run only when one did.
        one_eos = int(eos[0]) if len(eos) == 1 else None
        nothing = np.zeros(b, np.bool_)  # never written: every update below makes a new array
        done, any_done = np.zeros(b, np.bool_), False
        if spec is not None:
            driver.done = done  # updated in place below: an ended row makes no more calls
        started = time.perf_counter()
        # the prefill: the prompt at slots 0..t-1, in chunks for one row (prefill_chunk)
        token = driver.prefill(ids, prefill_chunk(sess, b, t))
        prefill = time.perf_counter() - started
        again = recompute_at(sess)
        for i in range(max_new_tokens):
            if any_done and pad is not None:
                token = np.where(done, pad, token)
            ended = (token == one_eos) if one_eos is not None else np.isin(token, eos) if len(eos) else nothing
            if any_done:
                ended = ended & ~done
            if rows:
                self.pieces = ["" if done[r] or ended[r] else rows[r].add(token[r]) for r in range(b)]
                ended = ended | (~done & np.array([r.stopped for r in rows]))
            self.sampler.observe(token)
            out[:, t + i] = token
            self.made = i + 1
            if ended.any():
                for r in np.flatnonzero(ended):
                    self.finish_reason[r] = "stop"
                done |= ended  # in place: a speculating driver holds this array
                any_done = True
            over_time = self.max_time is not None and time.perf_counter() - started > self.max_time
            last = (any_done and done.all()) or i + 1 == max_new_tokens or over_time
            if last:
                self._finish(done)
            yield token
            if last:
                break
            if t + i == again:  # the whole sequence as one call from slot 0, as DecoderLM.generate does
                token = driver.recompute(np.ascontiguousarray(out[:, : t + i + 1]))
                continue
            token = driver.step(token, i) if spec is None else driver.step(token, i, max_new_tokens - i - 2)
        decode = time.perf_counter() - started - prefill
        self.timings.update(prefill_s=prefill, decode_s=decode, steps=self.made - 1, capacity=self.n)
        if spec is not None:
            self.timings["speculation"] = driver.summary()
        if self.seed is not None:
            self.timings["seed"] = self.seed

    def _constrained(self, logits) -> np.ndarray:
        """The grammar's mask over the prompt and the tokens made so far, then the sampler's choice."""
        seen = self._out[:, : self.ids.shape[1] + self.made]
        return self.sampler.choose(self.constraint(seen, np.asarray(logits, np.float32)))

    def _finish(self, done: np.ndarray) -> None:
        """Rows still going end at their length; the text each row held back is released."""
        for r in np.flatnonzero(~done):
            self.finish_reason[r] = "length"
        if self.rows:
            self.pieces = [p + row.finish() for p, row in zip(self.pieces, self.rows)]

    def run(self):
        """Every step; returns `tokens`."""
        for _ in self:
            pass
        return self.tokens


def generate(
    sess: RuntimeSession,
    input_ids,
    max_new_tokens: int,
    attention_mask=None,
    eos_token_id=None,
    pad_token_id=None,
    *,
    timings: dict | None = None,
    **options,
):
    """(b, t + N) int64: the prompt then the new tokens (fewer than N when every row ended at an eos id or a
    stop string), greedy unless the options sample (runtime/sampling.py; Generation for every option). Beam
    search: runtime/beam_generation.generate, which OnnxSession.generate calls (it takes num_beams, given or
    the checkpoint's, and comes here without beams).

    torch in -> torch out; numpy (or lists) in -> numpy out. `timings`, a dict, receives
    prefill_s, decode_s, steps and capacity (and the seed of a sampling call)."""
    run = Generation(sess, input_ids, max_new_tokens, attention_mask, eos_token_id, pad_token_id, **options)
    tokens = run.run()
    if timings is not None:
        timings.update(run.timings)
    return tokens


def stream(sess: RuntimeSession, input_ids, max_new_tokens: int, attention_mask=None, *, tokenizer=None, **options):
    """Yields as each step is made: without a tokenizer each step's (b,) token ids; with one, each step's
    text pieces, one per row (a row's pieces join to its text, which ends before a stop string; a
    multi-byte character comes whole). A str prompt (with a tokenizer) is one row and yields str pieces."""
    one_text = isinstance(input_ids, str)
    if one_text:
        if tokenizer is None:
            raise zoo.ArgumentError("a text prompt needs tokenizer=... (a tokenizers.Tokenizer or a tokenizer.json)")
        input_ids = [Codec(tokenizer).encode(input_ids)]
    call, options = split_beam_options(options)
    config = options.get("generation_config")
    config = generation_defaults(sess) if config is None else config
    beams = beam_settings(call, config if isinstance(config, dict) else None)
    refuse_beams_in_stream(beams)
    options = without_beams(call, options, config)
    run = Generation(sess, input_ids, max_new_tokens, attention_mask, tokenizer=tokenizer, **options)
    yield from stream_pieces(run, tokenizer, one_text)


def refuse_beams_in_stream(beams) -> None:
    if beams.on:
        raise zoo.ArgumentError(
            f"num_beams={beams.num_beams} (the call's or the checkpoint's generation_config): beam search does not "
            "stream (its best hypothesis is known at the end); give num_beams=1 to stream, or call generate"
        )


def stream_pieces(run, tokenizer, one_text: bool):
    """A run's steps as a stream yields them: each step's (b,) ids without a tokenizer; with one, each row's text
    piece (a list a step), or for a one-text prompt its str pieces (empty ones skipped)."""
    for token in run:
        if tokenizer is None:
            yield token
        elif one_text:
            if run.pieces[0]:
                yield run.pieces[0]
        else:
            yield list(run.pieces)


__all__ = [
    "PREFILL_CHUNK",
    "ROUND",
    "Generation",
    "generate",
    "generation_defaults",
    "lm_max_len",
    "lm_vocab",
    "longrope_switch",
    "one_call_prompt_len",
    "positions_needed",
    "prefill_chunk",
    "recompute_at",
    "stream",
]
