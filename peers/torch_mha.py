"""Conversions to and from torch.nn.MultiheadAttention, the reference peer.

nn.MultiheadAttention keeps either one packed `in_proj_weight` ((3 E), E) — the [Q|K|V]
order of our combined layout — or separate q/k/v_proj_weight when kdim/vdim differ from E.
Its `bias` flag covers the input and output projections together, like our spec's.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from zoo import AttentionSpec, MultiHeadAttention
from zoo.errors import ArgumentError, InputTypeError
from zoo.heads import Projections, build, get_projections
from zoo.modifiers import active


def from_torch_mha(mha: nn.MultiheadAttention, *, cross_attention: bool | None = None) -> MultiHeadAttention:
    """A zoo module computing what `mha` computes (in eval mode: we have no dropout).

    Self-attention when kdim == vdim == embed_dim (call it as mha(x, x, x)); cross-attention
    when kdim == vdim != embed_dim, or when `cross_attention=True`. The packed form becomes
    the combined layout, the q/k/v_proj_weight form the separate one.

    Constructor options, each exact or refused: embed_dim, num_heads, bias, kdim/vdim and
    dtype/device carry over exactly; dropout has no zoo counterpart (equal in eval mode; a
    warning in training mode); add_bias_kv and add_zero_attn are refused. batch_first does
    not carry over: the zoo block always takes (b, t, c), so a sequence-first peer
    (batch_first=False, torch's default) gives a warning — transpose its (t, b, c) inputs.
    """
    if not isinstance(mha, nn.MultiheadAttention):
        raise InputTypeError(f"expected torch.nn.MultiheadAttention, got {type(mha).__name__}")
    if mha.bias_k is not None or mha.bias_v is not None:
        raise ArgumentError("add_bias_kv=True appends learned key/value rows; the zoo has no such variant")
    if mha.add_zero_attn:
        raise ArgumentError("add_zero_attn=True appends a zero key/value; the zoo has no such variant")
    if mha.kdim != mha.vdim:
        raise ArgumentError(
            f"kdim={mha.kdim} != vdim={mha.vdim}: keys and values from different tensors; "
            f"the zoo's cross-attention reads both from one context"
        )
    if mha.dropout > 0 and mha.training:
        warnings.warn(
            f"nn.MultiheadAttention has dropout={mha.dropout} and is in training mode; the zoo block "
            f"has no dropout and matches it in eval mode (call .eval() on the peer to compare)",
            stacklevel=2,
        )
    if not mha.batch_first:
        warnings.warn(
            "nn.MultiheadAttention(batch_first=False) takes sequence-first (t, b, c) tensors; the zoo block "
            "takes batch-first (b, t, c): give it x.transpose(0, 1) (its output is (b, t, c) too)",
            stacklevel=2,
        )
    e, h = mha.embed_dim, mha.num_heads
    if cross_attention is None:
        cross_attention = mha.kdim != e
    if not cross_attention and mha.kdim != e:
        raise ArgumentError(f"kdim={mha.kdim} != embed_dim={e} needs cross_attention=True")
    has_bias = mha.out_proj.bias is not None
    spec = AttentionSpec(
        d_model=e,
        heads=h,
        layout="combined" if mha._qkv_same_embed_dim else "separate",
        bias=has_bias,
        d_context=mha.kdim if cross_attention else None,
    )
    if mha._qkv_same_embed_dim:
        w_q, w_k, w_v = mha.in_proj_weight.detach().chunk(3)
    else:
        w_q, w_k, w_v = (t.detach() for t in (mha.q_proj_weight, mha.k_proj_weight, mha.v_proj_weight))
    b_q = b_k = b_v = b_o = None
    if has_bias:
        b_q, b_k, b_v = mha.in_proj_bias.detach().chunk(3)
        b_o = mha.out_proj.bias.detach()
    p = Projections(w_q, w_k, w_v, mha.out_proj.weight.detach(), b_q, b_k, b_v, b_o)
    m = build(spec, p)
    return m.to(device=mha.out_proj.weight.device, dtype=mha.out_proj.weight.dtype)


def to_torch_mha(m: MultiHeadAttention, *, batch_first: bool = True) -> nn.MultiheadAttention:
    """An nn.MultiheadAttention computing what `m` computes, where the spec fits that class.

    nn.MultiheadAttention needs kv_heads == heads, d_k == d_v == d_model / heads and the
    default scale, and has no built-in causal flag.
    """
    if not isinstance(m, MultiHeadAttention):
        raise InputTypeError(f"expected a zoo MultiHeadAttention module, got {type(m).__name__}")
    s = m.spec
    problems = []
    if s.kv_heads_ != s.heads:
        problems.append(f"kv_heads={s.kv_heads_} != heads={s.heads} (no GQA/MQA in torch's MHA)")
    if s.d_k_ * s.heads != s.d_model or s.d_v_ != s.d_k_:
        problems.append(f"d_k={s.d_k_}, d_v={s.d_v_} must both equal d_model/heads={s.d_model / s.heads:g}")
    if s.scale is not None:
        problems.append(f"scale={s.scale} (torch's MHA always uses 1/sqrt(d_k))")
    if s.causal:
        problems.append("causal=True (pass attn_mask/is_causal to torch's MHA yourself)")
    problems += [f"{mod.describe(s)} (torch's MHA has no {mod.name})" for mod in active(s)]
    if problems:
        raise ArgumentError("cannot express this spec as nn.MultiheadAttention: " + "; ".join(problems))
    kdim = s.d_context if s.is_cross else s.d_model
    ref = m.out_proj.weight
    mha = nn.MultiheadAttention(
        s.d_model,
        s.heads,
        bias=s.bias,
        kdim=kdim,
        vdim=kdim,
        batch_first=batch_first,
        device=ref.device,
        dtype=ref.dtype,
    )
    p = get_projections(m)
    with torch.no_grad():
        if mha._qkv_same_embed_dim:
            mha.in_proj_weight.copy_(torch.cat([p.w_q, p.w_k, p.w_v]))
        else:
            mha.q_proj_weight.copy_(p.w_q)
            mha.k_proj_weight.copy_(p.w_k)
            mha.v_proj_weight.copy_(p.w_v)
        mha.out_proj.weight.copy_(p.w_o)
        if s.bias:
            mha.in_proj_bias.copy_(torch.cat([p.b_q, p.b_k, p.b_v]))
            mha.out_proj.bias.copy_(p.b_o)
    return mha.eval()


__all__ = ["from_torch_mha", "to_torch_mha"]
