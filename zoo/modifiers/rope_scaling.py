"""Scaled rotary frequencies: transformers' rope types "llama3", "yarn" and "longrope", as spec fields
the rotary modifier (rotary.py) reads.

Each kind is a function of the spec alone giving the fp32 inverse frequencies (one per rotated pair)
and the attention factor that multiplies cos and sin (1 unless yarn or longrope), computed the way
transformers' `modeling_rope_utils` computes them, in the same dtype and order, so the rotation is
the same to the last bit:

    llama3    pairs with wavelength past original_max / low_freq are divided by factor, those under
              original_max / high_freq kept, the band between interpolated (Llama 3.1 / 3.2 / 3.3)
    yarn      a linear ramp between the interpolated (/ factor) and the original frequencies over the
              pairs that turn between beta_fast and beta_slow times in original_max positions;
              cos and sin times the attention factor (0.1 ln(factor) + 1 by default: the "mscale",
              which scales every score by its square)
    longrope  two lists of per-pair divisors: the short one while a call's largest position + 1 is at
              most original_max, the long one once it is past (Phi-3 / Phi-3.5 / Phi-4-mini); cos and
              sin times sqrt(1 + ln(factor) / ln(original_max))

"dynamic" (NTK) is not a kind: transformers recomputes its frequencies from the longest call a module
has seen so far (state kept across calls), so the same positions rotate differently after a longer
call; the zoo refuses it by name (peers.rows.config_rope).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..errors import SpecError
from ..spec_fields import SpecFields
from .base import is_number

KINDS = ("llama3", "yarn", "longrope")
# the fields each kind reads (rope_factor and rope_original_max besides)
OWN = {
    "llama3": ("rope_low_freq", "rope_high_freq"),
    "yarn": ("rope_beta_fast", "rope_beta_slow", "rope_truncate", "rope_attention"),
    "longrope": ("rope_short_factor", "rope_long_factor", "rope_attention"),
}
ALL = ("rope_factor", "rope_original_max", *sorted({f for fs in OWN.values() for f in fs}))


def base_frequencies(theta: float, rd: int) -> Tensor:
    """theta^(-2i/rd), fp32, as transformers' default rotary computes it."""
    return 1.0 / (theta ** (torch.arange(0, rd, 2, dtype=torch.int64).float() / rd))


def _num(spec: SpecFields, name: str, default: float) -> float:
    v = getattr(spec, name)
    return float(default if v is None else v)


def attention_factor(spec: SpecFields) -> float:
    """What cos and sin are multiplied by (1.0 for llama3 and for no scaling)."""
    kind = spec.rope_scaling
    if kind not in ("yarn", "longrope"):
        return 1.0
    if spec.rope_attention is not None:
        return float(spec.rope_attention)
    factor = _num(spec, "rope_factor", 1.0)
    if kind == "yarn":
        return 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0
    return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(spec.rope_original_max))


def frequencies(spec: SpecFields, rd: int) -> tuple[Tensor, Tensor | None]:
    """(inverse frequencies, the long ones or None), fp32, one per rotated pair."""
    theta, kind = float(spec.rope_theta), spec.rope_scaling
    if kind == "llama3":
        return _llama3(spec, base_frequencies(theta, rd)), None
    if kind == "yarn":
        return _yarn(spec, theta, rd), None
    if kind == "longrope":
        shape = torch.arange(0, rd, 2, dtype=torch.int64).float() / rd
        short, long = (torch.tensor(f, dtype=torch.float32) for f in (spec.rope_short_factor, spec.rope_long_factor))
        return 1.0 / (short * theta**shape), 1.0 / (long * theta**shape)
    inv = base_frequencies(theta, rd)
    return (inv if spec.rope_scale is None else inv / spec.rope_scale), None


def _llama3(spec: SpecFields, inv: Tensor) -> Tensor:
    factor, old = float(spec.rope_factor), spec.rope_original_max
    low, high = _num(spec, "rope_low_freq", 1.0), _num(spec, "rope_high_freq", 4.0)
    low_wavelen, high_wavelen = old / low, old / high
    wavelen = 2 * math.pi / inv
    out = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * out / factor + smooth * out
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, out)


def _yarn(spec: SpecFields, theta: float, rd: int) -> Tensor:
    factor, old = float(spec.rope_factor), spec.rope_original_max
    fast, slow = _num(spec, "rope_beta_fast", 32), _num(spec, "rope_beta_slow", 1)

    def dim_of(turns: float) -> float:  # the pair index that turns `turns` times in `old` positions
        return (rd * math.log(old / (turns * 2 * math.pi))) / (2 * math.log(theta))

    low, high = dim_of(fast), dim_of(slow)
    if spec.rope_truncate is None or spec.rope_truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rd - 1)
    if low == high:
        high += 0.001  # as transformers does, against a zero-width ramp
    ramp = torch.clamp((torch.arange(rd // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = theta ** (torch.arange(0, rd, 2).float() / rd)
    extrapolation = 1 - ramp
    return (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation


def check(spec: SpecFields, rd: int) -> None:
    """SpecError naming the field for an invalid scaling (rd: the rotated width, known valid)."""
    kind = spec.rope_scaling
    if kind is None:
        given = [f for f in ALL if getattr(spec, f) is not None]
        if given:
            raise SpecError(f"{', '.join(given)} set without rope_scaling: set rope_scaling to one of {KINDS}")
        return
    if kind not in KINDS:
        raise SpecError(
            f"rope_scaling={kind!r} is not one of {', '.join(map(repr, KINDS))} (linear scaling is rope_scale; "
            f"transformers' 'dynamic' NTK keeps state across calls and is refused)"
        )
    if spec.rope_theta is None:
        raise SpecError(f"rope_scaling={kind!r} scales rotary frequencies: set rope_theta too")
    if spec.rope_scale is not None:
        raise SpecError(f"rope_scale={spec.rope_scale} (linear) with rope_scaling={kind!r}: give one of them")
    stray = [f for f in ALL[2:] if getattr(spec, f) is not None and f not in OWN[kind]]
    if stray:
        raise SpecError(f"{', '.join(stray)} set with rope_scaling={kind!r}, which does not read them; drop them")
    om = spec.rope_original_max
    if isinstance(om, bool) or not isinstance(om, int) or om < 1:
        raise SpecError(f"rope_original_max={om!r} must be a positive integer (original_max_position_embeddings)")
    f = spec.rope_factor
    if kind in ("llama3", "yarn") or f is not None:
        if not is_number(f) or not 0 < f <= 1e6:
            raise SpecError(f"rope_factor={f!r} must be a number in (0, 1e6] with rope_scaling={kind!r}")
    for name in ("rope_low_freq", "rope_high_freq", "rope_beta_fast", "rope_beta_slow", "rope_attention"):
        v = getattr(spec, name)
        if v is not None and (not is_number(v) or not 0 < v <= 1e6):
            raise SpecError(f"{name}={v!r} must be a positive number (or None for the default)")
    # equal factors (Llama 4 Scout: 1.0 and 1.0) leave no band between: every pair is kept or divided
    if kind == "llama3" and _num(spec, "rope_low_freq", 1.0) > _num(spec, "rope_high_freq", 4.0):
        raise SpecError(
            f"rope_low_freq={spec.rope_low_freq} must be at or below rope_high_freq={spec.rope_high_freq} "
            f"(Llama 3.1: 1.0 and 4.0; Llama 4: 1.0 and 1.0)"
        )
    if spec.rope_truncate is not None and not isinstance(spec.rope_truncate, bool):
        raise SpecError(f"rope_truncate={spec.rope_truncate!r} must be True, False or None")
    if kind == "longrope":
        for name in ("rope_short_factor", "rope_long_factor"):
            v = getattr(spec, name)
            if not isinstance(v, tuple) or len(v) != rd // 2 or not all(is_number(x) and x > 0 for x in v):
                raise SpecError(
                    f"{name} must hold rope_dim / 2 = {rd // 2} positive numbers, one per rotated pair; got "
                    f"{'a ' + type(v).__name__ if not isinstance(v, tuple) else f'{len(v)} values'}"
                )


def describe(spec: SpecFields) -> str:
    kind = spec.rope_scaling
    if kind is None:
        return ""
    att = attention_factor(spec)
    extra = f", cos/sin x{att:.4g}" if att != 1.0 else ""
    factor = f" x{spec.rope_factor:g}" if spec.rope_factor is not None else ""
    return f", {kind}{factor} from {spec.rope_original_max}{extra}"


def reference_frequencies(spec: SpecFields, rd: int, longest: int) -> tuple[list[float], float]:
    """The same frequencies written out pair by pair in float64 (the audit's independent check), for a
    call whose largest position + 1 is `longest`; and the attention factor."""
    theta, kind = float(spec.rope_theta), spec.rope_scaling
    out = []
    for i in range(rd // 2):
        base = theta ** (-2 * i / rd)
        if kind == "llama3":
            old, factor = spec.rope_original_max, float(spec.rope_factor)
            low, high = _num(spec, "rope_low_freq", 1.0), _num(spec, "rope_high_freq", 4.0)
            wl = 2 * math.pi / base
            if wl < old / high:
                f = base
            elif wl > old / low:
                f = base / factor
            else:
                sm = (old / wl - low) / (high - low)
                f = (1 - sm) * base / factor + sm * base
        elif kind == "yarn":
            old, factor = spec.rope_original_max, float(spec.rope_factor)
            ends = [
                rd * math.log(old / (_num(spec, b, d) * 2 * math.pi)) / (2 * math.log(theta))
                for b, d in (("rope_beta_fast", 32), ("rope_beta_slow", 1))
            ]
            if spec.rope_truncate is not False:
                ends = [math.floor(ends[0]), math.ceil(ends[1])]
            lo, hi = max(ends[0], 0), min(ends[1], rd - 1)
            hi = hi + 0.001 if hi == lo else hi
            ramp = min(max((i - lo) / (hi - lo), 0.0), 1.0)  # 0: the original frequency, 1: divided by factor
            f = base * (1 - ramp) + base / factor * ramp
        elif kind == "longrope":
            table = spec.rope_long_factor if longest > spec.rope_original_max else spec.rope_short_factor
            f = base / table[i]
        else:
            f = base / (spec.rope_scale or 1.0)
        out.append(f)
    return out, attention_factor(spec)


__all__ = ["ALL", "KINDS", "attention_factor", "base_frequencies", "check", "describe", "frequencies"]
