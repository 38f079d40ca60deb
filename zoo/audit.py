"""The seeds' audit order as executable checks on one random input.

Each step recomputes its quantity independently (plain per-head matmuls on the weights,
no einops) and compares it with what the module computes. The audit runs in float64 so
that "equal" means equal to ~1e-12, not "close enough in fp32".
"""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass, field

import torch
from einops import rearrange
from torch import Tensor

from . import modifiers
from .accounting import count_parameters, parameter_breakdown
from .attend import MERGE_HEADS, SPLIT_HEADS
from .attention import MultiHeadAttention
from .heads import Projections, get_projections, permute_heads, prune_heads, to_combined, to_separate

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


@dataclass
class _Case:
    """The audited block (float64 copy), one random input, and what the steps compute from them."""

    m: MultiHeadAttention
    x: Tensor  # (b t c)
    ctx: Tensor | None  # (b s c_ctx) for cross-attention
    mask: Tensor  # (b 1 t s) bool, one query row with no allowed key
    rng: random.Random
    p: Projections = field(init=False)
    # filled by the steps, in order
    refs: tuple[Tensor, Tensor, Tensor] | None = None  # Q (b h t dk), K (b g s dk), V (b g s dv)
    y: Tensor | None = None  # the module's y (b t c) with the mask
    attn: Tensor | None = None  # its weights (b h t s)
    z_heads: list[Tensor] = field(default_factory=list)  # the reference Z^(r) (b t dv), r = 0..h-1
    z_merged: Tensor | None = None  # (b t (h dv))
    z_out: Tensor | None = None  # what W_O reads (b t (h dv)): z_merged after the output gate, if any

    def __post_init__(self) -> None:
        self.p = get_projections(self.m)

    @property
    def s(self):
        return self.m.spec

    @property
    def src(self) -> Tensor:
        return self.ctx if self.s.is_cross else self.x

    @property
    def shape(self) -> tuple[int, int, int]:
        """(b, t, s)"""
        return self.x.shape[0], self.x.shape[1], self.src.shape[1]


def run_audit(m: MultiHeadAttention, *, batch: int = 2, seq: int = 5, ctx_seq: int = 7, seed: int = 0) -> list[Step]:
    """Run every step, in the seeds' audit order; never raises for a failed check (a FAIL step
    says what was off)."""
    torch.manual_seed(seed)
    m = copy.deepcopy(m).to(torch.float64).eval()  # the caller's module stays as it was
    s = m.spec
    sl = ctx_seq if s.is_cross else seq
    x = torch.randn(batch, seq, s.d_model, dtype=torch.float64)
    ctx = torch.randn(batch, sl, s.d_context, dtype=torch.float64) if s.is_cross else None
    # A random padding-style mask with one query row that may attend to nothing.
    mask = torch.rand(batch, 1, seq, sl) > 0.3
    mask[..., 0] = True
    mask[0, 0, seq - 1, :] = False
    case = _Case(m, x, ctx, mask, random.Random(seed))
    return [step for audit_step in AUDIT_ORDER for step in audit_step(case)]


def _dims(c: _Case) -> list[Step]:
    """1. State B, T, d_model, h, d_k, d_v and the bias convention; the count checks the module."""
    s, (b, t, sl) = c.s, c.shape
    formula, counted = count_parameters(s), count_parameters(c.m)
    pb = parameter_breakdown(s)
    detail = (
        f"B={b} T={t} S={sl} d_model={s.d_model} h={s.heads} g={s.kv_heads_} d_k={s.d_k_} d_v={s.d_v_} "
        f"bias={'on (all four projections)' if s.bias else 'off'}; params formula={formula:,} "
        f"module={counted:,} (weights {pb.weights:,} + biases {pb.biases:,}"
        + (f" + modifier weights {pb.modifiers:,}" if pb.modifiers else "")
        + ")"
    )
    return [Step("dims and bias convention", formula == counted, detail)]


def _widths(c: _Case) -> list[Step]:
    """2. Verify the (combined) projection widths."""
    s, p = c.s, c.p
    h, g, dk, dv = s.heads, s.kv_heads_, s.d_k_, s.d_v_
    latent = s.kv_lora_rank is not None  # K, V (and a low-rank Q) come from the latent's weights
    want = {
        "W_Q": (0 if latent and s.q_lora_rank else h * dk, s.d_model),
        "W_K": (0 if latent else g * dk, s.d_kv_in),
        "W_V": (0 if latent else g * dv, s.d_kv_in),
        "W_O": (s.d_model, h * dv),
    }
    got = {"W_Q": p.w_q.shape, "W_K": p.w_k.shape, "W_V": p.w_v.shape, "W_O": p.w_o.shape}
    ok = all(tuple(got[k]) == want[k] for k in want)
    extra = ""
    if s.layout == "combined":
        lin = c.m.kv_proj if s.is_cross else c.m.qkv_proj
        fused_out = lin.weight.shape[0]
        expect = (g * dk + g * dv) + (0 if s.is_cross else h * dk)
        ok = ok and fused_out == expect
        extra = f"; combined projection out width {fused_out} = {expect}"
    widths = ", ".join(f"{k} {want[k][1]}->{want[k][0]}" for k in want)
    return [Step("projection widths (in->out)", ok, widths + extra)]


def _per_head(x: Tensor, w: Tensor, b: Tensor | None, heads: int, d: int) -> Tensor:
    """(b n heads d): each head's rows of w applied alone (no einops)."""
    blocks = [_lin(x, w[r * d : (r + 1) * d], None if b is None else b[r * d : (r + 1) * d]) for r in range(heads)]
    return torch.stack(blocks, 1)


def _split(c: _Case) -> list[Step]:
    """3. Label the axes before split and transpose: head r is feature block r."""
    s, p, (b, t, sl) = c.s, c.p, c.shape
    h, g, dk, dv = s.heads, s.kv_heads_, s.d_k_, s.d_v_
    q_m, k_m, v_m = c.m.project(c.x, c.ctx)
    q = rearrange(q_m, SPLIT_HEADS, h=h)
    k = rearrange(k_m, SPLIT_HEADS, h=g)
    v = rearrange(v_m, SPLIT_HEADS, h=g)
    c.refs = (
        _per_head(c.x, p.w_q, p.b_q, h, dk),
        _per_head(c.src, p.w_k, p.b_k, g, dk),
        _per_head(c.src, p.w_v, p.b_v, g, dv),
    )
    for mod in modifiers.active(s):  # latent attention makes Q, K, V itself
        c.refs = mod.reference_project(s, c.x, p) or c.refs
    for mod in modifiers.active(s):  # e.g. clip_qkv on the projections, before anything else
        c.refs = mod.reference_qkv(s, *c.refs)
    e = max(_err(q, c.refs[0]), _err(k, c.refs[1]), _err(v, c.refs[2]))
    shapes_ok = q.shape == (b, h, t, dk) and k.shape == (b, g, sl, dk) and v.shape == (b, g, sl, dv)
    detail = (
        f"Q (b t (h dk))={tuple(q_m.shape)} -> (b h t dk)={tuple(q.shape)}; "
        f"K -> (b g s dk)={tuple(k.shape)}; V -> (b g s dv)={tuple(v.shape)}; "
        f"head r = feature block r: max err {e:.1e}"
    )
    return [Step("axis labels: split 'b t (h d) -> b h t d'", shapes_ok and e < ATOL, detail)]


def _inside_heads(c: _Case) -> list[Step]:
    """4. Inside each head: scores, masks, softmax rows and values, against a reference that
    applies the modifiers from their own written-out forms (zoo/modifiers/, reference_*)."""
    s, p, (b, t, sl) = c.s, c.p, c.shape
    mods = modifiers.active(s)
    c.y, c.attn = c.m(c.x, c.ctx, c.mask, need_weights=True)
    builtin = torch.ones(t, sl, dtype=torch.bool)
    if s.causal:
        builtin = builtin.tril()
    for mod in mods:
        cells = mod.reference_allowed(s, t, sl)
        builtin = builtin if cells is None else builtin & cells
    allowed = c.mask.expand(b, s.heads, t, sl) & builtin
    _, a_nomask = c.m(c.x, c.ctx, need_weights=True)  # only the built-in mask applies
    q_ref, k_ref, v_ref = c.refs
    pos = torch.arange(t)[None]
    for mod in mods:
        q_ref, k_ref = mod.reference_qk(s, q_ref, k_ref, p, pos)
    worst = dict.fromkeys(("scores", "weights", "rowsum", "masked", "empty"), 0.0)
    sunk = False  # a sink takes a share of each row
    c.z_heads = []
    for r in range(s.heads):
        j = r // s.group_size  # blocked GQA
        sc = q_ref[:, r] @ k_ref[:, j].transpose(-1, -2) * s.scale_
        for mod in mods:
            sc = mod.reference_map(s, sc)
        for mod in mods:
            bias = mod.reference_bias(s, r, p, t, sl)
            sc = sc if bias is None else sc + bias.to(sc.dtype)
        al = allowed[:, r]
        has = al.any(-1, keepdim=True)
        sink = next((x for mod in mods if (x := mod.reference_sink(s, r, p)) is not None), None)
        sunk = sunk or sink is not None
        a = torch.where(has, _softmax(torch.where(has, sc.masked_fill(~al, float("-inf")), 0.0), sink), 0.0)
        c.z_heads.append(a @ v_ref[:, j])
        a_mod = c.attn[:, r]
        worst["weights"] = max(worst["weights"], _err(a_mod, a))
        rows = a_mod.sum(-1)[has[..., 0]]  # 1, less the share a sink takes
        want = torch.ones_like(rows) if sink is None else a.sum(-1)[has[..., 0]]
        worst["rowsum"] = max(worst["rowsum"], _err(rows, want))
        worst["masked"] = max(worst["masked"], a_mod[~al].abs().max().item() if (~al).any() else 0.0)
        worst["empty"] = max(worst["empty"], a_mod[~has[..., 0]].abs().max().item() if (~has).any() else 0.0)
        # The module does not expose its logits; the softmax without a user mask pins the
        # scale and Q K^T (up to a per-row constant, which a softmax cannot see anyway).
        a_plain = _softmax(sc.masked_fill(~builtin, float("-inf")), sink)
        worst["scores"] = max(worst["scores"], _err(a_plain, a_nomask[:, r]))
    finite = bool(torch.isfinite(c.y).all())
    empty_rows = int((~allowed.any(-1)).sum())
    rows_ok = worst["weights"] < ATOL and worst["rowsum"] < ATOL and worst["masked"] == 0.0 and worst["empty"] == 0.0
    return [
        Step(
            "per head: scores Q K^T * scale",
            worst["scores"] < ATOL,
            f"{s.heads} heads, scale={s.scale_:.6g}, softmax(Q_r K_j^T * scale) vs module: "
            f"max err {worst['scores']:.1e}",
        ),
        Step(
            "per head: mask, softmax rows, masked weights",
            rows_ok and finite,
            f"row sums - 1{' (less the sink share)' if sunk else ''}: {worst['rowsum']:.1e}; "
            f"masked weights max {worst['masked']:.1e} (must be 0); "
            f"{empty_rows} fully masked rows give weights {worst['empty']:.1e}, y finite: {finite}; "
            f"weights vs reference {worst['weights']:.1e}" + ("; causal" if s.causal else ""),
        ),
    ]


def _softmax(scores: Tensor, sink: float | None) -> Tensor:
    """The softmax over keys (b t s); a sink is one more column of logits, dropped after the softmax."""
    if sink is None:
        return torch.softmax(scores, -1)
    column = torch.full_like(scores[..., :1], sink)
    return torch.softmax(torch.cat([scores, column], -1), -1)[..., :-1]


def _layouts(c: _Case) -> list[Step]:
    """5. Compare the separate and combined head results."""
    s, m = c.s, c.m
    if s.kv_lora_rank is not None:
        return [Step("separate vs combined", True, "latent attention has no [Q|K|V] projection to combine")]
    y_plain = m(c.x, c.ctx)
    other = to_combined(m) if s.layout == "separate" else to_separate(m)
    e_conv = _err(other(c.x, c.ctx), y_plain)
    back = to_separate(other) if s.layout == "separate" else to_combined(other)
    e_round = max(_err(a_, b_) for a_, b_ in zip(m.state_dict().values(), back.state_dict().values()))
    detail = f"{s.layout} -> {other.spec.layout}: output max err {e_conv:.1e}; round trip weights exact ({e_round:.1e})"
    return [Step("separate vs combined", e_conv < ATOL and e_round == 0.0, detail)]


def _transpose(c: _Case) -> list[Step]:
    """6. Reverse the head-position transpose."""
    b, t, _ = c.shape
    z_ref = torch.stack(c.z_heads, 1)  # (b h t dv)
    c.z_merged = rearrange(z_ref, MERGE_HEADS)
    e_rev = _err(rearrange(c.z_merged, SPLIT_HEADS, h=c.s.heads), z_ref)
    detail = (
        f"Z (b h t dv)={tuple(z_ref.shape)} -> (b t (h dv))={tuple(c.z_merged.shape)}; split(merge(Z)) == Z exactly"
    )
    ok = e_rev == 0.0 and c.z_merged.shape == (b, t, c.s.heads * c.s.d_v_)
    c.z_out = c.z_merged  # what W_O reads: after the modifiers that act on Z (the output gate)
    for mod in modifiers.active(c.s):
        c.z_out = mod.reference_z(c.s, c.z_out, c.x, c.p)
    return [Step("transpose reversed: 'b h t d -> b t (h d)'", ok, detail)]


def _concat(c: _Case) -> list[Step]:
    """7. Concatenate along the head-feature axis in the declared order."""
    e_cat = _err(c.z_merged, torch.cat(c.z_heads, -1))
    detail = f"columns [r*dv:(r+1)*dv] hold head r for r = 0..{c.s.heads - 1}: max err {e_cat:.1e}"
    return [Step("concat along the head-feature axis, in head order", e_cat == 0.0, detail)]


def _w_o(c: _Case) -> list[Step]:
    """8. Verify W_O: (h d_v, d_model) and selected numerical rows."""
    s, p, (b, t, _) = c.s, c.p, c.shape
    w_o_math = p.w_o.T  # (h dv) x c
    y_ref = _lin(c.z_out, p.w_o, p.b_o)
    rows = [(0, 0), (b - 1, t - 1), (b // 2, t // 2)]
    e_rows = max(_err(c.y[bi, ti], y_ref[bi, ti]) for bi, ti in rows)
    e_all = _err(c.y, y_ref)
    ok = tuple(w_o_math.shape) == (s.heads * s.d_v_, s.d_model) and e_rows < ATOL and e_all < ATOL
    detail = f"W_O (h dv) x c = {tuple(w_o_math.shape)}; rows (b,t) {rows}: max err {e_rows:.1e}; whole y {e_all:.1e}"
    return [Step("W_O and selected output rows", ok, detail)]


def _zeroing(c: _Case) -> list[Step]:
    """9a. Head zeroing at the named location (Z^(r) before concat) == removing W_O's rows;
    pruning the head == zeroing it."""
    s, m, p = c.s, c.m, c.p
    h, g, gs, dv = s.heads, s.kv_heads_, s.group_size, s.d_v_
    j = h - 1
    hm = torch.ones(h, dtype=torch.float64)
    hm[j] = 0
    y_zero = m(c.x, c.ctx, c.mask, head_mask=hm)
    w_o_cut = p.w_o.T.clone()
    w_o_cut[j * dv : (j + 1) * dv] = 0
    y_cut = c.z_out @ w_o_cut + (0 if p.b_o is None else p.b_o)
    e_zero = _err(y_zero, y_cut)
    detail = f"head_mask[{j}]=0 vs W_O rows {j * dv}..{(j + 1) * dv - 1} zeroed: max err {e_zero:.1e}"
    ok = e_zero < ATOL
    refusal = modifiers.prune_refusal(s)
    if refusal is not None:  # refused by prune_heads, with the reason; zeroing still applies
        detail += f"; pruning does not apply with {refusal.setting} ({refusal.short})"
    elif h > 1:
        try:
            drop = [j] if gs == 1 or g == 1 else list(range((g - 1) * gs, h))
            hm2 = torch.ones(h, dtype=torch.float64)
            hm2[drop] = 0
            e_prune = _err(prune_heads(m, drop)(c.x, c.ctx, c.mask), m(c.x, c.ctx, c.mask, head_mask=hm2))
            ok = ok and e_prune < ATOL
            detail += f"; prune_heads({drop}) == zeroing them: {e_prune:.1e}"
        except ValueError as exc:  # reported, not hidden
            ok = False
            detail += f"; prune_heads failed: {exc}"
    return [Step("zeroing a head == removing its rows of W_O", ok, detail)]


def _permutation(c: _Case) -> list[Step]:
    """9b. Head permutation (with W_O's matching rows) preserves the function."""
    title = "head permutation preserves the function"
    if c.s.heads == 1:
        return [Step(title, True, "h=1: the only permutation is the identity")]
    perm = valid_permutation(c.m, c.rng)
    pm = permute_heads(c.m, perm)
    e_perm = _err(pm(c.x, c.ctx, c.mask), c.m(c.x, c.ctx, c.mask))
    _, a_perm = pm(c.x, c.ctx, c.mask, need_weights=True)
    e_aperm = _err(a_perm, c.attn[:, perm])
    gs = c.s.group_size
    detail = (
        f"perm={perm}"
        + (f" (GQA groups of {gs} move whole)" if gs > 1 else "")
        + f": y max err {e_perm:.1e}; weights follow the heads {e_aperm:.1e}"
    )
    return [Step(title, e_perm < ATOL and e_aperm < ATOL, detail)]


def _fused(c: _Case) -> list[Step]:
    """The fast path against the explicit one."""
    m, fused_flag = c.m, c.m.fused
    try:
        m.fused = True
        y_f = m(c.x, c.ctx, c.mask)
        m.fused = False
        y_e = m(c.x, c.ctx, c.mask)
    finally:
        m.fused = fused_flag
    e_fe = _err(y_f, y_e)
    return [Step("fused (SDPA) vs explicit path", e_fe < ATOL, f"max err {e_fe:.1e}")]


def _modifier_steps(c: _Case) -> list[Step]:
    """Each active modifier's own property (zoo/modifiers/, `audit`)."""
    return [Step(*mod.audit(c.m, c.x)) for mod in modifiers.active(c.s)]


# The seeds' audit order (seed 000, "Audit Order"), then the fast path and the modifiers.
AUDIT_ORDER = (
    _dims,
    _widths,
    _split,
    _inside_heads,
    _layouts,
    _transpose,
    _concat,
    _w_o,
    _zeroing,
    _permutation,
    _fused,
    _modifier_steps,
)


def format_audit(name: str, steps: list[Step]) -> str:
    width = max(len(st.title) for st in steps)
    lines = [f"audit {name}"]
    for i, st in enumerate(steps, 1):
        lines.append(f"{i:>2}. {'PASS' if st.ok else 'FAIL'}  {st.title:<{width}}  {st.detail}")
    n_fail = sum(not st.ok for st in steps)
    lines.append(f"{len(steps) - n_fail} passed, {n_fail} failed")
    return "\n".join(lines)
