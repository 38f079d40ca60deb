"""`ort-gqa`: com.microsoft GroupQueryAttention, built node by node (export/gqa.py): causal
self-attention with d_v = d_k; rotary, window, softcap and kv heads inside the op; ALiBi and
masks as its attention_bias; it decodes with past/present in the op. `auto` takes it first for a growing
decode cache with shared kv heads on the CPU and for decoding on CUDA; on the CPU the default static cache
goes to `decomposed` (export/choice.py)."""

from .. import gqa
from .base import Limit, Lowering


def _rotary_pairs(spec):
    rd = spec.rope_dim or spec.d_k_
    if (rd // 2) % 8:
        return f"GroupQueryAttention's rotary needs rope_dim / 2 a multiple of 8; rope_dim={rd}"
    return None


def _window_causal(spec):
    if not spec.causal:
        return f"GroupQueryAttention's local_window_size looks back only; window={spec.window} is symmetric here"
    return None


LOWERING = Lowering(
    name="ort-gqa",
    opset=gqa.OPSET,
    graph="`com.microsoft.GroupQueryAttention`, built node by node (export/gqa.py)",
    op="com.microsoft GroupQueryAttention",
    build=gqa.build,
    cannot=gqa.why_not,
    modifiers={
        "rope": Limit("rope_dim / 2 a multiple of 8", _rotary_pairs),
        "window": Limit("causal only (local_window_size looks back)", _window_causal),
        "rel_buckets": Limit(
            "the hand-built GroupQueryAttention graph (export/gqa.py) does not build T5's bucketed bias; "
            "use a traced lowering"
        ),
    },
    # The static cache: the op's past and present are one bound buffer of capacity n; seqlens_k =
    # past_len + t - 1 tells it where to write and how many keys to read (export/gqa.py).
    static_cache=None,
    fp16="d_k a multiple of 16 (CPU kernel)",
    kinds="no: causal self-attention with d_v = d_k only; d_k a multiple of 8",
)
