"""ONNX export of any zoo block through one of three lowerings.

    decomposed      the explicit path (einsum, masked softmax, einsum), opset 18; any request
    onnx-attention  torch SDPA -> the standard ONNX `Attention` op, opset 23
    ort-mha         torch SDPA at opset 18, fused by onnxscript's ORT rewriter into
                    com.microsoft MultiHeadAttention / Attention (ONNX Runtime's fused kernels)

Each is an eager compute path of the same module plus an opset (and, for ort-mha, a
rewrite whose success is checked by counting nodes), so parity with eager is by construction
something to verify, not something to re-implement.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import re
import shutil
import tempfile
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from einops import rearrange
from torch import nn

import zoo
from zoo.files import TEMP_PREFIX, ensure_writable_parent, is_special, publish, resolve_output

from .errors import ExportError
from .io import TensorIO, interface
from .names import DEVICES, LOWERINGS
from .names import DTYPES as DTYPE_NAMES

OPSET = {"decomposed": 18, "onnx-attention": 23, "ort-mha": 18, "ort-gqa": 18}
DTYPES = dict(zip(DTYPE_NAMES, (torch.float32, torch.float16)))
# Which lowering "auto" takes, fastest first, per provider and per kind of request, from
# `attnzoo bench` (README, "Choosing a lowering"); the first that can express it wins.
# ORT's CPU MultiHeadAttention has a flash path only without masks: with a causal or user
# mask it materializes the scores, and the standard Attention op then does better. For a
# causal block GroupQueryAttention beats both by far (RoPE+GQA, T=4096: 335 ms, +119 MB against
# the Attention op's 943 ms, +814 MB; with a 256-key window 493 ms against 1477 ms); it cannot
# take a non-causal mask, so a masked non-causal request falls through to the Attention op.
AUTO_PREFERENCE = {
    ("cpu", "unmasked"): ("ort-mha", "onnx-attention", "decomposed"),
    ("cpu", "masked"): ("ort-gqa", "onnx-attention", "ort-mha", "decomposed"),
    # Not yet measured on a GPU: ORT's fused CUDA kernels first, on the design's expectation.
    ("cuda", "unmasked"): ("ort-mha", "onnx-attention", "decomposed"),
    ("cuda", "masked"): ("ort-mha", "onnx-attention", "decomposed"),
}
TARGETS = DEVICES  # the providers lowering="auto" can optimise for


def auto_order(provider: str, spec: zoo.AttentionSpec, *, with_mask: bool) -> tuple[str, ...]:
    """The lowerings "auto" tries, in order, for a request on `provider`."""
    if provider not in TARGETS:
        raise ExportError(f"provider={provider!r} is not one of {', '.join(TARGETS)}")
    return AUTO_PREFERENCE[(provider, "masked" if spec.causal or with_mask else "unmasked")]


FUSED_OPS = (
    "com.microsoft::MultiHeadAttention",
    "com.microsoft::Attention",
    "com.microsoft::GroupQueryAttention",
)
# Ops ONNX Runtime registers in the default ONNX domain though ONNX itself has no such op.
ORT_DEFAULT_DOMAIN_OPS = ("SimplifiedLayerNormalization",)
EXTERNAL_DATA_BYTES = 1_800_000_000  # protobuf's hard limit is 2 GiB; stay clear of it
# Example sizes for tracing: all >= 2 and all different, so no axis is specialised to a
# constant (an example dim of 1, or two equal example dims, can be baked into the graph).
EXAMPLE_B, EXAMPLE_T, EXAMPLE_S = 2, 5, 7


@dataclass
class ExportResult:
    path: Path
    name: str
    lowering: str
    opset: int
    dtype: str
    spec: zoo.AttentionSpec
    inputs: list[tuple[str, str, tuple[int | str, ...]]]
    outputs: list[tuple[str, str, tuple[int | str, ...]]]
    op_counts: dict[str, int]
    parameters: int
    seconds: float
    file_bytes: int
    external_data: Path | None = None
    notes: list[str] = field(default_factory=list)
    module: nn.Module | None = field(default=None, repr=False)  # the eager block exported

    def summary(self) -> str:
        def fmt(ios):
            return ", ".join(f"{n} {d}[{', '.join(map(str, s))}]" for n, d, s in ios)

        ops = ", ".join(f"{k} x{v}" for k, v in sorted(self.op_counts.items(), key=lambda kv: -kv[1]))
        size = self.file_bytes + (self.external_data.stat().st_size if self.external_data else 0)
        weights_note = f", weights in {self.external_data.name}" if self.external_data else ""
        lines = [
            f"wrote {self.path} ({size / 1e6:.2f} MB{weights_note})",
            f"  block     {self.name}: {self.spec.describe()}",
            f"  lowering  {self.lowering} (opset {self.opset}), {self.dtype}, {self.parameters:,} parameters",
            f"  inputs    {fmt(self.inputs)}",
            f"  outputs   {fmt(self.outputs)}",
            f"  nodes     {sum(self.op_counts.values())}: {ops}",
            f"  took      {self.seconds:.1f} s",
        ]
        lines += [f"  note      {n}" for n in self.notes]
        return "\n".join(lines)


class _ExportBlock(nn.Module):
    """Named keyword inputs for torch.export; the ONNX mask (b t s) is shared by all heads."""

    def __init__(self, block: zoo.MultiHeadAttention, need_weights: bool) -> None:
        super().__init__()
        self.block = block
        self.need_weights = need_weights

    def forward(self, x, context=None, mask=None, head_mask=None):
        if mask is not None:
            mask = rearrange(mask, "b t s -> b 1 t s")
        return self.block(x, context, mask, need_weights=self.need_weights, head_mask=head_mask)


def why_not(
    lowering: str,
    spec: zoo.AttentionSpec | None = None,
    *,
    need_weights: bool = False,
    decode: bool = False,
    dtype: str | None = None,
    provider: str | None = None,
) -> str | None:
    """The one-line reason `lowering` cannot express a request for `spec`, or None if it can.

    `provider` ("cpu"/"cuda"; None = any) adds what that provider's kernels cannot run.

    The modifiers (zoo/modifiers.py) each say what a lowering cannot do for them.
    """
    if lowering not in LOWERINGS:
        raise ExportError(f"lowering={lowering!r} is not one of {', '.join(LOWERINGS)} or 'auto'")
    if need_weights and lowering != "decomposed":
        op = {
            "onnx-attention": "ONNX Attention",
            "ort-mha": "com.microsoft MultiHeadAttention",
            "ort-gqa": "com.microsoft GroupQueryAttention",
        }[lowering]
        return f"{op} does not output the softmax weights; use lowering='decomposed' for need_weights"
    if spec is None:
        return None
    if decode:
        reason = decode_why_not(spec)
        if reason:
            return reason
    if lowering == "ort-gqa":
        from . import gqa

        reason = gqa.why_not(spec, dtype=dtype, provider=provider)
        if reason:
            return reason
    return zoo.modifiers.why_not(spec, lowering)


def export_onnx(
    model_or_name: str | zoo.MultiHeadAttention,
    path: str | os.PathLike,
    *,
    lowering: str = "auto",
    dtype: str = "float32",
    need_weights: bool = False,
    with_mask: bool = False,
    with_head_mask: bool = False,
    overwrite: bool = False,
    provider: str = "cpu",
    decode: bool = False,
    **overrides: Any,
) -> ExportResult:
    """Export a zoo block to ONNX with dynamic b, t (and s) axes; returns what was written.

    `model_or_name` is a registered name (with spec-field `overrides`) or a module.
    `provider` steers lowering="auto" (the measured-fastest lowering differs by provider), and a
    lowering whose node that provider has no kernel for is refused (ort-gqa in fp32 on CUDA).
    decode=True writes a token-by-token model (io.decode_interface): x, past_key, past_value
    [, key_mask (b, p+t) with with_mask=True] -> y, present_key, present_value, with b, t and the
    past length p dynamic (p = 0 allowed).
    """
    started = time.perf_counter()
    _check_export_args(path, lowering, dtype, provider, need_weights, with_mask, with_head_mask, overwrite)
    if not isinstance(decode, bool):
        raise zoo.InputTypeError(f"decode={decode!r} must be True or False")
    if decode and (need_weights or with_head_mask):
        raise ExportError("a decode model outputs y and the cache only: drop need_weights / with_head_mask")
    if isinstance(model_or_name, str):  # a size past the machine is refused before any allocation
        _check_export_fits(zoo.spec(model_or_name, **overrides), dtype)
    module, name = _resolve_module(model_or_name, overrides)
    order = auto_order(provider, module.spec, with_mask=with_mask)
    path = Path(path)
    if path.is_dir():
        raise ExportError(f"{path} is a folder; give a file path such as {path / (name + '.onnx')}")
    target = resolve_output(path)  # symlinks followed; a device or FIFO is written through
    if target.exists() and not overwrite and not is_special(target):
        raise FileExistsError(f"{path} exists; pass overwrite=True (CLI: --force) to replace it")
    ensure_writable_parent(target)

    if decode:
        reason = decode_why_not(module.spec)
        if reason:
            raise ExportError(f"cannot export a decode model: {reason}")
        order = decode_order(provider, module.spec)
    request = {"need_weights": need_weights, "decode": decode, "dtype": dtype, "provider": provider}
    if lowering == "auto":
        candidates = [lw for lw in order if why_not(lw, module.spec, **request) is None]
    else:
        reason = why_not(lowering, module.spec, **request)
        if reason:
            raise ExportError(f"lowering={lowering!r} cannot express this request: {reason}")
        candidates = [lowering]

    notes: list[str] = []
    last_error: ExportError | None = None
    for lw in candidates:
        try:
            if decode:
                model, ins, outs = _lower_decode(module, lw, dtype, with_mask)
            else:
                model, ins, outs = _lower(module, lw, dtype, need_weights, with_mask, with_head_mask)
        except ExportError as e:
            if lowering != "auto":
                raise
            notes.append(f"auto: skipped {lw}: {e}")
            last_error = e
            continue
        break
    else:  # pragma: no cover - decomposed always expresses everything
        raise last_error or ExportError("no lowering could express this request")

    counts = op_counts(model)
    if lw == "ort-mha" and module.spec.layout == "combined":
        if counts.get("com.microsoft::Attention"):  # the packed op holds the Q/K/V weights itself
            notes.append("the combined projection is inside ONNX Runtime's packed Attention node")
        elif counts.get("MatMul", 0) >= 3:
            notes.append("the combined projection is written as separate Q/K/V MatMuls (same function, no Split copy)")
    _set_metadata(model, name, module.spec, lw, dtype, decode=decode)
    external = _save_atomic(model, target, module, dtype, overwrite=overwrite)
    return ExportResult(
        path=path,
        name=name,
        lowering=lw,
        opset=OPSET[lw],
        dtype=dtype,
        spec=module.spec,
        inputs=[(io.name, _type_name(io, dtype), io.shape(module.spec)) for io in ins],
        outputs=[(io.name, _type_name(io, dtype), io.shape(module.spec)) for io in outs],
        op_counts=counts,
        parameters=zoo.count_parameters(module),
        seconds=time.perf_counter() - started,
        file_bytes=target.stat().st_size,
        external_data=external,
        notes=notes,
        module=module,
    )


def _check_export_args(path, lowering, dtype, provider, need_weights, with_mask, with_head_mask, overwrite) -> None:
    """Types and choices of export_onnx's arguments, before any work (`with_mask='no'` is not True)."""
    if not isinstance(path, (str, os.PathLike)) or (isinstance(path, str) and not path.strip()):
        raise zoo.InputTypeError(f"path={path!r} must be a file path (str or os.PathLike), e.g. 'model.onnx'")
    flags = {
        "need_weights": need_weights,
        "with_mask": with_mask,
        "with_head_mask": with_head_mask,
        "overwrite": overwrite,
    }
    for flag, value in flags.items():
        if not isinstance(value, bool):
            raise zoo.InputTypeError(f"{flag}={value!r} must be True or False")
    for arg, value, choices in (
        ("lowering", lowering, ("auto", *LOWERINGS)),
        ("dtype", dtype, tuple(DTYPES)),
        ("provider", provider, TARGETS),
    ):
        if not isinstance(value, str) or value not in choices:
            raise ExportError(f"{arg}={value!r} is not one of {', '.join(choices)}")


# Exporting holds the fp32 module, its copy in the export dtype, torch's traced program and
# the serialized ONNX model: about four copies of the parameters at once.
_EXPORT_PARAMETER_COPIES = 4


def _check_export_fits(spec: zoo.AttentionSpec, dtype: str) -> None:
    from zoo.accounting import working_set_bytes
    from zoo.limits import check_fits

    need = _EXPORT_PARAMETER_COPIES * zoo.count_parameters(spec) * 4 + working_set_bytes(
        spec, EXAMPLE_B, EXAMPLE_T, EXAMPLE_S if spec.is_cross else None, score_copies=3
    )
    check_fits(need, f"exporting {spec.describe()} ({zoo.count_parameters(spec):,} parameters, {dtype})")


def _resolve_module(model_or_name, overrides) -> tuple[zoo.MultiHeadAttention, str]:
    if isinstance(model_or_name, str):
        return zoo.create(model_or_name, **overrides).eval(), model_or_name
    if isinstance(model_or_name, zoo.MultiHeadAttention):
        if overrides:
            raise zoo.InputTypeError(f"spec overrides {sorted(overrides)} apply to a name, not to a module")
        return model_or_name, "custom"
    raise zoo.InputTypeError(
        f"export_onnx takes a zoo name or a zoo.MultiHeadAttention, got {type(model_or_name).__name__}"
    )


def _type_name(io: TensorIO, dtype: str) -> str:
    return "bool" if io.kind == "bool" else dtype


def example_inputs(
    spec: zoo.AttentionSpec, ins: list[TensorIO], dtype: torch.dtype, b: int, t: int, s: int
) -> dict[str, torch.Tensor]:
    """Random inputs for the named interface at (b, t, s); masks allow key 0 in every row."""
    s = s if spec.is_cross else t
    dims = {"b": b, "t": t, "s": s}
    out = {}
    for io in ins:
        shape = [dims.get(a, a) for a in io.shape(spec)]
        if io.kind == "bool":
            m = torch.rand(shape) > 0.3
            m[..., 0] = True
            out[io.name] = m
        elif io.name == "head_mask":
            out[io.name] = torch.rand(shape).to(dtype)
        else:
            out[io.name] = torch.randn(shape).to(dtype)
    return out


def _lower(module, lowering, dtype, need_weights, with_mask, with_head_mask):
    """Trace one compute path of `module` and return (onnx_ir model, inputs, outputs)."""
    spec = module.spec
    ins, outs = interface(spec, need_weights=need_weights, with_mask=with_mask, with_head_mask=with_head_mask)
    if lowering == "ort-gqa":
        return _built_gqa(module, dtype, ins, outs), ins, outs
    block = _traced_block(module, lowering, dtype)
    wrapper = _ExportBlock(block, need_weights).eval()
    example = example_inputs(spec, ins, DTYPES[dtype], EXAMPLE_B, EXAMPLE_T, EXAMPLE_S)
    dims = {a: torch.export.Dim(a) for a in ("b", "t", "s")}
    dynamic_shapes = {io.name: {i: dims[a] for i, a in enumerate(io.axes) if a in dims} for io in ins}
    model = _trace(wrapper, example, dynamic_shapes, lowering, outs)
    # Graph inputs carry the axis vocabulary's names (torch's exporter names them after Dims).
    _check_interface(model, ins, outs, spec)
    return model, ins, outs


# Which lowering a decode model takes under "auto", fastest first (`attnzoo bench --decode`).
# Measured with `attnzoo bench NAME --decode --past 128,1024,4096,16384 --batch 1,8` (README,
# "Generation"; docs/bench/decode-*.md): on the CPU, with kv heads shared (GQA/MQA) ort-gqa is the
# fastest at every past length, while the traced lowerings repeat K and V per query head and fall
# behind eager; with one kv head per query head the standard Attention op is fastest (2.3x eager
# at past 4096 for gpt2-small, ort-gqa 2.2x). CUDA: not measured yet (scripts/gpu_check.sh).
DECODE_PREFERENCE = {
    ("cpu", "gqa"): ("ort-gqa", "onnx-attention", "decomposed", "ort-mha"),
    ("cpu", "mha"): ("onnx-attention", "ort-gqa", "decomposed", "ort-mha"),
    ("cuda", "gqa"): ("ort-gqa", "onnx-attention", "ort-mha", "decomposed"),
    ("cuda", "mha"): ("ort-gqa", "onnx-attention", "ort-mha", "decomposed"),
}


def decode_order(provider: str, spec: zoo.AttentionSpec) -> tuple[str, ...]:
    """The lowerings "auto" tries for a decode model, in order."""
    if provider not in TARGETS:
        raise ExportError(f"provider={provider!r} is not one of {', '.join(TARGETS)}")
    return DECODE_PREFERENCE[(provider, "gqa" if spec.group_size > 1 else "mha")]


# Example sizes for tracing a decode model: p past positions, all >= 2 and all different.
EXAMPLE_P = 3


def decode_why_not(spec: zoo.AttentionSpec) -> str | None:
    """Why a block cannot decode token by token, or None."""
    if spec.is_cross:
        return "decoding with a KV cache is for causal self-attention; this block is cross-attention"
    if not spec.causal:
        return "decoding with a KV cache is for causal self-attention; this block has causal=False"
    return None


class _DecodeBlock(nn.Module):
    """block.decode with named inputs for torch.export."""

    def __init__(self, block: zoo.MultiHeadAttention) -> None:
        super().__init__()
        self.block = block

    def forward(self, x, past_key, past_value, key_mask=None):
        return self.block.decode(x, past_key, past_value, key_mask=key_mask)


def _lower_decode(module, lowering, dtype, with_key_mask):
    """A token-by-token model of `module`: (onnx_ir model, inputs, outputs)."""
    import onnx_ir as ir

    from .io import decode_interface

    spec = module.spec
    ins, outs = decode_interface(spec, with_key_mask=with_key_mask)
    if lowering == "ort-gqa":
        return _built_gqa(module, dtype, ins, outs), ins, outs
    block = _traced_block(module, lowering, dtype)
    torch_dtype = DTYPES[dtype]
    b, t, p = EXAMPLE_B, EXAMPLE_T, EXAMPLE_P
    example = {
        "x": torch.randn(b, t, spec.d_model).to(torch_dtype),
        "past_key": torch.randn(b, spec.kv_heads_, p, spec.d_k_).to(torch_dtype),
        "past_value": torch.randn(b, spec.kv_heads_, p, spec.d_v_).to(torch_dtype),
    }
    dim_b, dim_t, dim_p = torch.export.Dim("b"), torch.export.Dim("t"), torch.export.Dim("p", min=0)
    dynamic_shapes = {
        "x": {0: dim_b, 1: dim_t},
        "past_key": {0: dim_b, 2: dim_p},
        "past_value": {0: dim_b, 2: dim_p},
    }
    if with_key_mask:
        key_mask = torch.ones(b, p + t, dtype=torch.bool)
        key_mask[0, :2] = False  # left padding in the example, so no branch on it is taken
        example["key_mask"] = key_mask
        # s = p + t: a sum of two dims, which torch.export's Dim cannot declare; AUTO infers it.
        dynamic_shapes["key_mask"] = {0: dim_b, 1: torch.export.Dim.AUTO}
    model = _trace(_DecodeBlock(block).eval(), example, dynamic_shapes, lowering, outs)
    # torch names derived dims by their formulas ("p + t", "s73"): give them the vocabulary's names.
    for value, io in zip(list(model.graph.inputs) + list(model.graph.outputs), ins + outs):
        value.shape = ir.Shape([d if isinstance(d, int) else d for d in io.shape(spec)])
    _check_interface(model, ins, outs, spec)
    return model, ins, outs


def _built_gqa(module, dtype: str, ins: list[TensorIO], outs: list[TensorIO]):
    """ort-gqa: no torch op exports to GroupQueryAttention, so the graph is built by hand (gqa.py)."""
    import onnx_ir as ir

    from . import gqa

    model = ir.from_proto(gqa.build(module, dtype, ins, outs))
    _check_interface(model, ins, outs, module.spec)
    return model


def _traced_block(module: zoo.MultiHeadAttention, lowering: str, dtype: str) -> zoo.MultiHeadAttention:
    """The copy of `module` whose eager path torch traces for `lowering`, in the export dtype."""
    block = copy.deepcopy(module).to(DTYPES[dtype]).eval()
    block.fused = lowering != "decomposed"
    block.sdpa_fp32 = lowering == "onnx-attention"  # ORT's CPU Attention overflows fp16 Q K^T (README)
    # GQA: repeat K and V in the graph rather than export SDPA's enable_gqa. ORT 1.31's CPU
    # Attention op with native kv heads measured slower and +47% memory (gqa-decoder-4096,
    # T=2048: 1746 ms, +1208 MB against 1619 ms, +822 MB); the ORT rewriter expands them anyway.
    block.share_kv = False
    if lowering == "ort-mha" and module.spec.layout == "combined":
        # ORT's CPU MultiHeadAttention takes Q, K and V as three tensors (its packed-QKV form is
        # not implemented on the CPU), so one MatMul + Split would copy all of Q|K|V once more.
        # Three MatMuls compute the same function without that copy (bench: see README).
        block = zoo.to_separate(block)
    return block


def _trace(wrapper: nn.Module, example: dict, dynamic_shapes: dict, lowering: str, outs: list[TensorIO]):
    """torch's dynamo exporter on `wrapper`, then the lowering's own step, checked by node counts:
    onnx-attention must hold one Attention node; ort-mha is onnxscript's ORT rewrite, which must
    leave exactly one fused attention node and no Softmax (a rewriter that matches nothing is the
    usual failure)."""
    try:
        with _quiet():
            program = torch.onnx.export(
                wrapper,
                (),
                kwargs=example,
                dynamo=True,
                opset_version=OPSET[lowering],
                dynamic_shapes=dynamic_shapes,
                output_names=[io.name for io in outs],
                optimize=True,
                verbose=False,
                report=False,
            )
    except Exception as e:  # torch's exporter raises many types; name the request in one
        raise _export_failure(lowering, e) from e
    model = program.model
    counts = op_counts(model)
    if lowering == "onnx-attention" and counts.get("Attention", 0) != 1:
        raise ExportError(f"expected one ONNX Attention node, found op counts {counts}")
    if lowering == "ort-mha":
        from onnxscript.rewriter.ort_fusions import optimize_for_ort

        with _quiet():
            model, _ = optimize_for_ort(model)
        counts = op_counts(model)
        if sum(counts.get(op, 0) for op in FUSED_OPS) != 1 or counts.get("Softmax", 0):
            raise ExportError(
                f"onnxscript's ORT rewriter did not fuse this block into one fused attention node "
                f"(op counts after rewrite: {counts}); use lowering='onnx-attention' or 'decomposed'"
            )
    return model


def op_counts(model) -> dict[str, int]:
    """{'MatMul': 4, 'com.microsoft::MultiHeadAttention': 1, ...} for an onnx_ir or onnx model."""
    import onnx

    nodes = model.graph.node if isinstance(model, onnx.ModelProto) else model.graph
    c = Counter(f"{n.domain}::{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type for n in nodes)
    return dict(sorted(c.items()))


def _check_interface(model, ins: list[TensorIO], outs: list[TensorIO], spec) -> None:
    """Stage 1 and 2 of validation: the names, then the dynamic axes."""
    got_in = [v.name for v in model.graph.inputs]
    got_out = [v.name for v in model.graph.outputs]
    want_in, want_out = [io.name for io in ins], [io.name for io in outs]
    if got_in != want_in or got_out != want_out:
        raise ExportError(f"exported graph has inputs {got_in} / outputs {got_out}; expected {want_in} / {want_out}")
    for v, io in zip(list(model.graph.inputs) + list(model.graph.outputs), ins + outs):
        dims = tuple(d if isinstance(d, int) else str(d) for d in v.shape) if v.shape is not None else None
        want = io.shape(spec)
        if dims is None or len(dims) != len(want):
            raise ExportError(f"{io.name}: exported rank {dims} differs from {want}")
        for d, w in zip(dims, want):
            if isinstance(w, int) and d != w:
                raise ExportError(f"{io.name}: exported shape {dims}, expected {want}")
            if isinstance(w, str) and isinstance(d, int):
                raise ExportError(f"{io.name}: axis {w!r} was baked in as {d} (shape {dims}); it must stay dynamic")


def _set_metadata(model, name: str, spec: zoo.AttentionSpec, lowering: str, dtype: str, *, decode: bool) -> None:
    model.metadata_props.update(
        {
            "attnzoo.kind": "decode" if decode else "full",
            "attnzoo.name": name,
            "attnzoo.spec": json.dumps(spec.to_dict(), sort_keys=True),
            "attnzoo.parameters": str(zoo.count_parameters(spec)),
            "attnzoo.version": zoo.__version__,
            "attnzoo.lowering": lowering,
            "attnzoo.dtype": dtype,
        }
    )
    model.producer_name = "attnzoo"
    model.producer_version = zoo.__version__


def _save_atomic(model, path: Path, module, dtype: str, *, overwrite: bool = False) -> Path | None:
    """Write into a temp folder beside `path` (same filesystem), check it, then publish it.

    The no-overwrite rule is enforced by the publishing step itself (see `publish`), not only
    by a check before the work: two exports racing for one name cannot both win."""
    import onnx_ir as ir

    path.parent.mkdir(parents=True, exist_ok=True)
    itemsize = torch.tensor([], dtype=DTYPES[dtype]).element_size()
    big = zoo.count_parameters(module) * itemsize > EXTERNAL_DATA_BYTES
    data_name = path.name + ".data" if big else None
    special = is_special(path)
    if special and big:
        raise ExportError(f"{path} is not a regular file, and this model keeps its weights in a .data file beside it")
    try:
        tmpdir = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX, dir=None if special else path.parent))
    except OSError as e:
        raise ExportError(f"cannot write {path}: {e.strerror or e}") from None
    try:
        tmp = tmpdir / path.name
        try:
            ir.save(model, tmp, external_data=data_name)
        except OSError as e:
            raise ExportError(f"cannot write {path}: {e.strerror or e}") from None
        _check_saved(tmp, model)
        data_path = path.parent / data_name if data_name else None
        if data_path is not None:
            publish(tmpdir / data_name, data_path, overwrite=overwrite)
        try:
            publish(tmp, path, overwrite=overwrite)
        except BaseException:
            if data_path is not None and not overwrite:
                data_path.unlink(missing_ok=True)  # ours: published a moment ago, now orphaned
            raise
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    return path.parent / data_name if data_name else None


def _check_saved(tmp: Path, model) -> None:
    """onnx.checker with strict shape inference; for a graph holding ORT-only ops in the default
    domain (onnx.checker rejects those), ONNX Runtime's own loader is the check instead."""
    import onnx

    if not any(op in ORT_DEFAULT_DOMAIN_OPS for op in op_counts(model)):
        try:
            onnx.checker.check_model(str(tmp), full_check=True)
        except Exception as e:
            raise ExportError(f"the exported model fails onnx.checker (full check): {e}") from e
        return
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    try:
        ort.InferenceSession(str(tmp), opts, providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - ORT raises its own types
        raise ExportError(f"ONNX Runtime cannot load the exported model: {str(e).splitlines()[0]}") from e


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _export_failure(lowering: str, e: Exception) -> ExportError:
    """One line naming the request and torch's first line; the full (uncoloured) text in .detail."""
    text = _ANSI.sub("", str(e))
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    err = ExportError(
        f"torch.onnx.export failed for lowering={lowering!r}: {type(e).__name__}: "
        f"{lines[0][:300] if lines else 'no message'}"
    )
    err.detail = text
    return err


class _quiet:
    """Silence torch.onnx's progress prints and warnings for one call (they're not ours)."""

    def __enter__(self):
        import contextlib
        import io

        self._stack = contextlib.ExitStack()
        self._stack.enter_context(warnings.catch_warnings())
        warnings.simplefilter("ignore")
        self._stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
        level = logging.root.manager.disable
        logging.disable(logging.WARNING)
        self._stack.callback(logging.disable, level)
        return self

    def __exit__(self, *exc):
        self._stack.close()
        return False
