"""The seeds' audit order as executable checks on one random input.

Each step recomputes its quantity independently (plain per-head matmuls on the weights,
no einops) and compares it with what the module computes. The audit runs in float64 so
that "equal" means equal to ~1e-12, not "close enough in fp32".
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass

import torch
from einops import rearrange
from torch import Tensor

from . import modifiers
from .accounting import count_parameters, parameter_breakdown
from .attention import MERGE_HEADS, SPLIT_HEADS, MultiHeadAttention
from .heads import get_projections, permute_heads, prune_heads, to_combined, to_separate

ATOL = 1e-10  # float64 throughout; a real bug is off by far more


@dataclass(frozen=True)
class Step:
    title: str
    ok: bool
    detail: str


def _err(a: Tensor, b: Tensor) -> float:
    return (a - b).abs().max().item() if a.numel() else 0.0


def _lin(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    y = x @ w.T
    return y if b is None else y + b


def valid_permutation(m: MultiHeadAttention, rng: random.Random) -> list[int]:
    """A random query-head permutation that respects GQA groups (whole groups move)."""
    s = m.spec
    gs, g = s.group_size, s.kv_heads_
    groups = list(range(g))
    rng.shuffle(groups)
    perm = []
    for j in groups:
        inside = list(range(j * gs, (j + 1) * gs))
        rng.shuffle(inside)
        perm += inside
    if perm == list(range(s.heads)) and s.heads > 1:  # make sure something actually moves
        perm = perm[::-1] if g == 1 or gs == 1 else perm[gs:] + perm[:gs]
    return perm


def run_audit(m: MultiHeadAttention, *, batch: int = 2, seq: int = 5, ctx_seq: int = 7, seed: int = 0) -> list[Step]:
    """Run every step; never raises for a failed check (a FAIL step says what was off)."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    m = copy.deepcopy(m).to(torch.float64).eval()  # the caller's module stays as it was
    s = m.spec
    b, t = batch, seq
    sl = ctx_seq if s.is_cross else seq
    h, g, dk, dv, gs = s.heads, s.kv_heads_, s.d_k_, s.d_v_, s.group_size
    x = torch.randn(b, t, s.d_model, dtype=torch.float64)
    ctx = torch.randn(b, sl, s.d_context, dtype=torch.float64) if s.is_cross else None
    src = ctx if s.is_cross else x
    # A random padding-style mask with one query row that may attend to nothing.
    mask = torch.rand(b, 1, t, sl) > 0.3
    mask[..., 0] = True
    mask[0, 0, t - 1, :] = False
    steps: list[Step] = []
    add = steps.append

    # 1. dims and bias convention
    formula, counted = count_parameters(s), count_parameters(m)
    pb = parameter_breakdown(s)
    add(
        Step(
            "dims and bias convention",
            formula == counted,
            f"B={b} T={t} S={sl} d_model={s.d_model} h={h} g={g} d_k={dk} d_v={dv} "
            f"bias={'on (all four projections)' if s.bias else 'off'}; params formula={formula:,} "
            f"module={counted:,} (weights {pb.weights:,} + biases {pb.biases:,}"
            + (f" + modifier weights {pb.modifiers:,}" if pb.modifiers else "")
            + ")",
        )
    )

    # 2. projection widths
    p = get_projections(m)
    want = {
        "W_Q": (h * dk, s.d_model),
        "W_K": (g * dk, s.d_kv_in),
        "W_V": (g * dv, s.d_kv_in),
        "W_O": (s.d_model, h * dv),
    }
    got = {"W_Q": p.w_q.shape, "W_K": p.w_k.shape, "W_V": p.w_v.shape, "W_O": p.w_o.shape}
    ok = all(tuple(got[k]) == want[k] for k in want)
    if s.layout == "combined":
        lin = m.kv_proj if s.is_cross else m.qkv_proj
        fused_out = lin.weight.shape[0]
        expect = (g * dk + g * dv) + (0 if s.is_cross else h * dk)
        ok = ok and fused_out == expect
        extra = f"; combined projection out width {fused_out} = {expect}"
    else:
        extra = ""
    widths = ", ".join(f"{k} {want[k][1]}->{want[k][0]}" for k in want)
    add(Step("projection widths (in->out)", ok, widths + extra))

    # 3. axis labels around split and transpose
    q_m, k_m, v_m = m.project(x, ctx)
    q = rearrange(q_m, SPLIT_HEADS, h=h)
    k = rearrange(k_m, SPLIT_HEADS, h=g)
    v = rearrange(v_m, SPLIT_HEADS, h=g)
    q_ref = torch.stack(
        [
            _lin(x, p.w_q[r * dk : (r + 1) * dk], None if p.b_q is None else p.b_q[r * dk : (r + 1) * dk])
            for r in range(h)
        ],
        1,
    )
    k_ref = torch.stack(
        [
            _lin(src, p.w_k[j * dk : (j + 1) * dk], None if p.b_k is None else p.b_k[j * dk : (j + 1) * dk])
            for j in range(g)
        ],
        1,
    )
    v_ref = torch.stack(
        [
            _lin(src, p.w_v[j * dv : (j + 1) * dv], None if p.b_v is None else p.b_v[j * dv : (j + 1) * dv])
            for j in range(g)
        ],
        1,
    )
    e = max(_err(q, q_ref), _err(k, k_ref), _err(v, v_ref))
    shapes_ok = q.shape == (b, h, t, dk) and k.shape == (b, g, sl, dk) and v.shape == (b, g, sl, dv)
    add(
        Step(
            "axis labels: split 'b t (h d) -> b h t d'",
            shapes_ok and e < ATOL,
            f"Q (b t (h dk))={tuple(q_m.shape)} -> (b h t dk)={tuple(q.shape)}; "
            f"K -> (b g s dk)={tuple(k.shape)}; V -> (b g s dv)={tuple(v.shape)}; "
            f"head r = feature block r: max err {e:.1e}",
        )
    )

    # 4. inside each head: scores, mask, softmax rows, values
    y_mod, a_mod = m(x, ctx, mask, need_weights=True)
    # The built-in mask (causal, window) and the modifiers, written out independently.
    builtin = torch.ones(t, sl, dtype=torch.bool)
    if s.causal:
        builtin = builtin.tril()
    if s.window is not None:
        builtin = builtin & torch.ones(t, sl, dtype=torch.bool).triu(-(s.window - 1))
    allowed = mask.expand(b, h, t, sl) & builtin
    _, a_nomask = m(x, ctx, need_weights=True)  # only the built-in mask applies
    causal = builtin
    if s.qk_norm is not None:
        q_ref, k_ref = modifiers.QKNorm.reference(s, q_ref, k_ref, p.q_norm, p.k_norm)
    if s.rope_theta is not None:
        pos = torch.arange(t)[None]
        q_ref, k_ref = modifiers.Rotary.reference(s, q_ref, pos), modifiers.Rotary.reference(s, k_ref, pos)
    z_heads = []
    worst = {"scores": 0.0, "weights": 0.0, "rowsum": 0.0, "masked": 0.0, "empty": 0.0}
    for r in range(h):
        j = r // gs  # blocked GQA
        sc = q_ref[:, r] @ k_ref[:, j].transpose(-1, -2) * s.scale_
        if s.softcap is not None:
            sc = s.softcap * torch.tanh(sc / s.softcap)
        if s.alibi:
            slope = float(p.alibi_slopes[r])
            sc = sc + torch.tensor(
                [[modifiers.ALiBi.reference(s, slope, i, jj) for jj in range(sl)] for i in range(t)], dtype=sc.dtype
            )
        al = allowed[:, r]
        sc_m = sc.masked_fill(~al, float("-inf"))
        has = al.any(-1, keepdim=True)
        a = torch.where(has, torch.softmax(torch.where(has, sc_m, 0.0), -1), 0.0)
        z_heads.append(a @ v_ref[:, j])
        worst["weights"] = max(worst["weights"], _err(a_mod[:, r], a))
        rows = a_mod[:, r].sum(-1)
        worst["rowsum"] = max(worst["rowsum"], _err(rows[has[..., 0]], torch.ones_like(rows[has[..., 0]])))
        worst["masked"] = max(worst["masked"], a_mod[:, r][~al].abs().max().item() if (~al).any() else 0.0)
        worst["empty"] = max(worst["empty"], a_mod[:, r][~has[..., 0]].abs().max().item() if (~has).any() else 0.0)
        # The module does not expose its logits; the softmax without a user mask pins the
        # scale and Q K^T (up to a per-row constant, which a softmax cannot see anyway).
        a_plain = torch.softmax(sc.masked_fill(~causal, float("-inf")), -1)
        worst["scores"] = max(worst["scores"], _err(a_plain, a_nomask[:, r]))
    finite = bool(torch.isfinite(y_mod).all())
    add(
        Step(
            "per head: scores Q K^T * scale",
            worst["scores"] < ATOL,
            f"{h} heads, scale={s.scale_:.6g}, softmax(Q_r K_j^T * scale) vs module: max err {worst['scores']:.1e}",
        )
    )
    empty_rows = int((~allowed.any(-1)).sum())
    add(
        Step(
            "per head: mask, softmax rows, masked weights",
            worst["weights"] < ATOL
            and worst["rowsum"] < ATOL
            and worst["masked"] == 0.0
            and worst["empty"] == 0.0
            and finite,
            f"row sums - 1: {worst['rowsum']:.1e}; masked weights max {worst['masked']:.1e} (must be 0); "
            f"{empty_rows} fully masked rows give weights {worst['empty']:.1e}, y finite: {finite}; "
            f"weights vs reference {worst['weights']:.1e}" + ("; causal" if s.causal else ""),
        )
    )

    # 5. separate vs combined
    y_plain = m(x, ctx)
    other = to_combined(m) if s.layout == "separate" else to_separate(m)
    e_conv = _err(other(x, ctx), y_plain)
    back = to_separate(other) if s.layout == "separate" else to_combined(other)
    e_round = max(_err(a_, b_) for a_, b_ in zip(m.state_dict().values(), back.state_dict().values()))
    add(
        Step(
            "separate vs combined",
            e_conv < ATOL and e_round == 0.0,
            f"{s.layout} -> {other.spec.layout}: output max err {e_conv:.1e}; round trip weights exact ({e_round:.1e})",
        )
    )

    # 6. transpose reversed + 7. concat order
    z_ref = torch.stack(z_heads, 1)  # (b h t dv)
    z_merged = rearrange(z_ref, MERGE_HEADS)
    e_rev = _err(rearrange(z_merged, SPLIT_HEADS, h=h), z_ref)
    add(
        Step(
            "transpose reversed: 'b h t d -> b t (h d)'",
            e_rev == 0.0 and z_merged.shape == (b, t, h * dv),
            f"Z (b h t dv)={tuple(z_ref.shape)} -> (b t (h dv))={tuple(z_merged.shape)}; split(merge(Z)) == Z exactly",
        )
    )
    cat = torch.cat(z_heads, -1)
    e_cat = _err(z_merged, cat)
    add(
        Step(
            "concat along the head-feature axis, in head order",
            e_cat == 0.0,
            f"columns [r*dv:(r+1)*dv] hold head r for r = 0..{h - 1}: max err {e_cat:.1e}",
        )
    )

    # 8. W_O shape and selected rows of y
    w_o_math = p.w_o.T  # (h dv) x c
    y_ref = _lin(z_merged, p.w_o, p.b_o)
    rows = [(0, 0), (b - 1, t - 1), (b // 2, t // 2)]
    e_rows = max(_err(y_mod[bi, ti], y_ref[bi, ti]) for bi, ti in rows)
    e_all = _err(y_mod, y_ref)
    add(
        Step(
            "W_O and selected output rows",
            tuple(w_o_math.shape) == (h * dv, s.d_model) and e_rows < ATOL and e_all < ATOL,
            f"W_O (h dv) x c = {tuple(w_o_math.shape)}; rows (b,t) {rows}: max err {e_rows:.1e}; whole y {e_all:.1e}",
        )
    )

    # 9. head zeroing at the named location (Z^(r) before concat) == removing W_O rows
    j = h - 1
    hm = torch.ones(h, dtype=torch.float64)
    hm[j] = 0
    y_zero = m(x, ctx, mask, head_mask=hm)
    w_o_cut = w_o_math.clone()
    w_o_cut[j * dv : (j + 1) * dv] = 0
    y_cut = z_merged @ w_o_cut + (0 if p.b_o is None else p.b_o)
    e_zero = _err(y_zero, y_cut)
    detail = f"head_mask[{j}]=0 vs W_O rows {j * dv}..{(j + 1) * dv - 1} zeroed: max err {e_zero:.1e}"
    ok = e_zero < ATOL
    if s.qk_norm == "full":  # refused by prune_heads, with the reason; zeroing still applies
        detail += "; pruning does not apply with qk_norm='full' (one RMS over all heads)"
    elif h > 1:
        try:
            drop = [j] if gs == 1 or g == 1 else list(range((g - 1) * gs, h))
            hm2 = torch.ones(h, dtype=torch.float64)
            hm2[drop] = 0
            pruned = prune_heads(m, drop)
            e_prune = _err(pruned(x, ctx, mask), m(x, ctx, mask, head_mask=hm2))
            ok = ok and e_prune < ATOL
            detail += f"; prune_heads({drop}) == zeroing them: {e_prune:.1e}"
        except ValueError as exc:  # reported, not hidden
            ok = False
            detail += f"; prune_heads failed: {exc}"
    add(Step("zeroing a head == removing its rows of W_O", ok, detail))

    # 10. permutation invariance
    if h > 1:
        perm = valid_permutation(m, rng)
        pm = permute_heads(m, perm)
        e_perm = _err(pm(x, ctx, mask), m(x, ctx, mask))
        _, a_perm = pm(x, ctx, mask, need_weights=True)
        e_aperm = _err(a_perm, a_mod[:, perm])
        add(
            Step(
                "head permutation preserves the function",
                e_perm < ATOL and e_aperm < ATOL,
                f"perm={perm}"
                + (f" (GQA groups of {gs} move whole)" if gs > 1 else "")
                + f": y max err {e_perm:.1e}; weights follow the heads {e_aperm:.1e}",
            )
        )
    else:
        add(Step("head permutation preserves the function", True, "h=1: the only permutation is the identity"))

    # 11. fused vs explicit paths
    fused_flag = m.fused
    try:
        m.fused = True
        y_f = m(x, ctx, mask)
        m.fused = False
        y_e = m(x, ctx, mask)
    finally:
        m.fused = fused_flag
    e_fe = _err(y_f, y_e)
    add(Step("fused (SDPA) vs explicit path", e_fe < ATOL, f"max err {e_fe:.1e}"))

    # 12+. each modifier's own property (zoo/modifiers.py)
    for mod in modifiers.active(s):
        title, ok, detail = mod.audit(m, x)
        add(Step(title, ok, detail))
    return steps


def format_audit(name: str, steps: list[Step]) -> str:
    width = max(len(st.title) for st in steps)
    lines = [f"audit {name}"]
    for i, st in enumerate(steps, 1):
        lines.append(f"{i:>2}. {'PASS' if st.ok else 'FAIL'}  {st.title:<{width}}  {st.detail}")
    n_fail = sum(not st.ok for st in steps)
    lines.append(f"{len(steps) - n_fail} passed, {n_fail} failed")
    return "\n".join(lines)
