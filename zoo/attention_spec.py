"""The attention spec: a small frozen description of one multi-head attention block.

Axis vocabulary, used in every einops pattern, docstring and ONNX dynamic-axis name:

    b  batch            t  query positions      s  key/value positions
    h  query heads      g  key/value heads      c  model channels (d_model)
    d  per-head width (dk / dv where the query/key and value widths differ)
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from . import modifiers
from .errors import SpecError
from .spec_fields import SpecFields

LAYOUTS = ("separate", "combined")


def _check_positive_int(name: str, value: Any, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    # bool is an int subclass; `heads=True` is a mistake, not 1 head.
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"{name}={value!r} must be a positive integer")
    if value <= 0:
        raise SpecError(f"{name}={value} must be a positive integer")


@dataclass(frozen=True)
class AttentionSpec(SpecFields):
    """One multi-head attention block: the fields of zoo.spec_fields.SpecFields (each default says why
    it is what it is), checked when made."""

    def __post_init__(self) -> None:
        for name in ("rope_short_factor", "rope_long_factor"):  # a TOML or JSON list: the spec holds a tuple
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))
        _check_positive_int("d_model", self.d_model)
        _check_positive_int("heads", self.heads)
        _check_positive_int("d_k", self.d_k, optional=True)
        _check_positive_int("d_v", self.d_v, optional=True)
        _check_positive_int("kv_heads", self.kv_heads, optional=True)
        _check_positive_int("d_context", self.d_context, optional=True)
        if self.d_k is None and self.d_model % self.heads != 0:
            raise SpecError(
                f"d_model={self.d_model} is not divisible by heads={self.heads}; "
                f"pick heads that divide d_model, or set d_k explicitly "
                f"(d_model % heads == 0 is only the convention for the default d_k)"
            )
        if self.heads % self.kv_heads_ != 0:
            raise SpecError(
                f"kv_heads={self.kv_heads} must divide heads={self.heads} "
                f"(each kv head serves heads // kv_heads query heads)"
            )
        if self.layout not in LAYOUTS:
            raise SpecError(f"layout={self.layout!r} is not one of {', '.join(map(repr, LAYOUTS))}")
        if not isinstance(self.bias, bool):
            raise SpecError(f"bias={self.bias!r} must be True or False")
        if not isinstance(self.causal, bool):
            raise SpecError(f"causal={self.causal!r} must be True or False")
        if self.causal and self.d_context is not None:
            raise SpecError(
                f"causal=True with d_context={self.d_context}: the causal mask is for "
                f"self-attention only; drop causal or d_context"
            )
        if self.scale is not None:
            if isinstance(self.scale, bool) or not isinstance(self.scale, (int, float)):
                raise SpecError(f"scale={self.scale!r} must be a positive number or None")
            if not math.isfinite(self.scale) or self.scale <= 0:
                raise SpecError(f"scale={self.scale} must be a positive finite number or None")
        modifiers.check_spec(self)

    def replace(self, **changes: Any) -> AttentionSpec:
        """A new spec with `changes` applied (validated again)."""
        unknown = sorted(set(changes) - set(field_names()))
        if unknown:
            close = {u: difflib.get_close_matches(u, field_names(), n=1) for u in unknown}
            hints = [f"{c[0]!r} for {u!r}" for u, c in close.items() if c]
            hint = f"did you mean {', '.join(hints)}? " if hints else ""
            raise SpecError(f"unknown spec field(s) {unknown}; {hint}valid fields: {field_names()}")
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def describe(self) -> str:
        """One line, e.g. 'd_model=512 h=8 g=8 dk=64 dv=64 combined no-bias self'."""
        kind = f"cross(d_context={self.d_context})" if self.is_cross else "self"
        parts = [
            f"d_model={self.d_model}",
            f"h={self.heads}",
            f"g={self.kv_heads_}",
            f"dk={self.d_k_}",
            f"dv={self.d_v_}",
            self.layout,
            "bias" if self.bias else "no-bias",
            kind,
        ]
        if self.causal:
            parts.append("causal")
        if self.scale is not None:
            parts.append(f"scale={self.scale:g}")
        parts += [mod.describe(self) for mod in modifiers.active(self)]
        return " ".join(parts)


def field_names() -> list[str]:
    return [f.name for f in dataclasses.fields(AttentionSpec)]


def parse_value(text: str) -> Any:
    """A spec value from text: true/false, none/null, an int, a float, numbers separated by commas (a tuple:
    longrope's factor lists), or the text itself."""
    if "," in text:
        parts = [parse_value(p.strip()) for p in text.split(",") if p.strip()]
        if parts and all(isinstance(p, (int, float)) and not isinstance(p, bool) for p in parts):
            return tuple(float(p) for p in parts)
        return text
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def parse_overrides(items: Sequence[str] | None) -> dict[str, Any]:
    """['d_model=256', 'heads=4'] -> {'d_model': 256, 'heads': 4} (the CLI's --set KEY=VALUE)."""
    out: dict[str, Any] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SpecError(f"--set {item!r}: expected KEY=VALUE, e.g. --set d_model=256")
        out[key.strip()] = parse_value(value.strip())
    return out
