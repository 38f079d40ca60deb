"""`onnx-attention`: torch's exporter writes SDPA as the standard ONNX `Attention` op (opset 23).
ORT's CPU kernel forms Q K^T in fp16, so an fp16 export runs the op in fp32 (sdpa_fp32)."""

from .base import Limit, Lowering, expect_ops


def _one_attention_node(model):
    return expect_ops(model, ("Attention",), "expected one ONNX Attention node, found op counts {counts}")


_NO_SHARED_BUFFER = (
    "the Attention op (opset 23) concatenates past_key and this call's keys into a new present every step; "
    "it has no shared past/present buffer"
)

LOWERING = Lowering(
    name="onnx-attention",
    opset=23,
    graph="the standard `Attention` op, opset 23",
    op="ONNX Attention",
    sdpa_fp32=True,
    static_cache=f"{_NO_SHARED_BUFFER} (use lowering='decomposed')",
    static_cache_note=_NO_SHARED_BUFFER,
    after_trace=_one_attention_node,
    modifiers={
        "softcap": Limit(
            "the ONNX Attention op applies its softcap after the mask (a masked score becomes -cap, not -inf), "
            "Gemma-2 caps before masking"
        ),
        "sinks": Limit("the ONNX Attention op (opset 23 to 25) has no input for a per-head sink logit"),
    },
)
