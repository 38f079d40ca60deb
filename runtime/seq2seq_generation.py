"""One generation call of an encoder-decoder (runtime/seq2seq_session.py), step by step, as a decoder's
(runtime/generation.py): greedy or sampled through the processors of every generation_config key
(runtime/sampling.py), seeds, stop strings, max_time, streaming, and each new token's log-probability.

The encoder runs once: its output's cross keys and values are bound as the decoder's past_key_values.i.encoder.*
for every step. The decoder's self-attention buffers (b g n d), n = the new tokens rounded up to ROUND, are bound
once as past and present, so each step writes its keys in place. The processors read the decoder's tokens (the
start token, then the new ones); encoder_repetition_penalty and encoder_no_repeat_ngram_size the encoder's input.
A row that produced an eos id (each listed id ends a row) is padded (pad_token_id, default the first eos id) while
the others go on; the loop stops once every row has ended. num_return_sequences=n (sampling) repeats each input
row n times, as transformers expands the encoder's inputs.
"""

from __future__ import annotations

import time
import warnings
from typing import TYPE_CHECKING

import numpy as np

import zoo

from .generation import ROUND
from .generation_keys import unapplied
from .io import CROSS_PAST, ENCODER_MASK, SELF_PAST, SELF_PRESENT
from .sampling import Sampler, log_softmax, resolve
from .stopping import Codec, RowText, eos_ids, stop_strings
from .tensors import from_numpy, is_tensor

if TYPE_CHECKING:
    from .seq2seq_session import Seq2SeqSession

TOKEN_KEYS = ("decoder_start_token_id", "eos_token_id", "pad_token_id")  # read here, not by the processors


def as_ids(x, name: str, vocab: int | None) -> np.ndarray:
    if is_tensor(x):
        x = x.detach().cpu().numpy()
    x = np.asarray(x)
    if x.ndim != 2 or x.size == 0 or (name == "input_ids" and x.dtype.kind not in "iu"):
        raise zoo.InputTypeError(f"{name} must be a non-empty (batch, tokens) integer array, got shape {x.shape}")
    if vocab is not None:
        bad = (x < 0) | (x >= vocab)
        if bad.any():
            raise zoo.InputError(f"{name}: token id {int(x[bad][0])} is outside the vocabulary of {vocab}")
    return x


def as_mask(attention_mask, shape: tuple[int, ...]) -> np.ndarray:
    """attention_mask (b s) as a contiguous bool array (all True when None)."""
    if attention_mask is None:
        return np.ones(shape, np.bool_)
    mask = as_ids(attention_mask, "attention_mask", None)
    if mask.shape != tuple(shape):
        raise zoo.InputError(f"attention_mask has shape {mask.shape}; input_ids has {tuple(shape)}")
    return np.ascontiguousarray(mask.astype(np.bool_))


def _token_ids(config: dict, last: int) -> tuple[int, tuple[int, ...], int | None]:
    """(decoder start, eos ids, pad) of a config, each a token id in 0..last."""
    for k in TOKEN_KEYS:
        v = config.get(k)
        many = k == "eos_token_id" and isinstance(v, (list, tuple, np.ndarray))
        for x in v if many else [v]:
            if x is not None and not (not isinstance(x, bool) and isinstance(x, (int, np.integer)) and 0 <= x <= last):
                lists = " or a list of them" if k == "eos_token_id" else ""
                raise zoo.ArgumentError(f"{k}={v!r} must be a token id in 0..{last}{lists}, or None")
    start = config.get("decoder_start_token_id")
    if start is None:
        raise zoo.ArgumentError("decoder_start_token_id is not set (nor in the export): give one")
    eos = eos_ids(config.get("eos_token_id"))
    pad = config.get("pad_token_id")
    return int(start), eos, pad if pad is not None else (eos[0] if eos else None)


class Seq2SeqGeneration:
    """One call: iterating yields each step's (b,) int64 tokens; then `tokens` (b, 1 + made), `finish_reason`
    per row, `logprobs` (b, made) (each new token's log-probability under the model, before any knob; with
    logprobs=True), and with a tokenizer `texts` and `pieces` (as runtime/generation.py's Generation).

    Options: every generation_config key applied here (runtime/generation_keys.py) over the checkpoint's; a
    token key given as None turns the checkpoint's off (forced_eos_token_id=None, suppress_tokens=None)."""

    def __init__(
        self,
        sess: Seq2SeqSession,
        input_ids,
        max_new_tokens: int = 32,
        attention_mask=None,
        *,
        stop=None,
        tokenizer=None,
        max_time: float | None = None,
        logprobs: bool = False,
        generation_config: dict | None = None,
        **keys,
    ) -> None:
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 1:
            raise zoo.ArgumentError(f"max_new_tokens={max_new_tokens!r} must be an int >= 1")
        self.sess, self.max_new_tokens, self.as_torch = sess, int(max_new_tokens), is_tensor(input_ids)
        ids = np.ascontiguousarray(as_ids(input_ids, "input_ids", sess.vocab), np.int64)
        mask = as_mask(attention_mask, ids.shape)
        config = dict(sess.generation if generation_config is None else generation_config)
        for k in [k for k, v in keys.items() if v is None]:  # None turns the checkpoint's off
            config.pop(k, None)
            del keys[k]
        config.update({k: keys.pop(k) for k in TOKEN_KEYS if k in keys})
        self.start, self.eos, self.pad = _token_ids(config, sess.decoder_vocab - 1)
        stop = keys.pop("stop_strings", None) if stop is None else stop  # transformers' name for it
        self.params = resolve(keys, config)
        self.note = "; ".join(unapplied(config, keys)) or None
        if self.note:
            warnings.warn(f"the generation_config's {self.note}: not applied", UserWarning, stacklevel=3)
        copies = self.params.num_return_sequences
        self.ids, self.mask = np.repeat(ids, copies, 0), np.repeat(mask, copies, 0)
        b = len(self.ids)
        stop = config.get("stop_strings") if stop is None else stop
        self.max_time = config.get("max_time") if max_time is None else max_time
        if self.max_time is not None and (
            isinstance(self.max_time, bool) or not isinstance(self.max_time, (int, float)) or self.max_time <= 0
        ):
            raise zoo.ArgumentError(f"max_time={self.max_time!r} must be a number of seconds > 0")
        stops = stop_strings(stop)
        if stops and tokenizer is None:
            raise zoo.ArgumentError(f"stop={stop!r} is matched on text: give the tokenizer too (tokenizer=...)")
        if stops and self.pad is None and b > 1:
            raise zoo.ArgumentError("stop strings in a batch pad the rows that stopped: give pad_token_id")
        self.codec = Codec(tokenizer) if tokenizer is not None else None
        self.rows = [RowText(self.codec, stops) for _ in range(b)] if self.codec else None
        self.pieces = [""] * b if self.rows else None
        self.sampler = Sampler(
            self.params,
            np.full((b, 1), self.start, np.int64),
            None,
            sess.decoder_vocab,
            eos=self.eos,
            max_new_tokens=self.max_new_tokens,
            encoder_ids=ids,
        )
        self.seed = self.sampler.seed
        self.want_logprobs = logprobs
        self._logprobs = np.zeros((b, self.max_new_tokens), np.float64)
        self._out = np.full((b, 1 + self.max_new_tokens), self.start, np.int64)
        self.finish_reason: list[str | None] = [None] * b
        self.made = 0
        self.timings: dict = {}

    @property
    def tokens(self):
        out = self._out[:, : 1 + self.made].copy()
        return from_numpy(out) if self.as_torch else out

    @property
    def logprobs(self) -> np.ndarray | None:
        return self._logprobs[:, : self.made].copy() if self.want_logprobs else None

    @property
    def texts(self) -> list[str] | None:
        return [r.text for r in self.rows] if self.rows else None

    def _bind(self, enc: list[np.ndarray]):
        """The decoder's binding: its self-attention buffers, the encoder's cross keys and values and mask, and
        the step's arrays (past_len, input_ids, next_token, logits), each bound once."""
        import onnxruntime as ort

        sess, b = self.sess, len(self.ids)
        n = -(-self.max_new_tokens // ROUND) * ROUND
        binding, keep = sess.decoder.new_binding(), []

        def bound(arr: np.ndarray):
            keep.append(arr)  # the arrays bound OrtValues wrap stay alive for the whole loop
            return ort.OrtValue.ortvalue_from_numpy(arr, "cpu", 0)

        inputs = {x.name: x for x in sess.decoder._sess.get_inputs()}
        self.buffers = {}  # the self-attention buffers by input name (a beam search reorders their rows)
        for i in range(sess.layers):
            for kv in ("key", "value"):
                x = inputs[SELF_PAST.format(i=i, kv=kv)]
                self.buffers[x.name] = np.zeros((b, int(x.shape[1]), n, int(x.shape[3])), enc[0].dtype)
                buf = bound(self.buffers[x.name])
                binding.bind_ortvalue_input(x.name, buf)
                binding.bind_ortvalue_output(SELF_PRESENT.format(i=i, kv=kv), buf)
        for i in range(sess.layers):  # the encoder's outputs after its hidden states: key, value per layer
            for j, kv in enumerate(("key", "value")):
                binding.bind_ortvalue_input(
                    CROSS_PAST.format(i=i, kv=kv), bound(np.ascontiguousarray(enc[1 + 2 * i + j]))
                )
        binding.bind_ortvalue_input(ENCODER_MASK, bound(self.mask))
        arrays = {
            "past_len": np.zeros((), np.int64),
            "input_ids": np.full((b, 1), self.start, np.int64),
            "next_token": np.zeros((b,), np.int64),
            "logits": np.zeros((b, 1, sess.decoder_vocab), enc[0].dtype),
        }
        for name in ("past_len", "input_ids"):
            binding.bind_ortvalue_input(name, bound(arrays[name]))
        for name in ("next_token", "logits"):
            binding.bind_ortvalue_output(name, bound(arrays[name]))
        return binding, arrays, n, keep

    def __iter__(self):
        sess, b = self.sess, len(self.ids)
        started = time.perf_counter()
        enc = sess.encode(self.ids, self.mask)
        binding, arrays, n, _keep = self._bind(enc)
        encoded = time.perf_counter()
        sampler, eos, pad, rows = self.sampler, np.array(self.eos, np.int64), self.pad, self.rows
        reads_logits = self.params.needs_logits
        done = np.zeros(b, np.bool_)
        for i in range(self.max_new_tokens):
            arrays["past_len"][()] = i
            sess.decoder.run_with_iobinding(binding)
            logits = arrays["logits"][:, 0]
            token = sampler.choose(logits) if reads_logits else arrays["next_token"].copy()
            if self.want_logprobs:
                self._logprobs[:, i] = log_softmax(logits)[np.arange(b), token]
            if pad is not None:
                token = np.where(done, pad, token)
            ended = ~done & np.isin(token, eos) if len(eos) else np.zeros(b, np.bool_)
            if rows:
                self.pieces = ["" if done[r] or ended[r] else rows[r].add(token[r]) for r in range(b)]
                ended |= ~done & np.array([r.stopped for r in rows])
            sampler.observe(token)
            self._out[:, 1 + i] = token
            self.made = i + 1
            for r in np.flatnonzero(ended):
                self.finish_reason[r] = "stop"
            done |= ended
            over_time = self.max_time is not None and time.perf_counter() - started > self.max_time
            last = done.all() or i + 1 == self.max_new_tokens or over_time
            if last:
                for r in np.flatnonzero(~done):
                    self.finish_reason[r] = "length"
                if rows:
                    self.pieces = [p + row.finish() for p, row in zip(self.pieces, rows)]
            yield token
            if last:
                break
            arrays["input_ids"][:, 0] = token
        end = time.perf_counter()
        self.timings.update(encode_s=encoded - started, decode_s=end - encoded, steps=self.made, capacity=n)
        if self.seed is not None:
            self.timings["seed"] = self.seed

    def run(self):
        """Every step; returns `tokens`."""
        for _ in self:
            pass
        return self.tokens


__all__ = ["Seq2SeqGeneration", "as_ids", "as_mask"]
