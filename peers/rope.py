"""transformers' rope_parameters (one layer type's dict, as the config resolves it) -> the zoo's rotary
spec fields: rope_scale for "linear", rope_scaling and its rope_* fields for "llama3", "yarn" and
"longrope" (zoo/modifiers/rope_scaling.py), read with the defaults and fallbacks transformers'
`modeling_rope_utils` applies. "dynamic" (NTK) and every other rope_type are refused, named.

No transformers here: `params` is a dict, `config` anything with the config's attributes.
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

from zoo.errors import HFConversionError
from zoo.modifiers import rope_scaling

SCALED = rope_scaling.KINDS
DYNAMIC_WHY = (
    "transformers recomputes its frequencies from the longest call the module has seen so far "
    "(max_seq_len_cached, state kept across calls): the same positions rotate differently after a longer call, "
    "and a cached key keeps the frequencies of the call that rotated it, so the layer is not a function of its "
    "inputs; the zoo's blocks are"
)


# Classes whose model's rotary multiplies cos and sin by rope_parameters' short_mscale below original_max and
# long_mscale past it, in place of the rope type's own attention factor, for every rope_type but "default"
# (transformers' PhimoeRotaryEmbedding); the zoo's rotary holds one factor (rope_attention).
MSCALE_CLASSES = ("PhimoeAttention",)


def _mscale(name: str, rope_type: str, params: dict) -> float | None:
    """The one attention factor a MSCALE_CLASSES rotary applies, or None for another class; refused, named,
    when short_mscale and long_mscale differ (the zoo's rotary would be wrong on one side of the switch)."""
    if name not in MSCALE_CLASSES:
        return None
    short, long = params.get("short_mscale"), params.get("long_mscale")
    if short is None or long is None:
        raise HFConversionError(
            f"{name}: rope_type={rope_type!r} without short_mscale and long_mscale in config.rope_parameters, "
            f"which its rotary reads (transformers raises KeyError); give both"
        )
    if float(short) != float(long):
        raise HFConversionError(
            f"{name}: short_mscale={short} and long_mscale={long} differ in config.rope_parameters: its rotary "
            f"multiplies cos and sin by the first below original_max_position_embeddings and by the second past "
            f"it, and the zoo's rotary holds one attention factor (rope_attention); refused rather than wrong"
        )
    return float(short)


def rope_fields(name: str, params: dict, config: Any) -> dict:
    """The spec fields of `params`' rope_type besides rope_theta / rope_dim (`name`: the class, for messages)."""
    rope_type = params.get("rope_type", "default")
    if rope_type == "default":
        return {}
    mscale = _mscale(name, rope_type, params)
    if mscale is not None and rope_type not in SCALED and mscale != 1.0:
        raise HFConversionError(
            f"{name}: rope_type={rope_type!r} with mscale {mscale} (short_mscale / long_mscale in "
            f"config.rope_parameters): the zoo's {rope_type!r} rotary has no attention factor; refused, not wrong"
        )
    if rope_type == "linear":
        scale = float(params["factor"])
        return {"rope_scale": None if scale == 1.0 else scale}
    if rope_type == "dynamic":
        raise HFConversionError(f"{name}: config.rope_parameters rope_type='dynamic' (NTK) is refused: {DYNAMIC_WHY}")
    if rope_type not in SCALED:
        raise HFConversionError(
            f"{name}: config.rope_parameters rope_type={rope_type!r} (scaled rotary frequencies; a config.json's "
            f"rope_scaling, where set, is what transformers reads there) is not expressible in the zoo, which "
            f"models the default rotary, linear ({'rope_scale'}) and {', '.join(SCALED)} (rope_scaling)"
        )
    om = params.get("original_max_position_embeddings")
    if om is None:  # as transformers' standardize_rope_params fills it in when it builds the rotary
        om = getattr(config, "max_position_embeddings", None)
    if om is None:
        raise HFConversionError(
            f"{name}: rope_type={rope_type!r} needs original_max_position_embeddings (or max_position_embeddings)"
        )
    out: dict = {"rope_scaling": rope_type, "rope_original_max": int(om)}
    factor = params.get("factor")
    if factor is None and rope_type in ("yarn", "longrope"):  # transformers: the ratio of the two lengths
        factor = config.max_position_embeddings / om
    if factor is not None:
        out["rope_factor"] = float(factor)
    if rope_type == "llama3":
        out.update(rope_low_freq=float(params["low_freq_factor"]), rope_high_freq=float(params["high_freq_factor"]))
        return out
    if rope_type == "yarn":
        out.update(
            rope_beta_fast=float(params.get("beta_fast") or 32),
            rope_beta_slow=float(params.get("beta_slow") or 1),
            # transformers reads truncate from the top-level rope_parameters, whatever the layer type
            rope_truncate=bool((getattr(config, "rope_parameters", None) or {}).get("truncate", True)),
        )
    else:
        out.update(rope_short_factor=tuple(map(float, params["short_factor"])))
        out["rope_long_factor"] = tuple(map(float, params["long_factor"]))
    att = _attention_factor(rope_type, params, float(out["rope_factor"]), int(om)) if mscale is None else mscale
    formula = rope_scaling.attention_factor(SimpleNamespace(**{**dict.fromkeys(rope_scaling.ALL), **out}))
    if att != formula:
        out["rope_attention"] = att
    return out


def _attention_factor(kind: str, params: dict, factor: float, om: int) -> float:
    """transformers' attention factor for yarn (mscale / mscale_all_dim) and longrope."""
    given = params.get("attention_factor")
    if given is not None:
        return float(given)
    if kind == "longrope":
        return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(om))

    def mscale(scale: float, m: float = 1) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    m, m_all = params.get("mscale"), params.get("mscale_all_dim")
    return float(mscale(factor, m) / mscale(factor, m_all)) if m and m_all else mscale(factor)


__all__ = ["DYNAMIC_WHY", "MSCALE_CLASSES", "SCALED", "rope_fields"]
