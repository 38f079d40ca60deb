"""A hand-built lowering inside a traced whole model: each layer's attention traced as one placeholder
node, then replaced by the graph the lowering's record builds for that block.

    traced():   every zoo block of the model copy answers its static step with the torch op
                attnzoo::spliced_attention (a placeholder torch.export carries through, with a fake
                kernel for shapes); the dynamo exporter translates it to one node
                attnzoo.splice::Attention(x, key_mask, past_len, past_key, past_value) -> (y, present_key,
                present_value), its `layer` an attribute; a packed-rows model's (StaticBuffers.rows)
                attnzoo::spliced_packed_attention, attnzoo.splice::PackedAttention(x, position_ids,
                seqlens_k, total_sequence_length, past_key, past_value).
    splice():   each placeholder becomes `rec.build(block, dtype, *static_interface)`, the same graph a
                static-cache block export of that lowering writes (export/gqa.py for ort-gqa), its values
                renamed under "L{layer}/" and wired to the placeholder's inputs and outputs. Constants
                the layers build alike (positions, masks, rotary tables) are then shared: equal small
                initializers merged, then common subexpressions eliminated, so the layers compute
                their positions and mask once.

So a lowering built node by node (no torch op traces to GroupQueryAttention) is one layer of a whole
model through the same record a block export uses; nothing here names a lowering or a modifier.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

import zoo
from runtime.io import (
    CACHE_KEY,
    CACHE_KEY_MASK,
    CACHE_PRESENT_KEY,
    CACHE_PRESENT_VALUE,
    CACHE_VALUE,
    PAST_LEN,
    POSITION_IDS,
    SEQLENS_K,
    TOTAL_SEQUENCE_LENGTH,
    X,
    Y,
    static_interface,
)

from .errors import ExportError

DOMAIN = "attnzoo.splice"
OP_TYPE = "Attention"
PACKED_OP_TYPE = "PackedAttention"  # a packed-rows layer (io.static_interface(packed=True))
# The placeholder's inputs and outputs, in order, by the names the built graphs use (io.static_interface).
PLACEHOLDER_INPUTS = (X.name, CACHE_KEY_MASK.name, PAST_LEN.name, CACHE_KEY.name, CACHE_VALUE.name)
PACKED_INPUTS = (
    X.name,
    POSITION_IDS.name,
    SEQLENS_K.name,
    TOTAL_SEQUENCE_LENGTH.name,
    CACHE_KEY.name,
    CACHE_VALUE.name,
)
INPUTS = {OP_TYPE: PLACEHOLDER_INPUTS, PACKED_OP_TYPE: PACKED_INPUTS}
PLACEHOLDER_OUTPUTS = (Y.name, CACHE_PRESENT_KEY.name, CACHE_PRESENT_VALUE.name)
# Initializers up to this many elements are merged when equal (positions, masks' constants, rotary tables).
SHARED_CONSTANT_ELEMENTS = 1 << 20


@torch.library.custom_op("attnzoo::spliced_attention", mutates_args=())
def spliced_attention(
    x: Tensor, key_mask: Tensor, past_len: Tensor, past_key: Tensor, past_value: Tensor, layer: int, width: int
) -> tuple[Tensor, Tensor, Tensor]:
    """A placeholder for tracing only: the layer's graph is spliced in after export."""
    raise ExportError(
        f"attnzoo::spliced_attention (layer {layer}) is a placeholder for exporting a whole model; it has no eager "
        "kernel: run the zoo block itself"
    )


@spliced_attention.register_fake
def _(x, key_mask, past_len, past_key, past_value, layer, width):
    return (
        x.new_empty((*x.shape[:-1], width)),
        past_key.new_empty(past_key.shape),
        past_value.new_empty(past_value.shape),
    )


@torch.library.custom_op("attnzoo::spliced_packed_attention", mutates_args=())
def spliced_packed_attention(
    x: Tensor,
    position_ids: Tensor,
    seqlens_k: Tensor,
    total_sequence_length: Tensor,
    past_key: Tensor,
    past_value: Tensor,
    layer: int,
    width: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """The placeholder of a packed-rows layer (tracing only, as spliced_attention)."""
    raise ExportError(
        f"attnzoo::spliced_packed_attention (layer {layer}) is a placeholder for exporting a whole model; it has "
        "no eager kernel: run the zoo block itself"
    )


@spliced_packed_attention.register_fake
def _(x, position_ids, seqlens_k, total_sequence_length, past_key, past_value, layer, width):
    return (
        x.new_empty((*x.shape[:-1], width)),
        past_key.new_empty(past_key.shape),
        past_value.new_empty(past_value.shape),
    )


def _op(onnxscript, op_type: str, kinds: tuple[str, ...], constraints: list):
    from onnx.defs import OpSchema

    param = OpSchema.FormalParameter
    schema = OpSchema(
        op_type,
        DOMAIN,
        1,
        inputs=[param(name, t) for name, t in zip(INPUTS[op_type], kinds)],
        outputs=[param(name, "T") for name in PLACEHOLDER_OUTPUTS],
        type_constraints=[
            ("T", ["tensor(float)", "tensor(float16)", "tensor(bfloat16)"], "activations and caches"),
            *constraints,
        ],
        attributes=[OpSchema.Attribute("layer", OpSchema.AttrType.INT, "the layer whose graph is spliced here")],
    )
    return onnxscript.values.Op(onnxscript.values.Opset(DOMAIN, 1), op_type, schema)


def translation_table() -> dict:
    """The exporter's custom_translation_table for the placeholders: onnxscript functions writing one
    node of DOMAIN each."""
    import onnxscript

    op = _op(
        onnxscript,
        OP_TYPE,
        ("T", "B", "I", "T", "T"),
        [("B", ["tensor(bool)"], "key mask"), ("I", ["tensor(int64)"], "positions written")],
    )
    packed = _op(
        onnxscript,
        PACKED_OP_TYPE,
        ("T", "I", "J", "J", "T", "T"),
        [("I", ["tensor(int64)"], "positions"), ("J", ["tensor(int32)"], "row lengths")],
    )

    def translate(x, key_mask, past_len, past_key, past_value, layer: int, width: int):
        return op(x, key_mask, past_len, past_key, past_value, layer=layer)

    def translate_packed(x, position_ids, seqlens_k, total, past_key, past_value, layer: int, width: int):
        return packed(x, position_ids, seqlens_k, total, past_key, past_value, layer=layer)

    return {
        torch.ops.attnzoo.spliced_attention.default: translate,
        torch.ops.attnzoo.spliced_packed_attention.default: translate_packed,
    }


class _Placeholder(nn.Module):
    """Stands in for layer `layer`'s block while the model is traced: its static step is the placeholder op."""

    def __init__(self, block: zoo.MultiHeadAttention, layer: int) -> None:
        super().__init__()
        self.spec, self.layer = block.spec, layer

    def step(self, x: Tensor, cache) -> tuple[Tensor, Tensor, Tensor]:  # noqa: ANN001 - a zoo.cache.StaticBuffers
        if cache.rows is not None:  # packed rows: each row's length, no key mask
            return torch.ops.attnzoo.spliced_packed_attention(
                x, *cache.rows, cache.key, cache.value, self.layer, self.spec.d_model
            )
        if cache.key_mask is None:
            raise ExportError("a spliced layer needs the model's key mask (attention_mask) in its step")
        return torch.ops.attnzoo.spliced_attention(
            x, cache.key_mask, cache.past_len, cache.key, cache.value, self.layer, self.spec.d_model
        )


def placeholders(lm: nn.Module) -> list[zoo.MultiHeadAttention]:
    """Put a placeholder in place of every layer's block of `lm` (a configured copy); returns the blocks, by layer."""
    blocks = []
    for i, layer in enumerate(lm.layers):
        blocks.append(layer.attn)
        layer.attn = _Placeholder(layer.attn, i)
    return blocks


def splice(model, rec, blocks: list[zoo.MultiHeadAttention], dtype: str, max_len: int | None = None):
    """Replace every placeholder node of `model` (onnx_ir) by `rec.build` of its layer's block; returns `model`.

    max_len (the export's, if any) fixes the positions a call can hold: a layer's tables over them (rotary's
    cos and sin, at most d_k / 2 wide) are then constants, where one fits the shared-constant limit, so that
    every layer reads the same one."""
    import onnx_ir as ir

    graph = model.graph
    found = [node for node in graph if node.domain == DOMAIN and node.op_type in INPUTS]
    if len(found) != len(blocks):
        raise ExportError(f"the traced model holds {len(found)} attention placeholders for {len(blocks)} layers")
    opsets: dict = {}
    # the inputs shaped alike in every layer -> the first layer's Shape of it
    names = INPUTS[found[0].op_type] if found else PLACEHOLDER_INPUTS
    shapes = {name: None for k, name in enumerate(names) if len({str(n.inputs[k].shape) for n in found}) == 1}
    for node in found:
        layer = node.attributes["layer"].as_int()
        spec = blocks[layer].spec
        ins, outs = static_interface(spec, with_key_mask=True, packed=node.op_type == PACKED_OP_TYPE)
        fits = max_len is not None and max_len * (spec.d_k_ // 2) <= SHARED_CONSTANT_ELEMENTS
        rows = max_len if fits else None
        built = ir.from_proto(rec.build(blocks[layer], dtype, ins, outs, in_model=True, max_positions=rows))
        opsets.update(built.opset_imports)
        _inline(graph, node, built.graph, f"L{layer}/", shapes)
    model.opset_imports.pop(DOMAIN, None)
    for domain, version in opsets.items():
        if domain != "":
            model.opset_imports.setdefault(domain, version)
    _share(model)
    return model


def _inline(graph, node, sub, prefix: str, shapes: dict) -> None:
    """Move `sub`'s nodes and initializers into `graph` in place of `node`, its inputs and outputs wired by
    name. `shapes` holds the inputs of the same shape in every layer, each with the first layer's Shape of
    it (None until that layer is inlined): a later layer reads that one, so what the layers derive from
    sizes (positions, masks, rotary tables) is one computation that subexpression elimination merges."""
    import onnx_ir as ir

    by_name = dict(zip(INPUTS[node.op_type], node.inputs))
    for n in list(sub):
        source = n.inputs[0] if n.op_type == "Shape" and n.domain == "" and len(n.inputs) == 1 else None
        if source is None or n.attributes or not source.is_graph_input() or source.name not in shapes:
            continue
        if shapes[source.name] is None:
            shapes[source.name] = n.outputs[0]
        else:
            n.outputs[0].replace_all_uses_with(shapes[source.name])
            sub.remove(n, safe=True)
    for value in sub.inputs:
        if value.name not in by_name:
            raise ExportError(f"the built graph takes {value.name!r}, which the placeholder does not carry")
        ir.convenience.replace_all_uses_with(value, by_name[value.name])
    for name, value in list(sub.initializers.items()):
        sub.initializers.pop(name)
        value.name = prefix + name
        graph.register_initializer(value)
    results = {v.name: v for v in sub.outputs}
    sub.outputs.clear()
    nodes = list(sub)
    sub.remove(nodes)
    for k, n in enumerate(nodes):
        n.name = f"{prefix}{n.name or n.op_type}_{k}"
        for out in n.outputs:
            if out.name:
                out.name = prefix + out.name
    graph.insert_before(node, nodes)
    for name, old in zip(PLACEHOLDER_OUTPUTS, node.outputs):
        new = results[name]
        old_name = old.name
        old.replace_all_uses_with(new, replace_graph_outputs=True)
        new.name = old_name
    graph.remove(node, safe=True)


def _share(model) -> None:
    """Merge equal small initializers, then eliminate common subexpressions and nodes nothing reads."""
    from onnx_ir.passes.common import (
        CommonSubexpressionEliminationPass,
        DeduplicateInitializersPass,
        RemoveUnusedNodesPass,
    )

    DeduplicateInitializersPass(size_limit=SHARED_CONSTANT_ELEMENTS)(model)
    CommonSubexpressionEliminationPass()(model)
    RemoveUnusedNodesPass()(model)


__all__ = ["DOMAIN", "placeholders", "splice", "translation_table"]
