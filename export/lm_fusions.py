"""ONNX Runtime's fused norms in a whole-model graph: each RMSNorm (x * rsqrt(mean(x^2) + eps) * w)
becomes one SimplifiedLayerNormalization, and a residual Add feeding a norm one
SkipSimplifiedLayerNormalization / SkipLayerNormalization (com.microsoft), which also return the sum.

onnxscript's rewrite rules match the nodes torch's exporter writes for zoo.lm_parts.Norm; a norm they
do not match (Gemma's 1 + w, a norm with a bias) stays as it was, so the function is the same either
way and only the node count changes. Measured on the issue's random LLaMA (8 layers): 5 nodes per norm
become 1, and the residual adds join them (docs/generation.md).
"""

from __future__ import annotations

from .graphs import quiet


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
    return model, counts


__all__ = ["fuse_norms"]
