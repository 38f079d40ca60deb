"""A whole encoder-decoder model (zoo.seq2seq.Seq2SeqLM) to TWO ONNX graphs, an encoder and a decoder step.

    export_seq2seq(model, "t5.onnx")     # writes t5.encoder.onnx and t5.decoder.onnx (weights in .data beside)

PATH names the pair: its `.onnx` suffix (if any) is replaced by `.encoder.onnx` and `.decoder.onnx`
(seq2seq_paths). The interface (names as optimum and onnxruntime-genai give them where they have them):

  encoder  input_ids (b s), attention_mask (b s)
           -> encoder_hidden_states (b s c), present.i.encoder.key / .value (b g s d) per decoder layer
  decoder  input_ids (b t), encoder_attention_mask (b s), past_len (),
           past_key_values.i.decoder.key / .value (b g n d)   the self-attention's static buffers of capacity n
           past_key_values.i.encoder.key / .value (b g s d)   the encoder's cross keys and values, as made
           -> logits (b 1 v), next_token (b), present.i.decoder.key / .value (b g n d)

The cross-attention keys and values are made ONCE, in the encoder graph (as onnxruntime-genai's Whisper
does), not in the decoder's first step (optimum): the decoder is then one graph with one shape of
inputs at every step, with no If node or second "decoder with past" graph, and the encoder's run is the
only place the encoder output is read. The decoder's self-attention keeps the decoders' static cache
(export/lm_export.py): the session binds each buffer as past and present, ONNX Runtime writes a step's
keys in place. Every attention takes the traced lowering (default decomposed: T5's bucket bias and
cross-attention are expressed by it at every shape).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from einops import rearrange
from torch import nn

import zoo
from runtime.io import TensorIO
from zoo.seq2seq import Seq2SeqLM

from .choice import why_not
from .errors import ExportError
from .graphs import op_counts
from .lm_export import check_precision_and_dtype
from .lm_fusions import fuse_norms
from .lowerings import able, record
from .names import seq2seq_paths
from .precision import apply as apply_precision
from .tracing import DTYPES, check_interface, configured, trace

SELF_PAST, SELF_PRESENT = "past_key_values.{i}.decoder.{kv}", "present.{i}.decoder.{kv}"
CROSS_PAST, CROSS_PRESENT = "past_key_values.{i}.encoder.{kv}", "present.{i}.encoder.{kv}"
ENCODER_HIDDEN = "encoder_hidden_states"
ENCODER_MASK = "encoder_attention_mask"
# example sizes: all >= 2 and different, so none is baked in
EXAMPLE_B, EXAMPLE_S, EXAMPLE_T, EXAMPLE_N, EXAMPLE_PAST = 2, 7, 3, 11, 4


def interfaces(model: Seq2SeqLM) -> tuple[list[TensorIO], list[TensorIO], list[TensorIO], list[TensorIO]]:
    """(encoder inputs, encoder outputs, decoder inputs, decoder outputs) in graph order."""
    s = model.spec
    enc_in = [
        TensorIO("input_ids", ("b", "s"), "int64", "encoder token ids, padded on the right"),
        TensorIO("attention_mask", ("b", "s"), "bool", "True = a real token"),
    ]
    enc_out = [TensorIO(ENCODER_HIDDEN, ("b", "s", s.d_model), "float", "the encoder output")]
    dec_in = [
        TensorIO("input_ids", ("b", "t"), "int64", "decoder token ids at positions past_len..past_len+t-1"),
        TensorIO(ENCODER_MASK, ("b", "s"), "bool", "True = a real encoder token"),
        TensorIO("past_len", (), "int64", "decoder positions already in the buffers"),
    ]
    dec_out = [
        TensorIO("logits", ("b", 1, s.decoder_vocab_), "float", "next-token logits"),
        TensorIO("next_token", ("b",), "int64", "argmax of the logits (greedy)"),
    ]
    for i, a in enumerate(s.decoder):  # the self-attention buffers of every layer, then the cross ones
        for kv, d in (("key", a.d_k_), ("value", a.d_v_)):
            axes = ("b", a.kv_heads_, "n", d)
            dec_in.append(TensorIO(SELF_PAST.format(i=i, kv=kv), axes, "float", f"layer {i}'s {kv} buffer"))
            dec_out.append(TensorIO(SELF_PRESENT.format(i=i, kv=kv), axes, "float", f"layer {i}'s {kv}, written"))
    for i, c in enumerate(s.cross):
        for kv, d in (("key", c.d_k_), ("value", c.d_v_)):
            axes = ("b", c.kv_heads_, "s", d)
            enc_out.append(TensorIO(CROSS_PRESENT.format(i=i, kv=kv), axes, "float", f"layer {i}'s cross {kv}"))
            dec_in.append(TensorIO(CROSS_PAST.format(i=i, kv=kv), axes, "float", f"layer {i}'s cross {kv}"))
    return enc_in, enc_out, dec_in, dec_out


class _Encoder(nn.Module):
    def __init__(self, model: Seq2SeqLM) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        e = self.model.encoder_output(input_ids, rearrange(attention_mask, "b s -> b 1 1 s"))
        keys, values = self.model.cross_cache(e)
        return (e, *(x for kv in zip(keys, values) for x in kv))


class _Decoder(nn.Module):
    def __init__(self, model: Seq2SeqLM) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids, encoder_attention_mask, past_len, caches, cross):
        logits, keys, values = self.model.step(
            input_ids,
            caches[0::2],
            caches[1::2],
            past_len,
            cross[0::2],
            cross[1::2],
            encoder_attention_mask,
            in_place=False,
        )
        last = logits[:, -1:]
        return (last, last[:, 0].argmax(-1), *(x for kv in zip(keys, values) for x in kv))


@dataclass
class Seq2SeqExportResult:
    encoder: Path
    decoder: Path
    lowering: str
    precision: str
    seconds: float
    op_counts: dict[str, dict[str, int]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        size = sum(p.stat().st_size for p in _written(self.encoder) + _written(self.decoder))
        lines = [
            f"wrote {self.encoder} and {self.decoder} ({size / 1e6:.2f} MB with their weights)",
            f"  lowering  {self.lowering} in every attention; precision {self.precision}",
            "  encoder   input_ids, attention_mask -> encoder_hidden_states, present.i.encoder.key / .value",
            "  decoder   input_ids, encoder_attention_mask, past_len, past_key_values.i.decoder.* (static, in "
            "place), past_key_values.i.encoder.* -> logits, next_token, present.i.decoder.*",
            f"  took      {self.seconds:.1f} s",
        ]
        return "\n".join(lines + [f"  note      {n}" for n in self.notes])


def _written(p: Path) -> list[Path]:
    from zoo.files import weights_file

    return [x for x in (p, weights_file(p)) if x.is_file()]


def _example(model: Seq2SeqLM, dtype: torch.dtype):
    s = model.spec
    b, src, t, n = EXAMPLE_B, EXAMPLE_S, EXAMPLE_T, EXAMPLE_N
    mask = torch.ones(b, src, dtype=torch.bool)
    mask[0, -2:] = False  # right padding in the example, so no branch on it is taken
    enc = {"input_ids": torch.randint(0, s.vocab, (b, src)), "attention_mask": mask}
    caches, cross = [], []
    for a, c in zip(s.decoder, s.cross):
        g, dk, dv = a.cache_widths_
        caches += [torch.randn(b, g, n, dk).to(dtype), torch.randn(b, g, n, dv).to(dtype)]
        cross += [
            torch.randn(b, c.kv_heads_, src, c.d_k_).to(dtype),
            torch.randn(b, c.kv_heads_, src, c.d_v_).to(dtype),
        ]
    dec = {
        "input_ids": torch.randint(0, s.decoder_vocab_, (b, t)),
        "encoder_attention_mask": mask,
        "past_len": torch.tensor(EXAMPLE_PAST),
        "caches": caches,
        "cross": cross,
    }
    dim_b, dim_s, dim_t, dim_n = (torch.export.Dim(x) for x in ("b", "s", "t", "n"))
    enc_dyn = {"input_ids": {0: dim_b, 1: dim_s}, "attention_mask": {0: dim_b, 1: dim_s}}
    dec_dyn = {
        "input_ids": {0: dim_b, 1: dim_t},
        "encoder_attention_mask": {0: dim_b, 1: dim_s},
        "past_len": {},
        "caches": [{0: dim_b, 2: dim_n} for _ in caches],
        "cross": [{0: dim_b, 2: dim_s} for _ in cross],
    }
    return enc, enc_dyn, dec, dec_dyn


def _named(onnx_model, ins: list[TensorIO], outs: list[TensorIO], spec: zoo.AttentionSpec):
    import onnx_ir as ir

    onnx_model, _ = fuse_norms(onnx_model)
    for value, io in zip(onnx_model.graph.inputs, ins):
        value.name = io.name
    for value, io in zip(list(onnx_model.graph.inputs) + list(onnx_model.graph.outputs), ins + outs):
        value.shape = ir.Shape(list(io.axes))
    check_interface(onnx_model, ins, outs, spec)  # every axis here is a letter or an int: any layer's spec
    return onnx_model


def export_seq2seq(
    model: Seq2SeqLM,
    path: str | os.PathLike,
    *,
    precision: str = "fp32",
    lowering: str = "decomposed",
    dtype: str = "float32",
    provider: str = "cpu",
    overwrite: bool = False,
    label: str | None = None,
    generation: dict | None = None,
) -> Seq2SeqExportResult:
    """Write `model` as its encoder and decoder graphs (the module docstring); `generation`: the token ids
    greedy generation honours (peers.seq2seq.generation_settings), kept in both graphs' metadata."""
    from .saving import output_target, save_atomic

    started = time.perf_counter()
    if not isinstance(model, Seq2SeqLM):
        raise zoo.InputTypeError(f"export_seq2seq takes a zoo Seq2SeqLM, got {type(model).__name__}")
    check_precision_and_dtype(precision, dtype, provider)
    takes = able("encoder_decoder")  # the lowerings whose records take a bias and cross-attention
    if lowering == "auto":
        lowering = takes[0]
    if lowering not in takes:
        raise ExportError(f"lowering={lowering!r}: a seq2seq model takes one of {', '.join(('auto', *takes))}")
    s = model.spec
    for name, specs in (("encoder", s.encoder), ("decoder", s.decoder), ("cross", s.cross)):
        for i, a in enumerate(specs):
            r = why_not(lowering, a, dtype=dtype, provider=provider)
            if r:
                raise ExportError(f"lowering={lowering!r} cannot export {name} layer {i}: {r}")
    enc_path, dec_path = seq2seq_paths(path)
    targets = [output_target(p, overwrite) for p in (enc_path, dec_path)]
    rec = record(lowering)
    m = configured(model, rec, dtype)
    enc_in, enc_out, dec_in, dec_out = interfaces(model)
    enc_ex, enc_dyn, dec_ex, dec_dyn = _example(m, DTYPES[dtype])
    with torch.no_grad():
        graphs = [
            _named(trace(_Encoder(m).eval(), enc_ex, enc_dyn, rec, enc_out), enc_in, enc_out, s.cross[0]),
            _named(trace(_Decoder(m).eval(), dec_ex, dec_dyn, rec, dec_out), dec_in, dec_out, s.cross[0]),
        ]
    notes, counts = [], {}
    meta = {
        "attnzoo.name": label or type(model).__name__,
        "attnzoo.vocab": str(s.vocab),
        "attnzoo.decoder_vocab": str(s.decoder_vocab_),
        "attnzoo.layers": str(len(s.decoder)),
        "attnzoo.seq2seq": json.dumps({"describe": s.describe()}),
        "attnzoo.generation": json.dumps(generation or {}, sort_keys=True),
        "attnzoo.version": zoo.__version__,
        "attnzoo.lowering": lowering,
        "attnzoo.dtype": dtype,
        "attnzoo.cache": "static",
    }
    for graph, kind, target in zip(graphs, ("seq2seq-encoder", "seq2seq-decoder"), targets):
        quantized, applied = apply_precision(graph, precision, decode=True)
        if applied.note():
            notes.append(f"{kind}: {applied.note()}")
        quantized.metadata_props.update({**meta, "attnzoo.kind": kind, **applied.metadata()})
        quantized.producer_name, quantized.producer_version = "attnzoo", zoo.__version__
        save_atomic(quantized, target, model, dtype, overwrite=overwrite, limit=0)
        counts[kind] = op_counts(quantized)
    return Seq2SeqExportResult(enc_path, dec_path, lowering, precision, time.perf_counter() - started, counts, notes)


__all__ = [
    "CROSS_PAST",
    "CROSS_PRESENT",
    "ENCODER_HIDDEN",
    "ENCODER_MASK",
    "SELF_PAST",
    "SELF_PRESENT",
    "Seq2SeqExportResult",
    "export_seq2seq",
    "interfaces",
    "seq2seq_paths",
]
