"""ONNX Runtime's fused norms in a whole-model graph: each RMSNorm (x * rsqrt(mean(x^2) + eps) * w)
becomes one SimplifiedLayerNormalization, and a residual Add feeding a norm one
SkipSimplifiedLayerNormalization / SkipLayerNormalization (com.microsoft), which also return the sum.

onnxscript's rewrite rules match the nodes torch's exporter writes for zoo.lm_parts.Norm; a norm they
do not match (a norm with a bias) stays as it was, so the function is the same either way and only the
node count changes. Measured on the issue's random LLaMA (8 layers): 5 nodes per norm become 1, and the
residual adds join them (docs/generation.md).

A norm computed in fp32 inside a float16/bfloat16 model (Gemma's x.float() * rsqrt(...) * (1 + w.float()))
comes out of the rules with its input in the model's type and its scale in fp32: the rule takes in the
Cast of x. ONNX Runtime's SkipSimplifiedLayerNormalization binds input, skip and gamma to one type and
refuses such a node at load ("Type parameter (T) ... bound to different types"); its CUDA
SimplifiedLayerNormalization has no (bfloat16 x, float scale) kernel. So `_unmix` restores what the model
computes: x cast to the scale's type before the norm, and a residual Add left in the model's type (as
the eager model adds) in front of it, so each norm runs in fp32 with kernels CUDA registers.
"""

from __future__ import annotations

from .graphs import quiet
from .lowerings.kernel_rules import KernelRules

# What ONNX Runtime's CUDA kernels of the fused norms accept, read from its source (a main snapshot):
# SimplifiedLayerNormalization is LayerNorm<T, U=float, V, simplified> instantiated for (X, scale) =
# (float, float), (float16, float16), (float, float16), (float16, float), (bfloat16, bfloat16)
# (core/providers/cuda/nn/layer_norm.cc): no bfloat16 input with an fp32 scale. SkipSimplifiedLayerNormalization
# binds input, skip, gamma and bias to one T (float, float16, bfloat16; contrib_ops/cuda/bert/skip_layer_norm.cc).
SIMPLIFIED_NORM_CUDA_RULES = KernelRules(
    op="SimplifiedLayerNormalization",
    sources=("onnxruntime/core/providers/cuda/nn/layer_norm.cc",),
    inputs=("X", "scale"),
    dtypes=("float32", "float16", "bfloat16"),
    t_input="X",
    typed_pairs={
        "scale": (
            ("float32", "float32"),
            ("float16", "float16"),
            ("float32", "float16"),
            ("float16", "float32"),
            ("bfloat16", "bfloat16"),
        )
    },
    attention=False,
)
SKIP_NORM_CUDA_RULES = KernelRules(
    op="com.microsoft::SkipSimplifiedLayerNormalization",
    sources=("onnxruntime/contrib_ops/cuda/bert/skip_layer_norm.cc",),
    inputs=("input", "skip", "gamma", "bias"),
    dtypes=("float32", "float16", "bfloat16"),
    t_input="input",
    typed={"skip": "T", "gamma": "T", "bias": "T"},
    attention=False,
    max_outputs=4,
)


def fuse_norms(model):
    """`model` (onnx_ir) with its norms fused where the rules match; returns (model, {fusion: count})."""
    from onnxscript.rewriter.ort_fusions.rms_normalization import fuse_rms_normalization
    from onnxscript.rewriter.ort_fusions.skip_normalization import (
        fuse_skip_layer_normalization,
        fuse_skip_rms_normalization,
    )

    counts = {}
    with quiet():
        for name, fuse in (
            ("rms_normalization", fuse_rms_normalization),
            ("skip_rms_normalization", fuse_skip_rms_normalization),
            ("skip_layer_normalization", fuse_skip_layer_normalization),
        ):
            counts[name] = fuse(model)
    from onnx_ir.passes.common import RemoveUnusedNodesPass

    RemoveUnusedNodesPass()(model)  # and the constants only the fused nodes read (ORT warned of each)
    counts["unmixed"] = _unmix(model)
    return model, counts


_NORMS = ("SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization")


def _unmix(model) -> int:
    """Every fused RMS norm whose scale's element type differs from its input's, made to compute as the eager
    model does (module docstring): returns how many were changed."""
    import onnx_ir as ir

    graph = model.graph
    changed = 0
    for node in list(graph):
        if node.op_type not in _NORMS or len(node.inputs) < 2:
            continue
        skip = node.op_type == _NORMS[1]
        x, scale = node.inputs[0], node.inputs[2 if skip else 1]
        if x is None or scale is None or x.dtype is None or scale.dtype is None or x.dtype == scale.dtype:
            continue
        eps = node.attributes.get("epsilon")
        attrs = [ir.AttrInt64("axis", -1), ir.AttrInt64("stash_type", 1)]
        attrs.append(ir.AttrFloat32("epsilon", eps.as_float() if eps is not None else 1e-5))
        new = []
        if skip:  # input + skip (+ bias) in the model's type: the residual stream, as the eager model adds
            total = ir.Node("", "Add", [x, node.inputs[1]], name=f"{node.name}_add")
            new.append(total)
            if len(node.inputs) > 3 and node.inputs[3] is not None:
                total = ir.Node("", "Add", [total.outputs[0], node.inputs[3]], name=f"{node.name}_bias")
                new.append(total)
            x = total.outputs[0]
            x.dtype, x.shape = node.inputs[0].dtype, node.inputs[0].shape
        cast = ir.Node("", "Cast", [x], [ir.AttrInt64("to", scale.dtype)], name=f"{node.name}_cast")
        cast.outputs[0].dtype, cast.outputs[0].shape = scale.dtype, x.shape
        norm = ir.Node("", _NORMS[0], [cast.outputs[0], scale], attrs, num_outputs=1, name=f"{node.name}_fp32")
        norm.outputs[0].dtype, norm.outputs[0].shape = scale.dtype, x.shape
        new += [cast, norm]
        graph.insert_before(node, new)
        node.outputs[0].replace_all_uses_with(norm.outputs[0], replace_graph_outputs=True)
        if skip and len(node.outputs) > 3:
            node.outputs[3].replace_all_uses_with(x, replace_graph_outputs=True)
        graph.remove(node, safe=True)
        changed += 1
    return changed


__all__ = ["fuse_norms"]
