"""Every attention node of a graph against what ONNX Runtime's CUDA kernels accept, on the CPU, statically.

    cuda_refusals(model)   # [] or one line per broken rule: "node L0/gqa (GroupQueryAttention): ..."
    cuda_refusal(model)    # the first of them (and how many more), or None
    attention_nodes(model) # each attention node as the rules see it (kernel_rules.NodeFacts)

The rules are data in the lowering records (export/lowerings/, `Lowering.cuda`: one
kernel_rules.KernelRules per fused op), read from ONNX Runtime's CUDA source; the CPU kernel's own input
check is not the CUDA one, so a CPU run proves nothing here. The graph is read, not run: each node's
inputs by schema name, their element types and shapes (onnx's shape inference, carried across the
com.microsoft nodes it does not know), its attributes and its outputs. export_onnx runs this on every
export for provider="cuda" (`auto` then skips a lowering whose graph breaks a rule)."""

from __future__ import annotations

import os
from typing import Any

import onnx
from onnx import helper

from .errors import ExportError
from .lm_fusions import SIMPLIFIED_NORM_CUDA_RULES, SKIP_NORM_CUDA_RULES
from .lowerings import LOWERING_LIST
from .lowerings.kernel_rules import KernelRules, NodeFacts
from .precision import NBITS_CUDA_RULES

# op ("domain::Op") -> its CUDA rules, from every record that writes it, and the weight precisions' MatMulNBits
RULES: dict[str, KernelRules] = {rules.op: rules for lw in LOWERING_LIST for rules in lw.cuda}
for _rules in (NBITS_CUDA_RULES, SIMPLIFIED_NORM_CUDA_RULES, SKIP_NORM_CUDA_RULES):
    RULES[_rules.op] = _rules
_DEFAULT_DOMAINS = ("", "ai.onnx")
_MAX_ROUNDS = 4096  # rounds of shape inference, each resolving the next com.microsoft nodes (two a layer)


def _op(node: onnx.NodeProto) -> str:
    return node.op_type if node.domain in _DEFAULT_DOMAINS else f"{node.domain}::{node.op_type}"


def _skeleton(model: Any) -> onnx.ModelProto:
    """The graph as a ModelProto without its large weights (each becomes a typed input): what shape
    inference needs, at the size of the graph rather than of its weights. `model`: onnx, onnx_ir, or a path
    (its weights left on disk)."""
    if isinstance(model, (str, os.PathLike)):
        model = onnx.load(os.fspath(model), load_external_data=False)
    if isinstance(model, onnx.ModelProto):
        graph = model.graph
        skeleton = onnx.ModelProto()
        skeleton.ir_version = model.ir_version
        skeleton.opset_import.extend(model.opset_import)
        g = skeleton.graph
        g.node.extend(graph.node)
        g.input.extend(graph.input)
        g.output.extend(graph.output)
        g.value_info.extend(graph.value_info)
        names = {i.name for i in graph.input}
        for init in graph.initializer:
            if init.name in names:
                continue
            size = len(init.raw_data) + 8 * len(init.int64_data) + 4 * (len(init.int32_data) + len(init.float_data))
            if size <= 1024 and init.data_location != onnx.TensorProto.EXTERNAL:
                g.initializer.append(init)  # small constants (shapes, axes) are what inference reads
            else:
                g.input.append(helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
        return skeleton
    # onnx_ir: its own helper serializes the graph with the large initializers lifted out, and restores them
    from onnx_ir.passes.common._c_api_utils import call_onnx_api

    return call_onnx_api(lambda proto: proto, model)


def _read(vi: onnx.ValueInfoProto) -> tuple[str | None, tuple | None]:
    t = vi.type.tensor_type
    dtype = helper.tensor_dtype_to_np_dtype(t.elem_type).name if t.elem_type else None
    if dtype == "bool_":
        dtype = "bool"
    if t.elem_type == onnx.TensorProto.BFLOAT16:
        dtype = "bfloat16"
    shape = None
    if t.HasField("shape"):
        shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim)
    return dtype, shape


def _types(proto: onnx.ModelProto) -> dict[str, tuple[str | None, tuple | None]]:
    """value name -> (element type, shape) for every value shape inference can type, carried across the
    nodes of other domains (output 0 typed as input 0, any other output with input 0's element type)."""
    for _ in range(_MAX_ROUNDS):
        inferred = onnx.shape_inference.infer_shapes(proto, check_type=False, strict_mode=False, data_prop=False)
        g = inferred.graph
        infos = {vi.name: vi for vi in (*g.input, *g.value_info, *g.output) if vi.type.tensor_type.elem_type}
        for init in g.initializer:
            infos.setdefault(init.name, helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
        added = False
        for node in proto.graph.node:
            if node.domain in _DEFAULT_DOMAINS or not node.input or node.input[0] not in infos:
                continue
            first = infos[node.input[0]].type.tensor_type
            for i, out in enumerate(node.output):
                if out and out not in infos:
                    rank = len(first.shape.dim) if first.HasField("shape") and i == 0 else None
                    shape = None if rank is None else [f"{out}_{a}" for a in range(rank)]
                    n = next((a.i for a in node.attribute if a.name == "N"), None)
                    if shape and node.op_type == "MatMulNBits" and n:  # A (.. K) -> Y (.. N): a projection
                        dims = first.shape.dim
                        shape = [d.dim_value or d.dim_param or shape[a] for a, d in enumerate(dims)][:-1] + [n]
                    proto.graph.value_info.append(helper.make_tensor_value_info(out, first.elem_type, shape))
                    added = True
        if not added:
            return {name: _read(vi) for name, vi in infos.items()}
    return {name: _read(vi) for name, vi in infos.items()}  # pragma: no cover - a graph of 2048 layers


def attention_nodes(model: Any) -> list[NodeFacts]:
    """Each node of `model` (onnx, onnx_ir or a path) that some lowering's CUDA rules speak of, as NodeFacts."""
    skeleton = _skeleton(model)
    nodes = [n for n in skeleton.graph.node if _op(n) in RULES]
    if not nodes:
        return []
    types = _types(skeleton)
    out = []
    for node in nodes:
        rules = RULES[_op(node)]
        inputs = {
            rules.inputs[i]: types.get(name, (None, None))
            for i, name in enumerate(node.input)
            if name and i < len(rules.inputs)
        }
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        outputs = sum(1 for o in node.output if o)
        out.append(NodeFacts(_op(node), node.name or node.output[0], inputs, attrs, outputs))
    return out


def cuda_refusals(model: Any) -> list[str]:
    """One line per CUDA rule an attention node of `model` breaks, naming the node, op and input; [] if none."""
    lines = []
    for facts in attention_nodes(model):
        rules = RULES[facts.op]
        for reason in rules.refusals(facts):
            lines.append(f"node {facts.name} ({facts.op.split('::')[-1]}): {reason}")
    return lines


def cuda_refusal(model: Any) -> str | None:
    """The first CUDA rule `model` breaks, in one line (with how many more), or None."""
    lines = cuda_refusals(model)
    if not lines:
        return None
    more = f" (and {len(lines) - 1} more)" if len(lines) > 1 else ""
    return f"ONNX Runtime's CUDA kernel refuses {lines[0]}{more}"


def check(model: Any, provider: str) -> None:
    """ExportError naming the first CUDA rule `model` breaks, when it is made for provider="cuda"."""
    reason = cuda_refusal(model) if provider == "cuda" else None
    if reason:
        raise ExportError(f"{reason}; use another lowering or dtype for --target cuda")


def fast_kernels(model: Any) -> dict[str, tuple[str, ...]]:
    """node name -> the fast CUDA kernels its features leave it (() = the unfused kernel only)."""
    return {f.name: RULES[f.op].kernels_left(f) for f in attention_nodes(model) if RULES[f.op].attention}
