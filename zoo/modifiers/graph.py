"""What a modifier adds to a graph built by hand (export/gqa.py's GroupQueryAttention graph), as types.

zoo imports no onnx: a modifier writes ONNX op types as strings through a `GraphBuilder` that the
graph's builder passes in, and names tensors by strings. Its pieces, in the order the graph applies them:

    gqa_qkv(g, q, k, v)     nodes on the projected Q (b t (h dk)), K (b t (g dk)), V (b t (g dv))
    gqa_inside(g)           in a whole model, gqa_qkv's piece done by the op itself at cache slots (`OpPart`),
                            or None; its tables may be constants of g.max_positions rows
    gqa_op(g)               attributes and inputs of the GroupQueryAttention node (`OpPart`)
    gqa_bias(g)             a term of its attention_bias, float32 (b|1, h|1, t, s)
    gqa_allowed(g)          a term of the "allowed keys" rule after the op, bool (b|1, t, s): a query
                            row with no allowed key gets Z = 0
    gqa_z(g, x, z)          nodes on the op's output Z (b t (h dv)) before head_mask and W_O (x: the input)
    gqa_refusal(spec)       "cannot", with the reason; `gqa_limit` says it in a few words for the README
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

MS_DOMAIN = "com.microsoft"  # ONNX Runtime's contrib ops: op(..., domain=MS_DOMAIN)


class GraphBuilder(Protocol):
    """The node list a modifier writes to. Tensors are names; element types are numpy's names
    ("float32", "float16", "int64", "bool"); op types and attributes are ONNX's (default domain, or
    `domain=MS_DOMAIN` for ONNX Runtime's contrib ops)."""

    @property
    def dtype(self) -> str:
        """The graph's float type: "float32" or "float16"."""
        ...

    def op(self, op_type: str, *inputs: str, **attributes: Any) -> str:
        """One node; the name of its one output."""
        ...

    def const(self, value: Any, hint: str = "c", dtype: str | None = None) -> str:
        """An initializer holding `value` (a number, a list, a tensor) in `dtype` (None: the graph's)."""
        ...

    def cast(self, x: str, dtype: str) -> str:
        """x cast to `dtype`."""
        ...

    def pair_positions(self) -> tuple[str, str]:
        """int64 (b|1, t, 1) and (b|1, 1, s): each query's and each key's token position."""
        ...

    def distance(self) -> str:
        """float32 (b|1, t, s): i - j, query i's position less key j's."""
        ...

    def positions(self) -> str:
        """float32 (s,): the key positions 0..s-1, one row of a rotary cache each."""
        ...

    @property
    def max_positions(self) -> int | None:
        """In a whole model exported with a max_len: the most positions a call can hold, so a table over
        positions may be a constant of that many rows, computed once at export instead of each call (small
        enough to be one initializer that every layer shares). None: computed per call from positions()."""
        ...

    def call_positions(self) -> str:
        """int64 (b, t): the position of each of this call's tokens (a left-padded row counts its real
        tokens only, as the eager block does; a pad's is 0)."""
        ...


@dataclass(frozen=True)
class OpPart:
    """What a modifier sets on the attention node itself: attributes, and optional inputs keyed by
    the op's input names (GroupQueryAttention: "cos_cache", "sin_cache", ...)."""

    attributes: Mapping[str, int | float] = field(default_factory=dict)
    inputs: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class GraphLimit:
    """What the hand-built graph cannot carry of a modifier, in a few words (the README's lowering
    table). `always`: whatever the modifier's values (the table's "no"); else only where
    `gqa_refusal(spec)` gives a reason (the table's "yes, ...")."""

    text: str
    always: bool = False


def per_head(g: GraphBuilder, x: str, heads: int, fn: Callable[[str], str]) -> str:
    """fn over each head's d of x (b t (n d)): x reshaped to (b t n d), and fn's result back."""
    split = g.op("Reshape", x, g.const([0, 0, heads, -1], "i", "int64"))
    return g.op("Reshape", fn(split), g.const([0, 0, -1], "i", "int64"))
