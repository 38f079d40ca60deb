"""A whole encoder (zoo.encoder.Encoder) or sentence encoder (zoo.encoder.SentenceEncoder) to ONE ONNX graph.

    export_encoder(sentence_encoder, "embed.onnx")                  # -> sentence_embedding (b e)
    export_encoder(encoder, "enc.onnx", precision="int8")           # -> last_hidden_state (b t c)

Inputs: input_ids (b t) int64, attention_mask (b t) int64 (1 = a real token, as tokenizers give it) and,
for a family with token types, token_type_ids (b t) int64; b and t are dynamic. The pooling (and the
Normalize) are in the graph, so a session's output is what sentence-transformers' encode returns. What a
caller needs to tokenize as sentence-transformers does is in the metadata (ENCODER_METADATA): the
truncation length, the prompts, the pad id, lower-casing. Every attention layer takes the chosen traced
lowering (tracing.configured); `auto` takes the first of choice.auto_order's masked order that every layer
allows. The weights go beside the graph (PATH.data) once they pass the protobuf inline limit.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

import zoo
from runtime.io import TensorIO

from .choice import auto_order, first_that_exports, lowerings_to_try, why_not
from .errors import ExportError
from .graphs import op_counts
from .lowerings import record
from .lowerings.base import EXPECTED_NODES
from .names import PRECISIONS, precision_words
from .precision import PrecisionError
from .precision import apply as apply_precision
from .precision import why_not as precision_why_not
from .tracing import BF16_CPU, DTYPES, check_interface, configured, trace

EXAMPLE_B, EXAMPLE_T = 2, 7  # different, both >= 2: none is baked in
IDS = TensorIO("input_ids", ("b", "t"), "int64", "token ids, right-padded")
MASK = TensorIO("attention_mask", ("b", "t"), "int64", "1 = a real token, 0 = padding")
TYPES = TensorIO("token_type_ids", ("b", "t"), "int64", "segment ids (0 for one text)")
ENCODER_METADATA = ("max_seq_length", "prompts", "default_prompt_name", "pad_id", "do_lower_case", "dim", "vocab")


def is_encoder(obj) -> bool:
    from zoo.encoder import Encoder, SentenceEncoder

    return isinstance(obj, (Encoder, SentenceEncoder))


def encoder_interface(model: nn.Module) -> tuple[list[TensorIO], list[TensorIO]]:
    """(inputs, outputs) of an encoder's graph."""
    from zoo.encoder import SentenceEncoder

    spec = model.spec
    ins = [IDS, MASK] + ([TYPES] if spec.type_vocab else [])
    if isinstance(model, SentenceEncoder):
        outs = [TensorIO("sentence_embedding", ("b", model.dim), "float", "the pooled (normalized) embedding")]
    else:
        outs = [TensorIO("last_hidden_state", ("b", "t", spec.d_model), "float", "the last layer's output")]
    return ins, outs


class _Wrapped(nn.Module):
    def __init__(self, model: nn.Module, types: bool) -> None:
        super().__init__()
        self.model, self.types = model, types

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        return self.model(input_ids, attention_mask, token_type_ids if self.types else None)


@dataclass
class EncoderExportResult:
    path: Path
    name: str
    lowering: str
    opset: int
    dtype: str
    layers: int
    inputs: list[str]
    outputs: list[tuple[str, tuple]]
    op_counts: dict[str, int]
    parameters: int
    seconds: float
    file_bytes: int
    external_data: Path | None = None
    notes: list[str] = field(default_factory=list)
    precision: str = "fp32"
    precision_method: str = ""

    def summary(self) -> str:
        ops = ", ".join(f"{k} x{v}" for k, v in sorted(self.op_counts.items(), key=lambda kv: -kv[1])[:8])
        size = self.file_bytes + (self.external_data.stat().st_size if self.external_data else 0)
        out = ", ".join(f"{n} {tuple(s)}" for n, s in self.outputs)
        weights = f", weights in {self.external_data.name}" if self.external_data else ""
        lines = [
            f"wrote {self.path} ({size / 1e6:.2f} MB{weights})",
            f"  model     {self.name}: encoder of {self.layers} layers, {self.parameters:,} parameters",
            f"  lowering  {self.lowering} (opset {self.opset}) in every layer, {self.dtype}",
            f"  precision {precision_words(self.precision, self.dtype, self.precision_method)}",
            f"  inputs    {', '.join(self.inputs)} (b t), dynamic b and t",
            f"  outputs   {out}",
            f"  nodes     {sum(self.op_counts.values())}: {ops}",
            f"  took      {self.seconds:.1f} s",
        ]
        return "\n".join(lines + [f"  note      {n}" for n in self.notes])


def _candidates(specs, lowering, provider: str, dtype: str) -> list[str]:
    def reason(lw: str) -> str | None:
        if not record(lw).traced:
            return "its graph is built by hand, for one block"
        for i, s in enumerate(specs):
            r = why_not(lw, s, dtype=dtype, provider=provider)
            if r:
                return f"layer {i}: {r}"
        return None

    return lowerings_to_try(
        lowering,
        auto_order(provider, specs[0], with_mask=True),
        reason,
        none="no traced lowering can express every layer of this encoder",
        refused="cannot export this encoder",
    )


def _trace(model: nn.Module, rec, dtype: str, ins, outs, spec0):
    import onnx_ir as ir

    m = configured(model, rec, dtype)
    b, t = EXAMPLE_B, EXAMPLE_T
    vocab = model.spec.vocab
    mask = torch.ones(b, t, dtype=torch.long)
    mask[1, t - 3 :] = 0  # padding in the example, so no branch on it is taken
    example = {"input_ids": torch.randint(0, vocab, (b, t)), "attention_mask": mask}
    dim_b, dim_t = torch.export.Dim("b"), torch.export.Dim("t")
    dynamic = {"input_ids": {0: dim_b, 1: dim_t}, "attention_mask": {0: dim_b, 1: dim_t}}
    if len(ins) == 3:
        example["token_type_ids"] = torch.zeros(b, t, dtype=torch.long)
        dynamic["token_type_ids"] = {0: dim_b, 1: dim_t}
    token = EXPECTED_NODES.set(len(model.spec.attention))  # one fused attention node per layer
    try:
        with torch.no_grad():
            onnx_model = trace(_Wrapped(m, len(ins) == 3).eval(), example, dynamic, rec, outs)
    finally:
        EXPECTED_NODES.reset(token)
    for value, io in zip(list(onnx_model.graph.inputs) + list(onnx_model.graph.outputs), ins + outs):
        value.name = io.name
        value.shape = ir.Shape(list(io.shape(spec0)))
    check_interface(onnx_model, ins, outs, spec0)
    return onnx_model


def export_encoder(
    model: nn.Module,
    path: str | os.PathLike,
    *,
    precision: str = "fp32",
    lowering: str = "auto",
    provider: str = "cpu",
    dtype: str = "float32",
    overwrite: bool = False,
    label: str | None = None,
    pad_id: int | None = None,
    do_lower_case: bool = False,
) -> EncoderExportResult:
    """Write `model` as one ONNX graph (see the module docstring); returns what was written. pad_id: the id
    the tokenizer pads with (recorded for sessions; default the model's pad_id); do_lower_case: texts are
    lower-cased before tokenizing (sentence-transformers' option of that name)."""
    from zoo.encoder import SentenceEncoder

    from .saving import EXTERNAL_DATA_BYTES, output_target, save_atomic

    started = time.perf_counter()
    if not is_encoder(model):
        raise zoo.InputTypeError(f"export_encoder takes a zoo Encoder or SentenceEncoder, got {type(model).__name__}")
    if not isinstance(path, (str, os.PathLike)) or (isinstance(path, str) and not path.strip()):
        raise zoo.InputTypeError(f"path={path!r} must be a file path (str or os.PathLike), e.g. 'embed.onnx'")
    if not isinstance(precision, str) or precision not in PRECISIONS:
        raise PrecisionError(f"precision={precision!r} is not one of {', '.join(PRECISIONS)}")
    if dtype not in DTYPES:
        raise ExportError(f"dtype={dtype!r} is not one of {', '.join(DTYPES)}")
    if dtype == "bfloat16" and provider == "cpu":
        raise ExportError(BF16_CPU)
    reason = precision_why_not(precision, dtype=dtype, provider=provider)
    if reason:
        raise PrecisionError(reason)
    specs = list(model.spec.attention)
    order = _candidates(specs, lowering, provider, dtype)
    path = Path(path)
    if path.is_dir():
        raise ExportError(f"{path} is a folder; give a file path such as {path / 'embed.onnx'}")
    target = output_target(path, overwrite)
    ins, outs = encoder_interface(model)
    lw, (quantized, applied), notes = first_that_exports(
        order,
        lowering,
        lambda lw: apply_precision(_trace(model, record(lw), dtype, ins, outs, specs[0]), precision),
        "encoder",
    )
    if applied.note():
        notes.append(applied.note())
    sentence = isinstance(model, SentenceEncoder)
    meta = {
        "attnzoo.kind": "sentence_encoder" if sentence else "encoder",
        "attnzoo.name": label or type(model).__name__,
        "attnzoo.layers": str(len(specs)),
        "attnzoo.layer_specs": json.dumps([s.to_dict() for s in specs], sort_keys=True),
        "attnzoo.version": zoo.__version__,
        "attnzoo.lowering": lw,
        "attnzoo.dtype": dtype,
        "attnzoo.pad_id": str(model.spec.pad_id if pad_id is None else pad_id),
        "attnzoo.vocab": str(model.spec.vocab),  # a server checks token ids against it
        "attnzoo.do_lower_case": json.dumps(bool(do_lower_case)),
        "attnzoo.token_types": json.dumps(len(ins) == 3),
        **applied.metadata(),
    }
    if sentence:
        meta.update(
            {
                "attnzoo.dim": str(model.dim),
                "attnzoo.pooling": json.dumps(list(model.pooling.modes)),
                "attnzoo.normalize": json.dumps(model.pooling.normalize),
                "attnzoo.max_seq_length": str(model.max_seq_length or ""),
                "attnzoo.prompts": json.dumps(model.prompts, sort_keys=True),
                "attnzoo.default_prompt_name": model.default_prompt_name or "",
            }
        )
    quantized.metadata_props.update(meta)
    quantized.producer_name, quantized.producer_version = "attnzoo", zoo.__version__
    external = save_atomic(quantized, target, model, dtype, overwrite=overwrite, limit=EXTERNAL_DATA_BYTES)
    return EncoderExportResult(
        path=path,
        name=meta["attnzoo.name"],
        lowering=lw,
        opset=record(lw).opset,
        dtype=dtype,
        layers=len(specs),
        inputs=[io.name for io in ins],
        outputs=[(io.name, io.axes) for io in outs],
        op_counts=op_counts(quantized),
        parameters=zoo.count_parameters(model),
        seconds=time.perf_counter() - started,
        file_bytes=target.stat().st_size,
        external_data=external,
        notes=notes,
        precision=precision,
        precision_method=applied.method.describe() if applied.method.tool != "none" else "",
    )


__all__ = ["ENCODER_METADATA", "EncoderExportResult", "encoder_interface", "export_encoder", "is_encoder"]
