"""`onnx-attention`: torch's exporter writes SDPA as the standard ONNX `Attention` op (opset 23).
ORT's CPU kernel forms Q K^T in fp16, so an fp16 export runs the op in fp32 (sdpa_fp32)."""

from .base import Limit, Lowering, expect_ops
from .kernel_rules import KernelRules, NodeFacts


def _attention_head_size(facts: NodeFacts) -> int | None:
    """Q (b h t d), or (b t (h d)) with q_num_heads."""
    width, shape, h = facts.last_dim("Q"), facts.shape("Q"), facts.attributes.get("q_num_heads")
    if width is None or shape is None:
        return None
    if len(shape) == 4:
        return width
    return width // h if isinstance(h, int) and h else None


# What ONNX Runtime's CUDA kernel of the ONNX Attention op accepts (../shared/gpu/ort-cuda-kernels.md 4,
# from main; the softcap and softmax_precision refusals from an older main, not yet seen in 1.31.1's).
CUDA_RULES = KernelRules(
    op="Attention",
    sources=("onnxruntime/core/providers/cuda/llm/attention.cc",),
    inputs=("Q", "K", "V", "attn_mask", "past_key", "past_value", "nonpad_kv_seqlen"),
    dtypes=("float32", "float16", "bfloat16"),
    t_input="Q",
    typed={"K": "T", "V": "T", "past_key": "T", "past_value": "T", "nonpad_kv_seqlen": "int64"},
    ranks={"Q": (3, 4), "K": (3, 4), "V": (3, 4), "attn_mask": (2, 3, 4), "past_key": (4,), "past_value": (4,)},
    pairs=(("past_key", "past_value"),),
    attribute_features={
        "is_causal": ("is_causal", 0),
        "softcap": ("softcap", 0.0),
        "softmax_precision": ("softmax_precision", 0),
    },
    refused=(
        (("softcap",), "not supported in the CUDA Attention op (older main; unchecked in 1.31.1)"),
        (("softmax_precision",), "not supported in the CUDA Attention op (older main; unchecked in 1.31.1)"),
    ),
    head_size=_attention_head_size,
    max_outputs=4,  # Y, present_key, present_value, qk_matmul_output
    padding="attn_mask (bool or additive, broadcast to (b h t s)); opset 24's nonpad_kv_seqlen keeps Flash",
    fast_kernels=("cuDNN", "Flash", "MEA"),
    disqualifies={
        "attn_mask": ("Flash",),  # MEA takes it as a bias when total % 4 == 0
        "output_qk": ("Flash", "MEA"),
        "float32": ("cuDNN", "Flash"),
    },
    run_time=(
        "cuDNN only decodes (q length 1) with opset 24's nonpad_kv_seqlen",
        "Flash refuses is_causal with q length != kv length and no past",
        "with an attn_mask MEA needs total_sequence_length % 4 == 0; else the unfused kernel materialises "
        "(b h t s) scores in fp32",
    ),
)


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
    encoder_decoder=True,
    op="ONNX Attention",
    sdpa_fp32=True,
    static_cache=f"{_NO_SHARED_BUFFER} (use lowering='decomposed')",
    static_cache_note=_NO_SHARED_BUFFER,
    after_trace=_one_attention_node,
    cuda=(CUDA_RULES,),
    modifiers={
        "softcap": Limit(
            "the ONNX Attention op applies its softcap after the mask (a masked score becomes -cap, not -inf), "
            "Gemma-2 caps before masking"
        ),
        "sinks": Limit("the ONNX Attention op (opset 23 to 25) has no input for a per-head sink logit"),
    },
)
