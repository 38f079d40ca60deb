"""A whole decoder model (zoo.lm.DecoderLM) to ONE ONNX graph: its step with a static cache.

    export_onnx(model, "lm.onnx")                        # decode=True, cache="static", fp32, auto lowering
    export_onnx(model, "lm4.onnx", precision="int4")

The graph traces `DecoderLM.step(..., in_place=False)`, the one function eager generation runs in
place. Its interface is io.lm_interface: input_ids (b t), attention_mask (b n) over the capacity,
past_len, past_key_values.i.key / .value (b g n d) per layer -> logits (b 1 v, or b t v with
all_logits), next_token (b, the argmax in the graph) and present.i.key / .value: the session binds
each layer's buffer as past and present, so ONNX Runtime writes a step's keys in place
(runtime/generation.py). The capacity n is a dynamic axis: a session allocates what its call needs
(prompt + new tokens, rounded up), and `max_len`, when given, is only the largest it will allocate.
The weights are written beside the graph, in PATH.data (ONNX Runtime maps them), as onnxruntime-genai
and optimum write theirs; the graph alone is a few hundred kB.

Every attention layer takes the chosen lowering through the mechanism a block export uses
(tracing.configured: every zoo block inside the module is configured for the traced lowering, then
the module is traced once); a lowering whose record builds the graph by hand (ort-gqa) is spliced in
per layer (export/splice.py). `auto` takes choice.LM_PREFERENCE's first that every layer allows. The
norms are then fused (export/lm_fusions.py).

Padding (docs/generation.md, "The padding rule"): a spliced GroupQueryAttention graph may take packed rows
(padding="packed"; "auto" packs for provider="cuda"): io.lm_interface(packed=True), input_ids (b t),
position_ids (b t), seqlens_k (b) int32, total_sequence_length () int32, each row's tokens from slot 0
and no attention_bias,
which is what CUDA's fast kernels, sinks and CUDA graphs need. The traced step is the same DecoderLM.step,
with each row's first slot as its past_len and each row's last real token's logits (_Step).
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
from runtime.io import LM_PAST, LM_PRESENT, SEQLENS_K, lm_interface

from . import cuda_check, kv_int8, splice
from .choice import first_that_exports, lm_order, lowerings_to_try, why_not
from .errors import ExportError
from .graphs import op_counts
from .lm_fusions import fuse_norms
from .lowerings import able, record
from .names import CACHE_CHOICES, DTYPE_SHORT, PRECISIONS, precision_words
from .precision import PrecisionError
from .precision import apply as apply_precision
from .precision import why_not as precision_why_not
from .progress import stage
from .tracing import BF16_CPU, DTYPES, check_interface, configured, trace

PADDINGS = ("auto", "left", "packed")
# The example the model is traced at: all sizes >= 2 and different, so none is baked in.
EXAMPLE_B, EXAMPLE_T, EXAMPLE_N, EXAMPLE_PAST = 2, 5, 11, 3
# The lowerings whose static step a whole model takes; fp16 on the CPU: see FP16_CPU.
FP16_CPU = (
    "dtype='float16' is refused for whole models on the CPU: ONNX Runtime's CPU provider has no float16 kernels "
    "for the graph's MatMul, Softmax and norms (it inserts casts around each, slower than fp32); use "
    "precision='int8' or 'int4' for smaller weights"
)


def is_lm(obj) -> bool:
    """A whole decoder model (zoo.DecoderLM), exported here rather than as a block."""
    return isinstance(obj, zoo.DecoderLM)


# the cache length at which generate re-runs the whole sequence (zoo.lm.LMSpec.recompute_at: Phi-3's longrope)
RECOMPUTE_AT = "attnzoo.recompute_at"


def layer_specs(model: nn.Module) -> list[zoo.AttentionSpec]:
    """The attention spec of each layer, in order (each layer holds a zoo block as `.attn`)."""
    specs = []
    for i, layer in enumerate(model.layers):
        block = getattr(layer, "attn", None)
        if not isinstance(block, zoo.MultiHeadAttention):
            raise ExportError(f"layer {i} of the model has no zoo.MultiHeadAttention as .attn; it cannot be exported")
        specs.append(block.spec)
    return specs


def vocab_size(model: nn.Module) -> int:
    return model.spec.vocab


@dataclass
class LMExportResult:
    path: Path
    name: str
    lowering: str
    opset: int
    dtype: str
    layers: int
    vocab: int
    inputs: list[tuple[str, str, tuple]]
    outputs: list[tuple[str, str, tuple]]
    op_counts: dict[str, int]
    parameters: int
    seconds: float
    file_bytes: int
    max_len: int | None
    external_data: Path | None = None
    notes: list[str] = field(default_factory=list)
    precision: str = "fp32"
    precision_method: str = ""
    kv_precision: str = "fp32"
    module: nn.Module | None = field(default=None, repr=False)

    def summary(self) -> str:
        ops = ", ".join(f"{k} x{v}" for k, v in sorted(self.op_counts.items(), key=lambda kv: -kv[1])[:8])
        size = self.file_bytes + (self.external_data.stat().st_size if self.external_data else 0)
        weights_note = f", weights in {self.external_data.name}" if self.external_data else ""
        caches = [n for n, _, _ in self.inputs if n.startswith(LM_PAST[:5])]
        per_layer = f"{caches[0]} .. (b g n d) per layer" if caches else ""
        cap = f"at most {self.max_len} positions" if self.max_len else "sized per call"
        kv = self.kv_precision if self.kv_precision != "fp32" else DTYPE_SHORT.get(self.dtype, self.dtype)
        lines = [
            f"wrote {self.path} ({size / 1e6:.2f} MB{weights_note})",
            f"  model     {self.name}: {self.layers} layers, vocabulary {self.vocab}, {self.parameters:,} parameters",
            f"  lowering  {self.lowering} (opset {self.opset}) in every layer, {self.dtype}",
            f"  precision {precision_words(self.precision, self.dtype, self.precision_method)}",
            f"  cache     static, in place, {kv}; capacity n {cap}",
            f"  inputs    {', '.join(n for n, _, _ in self.inputs if n not in caches)}, {per_layer}",
            f"  outputs   {', '.join(n for n, _, _ in self.outputs[:2])}, present.i.key / .value per layer",
            f"  nodes     {sum(self.op_counts.values())}: {ops}",
            f"  took      {self.seconds:.1f} s",
        ]
        return "\n".join(lines + [f"  note      {n}" for n in self.notes])


class _Step(nn.Module):
    """DecoderLM.step with flat named inputs: the buffers as one list (key, value per layer)."""

    def __init__(self, lm: nn.Module, all_logits: bool, argmax: bool) -> None:
        super().__init__()
        self.lm, self.all_logits, self.argmax = lm, all_logits, argmax

    def forward(self, input_ids, attention_mask, past_len, caches):
        keys, values = list(caches[0::2]), list(caches[1::2])
        out = self.lm.step(
            input_ids, keys, values, past_len, attention_mask, in_place=False, all_logits=self.all_logits
        )
        return self.outputs(*out)

    def outputs(self, logits, keys, values) -> tuple:
        outs = [logits] + ([logits[:, -1].argmax(-1)] if self.argmax else [])
        for k, v in zip(keys, values):
            outs += [k, v]
        return tuple(outs)


class _PackedStep(_Step):
    """The packed-rows step (io.lm_interface(packed=True)): positions are given (a row's slots), and a row's
    logits are those of its last real token, seqlens_k - its first position (a right-padded prompt row's last
    token is not the call's last). Nothing here computes from a shape: a captured CUDA graph refuses a value
    that goes from the host to the device inside it (ONNX Runtime's Memcpy nodes)."""

    def forward(self, input_ids, position_ids, seqlens_k, total_sequence_length, caches):
        keys, values = list(caches[0::2]), list(caches[1::2])
        first = position_ids[:, 0]
        last = None if self.all_logits else seqlens_k.long() - first
        rows = (position_ids, seqlens_k, total_sequence_length)
        out = self.lm.step(
            input_ids, keys, values, first, None, in_place=False, all_logits=self.all_logits, rows=rows, last=last
        )
        return self.outputs(*out)


def packs(lowering: str, padding: str, provider: str) -> bool:
    """Whether a whole model exported with `lowering` takes packed rows (io.lm_interface(packed=True)): a
    lowering built by hand and spliced (ort-gqa) with padding "packed", or "auto" on CUDA."""
    return not record(lowering).traced and (padding == "packed" or (padding == "auto" and provider == "cuda"))


def candidates(specs: list[zoo.AttentionSpec], lowering, provider: str, dtype: str, padding: str = "left") -> list[str]:
    """The lowerings to try, each able to express every layer with a static cache, or ExportError."""
    # a left-padded model is fed an attention_mask (io.lm_interface): a bias in each attention node; packed
    # rows have none
    request = {"decode": True, "cache": "static", "dtype": dtype, "provider": provider}

    def reason(lw: str) -> str | None:
        if padding == "packed" and record(lw).traced:
            return f"padding='packed' takes a lowering built by hand (ort-gqa); {lw} is traced and takes left padding"
        for i, spec in enumerate(specs):
            r = why_not(lw, spec, masked=not packs(lw, padding, provider), **request)
            if r:
                return f"layer {i}: {r}"
        return None

    return lowerings_to_try(
        lowering,
        lm_order(provider),
        reason,
        none="no lowering can express every layer of this model with a static cache",
        refused="cannot export a whole model",
    )


def stored_tables_max_len(
    model: nn.Module,
    positions: int | None,
    *,
    lowering: str = "auto",
    provider: str = "cpu",
    dtype: str = "float32",
) -> int | None:
    """The max_len to export `model` with when the caller gives none (the CLI): `positions` (its checkpoint's
    maximum positions) when the lowering the export tries first builds its layers by hand (export/splice.py:
    a traced lowering computes its tables at every call whatever max_len is) and each rotary layer's cos/sin
    table of that many rows fits one shared constant, so the export stores the tables instead of computing
    cos and sin of every position at every call; otherwise None (no cap). Either way a call's buffers are what
    it needs; max_len only caps them. (Should auto's first lowering fail at export and a traced one follow,
    the cap stays without the tables.)"""
    specs = layer_specs(model)
    rotary = [s for s in specs if s.rope_theta is not None]
    if positions is None or not rotary or record(candidates(specs, lowering, provider, dtype)[0]).traced:
        return None
    fits = all(positions * (s.d_k_ // 2) <= splice.SHARED_CONSTANT_ELEMENTS for s in rotary)
    return positions if fits else None


def _check_args(decode, cache, max_len, precision, dtype, provider, overwrite, all_logits, argmax, path) -> None:
    if not isinstance(path, (str, os.PathLike)) or (isinstance(path, str) and not path.strip()):
        raise zoo.InputTypeError(f"path={path!r} must be a file path (str or os.PathLike), e.g. 'model.onnx'")
    for flag, value in (("overwrite", overwrite), ("all_logits", all_logits), ("argmax", argmax)):
        if not isinstance(value, bool):
            raise zoo.InputTypeError(f"{flag}={value!r} must be True or False")
    if decode is not True:
        raise ExportError(f"decode={decode!r}: a whole model is exported as its step with a cache; pass decode=True")
    if not isinstance(cache, str) or cache not in CACHE_CHOICES:
        raise ExportError(f"cache={cache!r} is not one of {', '.join(CACHE_CHOICES)}")
    if cache == "grow":
        raise ExportError("cache='grow': a whole model keeps a static cache, written in place; pass cache='static'")
    if max_len is not None and (isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1):
        raise zoo.ArgumentError(f"max_len={max_len!r} must be a positive int (the most positions a session allocates)")
    check_precision_and_dtype(precision, dtype, provider)


def check_precision_and_dtype(precision, dtype, provider: str) -> None:
    """A whole model's weight precision and float type, for `provider` (decoders and encoder-decoder pairs)."""
    if not isinstance(precision, str) or precision not in PRECISIONS:
        raise PrecisionError(f"precision={precision!r} is not one of {', '.join(PRECISIONS)}")
    if dtype == "float16" and provider == "cpu":
        raise ExportError(FP16_CPU)
    if dtype == "bfloat16" and provider == "cpu":
        raise ExportError(BF16_CPU)
    if dtype not in DTYPES:
        raise ExportError(f"dtype={dtype!r} is not one of {', '.join(DTYPES)}")


def export_lm(
    model: nn.Module,
    path: str | os.PathLike,
    *,
    decode: bool = True,
    cache: str = "auto",
    max_len: int | None = None,
    precision: str = "fp32",
    lowering: str = "auto",
    provider: str = "cpu",
    dtype: str = "float32",
    overwrite: bool = False,
    label: str | None = None,
    all_logits: bool = False,
    argmax: bool = True,
    generation_config: dict | None = None,
    kv_precision: str = "fp32",
    padding: str = "auto",
    **overrides,
) -> LMExportResult:
    """Write `model`'s step as one ONNX graph (see the module docstring); returns what was written.

    cache "auto" and "static" are the same here (the in-place buffers); max_len, when given, is the
    largest capacity a session allocates (recorded as attnzoo.max_len), otherwise each call sizes its
    buffers to its prompt and new tokens. precision int8 / int4 quantizes every projection, MLP and
    the head (MatMulNBits, export/precision.py); the embedding stays fp32. all_logits: logits at
    every position of a call (b t v) instead of the last (b 1 v). argmax: a next_token output.
    generation_config: the checkpoint's generation_config.json (a dict), recorded for generate's defaults.
    kv_precision "int8": the cache as int8 with a scale per position and kv head (export/kv_int8.py).
    padding: "packed" (rows from slot 0, lengths through seqlens_k: a spliced lowering), "left" (a key mask),
    or "auto" (packed on CUDA where the lowering is spliced, else left); recorded as attnzoo.padding."""
    from zoo.files import is_special

    from .saving import EXTERNAL_DATA_BYTES, output_target, save_atomic

    started = time.perf_counter()
    if not is_lm(model):
        raise zoo.InputTypeError(f"export_lm takes a zoo.DecoderLM, got {type(model).__name__}")
    if overrides:
        raise zoo.InputTypeError(f"spec overrides {sorted(overrides)} apply to a name, not to a model")
    _check_args(decode, cache, max_len, precision, dtype, provider, overwrite, all_logits, argmax, path)
    reason = precision_why_not(precision, dtype=dtype, provider=provider, decode=True)
    if reason:
        raise PrecisionError(reason)
    reason = kv_int8.why_not(kv_precision, lowering, dtype)
    if reason:
        raise kv_int8.KVPrecisionError(reason)
    if label is not None and (not isinstance(label, str) or not label.strip()):
        raise zoo.InputTypeError(f"label={label!r} must be a non-empty string")
    if not isinstance(padding, str) or padding not in PADDINGS:
        raise ExportError(f"padding={padding!r} is not one of {', '.join(PADDINGS)}")
    specs, vocab = layer_specs(model), vocab_size(model)
    order = candidates(specs, lowering, provider, dtype, padding)
    if kv_precision != "fp32":
        order = [lw for lw in order if record(lw).int8_cache]
        if not order:
            raise kv_int8.KVPrecisionError(
                f"kv_precision={kv_precision!r}: no lowering of {', '.join(able('int8_cache'))} "
                "can express every layer of this model"
            )
    path = Path(path)
    if path.is_dir():
        raise ExportError(f"{path} is a folder; give a file path such as {path / 'model.onnx'}")
    target = output_target(path, overwrite)
    interfaces = {
        packed: lm_interface(specs, vocab, all_logits=all_logits, argmax=argmax, packed=packed)
        for packed in (False, True)
    }

    def build(lw: str):
        ins, outs = interfaces[packs(lw, padding, provider)]
        stage("trace")  # then optimize (in _trace_lm), quantize (precision.apply) and save (save_atomic)
        onnx_model = _trace_lm(model, record(lw), dtype, ins, outs, all_logits, argmax, specs[0], max_len)
        if kv_precision != "fp32":
            onnx_model = kv_int8.rewrite(onnx_model, len(specs))
        quantized, applied = apply_precision(onnx_model, precision, decode=True)
        cuda_check.check(quantized, provider)  # every attention and MatMulNBits node within the CUDA kernels' rules
        return quantized, applied

    lw, (quantized, applied), notes = first_that_exports(order, lowering, build, "model")
    if applied.note():
        notes.append(applied.note())
    meta = {
        "attnzoo.kind": "lm",
        "attnzoo.name": label or type(model).__name__,
        "attnzoo.layers": str(len(specs)),
        "attnzoo.vocab": str(vocab),
        "attnzoo.layer_specs": json.dumps([s.to_dict() for s in specs], sort_keys=True),
        "attnzoo.version": zoo.__version__,
        "attnzoo.lowering": lw,
        "attnzoo.dtype": dtype,
        "attnzoo.cache": "static",
        "attnzoo.padding": "packed" if packs(lw, padding, provider) else "left",
        **({"attnzoo.max_len": str(max_len)} if max_len else {}),
        **({"attnzoo.kv_precision": kv_precision} if kv_precision != "fp32" else {}),
        **({"attnzoo.generation_config": json.dumps(generation_config)} if generation_config else {}),
        **({RECOMPUTE_AT: str(model.spec.recompute_at)} if model.spec.recompute_at is not None else {}),
        **applied.metadata(),
    }
    quantized.metadata_props.update(meta)
    quantized.producer_name, quantized.producer_version = "attnzoo", zoo.__version__
    # The weights go beside the graph (PATH.data), as onnxruntime-genai and optimum write them: ONNX
    # Runtime then maps them instead of parsing them out of the graph's protobuf, which held a second
    # copy of the weights at load (peak memory 1.9x the weights -> 1.1x, docs/generation.md). A device
    # or FIFO target takes one stream: the weights stay inside it, up to protobuf's limit.
    limit = EXTERNAL_DATA_BYTES if is_special(target) else 0
    external = save_atomic(quantized, target, model, dtype, overwrite=overwrite, limit=limit)
    spec0 = specs[0]
    ins, outs = interfaces[packs(lw, padding, provider)]
    if kv_precision != "fp32":
        ins, outs = kv_int8.interface(ins, outs)
    return LMExportResult(
        path=path,
        name=meta["attnzoo.name"],
        lowering=lw,
        opset=record(lw).opset,
        dtype=dtype,
        layers=len(specs),
        vocab=vocab,
        inputs=[io.summary(spec0, dtype) for io in ins],
        outputs=[io.summary(spec0, dtype) for io in outs],
        op_counts=op_counts(quantized),
        parameters=zoo.count_parameters(model),
        seconds=time.perf_counter() - started,
        file_bytes=target.stat().st_size,
        max_len=max_len,
        external_data=external,
        notes=notes,
        precision=precision,
        precision_method=applied.method.describe() if applied.method.tool != "none" else "",
        kv_precision=kv_precision,
        module=model,
    )


def _trace_lm(model, rec, dtype, ins, outs, all_logits, argmax, spec0, max_len):
    """The configured copy of `model` traced once: (onnx_ir model) with io.lm_interface's names."""
    import onnx_ir as ir

    lm = configured(model, rec, dtype)
    # A lowering built by hand: each layer traced as a placeholder, its built graph spliced in after.
    blocks = None if rec.traced else splice.placeholders(lm)
    torch_dtype = DTYPES[dtype]
    b, t, n = EXAMPLE_B, EXAMPLE_T, EXAMPLE_N
    vocab = outs[0].axes[-1]
    caches = []
    for io in (io for io in ins if io.name.startswith(LM_PAST.split("{", 1)[0])):
        shape = [b if a == "b" else n if a == "n" else a for a in io.axes]
        caches.append(torch.randn(shape).to(torch_dtype))
    dim_b, dim_t, dim_n = torch.export.Dim("b"), torch.export.Dim("t"), torch.export.Dim("n")
    example = {"input_ids": torch.randint(0, vocab, (b, t))}
    dynamic = {"input_ids": {0: dim_b, 1: dim_t}}
    packed = any(io.name == SEQLENS_K.name for io in ins)
    if packed:  # rows of different lengths after a past, so no branch on them is taken
        first = torch.tensor([[EXAMPLE_PAST], [EXAMPLE_PAST + 1]])
        example["position_ids"] = first + torch.arange(t)
        example["seqlens_k"] = (first[:, 0] + t - 1).to(torch.int32)
        example["total_sequence_length"] = torch.tensor(n, dtype=torch.int32)
        dynamic.update(position_ids={0: dim_b, 1: dim_t}, seqlens_k={0: dim_b}, total_sequence_length={})
    else:
        mask = torch.ones(b, n, dtype=torch.bool)
        mask[0, :2] = False  # left padding in the example, so no branch on it is taken
        example.update(attention_mask=mask, past_len=torch.tensor(EXAMPLE_PAST))
        dynamic.update(attention_mask={0: dim_b, 1: dim_n}, past_len={})
    example["caches"] = caches
    dynamic["caches"] = [{0: dim_b, 2: dim_n} for _ in caches]
    with torch.no_grad():
        translations = None if blocks is None else splice.translation_table()
        step = (_PackedStep if packed else _Step)(lm, all_logits, argmax).eval()
        onnx_model = trace(step, example, dynamic, rec, outs, translations)
    stage("optimize")
    if blocks is not None:
        onnx_model = splice.splice(onnx_model, rec, blocks, dtype, max_len)
    onnx_model, _ = fuse_norms(onnx_model)
    for value, io in zip(onnx_model.graph.inputs, ins):
        value.name = io.name
    for value, io in zip(list(onnx_model.graph.inputs) + list(onnx_model.graph.outputs), ins + outs):
        value.shape = ir.Shape(list(io.shape(spec0)))
    check_interface(onnx_model, ins, outs, spec0)
    return onnx_model


__all__ = [
    "LM_PAST",
    "LM_PRESENT",
    "PADDINGS",
    "LMExportResult",
    "export_lm",
    "is_lm",
    "layer_specs",
    "packs",
    "stored_tables_max_len",
]
