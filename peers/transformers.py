"""Weights in and out of Hugging Face transformers: `from_hf(module)` and `to_hf(block, module)`.

`from_hf` reads one transformers attention module (and its `config`) and returns a zoo block
that computes the same function, weights copied; `to_hf` writes a block's weights back into a
module of the same shape. Each class is one row of the family table (`peers.copies.ROWS`, read by
`peers.rows.read` / `peers.rows.write`); anything the zoo cannot express exactly (a rope scaling type,
a LayerNorm on Q/K, bidirectional Gemma-2, BERT's and GPT-2's cross-attention) is refused with an
`HFConversionError` naming it.

transformers is imported only when a function here needs it: `import peers.transformers` works
without it. `zoo.from_hf` and `zoo.to_hf` are these functions.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import torch
from torch import nn

from zoo import AttentionSpec, MultiHeadAttention, get_projections
from zoo.errors import HFConversionError, HFTypeError
from zoo.heads import Projections, build

from .copies import BY_CLASS, ROWS, STATE_SPACE
from .rows import Row, cls_name, default_scale, read, write

_MEASURED = Path(__file__).with_name("measured.json")
# Parts of a supported module that are not the whole block: say which module to pass instead.
_PARTS = {
    "BertSelfAttention": "pass its parent BertAttention (layer.attention), which holds the output dense too",
    "BertSelfOutput": "pass its parent BertAttention (layer.attention)",
    "BertCrossAttention": "cross-attention BERT layers are not converted",
}


def supported_classes() -> dict[str, str]:
    """The transformers attention classes from_hf / to_hf accept, each with what the block covers."""
    return {row.cls: row.covers for row in ROWS if row.refused is None}


@functools.cache
def measured_errors() -> dict[str, dict]:
    """case name -> {"class", "eager_max_abs_err"}: the parity cases' measured errors (fp32), as
    scripts/measure_hf.py wrote them into peers/measured.json (tests/peers/test_hf.py re-measures them)."""
    return json.loads(_MEASURED.read_text())["cases"]


def _max_error(cls: str) -> float | None:
    errs = [m["eager_max_abs_err"] for m in measured_errors().values() if m["class"] == cls]
    return max(errs) if errs else None


def family_table() -> list[dict]:
    """One dict per class in the table: family, class, status ("exact" / "refused"), max_error (an exact
    class's largest measured eager max abs error over its parity cases, fp32; None if unmeasured),
    reason (refused classes), refuses (the configs of an exact class that are refused, by name),
    modifiers, covers."""
    return [
        {
            "family": row.family,
            "class": row.cls,
            "status": "refused" if row.refused is not None else "exact",
            "max_error": _max_error(row.cls) if row.refused is None else None,
            "reason": row.refused,
            "refuses": [check.name for check in row.checks],
            "modifiers": list(row.modifiers()),
            "covers": row.covers,
        }
        for row in ROWS
    ]


def _row(module: object) -> Row:
    if not isinstance(module, nn.Module):
        raise HFTypeError(f"expected a transformers attention module, got {type(module).__name__}")
    name = cls_name(module)
    if name in _PARTS:
        raise HFTypeError(f"{name}: {_PARTS[name]}")
    if name in STATE_SPACE:  # a hybrid model's other layers: outside the zoo, named
        home = vars(sys.modules.get(type(module).__module__, sys))
        rows = sorted(n for n in home if n in BY_CLASS)
        raise HFTypeError(
            f"{name} is {STATE_SPACE[name]}, outside the zoo (the zoo converts attention); convert this hybrid "
            f"model's attention layers instead ({', '.join(rows) or 'none here'})"
        )
    row = BY_CLASS.get(name)
    if row is None or not type(module).__module__.startswith("transformers."):
        inside = [
            f"{n} ({cls_name(c)})"
            for n, c in module.named_modules()
            if n and cls_name(c) in BY_CLASS and type(c).__module__.startswith("transformers.")
        ][:2]
        hint = f"; it holds {', '.join(inside)}: pass that" if inside else ""
        raise HFTypeError(
            f"{type(module).__module__}.{name} is not a supported transformers attention module{hint}; "
            f"supported: {', '.join(supported_classes())}"
        )
    return row


def _derive(module: nn.Module, model: nn.Module | None) -> tuple[Row, AttentionSpec, Projections]:
    row = _row(module)
    if model is not None and not isinstance(model, nn.Module):
        raise HFTypeError(f"model must be the transformers model the module sits in, got {type(model).__name__}")
    with torch.no_grad():
        spec, p = read(row, module, model)
    return row, spec, p


def spec_from_hf(module: nn.Module, *, model: nn.Module | None = None) -> AttentionSpec:
    """The spec from_hf would give `module`, without copying weights (works on the meta device)."""
    return _derive(module, model)[1]


def from_hf(module: nn.Module, *, model: nn.Module | None = None) -> MultiHeadAttention:
    """A zoo block computing what the transformers attention `module` computes, weights copied.

    x (b t c) -> y (b t c). What the block covers is the row's `covers` (`supported_classes()`):
    usually the whole module with the model's rotary embedding and causal/sliding mask. Notable:
      BertAttention (and its copies)  self-attention + output.dense; the dropout, residual add and
                            LayerNorm of BertSelfOutput follow the block in the layer
      GPT2Attention         Conv1D (in, out) weights become (out, in)
      BloomAttention        fused rows (h r d) rearranged to [Q|K|V]; ALiBi with BLOOM's slopes.
                            BloomAttention adds its `residual` argument to its output; the block
                            does not: bloom(x, residual=r, ...)[0] == block(x) + r
      FalconAttention       rotary Falcon: multi-query, grouped (new_decoder_architecture) or
                            per-head fused rows; ALiBi Falcon is refused
      BartAttention (and its copies), WhisperAttention
                            the decoder's encoder_attn is a cross-attention block (d_context =
                            d_model): module(x, key_value_states=e) == block(x, e)
      T5Attention (MT5, UMT5)
                            self-attention with T5's relative position buckets (encoder:
                            bidirectional; decoder: causal, past distances), no score scaling;
                            EncDecAttention is a cross-attention block. T5 and MT5 keep the bias
                            table in the stack's first layer only: for a later layer pass
                            `model=` (the model it sits in) and the block gets that table

    Dropout is not modelled: the block equals the module in eval mode. Positions for RoPE/ALiBi
    are 0..t-1 unless given (`block(x, positions=...)`); padding is a key mask
    (`block(x, mask=keep[:, None, None, :])`). A module whose Q/K/V/O biases are only partly
    present (ViT without qkv_bias) gets bias=True with zeros in their place: the same function.
    Unsupported classes (HFTypeError) and config values the zoo cannot express, such as a
    rope_type other than "default" or "linear" (HFConversionError), are refused, never approximated;
    `family_table()` lists every class with its status.

    `model`: the transformers model `module` sits in, needed only where the module reads state that
    another layer holds (T5's relative bias table, in its stack's first layer).
    """
    _, spec, p = _derive(module, model)
    block = build(spec, p)
    return block.eval()


def to_hf(block: MultiHeadAttention, module: nn.Module, *, model: nn.Module | None = None) -> nn.Module:
    """Write `block`'s weights into the transformers attention `module` (in place; returns it).

    The block must compute a function of the module's shape: the spec the module implies
    (from_hf's) and the block's must agree on every field but the layout. A bias the module
    lacks must be zero in the block; BLOOM takes only its own ALiBi slopes. T5's relative bias
    table is written into the layer that owns it (the stack's first; every layer of the stack reads
    it); a later layer (`model=` as for from_hf) takes only the table it already reads.
    """
    if not isinstance(block, MultiHeadAttention):
        raise HFTypeError(f"expected a zoo MultiHeadAttention block, got {type(block).__name__}")
    row, want, _ = _derive(module, model)
    # Compare values, not spellings: a scale written out as the default is the default.
    have = block.spec.replace(
        layout=want.layout, bias=want.bias, scale=default_scale(block.spec.scale_, block.spec.d_k_)
    )
    for field, resolved in (("d_k", "d_k_"), ("d_v", "d_v_"), ("kv_heads", "kv_heads_")):
        if getattr(have, resolved) == getattr(want, resolved):  # d_k=16 written out is the default 16
            have = have.replace(**{field: getattr(want, field)})
    if have != want:
        diffs = [
            f"{f}: block {getattr(have, f)!r} vs module {getattr(want, f)!r}"
            for f in want.to_dict()
            if getattr(have, f) != getattr(want, f)
        ]
        raise HFConversionError(f"the block does not fit this {cls_name(module)}: " + "; ".join(diffs))
    p = get_projections(block)
    if not block.spec.bias:
        zeros = [t.new_zeros(t.shape[0]) for t in (p.w_q, p.w_k, p.w_v, p.w_o)]
        p.b_q, p.b_k, p.b_v, p.b_o = zeros
    with torch.no_grad():
        write(row, module, want, p, model)
    return module


__all__ = [
    "HFConversionError",
    "HFTypeError",
    "family_table",
    "from_hf",
    "measured_errors",
    "spec_from_hf",
    "supported_classes",
    "to_hf",
]
