"""`ort-mha`: torch's SDPA export at opset 18, fused by onnxscript's ORT rewriter into
com.microsoft MultiHeadAttention (or the packed Attention contrib op). The export fails unless
exactly one fused node replaced the softmax: a rewriter that matches nothing is the usual failure."""

from .base import Limit, Lowering, expect_ops

FUSED_OPS = ("com.microsoft::MultiHeadAttention", "com.microsoft::Attention", "com.microsoft::GroupQueryAttention")


def _fuse(model):
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    from ..graphs import quiet

    with quiet():
        model, _ = optimize_for_ort(model)
    return expect_ops(
        model,
        FUSED_OPS,
        "onnxscript's ORT rewriter did not fuse this block into one fused attention node "
        "(op counts after rewrite: {counts}); use lowering='onnx-attention' or 'decomposed'",
        absent=("Softmax",),
    )


_NO_SHARED_BUFFER = (
    "MultiHeadAttention's CPU kernel concatenates past and new keys into a new present every step and "
    "shares no buffer on the CPU"
)

LOWERING = Lowering(
    name="ort-mha",
    opset=18,
    graph="`com.microsoft.MultiHeadAttention` (or the packed `Attention` contrib op)",
    op="com.microsoft MultiHeadAttention",
    # ORT's CPU MultiHeadAttention takes Q, K and V as three tensors (its packed-QKV form is not
    # implemented on the CPU), so one MatMul + Split would copy Q|K|V once more: three MatMuls
    # compute the same function without that copy.
    combined_as_separate=True,
    static_cache=f"{_NO_SHARED_BUFFER}; use lowering='decomposed'",
    static_cache_note=_NO_SHARED_BUFFER,
    after_trace=_fuse,
    modifiers={
        "softcap": Limit("com.microsoft MultiHeadAttention has no softcap"),
        "sinks": Limit("com.microsoft MultiHeadAttention has no input for a per-head sink logit"),
    },
)
