"""Operations on whole heads, each returning a new module: layout conversion, permutation, pruning.

Weights are read and written as nn.Linear stores them, (out, in). In that form a head's
block of W_Q/W_K/W_V is a block of rows and its block of W_O is a block of columns
(in the math's W_O : (h dv) x c, rows again).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from . import modifiers
from .attention import MultiHeadAttention
from .attention_spec import AttentionSpec
from .errors import ArgumentError, InputTypeError
from .modifiers import take_blocks


@dataclass
class Projections:
    """The four projections of a block, layout-independent. Biases are None without bias."""

    w_q: Tensor  # ((h dk), c)
    w_k: Tensor  # ((g dk), c_kv)
    w_v: Tensor  # ((g dv), c_kv)
    w_o: Tensor  # (c, (h dv))
    b_q: Tensor | None = None
    b_k: Tensor | None = None
    b_v: Tensor | None = None
    b_o: Tensor | None = None
    # Modifier state, one field per name in a modifier's `state_fields` (zoo/modifiers/ says
    # what each holds and how it follows the heads). None when the spec has no such modifier.
    q_norm: Tensor | None = None
    k_norm: Tensor | None = None
    q_norm_bias: Tensor | None = None  # LayerNorm QK-norm's biases (qk_norm_bias)
    k_norm_bias: Tensor | None = None
    alibi_slopes: Tensor | None = None
    rel_bias: Tensor | None = None  # T5's relative bias table (buckets, h)
    sinks: Tensor | None = None  # attention sinks: one softmax logit per query head (h)
    # latent attention (zoo/modifiers/latent.py): its projections as nn.Linear stores them; w_k and w_v then
    # have no rows, and w_q none either when the query has its low rank (q_a, q_b)
    q_a: Tensor | None = None  # (rq, c)
    q_a_norm: Tensor | None = None  # (rq)
    q_b: Tensor | None = None  # ((h dk), rq), each head [q_nope | q_rot] as the model stores it
    kv_a: Tensor | None = None  # ((r + dr), c)
    kv_a_norm: Tensor | None = None  # (r)
    kv_b: Tensor | None = None  # ((h (dk - dr + dv)), r)
    # the gated output (zoo/modifiers/gate.py): W_G as nn.Linear stores it, rows head-major
    w_gate: Tensor | None = None  # ((h dv), c)
    b_gate: Tensor | None = None  # ((h dv))


def _require_module(m: object) -> MultiHeadAttention:
    if not isinstance(m, MultiHeadAttention):
        raise InputTypeError(f"expected a zoo MultiHeadAttention module, got {type(m).__name__}")
    return m


def get_projections(m: MultiHeadAttention) -> Projections:
    """Detached copies of the block's weights, split per projection whatever the layout."""
    s = _require_module(m).spec
    qw, kw = s.heads * s.d_k_, s.kv_heads_ * s.d_k_
    b = s.bias

    def wb(lin: torch.nn.Linear) -> tuple[Tensor, Tensor | None]:
        return lin.weight.detach().clone(), (lin.bias.detach().clone() if b else None)

    w_o, b_o = wb(m.out_proj)
    if s.kv_lora_rank is not None:
        none = w_o.new_zeros(0, s.d_model)
        w_q = wb(m.q_proj)[0] if s.q_lora_rank is None else none
        (w_k, w_v), (b_q, b_k, b_v) = (none, none.clone()), (None, None, None)
    elif s.layout == "separate":
        (w_q, b_q), (w_k, b_k), (w_v, b_v) = wb(m.q_proj), wb(m.k_proj), wb(m.v_proj)
    elif s.is_cross:
        (w_q, b_q), (w_kv, b_kv) = wb(m.q_proj), wb(m.kv_proj)
        w_k, w_v = w_kv[:kw], w_kv[kw:]
        b_k, b_v = (b_kv[:kw], b_kv[kw:]) if b else (None, None)
    else:
        w, bb = wb(m.qkv_proj)
        w_q, w_k, w_v = w[:qw], w[qw : qw + kw], w[qw + kw :]
        b_q, b_k, b_v = (bb[:qw], bb[qw : qw + kw], bb[qw + kw :]) if b else (None, None, None)
    p = Projections(w_q, w_k, w_v, w_o, b_q, b_k, b_v, b_o)
    for mod in m.mods.values():
        for key, value in mod.head_state().items():
            setattr(p, key, value)
    return p


def build(spec: AttentionSpec, p: Projections, *, like: MultiHeadAttention | None = None) -> MultiHeadAttention:
    """A new module for `spec` holding exactly the weights `p`.

    Dtype and device come from `like` if given, else from the weights themselves, so an fp64
    block stays exact (no detour through the fp32 default).
    """
    m = MultiHeadAttention(spec, fused=like.fused if like is not None else True)
    if like is not None:
        m.share_kv = like.share_kv
        m.sdpa_fp32 = like.sdpa_fp32
    ref = like.out_proj.weight if like is not None else p.w_o
    m = m.to(device=ref.device, dtype=ref.dtype)
    with torch.no_grad():
        m.out_proj.weight.copy_(p.w_o)
        if spec.bias:
            m.out_proj.bias.copy_(p.b_o)
        if spec.kv_lora_rank is not None:
            pairs = [(m.q_proj, p.w_q, None)] if spec.q_lora_rank is None else []
        elif spec.layout == "separate":
            pairs = [(m.q_proj, p.w_q, p.b_q), (m.k_proj, p.w_k, p.b_k), (m.v_proj, p.w_v, p.b_v)]
        elif spec.is_cross:
            pairs = [
                (m.q_proj, p.w_q, p.b_q),
                (m.kv_proj, torch.cat([p.w_k, p.w_v]), _cat(p.b_k, p.b_v)),
            ]
        else:
            pairs = [(m.qkv_proj, torch.cat([p.w_q, p.w_k, p.w_v]), _cat(p.b_q, p.b_k, p.b_v))]
        for lin, w, bias in pairs:
            lin.weight.copy_(w)
            if spec.bias:
                lin.bias.copy_(bias)
        for mod in m.mods.values():
            mod.load_head_state({key: getattr(p, key) for key in mod.state_fields})
    return m


def _cat(*parts: Tensor | None) -> Tensor | None:
    return None if parts[0] is None else torch.cat(parts)  # type: ignore[arg-type]


def to_combined(m: MultiHeadAttention) -> MultiHeadAttention:
    """Same function, one input projection [Q|K|V] ([K|V] for cross-attention)."""
    _require_module(m)
    return build(m.spec.replace(layout="combined"), get_projections(m), like=m)


def to_separate(m: MultiHeadAttention) -> MultiHeadAttention:
    """Same function, separate W_Q, W_K, W_V."""
    _require_module(m)
    return build(m.spec.replace(layout="separate"), get_projections(m), like=m)


def _head_indices(values: Sequence[int] | Tensor, what: str) -> list[int]:
    """A list of int head indices, or a TypeError naming what was given."""
    if isinstance(values, Tensor):
        values = values.tolist()
    if isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, set, frozenset, range)):
        raise InputTypeError(f"{what} must be a sequence of head indices, got {values!r}")
    out = []
    for v in values:
        if isinstance(v, bool) or not (isinstance(v, int) or (hasattr(v, "__index__") and not isinstance(v, float))):
            raise InputTypeError(f"{what} must hold integer head indices, got {v!r} in {values!r}")
        out.append(int(v))
    return out


def _check_perm(perm: Sequence[int] | Tensor, n: int, what: str) -> list[int]:
    perm = _head_indices(perm, what)
    if sorted(perm) != list(range(n)):
        raise ArgumentError(f"{what}={perm} is not a permutation of range({n})")
    return perm


def _select_heads(p: Projections, spec: AttentionSpec, q_heads: Sequence[int], kv_heads: Sequence[int]) -> Projections:
    """The projections of query heads `q_heads` and kv heads `kv_heads`, in that order."""
    h, g = spec.heads, spec.kv_heads_
    out = Projections(
        w_q=take_blocks(p.w_q, q_heads, h),
        w_k=take_blocks(p.w_k, kv_heads, g),
        w_v=take_blocks(p.w_v, kv_heads, g),
        w_o=take_blocks(p.w_o, q_heads, h, dim=1),
        b_q=take_blocks(p.b_q, q_heads, h),
        b_k=take_blocks(p.b_k, kv_heads, g),
        b_v=take_blocks(p.b_v, kv_heads, g),
        b_o=p.b_o,
    )
    for mod in modifiers.active(spec):
        state = {key: getattr(p, key) for key in mod.state_fields}
        for key, value in mod.select_heads(spec, state, q_heads, kv_heads).items():
            setattr(out, key, value)
    return out


def kv_permutation_for(spec: AttentionSpec, perm: Sequence[int]) -> list[int]:
    """The kv-head order that a query-head permutation implies under blocked GQA.

    New query head r is old head perm[r]; it must still read the kv head its old self read,
    so every block of group_size new heads must come from one old group.
    """
    gs = spec.group_size
    kv = []
    for j in range(spec.kv_heads_):
        groups = {perm[r] // gs for r in range(j * gs, (j + 1) * gs)}
        if len(groups) != 1:
            raise ArgumentError(
                f"perm={list(perm)} splits a GQA group: with heads={spec.heads}, "
                f"kv_heads={spec.kv_heads_} each block of {gs} new heads must come from one "
                f"kv group, but new heads {j * gs}..{(j + 1) * gs - 1} come from groups {sorted(groups)}"
            )
        kv.append(groups.pop())
    return kv


def permute_heads(m: MultiHeadAttention, perm: Sequence[int] | Tensor) -> MultiHeadAttention:
    """Same function, heads relabelled: new head r is old head perm[r].

    Q head blocks and the matching W_O blocks move together (W_O's inverse permutation in
    the math's convention); under GQA the kv heads move with their groups.
    """
    s = _require_module(m).spec
    perm = _check_perm(perm, s.heads, "perm")
    kv = kv_permutation_for(s, perm)
    return build(s, _select_heads(get_projections(m), s, perm, kv), like=m)


def prune_heads(m: MultiHeadAttention, heads: Sequence[int]) -> MultiHeadAttention:
    """A smaller module without the given query heads (pruning at evaluation).

    Equals zeroing those heads with head_mask: removing head r removes its rows of W_Q and
    its rows of W_O (math convention). Under GQA the survivors must still form equal blocked
    groups (drop whole groups, or as many heads from every group), so that each remaining
    head keeps reading the kv head it read before.
    """
    s = _require_module(m).spec
    refusal = modifiers.prune_refusal(s)
    if refusal is not None:
        raise ArgumentError(
            f"prune_heads cannot apply with {refusal.setting}: {refusal.why} (zeroing with head_mask is exact; "
            "pruning would be a different function)"
        )
    drop = sorted(set(_head_indices(heads, "heads")))
    if any(r < 0 or r >= s.heads for r in drop):
        raise ArgumentError(f"heads={list(heads)} has indices outside range({s.heads})")
    if len(drop) >= s.heads:
        raise ArgumentError(f"cannot prune all {s.heads} heads; keep at least one")
    keep = [r for r in range(s.heads) if r not in set(drop)]
    gs = s.group_size
    # Under GQA the survivors must still form equal blocked groups: drop whole groups, or the
    # same number of heads from every group.
    per_group = {j: sum(1 for r in keep if r // gs == j) for j in range(s.kv_heads_)}
    kv_keep = [j for j, n in per_group.items() if n > 0]
    sizes = {per_group[j] for j in kv_keep}
    if len(sizes) != 1:
        raise ArgumentError(
            f"heads={drop} leaves GQA groups of unequal sizes "
            f"{ {j: per_group[j] for j in kv_keep} }; with kv_heads={s.kv_heads_} drop whole "
            f"groups or the same number of heads from every group"
        )
    p = get_projections(m)
    new_spec = s.replace(
        heads=len(keep),
        kv_heads=None if s.kv_heads is None else len(kv_keep),
        d_k=s.d_k_,  # explicit: the default d_model // heads would change with the head count
    )
    return build(new_spec, _select_heads(p, s, keep, kv_keep), like=m)
