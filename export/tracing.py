"""From a zoo block to an ONNX graph: trace a lowering's eager path with torch's exporter (or let
its record build the graph), with the named interface (runtime/io.py) and dynamic axes checked."""

from __future__ import annotations

import copy
import re

import torch
from einops import rearrange
from torch import nn

import zoo
from runtime.io import HEAD_MASK, KEY_MASK, PAST_KEY, PAST_LEN, PAST_VALUE, TensorIO, X, interface
from zoo.attention import static_step
from zoo.hooks import HookRun, hooked

from .errors import ExportError
from .fast_export import fast_export
from .graphs import quiet
from .lowerings import Lowering, record
from .names import DTYPES as DTYPE_NAMES

DTYPES = dict(zip(DTYPE_NAMES, (torch.float32, torch.float16, torch.bfloat16)))
# bfloat16 graphs are for CUDA: ONNX Runtime 1.31's CPU provider registers no bfloat16 MatMul (measured: the
# session refuses to load, "Could not find an implementation for MatMul(13)").
BF16_CPU = (
    "dtype='bfloat16' is refused on the CPU: ONNX Runtime's CPU provider has no bfloat16 kernels for the graph's "
    "MatMul (the session cannot load); export it for CUDA (provider='cuda', CLI --target cuda) or use float32"
)
# Example sizes for tracing: all >= 2 and all different, so no axis is specialised to a
# constant (an example dim of 1, or two equal example dims, can be baked into the graph).
EXAMPLE_B, EXAMPLE_T, EXAMPLE_S = 2, 5, 7


class _ExportBlock(nn.Module):
    """Named keyword inputs for torch.export; the ONNX mask (b t s) is shared by all heads."""

    def __init__(self, block: zoo.MultiHeadAttention, need_weights: bool, locations: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.block = block
        self.need_weights = need_weights
        self.locations = tuple(locations)

    def forward(self, x, context=None, mask=None, head_mask=None):
        if mask is not None:
            mask = rearrange(mask, "b t s -> b 1 t s")
        if not self.locations:
            return self.block(x, context, mask, need_weights=self.need_weights, head_mask=head_mask)
        cache: dict = {}
        with hooked(self.block, HookRun(cache=cache, names=self.locations)):
            out = self.block(x, context, mask, need_weights=self.need_weights, head_mask=head_mask)
        return (*(out if isinstance(out, tuple) else (out,)), *(cache[loc] for loc in self.locations))


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
        elif io.name == HEAD_MASK.name:
            out[io.name] = torch.rand(shape).to(dtype)
        else:
            out[io.name] = torch.randn(shape).to(dtype)
    return out


def lower(module, lowering, dtype, need_weights, with_mask, with_head_mask, locations=()):
    """Trace one compute path of `module` and return (onnx_ir model, inputs, outputs); `locations`
    (zoo/hooks.py names) become extra outputs after y (and attn)."""
    spec = module.spec
    ins, outs = interface(
        spec, need_weights=need_weights, with_mask=with_mask, with_head_mask=with_head_mask, locations=locations
    )
    rec = record(lowering)
    if not rec.traced:
        return built(rec, module, dtype, ins, outs), ins, outs
    block = traced_block(module, rec, dtype)
    wrapper = _ExportBlock(block, need_weights, locations).eval()
    example = example_inputs(spec, ins, DTYPES[dtype], EXAMPLE_B, EXAMPLE_T, EXAMPLE_S)
    dims = {a: torch.export.Dim(a) for a in ("b", "t", "s")}
    dynamic_shapes = {io.name: {i: dims[a] for i, a in enumerate(io.axes) if a in dims} for io in ins}
    model = trace(wrapper, example, dynamic_shapes, rec, outs)
    # Graph inputs carry the axis vocabulary's names (torch's exporter names them after Dims).
    check_interface(model, ins, outs, spec)
    return model, ins, outs


# Example sizes for tracing a decode model: p past positions, all >= 2 and all different.
EXAMPLE_P = 3


class _DecodeBlock(nn.Module):
    """block.decode with named inputs for torch.export."""

    def __init__(self, block: zoo.MultiHeadAttention) -> None:
        super().__init__()
        self.block = block

    def forward(self, x, past_key, past_value, key_mask=None):
        return self.block.decode(x, past_key, past_value, key_mask=key_mask)


def lower_decode(module, lowering, dtype, with_key_mask):
    """A token-by-token model of `module`: (onnx_ir model, inputs, outputs)."""
    import onnx_ir as ir

    from runtime.io import decode_interface

    spec = module.spec
    ins, outs = decode_interface(spec, with_key_mask=with_key_mask)
    rec = record(lowering)
    if not rec.traced:
        return built(rec, module, dtype, ins, outs), ins, outs
    block = traced_block(module, rec, dtype)
    torch_dtype = DTYPES[dtype]
    g, dk, dv = spec.cache_widths_
    b, t, p = EXAMPLE_B, EXAMPLE_T, EXAMPLE_P
    example = {
        X.name: torch.randn(b, t, spec.d_model).to(torch_dtype),
        PAST_KEY.name: torch.randn(b, g, p, dk).to(torch_dtype),
        PAST_VALUE.name: torch.randn(b, g, p, dv).to(torch_dtype),
    }
    dim_b, dim_t, dim_p = torch.export.Dim("b"), torch.export.Dim("t"), torch.export.Dim("p", min=0)
    dynamic_shapes = {
        X.name: {0: dim_b, 1: dim_t},
        PAST_KEY.name: {0: dim_b, 2: dim_p},
        PAST_VALUE.name: {0: dim_b, 2: dim_p},
    }
    if with_key_mask:
        key_mask = torch.ones(b, p + t, dtype=torch.bool)
        key_mask[0, :2] = False  # left padding in the example, so no branch on it is taken
        example[KEY_MASK.name] = key_mask
        # s = p + t: a sum of two dims, which torch.export's Dim cannot declare; AUTO infers it.
        dynamic_shapes[KEY_MASK.name] = {0: dim_b, 1: torch.export.Dim.AUTO}
    model = trace(_DecodeBlock(block).eval(), example, dynamic_shapes, rec, outs)
    # torch names derived dims by their formulas ("p + t", "s73"): give them the vocabulary's names.
    for value, io in zip(list(model.graph.inputs) + list(model.graph.outputs), ins + outs):
        value.shape = ir.Shape([d if isinstance(d, int) else d for d in io.shape(spec)])
    check_interface(model, ins, outs, spec)
    return model, ins, outs


class _StaticDecodeBlock(nn.Module):
    """zoo.attention.static_step with named inputs: the buffers come back as written copies, which
    ONNX Runtime writes in place when the session binds each buffer as input and output."""

    def __init__(self, block: zoo.MultiHeadAttention) -> None:
        super().__init__()
        self.block = block

    def forward(self, x, past_key, past_value, past_len, key_mask=None):
        return static_step(self.block, x, past_key, past_value, past_len, key_mask, in_place=False)


def lower_static_decode(module, lowering, dtype, with_key_mask):
    """A static-cache decode model of `module` (io.static_interface): (onnx_ir model, inputs, outputs)."""
    import onnx_ir as ir

    from runtime.io import static_interface

    spec = module.spec
    ins, outs = static_interface(spec, with_key_mask=with_key_mask)
    rec = record(lowering)
    if rec.static_cache is not None:
        raise ExportError(f"lowering={lowering!r} cannot keep a static cache: {rec.static_cache}")
    if not rec.traced:
        return built(rec, module, dtype, ins, outs), ins, outs
    block = traced_block(module, rec, dtype)
    torch_dtype = DTYPES[dtype]
    g, dk, dv = spec.cache_widths_
    b, t, n = EXAMPLE_B, EXAMPLE_T, EXAMPLE_S + EXAMPLE_T  # capacity > p + t, all sizes different
    example = {
        X.name: torch.randn(b, t, spec.d_model).to(torch_dtype),
        PAST_KEY.name: torch.randn(b, g, n, dk).to(torch_dtype),
        PAST_VALUE.name: torch.randn(b, g, n, dv).to(torch_dtype),
        PAST_LEN.name: torch.tensor(EXAMPLE_P),
    }
    dim_b, dim_t, dim_n = torch.export.Dim("b"), torch.export.Dim("t"), torch.export.Dim("n")
    dynamic_shapes = {
        X.name: {0: dim_b, 1: dim_t},
        PAST_KEY.name: {0: dim_b, 2: dim_n},
        PAST_VALUE.name: {0: dim_b, 2: dim_n},
        PAST_LEN.name: {},
    }
    if with_key_mask:
        key_mask = torch.ones(b, n, dtype=torch.bool)
        key_mask[0, :2] = False  # left padding in the example, so no branch on it is taken
        example[KEY_MASK.name] = key_mask
        dynamic_shapes[KEY_MASK.name] = {0: dim_b, 1: dim_n}
    model = trace(_StaticDecodeBlock(block).eval(), example, dynamic_shapes, rec, outs)
    for value, io in zip(list(model.graph.inputs) + list(model.graph.outputs), ins + outs):
        value.shape = ir.Shape(list(io.shape(spec)))
    check_interface(model, ins, outs, spec)
    return model, ins, outs


def built(rec: Lowering, module, dtype: str, ins: list[TensorIO], outs: list[TensorIO]):
    """A lowering no torch op exports to (ort-gqa): its record builds the graph by hand."""
    import onnx_ir as ir

    model = ir.from_proto(rec.build(module, dtype, ins, outs))
    check_interface(model, ins, outs, module.spec)
    return model


def traced_block(module: zoo.MultiHeadAttention, rec: Lowering, dtype: str) -> zoo.MultiHeadAttention:
    """The copy of `module` whose eager path torch traces for the lowering `rec`, in the export dtype."""
    return configured(module, rec, dtype)


def configured(module: nn.Module, rec: Lowering, dtype: str) -> nn.Module:
    """A copy of `module` in the export dtype, with every zoo block in it (or the module itself, a
    block) configured for the traced lowering `rec`: the one mechanism a block export and a whole-model
    export (export/lm_export.py) share. Where a block is rewritten (a combined projection written as
    separate ones), the copy holds the new block in the old one's place."""
    root = copy.deepcopy(module).to(DTYPES[dtype]).eval()
    if isinstance(root, zoo.MultiHeadAttention):
        return _configure_block(root, rec)
    for parent in list(root.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, zoo.MultiHeadAttention):
                setattr(parent, name, _configure_block(child, rec))
    return root


def _configure_block(block: zoo.MultiHeadAttention, rec: Lowering) -> zoo.MultiHeadAttention:
    block.fused = rec.fused
    block.sdpa_fp32 = rec.sdpa_fp32  # ORT's CPU Attention overflows fp16 Q K^T (README)
    # GQA: repeat K and V in the graph rather than export SDPA's enable_gqa. ORT 1.31's CPU
    # Attention op with native kv heads measured slower and +47% memory (gqa-decoder-4096,
    # T=2048: 1746 ms, +1208 MB against 1619 ms, +822 MB); the ORT rewriter expands them anyway.
    block.share_kv = False
    if rec.combined_as_separate and block.spec.layout == "combined":
        block = zoo.to_separate(block)
    return block


def trace(
    wrapper: nn.Module, example: dict, dynamic_shapes: dict, rec: Lowering, outs: list[TensorIO], translations=None
):
    """torch's dynamo exporter on `wrapper` at the lowering's opset, then the lowering's own step
    (`after_trace`: a rewrite, a check by node counts). `translations`: torch ops -> onnxscript
    functions (export/splice.py's placeholder), for the exporter's custom_translation_table."""
    try:
        with quiet(), fast_export():
            program = torch.onnx.export(
                wrapper,
                (),
                kwargs=example,
                dynamo=True,
                opset_version=rec.opset,
                dynamic_shapes=dynamic_shapes,
                output_names=[io.name for io in outs],
                optimize=True,
                verbose=False,
                report=False,
                custom_translation_table=translations,
            )
    except Exception as e:  # torch's exporter raises many types; name the request in one
        raise export_failure(rec.name, e) from e
    model = program.model
    model = rec.after_trace(model) if rec.after_trace else model
    exact_scales(model, {float(m.spec.scale_) for m in wrapper.modules() if isinstance(m, zoo.MultiHeadAttention)})
    return model


# A fused attention node's `scale` as the rewriter computed it, from torch's SDPA export: Q and K each times
# sqrt(scale) as a constant of the export's dtype, then the product of the two. In a half dtype that constant
# is rounded (fp16: 2^-11, bf16: 2^-8 of it), so the node's scale is off by up to twice that: 0.0884249 for
# llama's 1/sqrt(128) = 0.0883883 in fp16, a bias on every score. Within this of a block's own scale, the
# block's is meant.
_SCALE_ROUNDING = 2.0**-6


def exact_scales(model, scales: set[float]) -> None:
    """Set every fused attention node's `scale` attribute to the block scale it rounds (the nearest within
    _SCALE_ROUNDING, relative), so a half-precision export scores with its blocks' exact scale, as eager does."""
    import onnx_ir as ir

    for node in model.graph.all_nodes():
        attr = node.attributes.get("scale")
        if attr is None or not scales or node.domain not in ("", "com.microsoft") or "Attention" not in node.op_type:
            continue
        got = attr.as_float()
        best = min(scales, key=lambda s: abs(got - s))
        if got != best and abs(got - best) <= _SCALE_ROUNDING * best:
            node.attributes["scale"] = ir.AttrFloat32("scale", best)


def check_interface(model, ins: list[TensorIO], outs: list[TensorIO], spec) -> None:
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


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def export_failure(lowering: str, e: Exception) -> ExportError:
    """One line naming the request and torch's first line; the full (uncoloured) text in .detail."""
    text = _ANSI.sub("", str(e))
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    err = ExportError(
        f"torch.onnx.export failed for lowering={lowering!r}: {type(e).__name__}: "
        f"{lines[0][:300] if lines else 'no message'}"
    )
    err.detail = text
    return err
