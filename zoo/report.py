"""Human-readable reports on a spec: what `attnzoo show` prints."""

from __future__ import annotations

import torch

from . import modifiers
from .accounting import (
    FLOP_CONVENTION,
    bytes_moved,
    count_parameters,
    flops,
    key_length,
    parameter_breakdown,
    score_entries,
    stage_shapes,
)
from .attention import MultiHeadAttention
from .attention_spec import AttentionSpec


def human(n: float, unit: str = "") -> str:
    """1234567 -> '1.23 M'; keeps small numbers exact."""
    for div, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= div:
            return f"{n / div:.3g} {prefix}{unit}"
    return f"{n:g} {unit}".rstrip()


def _module_count(s: AttentionSpec) -> int | None:
    """Entries counted from a module built on the meta device (nothing allocated); None when a
    weight's byte size would overflow torch's int64 storage arithmetic."""
    widths = (s.heads * s.d_k_, s.kv_heads_ * (s.d_k_ + s.d_v_), s.heads * s.d_v_)
    if max(widths + (s.d_model, s.d_kv_in)) ** 2 * 8 >= 2**63:
        return None
    with torch.device("meta"):
        return count_parameters(MultiHeadAttention(s))


def show_spec(
    name: str,
    spec: AttentionSpec,
    *,
    batch: int = 1,
    seq: int = 128,
    ctx_seq: int | None = None,
    description: str = "",
    itemsize: int = 4,
) -> str:
    s = spec
    sl = key_length(s, seq, ctx_seq)
    module_count = _module_count(s)
    pb = parameter_breakdown(s)
    formula = count_parameters(s)
    h, g, dk, dv = s.heads, s.kv_heads_, s.d_k_, s.d_v_
    out = [f"{name}" + (f": {description}" if description else ""), ""]
    out.append("spec")
    for k, v in s.to_dict().items():
        resolved = {"d_k": dk, "d_v": dv, "kv_heads": g, "scale": f"{s.scale_:.6g}"}.get(k)
        note = f"  (-> {resolved})" if v is None and resolved is not None else ""
        out.append(f"  {k:<16} {v}{note}")
    out += ["", "parameters (exact)"]
    bias_rule = (
        f"with biases on all four projections: h*dk + g*dk + g*dv + d_model = {pb.biases:,}" if s.bias else "no biases"
    )
    out.append(f"  convention   {bias_rule}")
    rows = [
        ("W_Q", f"{s.d_model} x {h * dk}", "c x (h dk)", pb.w_q),
        ("W_K", f"{s.d_kv_in} x {g * dk}", "c_kv x (g dk)", pb.w_k),
        ("W_V", f"{s.d_kv_in} x {g * dv}", "c_kv x (g dv)", pb.w_v),
        ("W_O", f"{h * dv} x {s.d_model}", "(h dv) x c", pb.w_o),
    ]
    for label, dims, axes, n in rows:
        out.append(f"  {label}  {dims:<13} ({axes:<13}) {n:>14,}")
    if s.bias:
        out.append(f"  {'biases':<35}{pb.biases:>14,}")
    for mod in modifiers.active(s):
        added = mod.parameters_added(s)
        if added:
            out.append(f"  {mod.parameters_label(s):<35}{added:>14,}")
    if module_count is None:
        out.append(f"  total: formula {formula:,} (too large for torch to build even on the meta device)")
    else:
        agree = "agree" if formula == module_count else "DISAGREE"
        out.append(f"  total: formula {formula:,}, counted from the module {module_count:,} ({agree})")
    if s.layout == "combined":
        w = g * dk + g * dv + (0 if s.is_cross else h * dk)
        what = "[K|V]" if s.is_cross else "[Q|K|V]"
        out.append(f"  combined input projection {what}: {s.d_kv_in if s.is_cross else s.d_model} -> {w}")
    active = modifiers.active(s)
    if active:
        out += ["", "modifiers (in order of application; zoo/modifiers/)"]
        out += [f"  {mod.describe(s)}" for mod in active]
    out += ["", f"shapes at B={batch}, T={seq}" + (f", S={sl}" if s.is_cross else "")]
    for st in stage_shapes(s, batch, seq, sl):
        out.append(f"  {st.name}  ({st.axes:<10})  {st.shape}")
    n_scores = score_entries(s, batch, seq, sl)
    out += ["", f"score entries B*h*T*S = {batch}*{h}*{seq}*{sl} = {n_scores:,}"]
    f = flops(s, batch, seq, sl)
    out += ["", f"FLOPs ({FLOP_CONVENTION})"]
    out.append(f"  projections Q/K/V/O  {f.projections:>18,}  ({human(f.projections, 'FLOP')})")
    out.append(f"  scores Q K^T         {f.scores:>18,}")
    out.append(f"  A V                  {f.weighted_values:>18,}")
    out.append(f"  total                {f.total:>18,}  ({human(f.total, 'FLOP')})")
    bm = bytes_moved(s, batch, seq, sl, itemsize=itemsize)
    out += ["", f"bytes moved (itemsize {itemsize})"]
    out.append(
        f"  minimum (read x{', context' if s.is_cross else ''} and parameters once, write y once): "
        f"{bm.minimum:,} ({human(bm.minimum, 'B')})"
    )
    out.append(f"  a materialized score tensor adds at least {bm.scores:,} ({human(bm.scores, 'B')}) each way")
    return "\n".join(out)
