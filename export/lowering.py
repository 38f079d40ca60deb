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
import shutil
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from einops import rearrange
from torch import nn

import zoo

from .io import TensorIO, interface

LOWERINGS = ("decomposed", "onnx-attention", "ort-mha")
OPSET = {"decomposed": 18, "onnx-attention": 23, "ort-mha": 18}
DTYPES = {"float32": torch.float32, "float16": torch.float16}
# Which lowering "auto" takes, fastest first, per provider and per kind of request, from
# `attnzoo bench` (README, "Choosing a lowering"); the first that can express it wins.
# ORT's CPU MultiHeadAttention has a flash path only without masks: with a causal or user
# mask it materializes the scores, and the standard Attention op then does better.
AUTO_PREFERENCE = {
    ("cpu", "unmasked"): ("ort-mha", "onnx-attention", "decomposed"),
    ("cpu", "masked"): ("onnx-attention", "ort-mha", "decomposed"),
    # Not yet measured on a GPU: ORT's fused CUDA kernels first, on the design's expectation.
    ("cuda", "unmasked"): ("ort-mha", "onnx-attention", "decomposed"),
    ("cuda", "masked"): ("ort-mha", "onnx-attention", "decomposed"),
}
TARGETS = ("cpu", "cuda")


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
EXTERNAL_DATA_BYTES = 1_800_000_000  # protobuf's hard limit is 2 GiB; stay clear of it
# Example sizes for tracing: all >= 2 and all different, so no axis is specialised to a
# constant (an example dim of 1, or two equal example dims, can be baked into the graph).
EXAMPLE_B, EXAMPLE_T, EXAMPLE_S = 2, 5, 7


class ExportError(ValueError):
    """A lowering cannot express a request, or its result failed a check."""


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


def why_not(lowering: str, *, need_weights: bool) -> str | None:
    """The reason `lowering` cannot express a request, or None if it (statically) can."""
    if lowering not in LOWERINGS:
        raise ExportError(f"lowering={lowering!r} is not one of {', '.join(LOWERINGS)} or 'auto'")
    if need_weights and lowering != "decomposed":
        op = "ONNX Attention" if lowering == "onnx-attention" else "com.microsoft MultiHeadAttention"
        return f"{op} does not output the softmax weights; use lowering='decomposed' for need_weights"
    return None


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
    **overrides: Any,
) -> ExportResult:
    """Export a zoo block to ONNX with dynamic b, t (and s) axes; returns what was written.

    `model_or_name` is a registered name (with spec-field `overrides`) or a module.
    `provider` only steers lowering="auto" (the measured-fastest lowering differs by provider).
    """
    started = time.perf_counter()
    module, name = _resolve_module(model_or_name, overrides)
    if dtype not in DTYPES:
        raise ExportError(f"dtype={dtype!r} is not one of {', '.join(DTYPES)}")
    order = auto_order(provider, module.spec, with_mask=with_mask)
    path = Path(path)
    if path.is_dir():
        raise ExportError(f"{path} is a folder; give a file path such as {path / (name + '.onnx')}")
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} exists; pass overwrite=True (CLI: --force) to replace it")
    ensure_writable_parent(path)

    if lowering == "auto":
        candidates = [lw for lw in order if why_not(lw, need_weights=need_weights) is None]
    else:
        reason = why_not(lowering, need_weights=need_weights)
        if reason:
            raise ExportError(f"lowering={lowering!r} cannot express this request: {reason}")
        candidates = [lowering]

    notes: list[str] = []
    last_error: ExportError | None = None
    for lw in candidates:
        try:
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

    if lw == "ort-mha" and module.spec.layout == "combined":
        notes.append("the combined projection is written as separate Q/K/V MatMuls (same function, no Split copy)")
    _set_metadata(model, name, module.spec, lw, dtype)
    external = _save_atomic(model, path, module, dtype)
    return ExportResult(
        path=path,
        name=name,
        lowering=lw,
        opset=OPSET[lw],
        dtype=dtype,
        spec=module.spec,
        inputs=[(io.name, _type_name(io, dtype), io.shape(module.spec)) for io in ins],
        outputs=[(io.name, _type_name(io, dtype), io.shape(module.spec)) for io in outs],
        op_counts=op_counts(model),
        parameters=zoo.count_parameters(module),
        seconds=time.perf_counter() - started,
        file_bytes=path.stat().st_size,
        external_data=external,
        notes=notes,
        module=module,
    )


def ensure_writable_parent(path: Path) -> None:
    """Create `path`'s folder if needed and check it can be written, before any long work."""
    for folder in (path.parent, *path.parent.parents):
        if folder.exists():
            if not folder.is_dir():
                raise ExportError(f"cannot write {path}: {folder} is not a folder")
            break
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ExportError(f"cannot create the folder for {path}: {e.strerror or e}") from None
    if not os.access(path.parent, os.W_OK):
        raise ExportError(f"cannot write to {path.parent}")


def write_atomic(path: Path, write: Callable[[Path], None]) -> None:
    """write(tmp) into a temp file beside `path`, then rename it into place (no half files)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=path.suffix, dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _resolve_module(model_or_name, overrides) -> tuple[zoo.MultiHeadAttention, str]:
    if isinstance(model_or_name, str):
        return zoo.create(model_or_name, **overrides).eval(), model_or_name
    if isinstance(model_or_name, zoo.MultiHeadAttention):
        if overrides:
            raise TypeError(f"spec overrides {sorted(overrides)} apply to a name, not to a module")
        return model_or_name, "custom"
    raise TypeError(f"export_onnx takes a zoo name or a zoo.MultiHeadAttention, got {type(model_or_name).__name__}")


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
    block = copy.deepcopy(module).to(DTYPES[dtype]).eval()
    block.fused = lowering != "decomposed"
    # GQA: repeat K and V in the graph rather than export SDPA's enable_gqa. ORT 1.31's CPU
    # Attention op with native kv heads measured slower and +47% memory (gqa-decoder-4096,
    # T=2048: 1746 ms, +1208 MB against 1619 ms, +822 MB); the ORT rewriter expands them anyway.
    block.share_kv = False
    if lowering == "ort-mha" and spec.layout == "combined":
        # ORT's CPU MultiHeadAttention takes Q, K and V as three tensors (its packed-QKV form is
        # not implemented on the CPU), so one MatMul + Split would copy all of Q|K|V once more.
        # Three MatMuls compute the same function without that copy (bench: see README).
        block = zoo.to_separate(block)
    wrapper = _ExportBlock(block, need_weights).eval()
    example = example_inputs(spec, ins, DTYPES[dtype], EXAMPLE_B, EXAMPLE_T, EXAMPLE_S)
    dims = {a: torch.export.Dim(a) for a in ("b", "t", "s")}
    dynamic_shapes = {io.name: {i: dims[a] for i, a in enumerate(io.axes) if a in dims} for io in ins}
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
        raise ExportError(f"torch.onnx.export failed for lowering={lowering!r}: {type(e).__name__}: {e}") from e
    model = program.model
    counts = op_counts(model)
    if lowering == "onnx-attention" and counts.get("Attention", 0) != 1:
        raise ExportError(f"expected one ONNX Attention node, found op counts {counts}")
    if lowering == "ort-mha":
        from onnxscript.rewriter.ort_fusions import optimize_for_ort

        with _quiet():
            model, _ = optimize_for_ort(model)
        counts = op_counts(model)
        fused = sum(counts.get(op, 0) for op in FUSED_OPS)
        if fused != 1 or counts.get("Softmax", 0):
            raise ExportError(
                f"onnxscript's ORT rewriter did not fuse this block into one fused attention node "
                f"(op counts after rewrite: {counts}); use lowering='onnx-attention' or 'decomposed'"
            )
    # Graph inputs carry the axis vocabulary's names (torch's exporter names them after Dims).
    _check_interface(model, ins, outs, spec)
    return model, ins, outs


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


def _set_metadata(model, name: str, spec: zoo.AttentionSpec, lowering: str, dtype: str) -> None:
    model.metadata_props.update(
        {
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


def _save_atomic(model, path: Path, module, dtype: str) -> Path | None:
    """Write into a temp folder beside `path`, check it, then rename into place."""
    import onnx
    import onnx_ir as ir

    path.parent.mkdir(parents=True, exist_ok=True)
    itemsize = torch.tensor([], dtype=DTYPES[dtype]).element_size()
    big = zoo.count_parameters(module) * itemsize > EXTERNAL_DATA_BYTES
    data_name = path.name + ".data" if big else None
    tmpdir = Path(tempfile.mkdtemp(prefix=".attnzoo-", dir=path.parent))
    try:
        tmp = tmpdir / path.name
        ir.save(model, tmp, external_data=data_name)
        try:
            onnx.checker.check_model(str(tmp), full_check=True)  # includes strict shape inference
        except Exception as e:
            raise ExportError(f"the exported model fails onnx.checker (full check): {e}") from e
        if data_name:
            os.replace(tmpdir / data_name, path.parent / data_name)
        os.replace(tmp, path)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    return path.parent / data_name if data_name else None


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
