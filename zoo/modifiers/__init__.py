"""Projection, position, score and output modifiers: clip_qkv, QK-norm, rotary positions, ALiBi, T5's
relative position buckets, sliding window, chunked attention, logit softcap, attention sinks, the gated output.

Each modifier is one class that says everything about itself:

    fields          the spec fields it owns (all off by default)
    active(spec)    whether a spec turns it on
    check(spec)     SpecError for an invalid value or combination (called by AttentionSpec)
    parameters      learned entries it adds to the block (RoPE and ALiBi add none), and their label
    describe        its words in `AttentionSpec.describe()`
    head state      what follows a head under permute_heads / prune_heads (zoo/heads.py):
                      state_fields         the zoo.heads.Projections fields that hold it
                      head_state()         read it from the block; load_head_state(state) writes it back
                      select_heads(...)    the state for a subset or reordering of the heads
                      prune_refusal(spec)  why pruning cannot apply (None: it can)
    the eager op    as an nn.Module built into the block, at one of four stages:
                      qkv_projected(q, k, v)           Q, K, V straight from the projections
                      qk_merged(q, k)                  Q (b t (h dk)), K (b s (g dk)), before the split
                      qk_heads(q, k, q_pos, k_pos)     Q (b h t dk), K (b g s dk), after the split
                      score_allowed / score_bias / score_map   on the (b h t s) scores
                      z_heads(z, x)                    Z (b h t dv) after attention, before W_O (the gate)
                      score_sink()                     a logit per head in the softmax's denominator
    reference_*     the same math written independently (plain loops, float64) for the audit:
                      reference_qkv, reference_qk, reference_map, reference_bias, reference_allowed, reference_z
    audit           its own property check, as an audit step
    gqa_*           what it adds to the hand-built GroupQueryAttention graph (graph.py): nodes on the
                    projected Q/K/V, attributes and inputs of the op, an attention_bias term, a term of
                    the allowed-keys rule after the op, or `gqa_refusal` (the ort-gqa record reads it)

zoo imports no onnx: the graph pieces are ONNX op types as strings, written through the builder that
export/gqa.py passes in (`graph.GraphBuilder`). What a traced lowering cannot express for a modifier
lives in that lowering's record (export/lowerings/), keyed by the modifier's `name`.

One module per family: `base` (the protocol, shared helpers), `graph` (the hand-built graph's types),
`latent` (multi-head latent attention), `clip`, `qk_norm`, `rotary`, `alibi`, `relative` (T5's buckets),
`scores` (window, softcap), `chunk` (chunked attention), `l2_norm` and `temperature` (Llama 4's weightless
QK-norm after the rotary and its query temperature), `sinks` (gpt-oss's attention sinks), `gate` (the gated
output); this package lists them in order of application and re-exports every name, so
`from zoo.modifiers import X` reaches all of them.

Positions are integers, q_pos (b|1, t) and k_pos (b|1, s); for self-attention they are the
same tensor (0..t-1 unless the caller gives `positions`).
"""

from __future__ import annotations

from torch import nn

from ..spec_fields import SpecFields
from .alibi import ALiBi, alibi_slopes
from .base import (
    Modifier,
    PruneRefusal,
    is_number,
    relative_distance,
    relative_positions_audit,
    take_blocks,
)
from .chunk import Chunk, same_chunk
from .clip import ClipQKV
from .gate import OutputGate
from .graph import GraphBuilder, GraphLimit, OpPart, per_head
from .l2_norm import L2Norm, l2_normalize
from .latent import Latent
from .qk_norm import QK_NORM_KINDS, QK_NORMS, QKNorm, qk_normalize, rms_norm
from .relative import RelativeBuckets, relative_bucket
from .rotary import Rotary
from .scores import Softcap, Window
from .sinks import Sinks
from .temperature import Temperature, temperature

__all__ = [
    "MODIFIERS",
    "QK_NORMS",
    "QK_NORM_KINDS",
    "ALiBi",
    "Chunk",
    "ClipQKV",
    "GraphBuilder",
    "GraphLimit",
    "L2Norm",
    "Latent",
    "Modifier",
    "OpPart",
    "OutputGate",
    "PruneRefusal",
    "QKNorm",
    "RelativeBuckets",
    "Rotary",
    "Sinks",
    "Softcap",
    "Temperature",
    "Window",
    "active",
    "alibi_slopes",
    "build",
    "check_spec",
    "is_number",
    "l2_normalize",
    "parameters_added",
    "per_head",
    "prune_refusal",
    "qk_normalize",
    "relative_bucket",
    "relative_distance",
    "relative_positions_audit",
    "rms_norm",
    "same_chunk",
    "take_blocks",
    "temperature",
]

# The order is the order of application at each stage (the latent's projections first, the clamp on the
# projections, then QK-norm before RoPE, as every model does).
MODIFIERS: tuple[type[Modifier], ...] = (
    Latent,
    ClipQKV,
    QKNorm,
    Rotary,
    L2Norm,
    Temperature,
    ALiBi,
    RelativeBuckets,
    Window,
    Chunk,
    Softcap,
    Sinks,  # in the softmax's denominator, after every map, bias and mask of the scores
    OutputGate,
)


def check_spec(spec: SpecFields) -> None:
    for mod in MODIFIERS:
        mod.check(spec)


def active(spec: SpecFields) -> list[type[Modifier]]:
    return [mod for mod in MODIFIERS if mod.active(spec)]


def parameters_added(spec: SpecFields) -> int:
    return sum(mod.parameters_added(spec) for mod in MODIFIERS)


def prune_refusal(spec: SpecFields) -> PruneRefusal | None:
    """The first active modifier's reason why prune_heads cannot apply to `spec`, or None."""
    for mod in active(spec):
        refusal = mod.prune_refusal(spec)
        if refusal is not None:
            return refusal
    return None


def build(spec: SpecFields) -> nn.ModuleDict:
    """The block's modifier modules, keyed by name, in order of application."""
    return nn.ModuleDict({mod.name: mod(spec) for mod in active(spec)})
