"""`ort-gqa`: com.microsoft GroupQueryAttention, built node by node (export/gqa.py): causal
self-attention with d_v = d_k; kv heads and the modifiers' op attributes inside the op, their biases
and masks as its attention_bias; it decodes with past/present in the op, and its static cache is one
bound buffer. export/choice.py says where `auto` takes it. What it cannot carry of each modifier is
the modifier's own word (zoo/modifiers: gqa_limit, gqa_refusal)."""

import zoo

from .. import gqa
from .base import Limit, Lowering

LOWERING = Lowering(
    name="ort-gqa",
    opset=gqa.OPSET,
    graph="`com.microsoft.GroupQueryAttention`, built node by node (export/gqa.py)",
    op="com.microsoft GroupQueryAttention",
    build=gqa.build,
    cannot=gqa.why_not,
    modifiers={
        mod.name: Limit(mod.gqa_limit.text, mod.gqa_refusal, always=mod.gqa_limit.always)
        for mod in zoo.modifiers.MODIFIERS
        if mod.gqa_limit is not None
    },
    # GroupQueryAttention refuses b > 1 with t > 1 and a past ("batch_size must be 1 when sequence_length
    # > 1 and past context is given"): such a chunk runs one row at a time.
    batched_chunks=False,
    # The static cache: the op's past and present are one bound buffer of capacity n; seqlens_k =
    # past_len + t - 1 tells it where to write and how many keys to read (export/gqa.py).
    static_cache=None,
    # A whole model is one traced graph; this graph is built by hand for one block (no torch op traces to
    # GroupQueryAttention), so it cannot be spliced in until it is a torch.library op with an onnxscript
    # translation for the dynamo exporter.
    in_model=(
        "its GroupQueryAttention graph is built node by node for a block alone (export/gqa.py) and no torch op "
        "traces to it, so it cannot be one layer of a traced whole model; use lowering='decomposed' or 'auto'"
    ),
    fp16="d_k a multiple of 16 (CPU kernel)",
    kinds="no: causal self-attention with d_v = d_k only; d_k a multiple of 8",
)
