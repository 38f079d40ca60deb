"""`ort-gqa`: com.microsoft GroupQueryAttention, built node by node (export/gqa.py): causal
self-attention with d_v = d_k; one packed Q|K|V projection; rotary and the other pieces on Q and K
before the op (gqa_qkv), kv heads and the modifiers' op attributes inside the op, their biases
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
    # > 1 and past context is given"): such a chunk runs one row at a time (runtime/lowering_facts.py).
    # The static cache: the op's past and present are one bound buffer of capacity n; seqlens_k =
    # past_len + t - 1 tells it where to write and how many keys to read (export/gqa.py).
    static_cache=None,
    fp16="d_k a multiple of 16 (CPU kernel)",
    kinds="no: causal self-attention with d_v = d_k only; d_k a multiple of 8",
)
