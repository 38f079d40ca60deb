"""The ONNX interface of an exported block, described once as data.

Every exported model has the inputs and outputs below (the optional ones when asked for),
with the axis vocabulary as dynamic-axis names. Export, sessions and parity all read this
table; nothing else spells out input names or axes.
"""

from __future__ import annotations

from dataclasses import dataclass

import zoo


@dataclass(frozen=True)
class TensorIO:
    name: str
    axes: tuple[str, ...]  # "b", "t", "s" are dynamic; others are resolved from the spec
    kind: str  # "float" (the model's dtype) or "bool"
    doc: str

    def shape(self, spec: zoo.AttentionSpec) -> tuple[int | str, ...]:
        """Dims as ONNX shows them: dynamic axes by name, the rest as integers."""
        fixed = {
            "c": spec.d_model,
            "c_ctx": spec.d_context or 0,
            "h": spec.heads,
        }
        return tuple(fixed.get(a, a) for a in self.axes)


X = TensorIO("x", ("b", "t", "c"), "float", "queries (and keys/values for self-attention)")
CONTEXT = TensorIO("context", ("b", "s", "c_ctx"), "float", "keys/values source for cross-attention")
MASK = TensorIO(
    "mask",
    ("b", "t", "s"),
    "bool",
    "True = may attend; the same for every head (a row with no True gives y = W_O's bias)",
)
HEAD_MASK = TensorIO("head_mask", ("b", "h"), "float", "scales each head's output Z^(r) before concat")
Y = TensorIO("y", ("b", "t", "c"), "float", "the block's output")
ATTN = TensorIO("attn", ("b", "h", "t", "s"), "float", "attention weights A, rows sum to 1")

DYNAMIC_AXES = ("b", "t", "s")


def interface(
    spec: zoo.AttentionSpec, *, need_weights: bool, with_mask: bool, with_head_mask: bool
) -> tuple[list[TensorIO], list[TensorIO]]:
    """(inputs, outputs) in graph order for one export request.

    For self-attention the key axis *is* the query axis, so `s` is renamed `t`.
    """
    ins = [X]
    if spec.is_cross:
        ins.append(CONTEXT)
    if with_mask:
        ins.append(MASK)
    if with_head_mask:
        ins.append(HEAD_MASK)
    outs = [Y] + ([ATTN] if need_weights else [])
    if not spec.is_cross:
        ins = [_self_axes(io) for io in ins]
        outs = [_self_axes(io) for io in outs]
    return ins, outs


def _self_axes(io: TensorIO) -> TensorIO:
    return TensorIO(io.name, tuple("t" if a == "s" else a for a in io.axes), io.kind, io.doc)
