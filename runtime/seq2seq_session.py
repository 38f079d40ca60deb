"""An encoder-decoder export (export/seq2seq_export.py) under ONNX Runtime: its two sessions, the encoder's
run, and generation (runtime/seq2seq_generation.py: greedy or sampled, stop strings, streaming, logprobs).

    sess = Seq2SeqSession("t5.onnx")                  # opens t5.encoder.onnx and t5.decoder.onnx
    tokens = sess.generate(input_ids, max_new_tokens=32, attention_mask=mask)     # (b, 1 + k) int64
    tokens = sess.generate(input_ids, 32, mask, temperature=0.8, top_p=0.9, seed=1)  # sampled, reproducible
    text = "".join(sess.stream("translate: hello", 32, tokenizer="tokenizer.json", stop="."))

The tokens are transformers' generate: the row starts with decoder_start_token_id, and every key of the
checkpoint's generation_config.json (kept in the export's metadata) applies as in transformers
(runtime/processors.py: forced_bos/forced_eos, suppress_tokens, bad_words_ids, min_length, no_repeat_ngram_size,
the sampling knobs, ...; num_beams > 1: beam search, runtime/seq2seq_beam.py); the keys not done here are said in
`note`.
"""

from __future__ import annotations

import json
import os

import numpy as np

import zoo

from .beam_generation import BeamOutput
from .beam_search import beam_settings, split_beam_options, without_beams
from .core import RuntimeSession
from .generation import refuse_beams_in_stream, stream_pieces
from .generation_keys import unapplied
from .names import seq2seq_paths
from .providers import SessionError
from .seq2seq_beam import beam_generate
from .seq2seq_generation import Seq2SeqGeneration, as_ids, as_mask
from .stopping import Codec
from .tensors import from_numpy, is_tensor


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
        self.generation = _settings(json.loads(meta.get("attnzoo.generation") or "{}"))  # a generation_config
        self.provider = self.decoder.provider
        notes = unapplied(self.generation, beams=True)  # generate runs the checkpoint's beams
        self.note = f"the checkpoint's generation_config.json sets {'; '.join(notes)}: not applied" if notes else None

    def encode(self, input_ids, attention_mask=None) -> list[np.ndarray]:
        """encoder_hidden_states (b s c) then each layer's cross key and value (b g s d), as numpy."""
        ids = np.ascontiguousarray(as_ids(input_ids, "input_ids", self.vocab), np.int64)
        mask = as_mask(attention_mask, ids.shape)
        return self.encoder._sess.run(None, {"input_ids": ids, "attention_mask": mask})

    def generate(
        self,
        input_ids,
        max_new_tokens: int = 32,
        attention_mask=None,
        *,
        timings: dict | None = None,
        processors=None,
        return_dict_in_generate: bool = False,
        max_length: int | None = None,
        **options,
    ):
        """(b, 1 + k) int64: decoder_start_token_id then k <= max_new_tokens tokens, greedy unless the options or
        the checkpoint sample (runtime/seq2seq_generation.py for every option). torch in -> torch out.
        `timings`, a dict, receives encode_s, decode_s, steps and capacity (and the seed of a sampling call).

        Beam search when num_beams > 1 (the call's, else the checkpoint's generation_config), with length_penalty,
        early_stopping and num_return_sequences (runtime/seq2seq_beam.py): (b * num_return_sequences, 1 + k), or
        with return_dict_in_generate=True a BeamOutput (sequences, sequences_scores), as transformers'.
        max_length (transformers': the start token included) replaces max_new_tokens when given."""
        if max_length is not None:  # transformers' max_length: the start token and the new ones
            if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 2:
                raise zoo.ArgumentError(f"max_length={max_length!r} must be an int >= 2 (the start token included)")
            max_new_tokens = max_length - 1
        call, options = split_beam_options(options)
        beams = beam_settings(call, self.generation)
        if beams.on:
            seqs, scores, spent = beam_generate(
                self, input_ids, max_new_tokens, attention_mask, beams, processors, options
            )
            if timings is not None:
                timings.update(spent)
            if is_tensor(input_ids):
                seqs, scores = from_numpy(seqs), from_numpy(scores)
            return BeamOutput(seqs, scores) if return_dict_in_generate else seqs
        for name, given in (
            ("processors", processors is not None),
            ("return_dict_in_generate", return_dict_in_generate),
        ):
            if given:
                raise zoo.ArgumentError(
                    f"{name}= is taken with num_beams > 1 here; leave it out for greedy or sampling"
                )
        run = Seq2SeqGeneration(
            self,
            input_ids,
            max_new_tokens,
            attention_mask,
            **without_beams(call, options, options.get("generation_config") or self.generation),
        )
        tokens = run.run()
        if timings is not None:
            timings.update(run.timings)
        return tokens

    def stream(self, input_ids, max_new_tokens: int = 32, attention_mask=None, *, tokenizer=None, **options):
        """As runtime.generation.stream: each step's (b,) ids, or with a tokenizer each row's text piece (a str
        prompt is one row, encoded with the tokenizer, and yields str pieces)."""
        one_text = isinstance(input_ids, str)
        if one_text:
            if tokenizer is None:
                raise zoo.ArgumentError("a text prompt needs tokenizer=... (a tokenizers.Tokenizer or tokenizer.json)")
            input_ids = [Codec(tokenizer).encode(input_ids)]
        call, options = split_beam_options(options)
        refuse_beams_in_stream(beam_settings(call, self.generation))
        options = without_beams(call, options, options.get("generation_config") or self.generation)
        run = Seq2SeqGeneration(self, input_ids, max_new_tokens, attention_mask, tokenizer=tokenizer, **options)
        yield from stream_pieces(run, tokenizer, one_text)


def _settings(recorded: dict) -> dict:
    """An export's recorded generation settings as a generation_config: exports made before every key was
    carried kept multi-token bad_words_ids as `bad_sequences` and the keys their loop skipped as `unhonoured`."""
    out = {k: v for k, v in recorded.items() if k not in ("bad_sequences", "unhonoured")}
    out.update(recorded.get("unhonoured") or {})
    if recorded.get("bad_sequences"):
        out["bad_words_ids"] = [*(out.get("bad_words_ids") or []), *recorded["bad_sequences"]]
    return out


__all__ = ["Seq2SeqSession"]
