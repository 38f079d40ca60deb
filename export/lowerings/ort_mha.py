"""`ort-mha`: torch's SDPA export at opset 18, fused by onnxscript's ORT rewriter into
com.microsoft MultiHeadAttention (or the packed Attention contrib op). The export fails unless
exactly one fused node replaced the softmax: a rewriter that matches nothing is the usual failure."""

from .base import Limit, Lowering, expect_ops
from .kernel_rules import KernelRules, NodeFacts

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


def _mha_head_size(facts: NodeFacts) -> int | None:
    """query (b t (h d)) with K and V apart; a packed (b t h 3 d) query has d last."""
    width, h = facts.last_dim("query"), facts.attributes.get("num_heads")
    shape = facts.shape("query")
    if width is None or not isinstance(h, int) or shape is None:
        return None
    return width if len(shape) == 5 else width // h


# What ONNX Runtime's CUDA MultiHeadAttention accepts (../shared/gpu/ort-cuda-kernels.md 3; the 1.31.1
# binary registers T float, float16 and bfloat16). Nothing our graphs use is refused: the rules say
# which features keep a node off the fast kernels.
MHA_CUDA_RULES = KernelRules(
    op="com.microsoft::MultiHeadAttention",
    sources=(
        "onnxruntime/contrib_ops/cuda/bert/multihead_attention.cc",
        "onnxruntime/contrib_ops/cpu/bert/multihead_attention_helper.h",
    ),
    inputs=(
        "query",
        "key",
        "value",
        "bias",
        "key_padding_mask",
        "attention_bias",
        "past_key",
        "past_value",
        "past_sequence_length",
        "cache_indirection",
    ),
    dtypes=("float32", "float16", "bfloat16"),
    typed={
        "key": "T",
        "value": "T",
        "bias": "T",
        "key_padding_mask": "int32",
        "attention_bias": "T",
        "past_key": "T",
        "past_value": "T",
        "past_sequence_length": "int32",
        "cache_indirection": "int32",
    },
    ranks={"query": (3, 5), "attention_bias": (4,), "past_key": (4,), "past_value": (4,)},
    heads_axis={"attention_bias": 1},
    pairs=(("past_key", "past_value"),),
    attribute_features={"unidirectional": ("unidirectional", 0)},
    head_size=_mha_head_size,
    max_outputs=4,  # y, present_key, present_value, and the QK scores
    padding="key_padding_mask (b s) int32 or an attention_bias; a 2-D mask keeps it off cuDNN and Flash",
    fast_kernels=("cuDNN", "Flash", "TRT fused", "MEA"),
    disqualifies={
        "attention_bias": ("Flash", "TRT fused"),  # MEA takes a bias when S % (4 * sizeof(T)) == 0
        "key_padding_mask": ("cuDNN", "Flash", "TRT fused"),  # a 1-D key length mask keeps cuDNN
        "past_key": ("cuDNN", "Flash", "TRT fused"),
        "past_sequence_length": ("Flash", "MEA"),
        "unidirectional": ("TRT fused",),
        "output_qk": ("Flash", "TRT fused", "MEA"),
        "float32": ("cuDNN", "Flash", "TRT fused"),  # 2-byte T only
    },
    run_time=(
        "Flash needs head_size == v_head_size and head_size <= 256, a multiple of 8; packed QKV takes Flash "
        "only at S >= 513 (ORT_MIN_SEQ_LEN_FLASH_ATTENTION_PACKED_QKV)",
        "MEA with an attention_bias needs S % (4 * sizeof(T)) == 0",
    ),
)

# The packed com.microsoft Attention (the rewriter's choice for a biased combined projection).
ATTENTION_CUDA_RULES = KernelRules(
    op="com.microsoft::Attention",
    sources=("onnxruntime/contrib_ops/cuda/bert/attention.cc",),
    inputs=("input", "weights", "bias", "mask_index", "past", "attention_bias", "past_sequence_length"),
    dtypes=("float32", "float16"),  # REGISTER_KERNEL_TYPED(float | MLFloat16)
    t_input="input",
    typed={"weights": "T", "bias": "T", "mask_index": "int32", "past": "T", "attention_bias": "T"},
    ranks={"input": (3,), "weights": (2,)},
    max_outputs=2,  # y and present
    padding="mask_index (b s) int32 or an attention_bias",
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
    cuda=(MHA_CUDA_RULES, ATTENTION_CUDA_RULES),
    modifiers={
        "softcap": Limit("com.microsoft MultiHeadAttention has no softcap"),
        "sinks": Limit("com.microsoft MultiHeadAttention has no input for a per-head sink logit"),
    },
)
