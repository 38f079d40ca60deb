"""`ort-gqa`: com.microsoft GroupQueryAttention, built node by node (export/gqa.py): causal
self-attention with d_v = d_k; one packed Q|K|V projection; rotary and the other pieces on Q and K
before the op (gqa_qkv), kv heads and the modifiers' op attributes inside the op, their biases
and masks as its attention_bias; it decodes with past/present in the op, and its static cache is one
bound buffer. export/choice.py says where `auto` takes it. What it cannot carry of each modifier is
the modifier's own word (zoo/modifiers: gqa_limit, gqa_refusal)."""

import zoo

from .. import gqa
from .base import Limit, Lowering
from .kernel_rules import KernelRules, NodeFacts

_GQA_CUDA = "onnxruntime/contrib_ops/cuda/bert/group_query_attention.cc"
_GQA_HELPER = "onnxruntime/contrib_ops/cpu/bert/group_query_attention_helper.h"
_NOT_IMPLEMENTED = (
    "NOT_IMPLEMENTED in the CUDA kernel (the only kernel that takes a bias, the unfused one, has neither)"
)


def _gqa_head_size(facts: NodeFacts) -> int | None:
    """query (b t (h d)), or Q|K|V packed (b t ((h + 2 g) d)) when key is absent."""
    width, h, g = facts.last_dim("query"), facts.attributes.get("num_heads"), facts.attributes.get("kv_num_heads")
    if width is None or not isinstance(h, int) or not isinstance(g, int):
        return None
    return width // (h if "key" in facts.inputs else h + 2 * g)


# What ONNX Runtime's CUDA GroupQueryAttention accepts, read from its source (a main snapshot with
# attention_bias support, PR #29525; the 1.31.1 binary's strings agree: ../shared/gpu/ort-cuda-kernels.md 1a-1c).
def _cuda_node(spec: zoo.AttentionSpec, dtype: str, masked: bool) -> NodeFacts:
    """The GroupQueryAttention node export/gqa.py would write for `spec` (Q|K|V packed; what each modifier
    sets on the op, by its own gqa_op; a bias where a mask is fed or a modifier adds a term), for the CUDA
    rules to read before anything is built."""
    g = gqa._Graph(dtype)
    mods = list(zoo.modifiers.build(spec).values())
    h, kv = spec.heads, spec.kv_heads_
    attrs: dict = {"num_heads": h, "kv_num_heads": kv}
    inputs: dict = {
        "query": (dtype, ("b", "t", (h + 2 * kv) * spec.d_k_)),
        "seqlens_k": ("int32", ("b",)),
        "total_sequence_length": ("int32", ()),
    }
    for mod in mods:
        part = mod.gqa_op(g)
        attrs.update(part.attributes)
        inputs.update({name: (dtype, None) for name in part.inputs})
    if masked or any(type(m).gqa_bias is not zoo.modifiers.Modifier.gqa_bias for m in mods):
        inputs["attention_bias"] = (dtype, ("b", 1, "t", "s"))
    return NodeFacts(CUDA_RULES.op, "GroupQueryAttention", inputs, attrs, outputs=3)


CUDA_RULES = KernelRules(
    op="com.microsoft::GroupQueryAttention",
    sources=(_GQA_CUDA, _GQA_HELPER, "onnxruntime/contrib_ops/cuda/bert/group_query_attention_impl.cu"),
    inputs=gqa.GQA_INPUTS,
    dtypes=("float16", "bfloat16"),  # REGISTER_KERNEL_TYPED(MLFloat16 | BFloat16, ...): no fp32 kernel
    typed={
        "key": "T",
        "value": "T",
        "past_key": "T",
        "past_value": "T",
        "seqlens_k": "int32",
        "total_sequence_length": "int32",
        "cos_cache": "T",
        "sin_cache": "T",
        "position_ids": "int64",
        "attention_bias": "T",  # "attention_bias type must match GroupQueryAttention input type T."
        "head_sink": "T",
    },
    ranks={
        "query": (3,),
        "key": (3,),
        "value": (3,),
        "past_key": (4,),
        "past_value": (4,),
        "seqlens_k": (1,),
        "total_sequence_length": (0, 1),
        "cos_cache": (2,),
        "sin_cache": (2,),
        "position_ids": (2,),
        "attention_bias": (4,),
        "head_sink": (1,),
    },
    heads_axis={"attention_bias": 1},
    pairs=(("key", "value"), ("past_key", "past_value"), ("cos_cache", "sin_cache")),
    attribute_features={
        "softcap": ("softcap", 0.0),
        "smooth_softmax": ("smooth_softmax", 0),
        "local_window": ("local_window_size", -1),
        "do_rotary": ("do_rotary", 0),
        "k_quantized": ("k_quant_type", "NONE"),
        "v_quantized": ("v_quant_type", "NONE"),
        "sliding_window_cache": ("sliding_window_cache", 0),  # 1.31.1's strings: no bias with it
        "qk_output": ("qk_output", 0),
    },
    refused=(
        (("attention_bias", "head_sink"), _NOT_IMPLEMENTED),
        (("attention_bias", "smooth_softmax"), _NOT_IMPLEMENTED),
        (("attention_bias", "k_quantized"), "NOT_IMPLEMENTED in the CUDA kernel (a bias with a quantized KV cache)"),
        (("attention_bias", "v_quantized"), "NOT_IMPLEMENTED in the CUDA kernel (a bias with a quantized KV cache)"),
        (("attention_bias", "sliding_window_cache"), "refused by the CUDA kernel of onnxruntime 1.31.1"),
        (("head_sink", "smooth_softmax"), "head_sink should not be provided when use_smooth_softmax is true"),
        (("output_qk",), "the CUDA kernel has no QK output (CheckNoQKOutput)"),
        (("qk_output",), "the CUDA kernel has no QK output (CheckNoQKOutput)"),
    ),
    requires={"do_rotary": ("cos_cache", "sin_cache")},
    head_size=_gqa_head_size,
    head_multiple=8,  # "head_size must be a multiple of 8"
    head_multiple_with={"cos_cache": 16},  # CheckRotaryCaches: "head_size shall be a multiple of 16"
    padding="right padding only, through seqlens_k (total length - 1 per row); left padding needs attention_bias",
    words={
        "attention_bias": "attention_bias (a mask, a key mask or a position bias)",
        "head_sink": "head_sink (attention sinks)",
        "smooth_softmax": "smooth_softmax",
    },
    fast_kernels=("XQA", "cuDNN", "Flash", "MEA"),
    disqualifies={
        "attention_bias": ("XQA", "cuDNN", "Flash", "MEA"),  # the bias runs on the unfused path only
        "softcap": ("XQA", "cuDNN"),
        "local_window": ("cuDNN",),
        "smooth_softmax": ("XQA", "cuDNN"),
        "head_sink": ("cuDNN",),
        "float32": ("XQA", "cuDNN", "Flash", "MEA"),
    },
    run_time=(
        "attention_bias is (b or 1, num_heads or 1, S, total) with total the VALUE of total_sequence_length "
        "(an int32 scalar read on the host), not the cache's capacity",
        "total_sequence_length = past + S for a growing cache, or any value <= the capacity N of a shared "
        "past/present buffer (a captured CUDA graph needs it constant: N)",
        "cos_cache and sin_cache have at least total_sequence_length rows; their width is <= head_size / 2, "
        "a multiple of 8",
        "S > 1 with S != total_sequence_length (a chunk after a past) needs batch 1",
        "XQA (decode) needs S = 1, a shared past/present buffer, head size 64/128/256 and a group size of "
        "1, 2, 4, 5, 8, 16 or 32",
    ),
)

LOWERING = Lowering(
    name="ort-gqa",
    opset=gqa.OPSET,
    graph="`com.microsoft.GroupQueryAttention`, built node by node (export/gqa.py)",
    op="com.microsoft GroupQueryAttention",
    build=gqa.build,
    cannot=gqa.why_not,
    cuda=(CUDA_RULES,),
    cuda_node=_cuda_node,
    modifiers={
        mod.name: Limit(mod.gqa_limit.text, mod.gqa_refusal, always=mod.gqa_limit.always)
        for mod in zoo.modifiers.MODIFIERS
        if mod.gqa_limit is not None
    },
    # GroupQueryAttention refuses b > 1 with t > 1 and a past ("batch_size must be 1 when sequence_length
    # > 1 and past context is given"): such a chunk runs one row at a time (runtime/lowering_facts.py).
    # The static cache: the op's past and present are one bound buffer of capacity n; seqlens_k =
    # past_len + t - 1 tells it where to write and how many keys to read (export/gqa.py).
    static_cache=None,
    fp16="d_k a multiple of 16 (CPU kernel)",
    kinds="no: causal self-attention with d_v = d_k only; d_k a multiple of 8",
)
