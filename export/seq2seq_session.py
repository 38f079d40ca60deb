"""Greedy and beam-search generation from an encoder-decoder export (export/seq2seq_export.py) under ONNX Runtime.

    sess = Seq2SeqSession("t5.onnx")                  # opens t5.encoder.onnx and t5.decoder.onnx
    tokens = sess.generate(input_ids, max_new_tokens=32, attention_mask=mask)     # (b, 1 + k) int64

The encoder runs once: its output's cross keys and values are bound as the decoder's
past_key_values.i.encoder.* for every step. The decoder's self-attention buffers (b g n d), n = the new
tokens rounded up to ROUND, are bound once as past and present, so each step writes its keys in place.

The tokens are transformers' generate(num_beams=1, do_sample=False): the row starts with
decoder_start_token_id; forced_bos_token_id is the first new token, forced_eos_token_id the last one a
max_new_tokens budget allows (the lowest of several, as transformers' argmax over their tie takes it);
suppress_tokens are never made (the single-token bad_words_ids too: Marian bans its pad id so); a row that
produced an eos id (eos_token_id may list several: each ends a row) is padded (pad_token_id, default the first
eos id) while others go on, and the loop stops once every row has ended. The ids default to what the
checkpoint's generation_config.json says (kept in the export's metadata). With num_beams > 1 (the call's,
or the checkpoint's generation_config.json as in transformers) the tokens are transformers' beam search
(runtime/seq2seq_beam.py), with sequences_scores.
"""

from __future__ import annotations

import json
import os
import time

import numpy as np

import zoo
from runtime.beam_cache import HostReorder, position_axes
from runtime.beam_generation import BeamOutput
from runtime.beam_search import KEYS, beam_settings, split_beam_options
from runtime.core import RuntimeSession
from runtime.generation import ROUND
from runtime.providers import SessionError
from runtime.seq2seq_beam import beam_search, forced_processor
from runtime.stopping import eos_ids
from runtime.tensors import from_numpy, is_tensor

from .seq2seq_export import CROSS_PAST, ENCODER_MASK, SELF_PAST, SELF_PRESENT, seq2seq_paths

TOKEN_IDS = (
    "decoder_start_token_id",
    "eos_token_id",
    "pad_token_id",
    "forced_bos_token_id",
    "forced_eos_token_id",
    "suppress_tokens",
)
MANY = ("eos_token_id", "forced_eos_token_id", "suppress_tokens")  # a token id or a list of them
_UNSET = object()


def _ids(x, name: str, vocab: int | None) -> np.ndarray:
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


class _Bound:
    """The decoder's binding for `rows` rows: the encoder's outputs and mask (each bound once), the self-attention
    buffers (b g n d) bound as past and present (written in place: `arrays` holds them), past_len, the step's
    input_ids (rows 1), next_token (rows) and logits (rows 1 v), host arrays the bound OrtValues wrap."""

    def __init__(self, sess: Seq2SeqSession, enc: list, mask: np.ndarray, rows: int, n: int, start: int) -> None:
        import onnxruntime as ort

        self.keep, self.arrays = [], {}  # the arrays bound OrtValues wrap stay alive for the whole loop

        def bound(arr: np.ndarray):
            self.keep.append(arr)
            return ort.OrtValue.ortvalue_from_numpy(arr, "cpu", 0)

        self.binding = binding = sess.decoder.new_binding()
        inputs = {x.name: x for x in sess.decoder._sess.get_inputs()}
        for i in range(sess.layers):
            for kv in ("key", "value"):
                x = inputs[SELF_PAST.format(i=i, kv=kv)]
                self.arrays[x.name] = np.zeros((rows, int(x.shape[1]), n, int(x.shape[3])), enc[0].dtype)
                buf = bound(self.arrays[x.name])
                binding.bind_ortvalue_input(x.name, buf)
                binding.bind_ortvalue_output(SELF_PRESENT.format(i=i, kv=kv), buf)
        for i in range(sess.layers):  # the encoder's outputs after its hidden states: key, value per layer
            for j, kv in enumerate(("key", "value")):
                binding.bind_ortvalue_input(
                    CROSS_PAST.format(i=i, kv=kv), bound(np.ascontiguousarray(enc[1 + 2 * i + j]))
                )
        binding.bind_ortvalue_input(ENCODER_MASK, bound(np.ascontiguousarray(mask)))
        self.past_len = np.zeros((), np.int64)
        binding.bind_ortvalue_input("past_len", bound(self.past_len))
        self.step_ids = np.full((rows, 1), start, np.int64)
        binding.bind_ortvalue_input("input_ids", bound(self.step_ids))
        self.next_token = np.zeros((rows,), np.int64)
        binding.bind_ortvalue_output("next_token", bound(self.next_token))
        self.logits = np.zeros((rows, 1, sess.decoder_vocab), enc[0].dtype)
        binding.bind_ortvalue_output("logits", bound(self.logits))


class Seq2SeqSession:
    """The encoder and decoder graphs of one export (PATH, PATH.encoder.onnx or PATH.decoder.onnx)."""

    def __init__(self, path: str | os.PathLike, provider: str = "cpu", threads: int | None = None) -> None:
        enc_path, dec_path = seq2seq_paths(path)
        for p in (enc_path, dec_path):
            if not p.is_file():
                raise zoo.MissingFileError(
                    f"{p}: no such file; an encoder-decoder export is a pair, {enc_path.name} and {dec_path.name} "
                    f"(attnzoo export --checkpoint DIR --whole -o {dec_path.name.removesuffix('.decoder.onnx')}.onnx)"
                )
        self.encoder = RuntimeSession(enc_path, provider, threads, verbose=False, spin=True)
        self.decoder = RuntimeSession(dec_path, provider, threads, verbose=False, spin=True)
        kinds = (self.encoder.metadata.get("attnzoo.kind"), self.decoder.metadata.get("attnzoo.kind"))
        if kinds != ("seq2seq-encoder", "seq2seq-decoder"):
            raise SessionError(f"{enc_path} and {dec_path} are not an attnzoo encoder-decoder export (kinds {kinds})")
        meta = self.decoder.metadata
        self.vocab = int(meta["attnzoo.vocab"])  # the encoder's (input_ids)
        self.decoder_vocab = int(meta.get("attnzoo.decoder_vocab") or self.vocab)  # the logits' width
        self.layers = int(meta["attnzoo.layers"])
        self.generation = json.loads(meta.get("attnzoo.generation") or "{}")
        self.provider = self.decoder.provider
        notes = []
        if self.generation.get("bad_sequences"):
            notes.append(
                f"bad_words_ids of several tokens {self.generation['bad_sequences']} are not honoured here "
                "(single-token ones are)"
            )
        if self.generation.get("unhonoured"):
            asked = ", ".join(f"{k}={v}" for k, v in self.generation["unhonoured"].items())
            notes.append(f"the checkpoint's generation settings {asked} are not applied here")
        self.note = "; ".join(notes) or None

    def encode(self, input_ids, attention_mask=None) -> list[np.ndarray]:
        """encoder_hidden_states (b s c) then each layer's cross key and value (b g s d), as numpy."""
        ids = np.ascontiguousarray(_ids(input_ids, "input_ids", self.vocab), np.int64)
        mask = self._mask(attention_mask, ids.shape)
        return self.encoder._sess.run(None, {"input_ids": ids, "attention_mask": mask})

    @staticmethod
    def _mask(attention_mask, shape: tuple[int, ...]) -> np.ndarray:
        """attention_mask (b s) as a contiguous bool array (all True when None)."""
        if attention_mask is None:
            return np.ones(shape, np.bool_)
        mask = _ids(attention_mask, "attention_mask", None)
        if mask.shape != tuple(shape):
            raise zoo.InputError(f"attention_mask has shape {mask.shape}; input_ids has {tuple(shape)}")
        return np.ascontiguousarray(mask.astype(np.bool_))

    def generate(
        self,
        input_ids,
        max_new_tokens: int = 32,
        attention_mask=None,
        *,
        decoder_start_token_id=_UNSET,
        eos_token_id=_UNSET,
        pad_token_id=_UNSET,
        forced_bos_token_id=_UNSET,
        forced_eos_token_id=_UNSET,
        suppress_tokens=_UNSET,
        timings: dict | None = None,
        processors=None,
        return_dict_in_generate: bool = False,
        **beam_options,
    ):
        """(b, 1 + k) int64: decoder_start_token_id then k <= max_new_tokens greedy tokens (the module
        docstring). Token ids left unset take the checkpoint's; None turns one off. torch in -> torch out.

        Beam search when num_beams > 1 (the call's, else the checkpoint's generation_config), with length_penalty,
        early_stopping and num_return_sequences (runtime/seq2seq_beam.py): (b * num_return_sequences, 1 + k),
        or with return_dict_in_generate=True a BeamOutput (sequences, sequences_scores), as transformers'."""
        beam_call, unknown = split_beam_options(beam_options)
        if unknown:
            raise zoo.ArgumentError(f"unknown generate options {sorted(unknown)}; beam options: {', '.join(KEYS)}")
        beams = beam_settings(beam_call, self.generation)
        if not beams.on and (processors is not None or return_dict_in_generate):
            raise zoo.ArgumentError("processors= and return_dict_in_generate= are taken with num_beams > 1 here")
        as_dict = return_dict_in_generate
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise zoo.ArgumentError(f"max_new_tokens={max_new_tokens!r} must be an int >= 1")
        given = dict(
            decoder_start_token_id=decoder_start_token_id,
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
            forced_bos_token_id=forced_bos_token_id,
            forced_eos_token_id=forced_eos_token_id,
            suppress_tokens=suppress_tokens,
        )
        ids_ = {k: self.generation.get(k) if v is _UNSET else v for k, v in given.items()}
        last = self.decoder_vocab - 1
        for k, v in ids_.items():
            many = k in MANY and isinstance(v, (list, tuple, np.ndarray))
            for x in v if many else [v]:
                token = not isinstance(x, bool) and isinstance(x, (int, np.integer)) and 0 <= x <= last
                if x is not None and not token:
                    lists = " or a list of them" if k in MANY else ""
                    raise zoo.ArgumentError(f"{k}={v!r} must be a token id in 0..{last}{lists}, or None")
        start = ids_["decoder_start_token_id"]
        if start is None:
            raise zoo.ArgumentError("decoder_start_token_id is not set (nor in the export): give one")
        as_torch = is_tensor(input_ids)
        started = time.perf_counter()
        enc = self.encode(input_ids, attention_mask)
        mask = self._mask(attention_mask, enc[0].shape[:2])
        b = enc[0].shape[0]
        n = -(-max_new_tokens // ROUND) * ROUND
        if beams.on:
            seqs, scores, spent = self._beams(enc, mask, n, max_new_tokens, ids_, beams, processors)
            if timings is not None:
                timings.update(encode_s=spent.pop("encoded") - started, capacity=n, **spent)
            seqs, scores = (from_numpy(seqs), from_numpy(scores)) if as_torch else (seqs, scores)
            return BeamOutput(seqs, scores) if as_dict else seqs
        bound = _Bound(self, enc, mask, b, n, start)
        binding, past_len, step_ids, logits = bound.binding, bound.past_len, bound.step_ids, bound.logits
        next_token = bound.next_token
        encoded = time.perf_counter()

        eos = np.array(eos_ids(ids_["eos_token_id"]), np.int64)
        forced_bos, forced_eos = ids_["forced_bos_token_id"], eos_ids(ids_["forced_eos_token_id"])
        forced_eos = min(forced_eos) if forced_eos else None  # several tie at 0 over -inf: argmax takes the lowest
        suppress = list(eos_ids(ids_["suppress_tokens"]))
        pad = ids_["pad_token_id"] if ids_["pad_token_id"] is not None else (int(eos[0]) if len(eos) else None)
        out = np.full((b, 1 + max_new_tokens), start, np.int64)
        done = np.zeros(b, np.bool_)
        length = 1
        max_length = 1 + max_new_tokens  # transformers: the decoder prompt (one start token) + new tokens
        while length < max_length:
            past_len[()] = length - 1
            self.decoder.run_with_iobinding(binding)
            if suppress:  # the graph's argmax may be a banned id: take it again over the rest
                scores = logits[:, 0].copy()
                scores[:, suppress] = -np.inf
                token = scores.argmax(-1)
            else:
                token = next_token.copy()
            if forced_bos is not None and length == 1:
                token[:] = forced_bos
            if forced_eos is not None and length == max_length - 1:
                token[:] = forced_eos
            if len(eos):
                token = np.where(done, pad, token)
                done |= np.isin(token, eos)
            out[:, length] = token
            length += 1
            step_ids[:, 0] = token
            if len(eos) and done.all():
                break
        if timings is not None:
            end = time.perf_counter()
            timings.update(encode_s=encoded - started, decode_s=end - encoded, steps=length - 1, capacity=n)
        out = out[:, :length]
        return from_numpy(out) if as_torch else out

    def _beams(self, enc, mask, n, max_new_tokens, ids_, beams, processors):
        """Beam search (runtime/seq2seq_beam.py) over the encoder's outputs repeated num_beams times ->
        (sequences, sequences_scores, timings with `encoded`, when the decoder's binding was made)."""
        k, start = beams.num_beams, ids_["decoder_start_token_id"]
        enc = [np.repeat(e, k, axis=0) for e in enc]
        bound = _Bound(self, enc, np.repeat(mask, k, axis=0), enc[0].shape[0], n, start)
        encoded = time.perf_counter()
        eos = eos_ids(ids_["eos_token_id"])
        pad = ids_["pad_token_id"] if ids_["pad_token_id"] is not None else (eos[0] if eos else None)
        if processors is None:
            forced_eos, suppress = eos_ids(ids_["forced_eos_token_id"]), eos_ids(ids_["suppress_tokens"])
            processors = forced_processor(suppress, ids_["forced_bos_token_id"], forced_eos, 1 + max_new_tokens)

        def step(tokens: np.ndarray, past_len: int) -> np.ndarray:
            bound.step_ids[:, 0] = tokens
            bound.past_len[()] = past_len
            self.decoder.run_with_iobinding(bound.binding)
            return bound.logits[:, 0]

        reorder = HostReorder(bound.arrays, position_axes(self.decoder._sess.get_inputs(), bound.arrays))
        b = mask.shape[0]
        seqs, scores, spent = beam_search(step, reorder, b, start, max_new_tokens, beams, eos, pad, processors)
        return seqs, scores, dict(spent, encoded=encoded)


__all__ = ["Seq2SeqSession"]
