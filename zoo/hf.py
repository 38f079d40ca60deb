"""Weights in and out of Hugging Face transformers: `from_hf(module)` and `to_hf(block, module)`.

`from_hf` reads one transformers attention module (and its `config`) and returns a zoo block
that computes the same function, weights copied; `to_hf` writes a block's weights back into a
module of the same shape. Each family below says what the block covers and how its weights
are laid out; anything the zoo cannot express exactly (a rope scaling type, a LayerNorm on Q/K,
bidirectional Gemma-2, cross-attention) is refused with an `HFConversionError` naming it.

transformers is imported only when a function here needs it: `import zoo` works without it.

Axes as everywhere: b batch, t query positions, s key positions, h heads, g kv heads,
d per-head width, c model channels, r the q/k/v slot of a fused projection.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from einops import rearrange
from torch import Tensor, nn

from .attention import MultiHeadAttention
from .errors import AttnzooError
from .heads import Projections, build, get_projections
from .spec import AttentionSpec

# BLOOM's and GPT-NeoX's fused projection rows are grouped per head, q/k/v inside each head;
# the zoo's combined rows are [Q | K | V], each head-major.
PER_HEAD_QKV = "(h r d) c -> r (h d) c"
PER_HEAD_QKV_BIAS = "(h r d) -> r (h d)"
ZOO_TO_PER_HEAD = "r (h d) c -> (h r d) c"
ZOO_TO_PER_HEAD_BIAS = "r (h d) -> (h r d)"
CONV1D_TO_LINEAR = "i o -> o i"  # GPT-2's Conv1D stores (in, out); nn.Linear stores (out, in)


class HFConversionError(AttnzooError, ValueError):
    """A transformers module or config the zoo cannot express exactly, or a block that does not fit a module."""


class HFTypeError(AttnzooError, TypeError):
    """Not a transformers attention module of a supported class (or not a zoo block)."""


# -- reading and writing linear layers ---------------------------------------------------------


def _read_linear(lin: nn.Module, conv1d: bool = False) -> tuple[Tensor, Tensor | None]:
    """(out, in) weight and bias (or None), detached copies."""
    w = lin.weight.detach()
    w = rearrange(w, CONV1D_TO_LINEAR) if conv1d else w.clone()
    b = lin.bias.detach().clone() if getattr(lin, "bias", None) is not None else None
    return w, b


def _write_linear(lin: nn.Module, w: Tensor, b: Tensor | None, what: str, conv1d: bool = False) -> None:
    """Copy (out, in) `w` and bias `b` into `lin`; a bias the module lacks must be zero (exact, not dropped)."""
    w = rearrange(w, "o i -> i o") if conv1d else w
    if tuple(lin.weight.shape) != tuple(w.shape):
        raise HFConversionError(
            f"{what}: module weight has shape {tuple(lin.weight.shape)}, block's is {tuple(w.shape)}"
        )
    lin.weight.copy_(w)
    if getattr(lin, "bias", None) is not None:
        lin.bias.copy_(b if b is not None else torch.zeros_like(lin.bias))
    elif b is not None and bool((b != 0).any()):
        raise HFConversionError(
            f"{what} has no bias in the module but the block's is nonzero (max |b| = {b.abs().max().item():.3g}); "
            f"the module cannot hold it"
        )


def _complete_biases(biases: list[Tensor | None], weights: list[Tensor]) -> tuple[bool, list[Tensor | None]]:
    """The zoo's bias flag covers all four projections. A module with biases on some only (ViT without
    qkv_bias, ...) becomes bias=True with zeros where it has none: the same function, exactly."""
    if all(b is None for b in biases):
        return False, biases
    return True, [b if b is not None else w.new_zeros(w.shape[0]) for b, w in zip(biases, weights)]


# -- config values -------------------------------------------------------------------------------


def _cls(module: nn.Module) -> str:
    return type(module).__name__


def _scale(value: float, d_k: int) -> float | None:
    """None when `value` is the default 1/sqrt(d_k) (up to rounding), else the value itself."""
    return None if math.isclose(value, d_k**-0.5, rel_tol=1e-12) else float(value)


def _rope(module: nn.Module, head_dim: int, *, partial: bool) -> dict:
    """rope_theta / rope_dim from `config.rope_parameters`; anything but the default rotary is refused."""
    cfg = module.config
    params = getattr(cfg, "rope_parameters", None)
    layer_type = getattr(module, "layer_type", None)
    if isinstance(params, dict) and layer_type in params and isinstance(params[layer_type], dict):
        params = params[layer_type]  # per-layer-type parameters (full vs sliding layers)
    if not isinstance(params, dict) or "rope_theta" not in params:
        raise HFConversionError(f"{_cls(module)}: config.rope_parameters={params!r} has no rope_theta")
    rope_type = params.get("rope_type", "default")
    if rope_type != "default":
        raise HFConversionError(
            f"{_cls(module)}: config.rope_parameters rope_type={rope_type!r} (scaled rotary frequencies) is not "
            f"expressible in the zoo, which models the default rotary only"
        )
    factor = float(params.get("partial_rotary_factor", 1.0))
    if not partial and factor != 1.0:
        raise HFConversionError(
            f"{_cls(module)}: partial_rotary_factor={factor} in config.rope_parameters, which this family's "
            f"rotary does not read; refusing rather than guessing which dims rotate"
        )
    rope_dim = int(head_dim * factor)
    return {"rope_theta": float(params["rope_theta"]), "rope_dim": None if rope_dim == head_dim else rope_dim}


def _kv(heads: int, kv_heads: int) -> int | None:
    return None if kv_heads == heads else kv_heads


def _d_k(d_model: int, heads: int, head_dim: int) -> int | None:
    return None if head_dim * heads == d_model else head_dim


# -- families ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Family:
    """How one transformers class maps to a zoo block.

    read(module) -> (spec, projections); write(module, spec, projections) the inverse.
    covers: one line on what the block computes of the module (for errors and the docs).
    """

    classes: tuple[str, ...]
    read: Callable[[nn.Module], tuple[AttentionSpec, Projections]]
    write: Callable[[nn.Module, AttentionSpec, Projections], None]
    covers: str


# BERT: BertAttention = BertSelfAttention (.self) + BertSelfOutput (.output); the block is
# self-attention + output.dense. BertSelfOutput's dropout, residual add and LayerNorm stay outside.


def _bert_read(m: nn.Module) -> tuple[AttentionSpec, Projections]:
    sa, cfg = m.self, m.self.config
    if _cls(sa) != "BertSelfAttention":
        raise HFConversionError(
            f"BertAttention holding {_cls(sa)}: cross-attention BERT layers are not converted "
            f"(the zoo's cross-attention takes its keys from a context of width d_context; convert self-attention)"
        )
    heads, d = sa.num_attention_heads, sa.attention_head_size
    lins = (sa.query, sa.key, sa.value, m.output.dense)
    (wq, bq), (wk, bk), (wv, bv), (wo, bo) = (_read_linear(lin) for lin in lins)
    bias, (bq, bk, bv, bo) = _complete_biases([bq, bk, bv, bo], [wq, wk, wv, wo])
    spec = AttentionSpec(
        d_model=cfg.hidden_size,
        heads=heads,
        d_k=_d_k(cfg.hidden_size, heads, d),
        bias=bias,
        causal=bool(sa.is_causal),
        scale=_scale(sa.scaling, d),
    )
    return spec, Projections(wq, wk, wv, wo, bq, bk, bv, bo)


def _bert_write(m: nn.Module, spec: AttentionSpec, p: Projections) -> None:
    sa = m.self
    for lin, w, b, what in (
        (sa.query, p.w_q, p.b_q, "self.query"),
        (sa.key, p.w_k, p.b_k, "self.key"),
        (sa.value, p.w_v, p.b_v, "self.value"),
        (m.output.dense, p.w_o, p.b_o, "output.dense"),
    ):
        _write_linear(lin, w, b, what)


# GPT-2: c_attn Conv1D (c, 3c) = [Q | K | V] columns, c_proj Conv1D; both with biases.


def _gpt2_read(m: nn.Module) -> tuple[AttentionSpec, Projections]:
    if m.is_cross_attention:
        raise HFConversionError(
            "GPT2Attention(is_cross_attention=True): cross-attention GPT-2 layers are not converted; "
            "convert self-attention"
        )
    c, heads, d = m.embed_dim, m.num_heads, m.head_dim
    w, b = _read_linear(m.c_attn, conv1d=True)
    wo, bo = _read_linear(m.c_proj, conv1d=True)
    wq, wk, wv = w.split(c)
    bq, bk, bv = b.split(c)
    spec = AttentionSpec(d_model=c, heads=heads, layout="combined", bias=True, causal=True, scale=_scale(m.scaling, d))
    return spec, Projections(wq, wk, wv, wo, bq, bk, bv, bo)


def _gpt2_write(m: nn.Module, spec: AttentionSpec, p: Projections) -> None:
    zero = p.w_q.new_zeros(p.w_q.shape[0])
    b = torch.cat([p.b_q, p.b_k, p.b_v]) if p.b_q is not None else torch.cat([zero, zero, zero])
    _write_linear(m.c_attn, torch.cat([p.w_q, p.w_k, p.w_v]), b, "c_attn", conv1d=True)
    _write_linear(m.c_proj, p.w_o, p.b_o, "c_proj", conv1d=True)


# LLaMA-style: q_proj, k_proj, v_proj, o_proj (Phi: dense), the model's rotary embedding,
# plus per family: sliding window (Mistral, Gemma-2 sliding layers, Qwen3 sliding layers),
# softcap and query_pre_attn_scalar (Gemma-2), QK-norm (Qwen3 per head, OLMo-2 full).


def _llama_read(m: nn.Module) -> tuple[AttentionSpec, Projections]:
    cfg, name = m.config, _cls(m)
    out = m.dense if name == "PhiAttention" else m.o_proj
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    d = m.head_dim
    lins = (m.q_proj, m.k_proj, m.v_proj, out)
    (wq, bq), (wk, bk), (wv, bv), (wo, bo) = (_read_linear(lin) for lin in lins)
    bias, (bq, bk, bv, bo) = _complete_biases([bq, bk, bv, bo], [wq, wk, wv, wo])
    fields: dict = {}
    if not getattr(m, "is_causal", True) or getattr(cfg, "use_bidirectional_attention", None):
        raise HFConversionError(
            f"{name}: use_bidirectional_attention=True is not converted (the zoo converts causal layers)"
        )
    if name == "MistralAttention":
        window = getattr(cfg, "sliding_window", None)
    else:
        window = getattr(m, "sliding_window", None)
    if window is not None:
        fields["window"] = int(window)
    if name == "Gemma2Attention":
        if m.attn_logit_softcapping is not None:
            fields["softcap"] = float(m.attn_logit_softcapping)
    if name == "PhiAttention":
        if m.qk_layernorm:
            raise HFConversionError(
                "PhiAttention with qk_layernorm=True: Phi normalizes Q and K with LayerNorm (mean removed, bias), "
                "the zoo's qk_norm is RMSNorm"
            )
        fields.update(_rope(m, d, partial=True))
        if fields["rope_dim"] is not None and fields["rope_dim"] != m.rotary_ndims:
            raise HFConversionError(f"PhiAttention: rotary_ndims={m.rotary_ndims} disagrees with its config")
    else:
        fields.update(_rope(m, d, partial=False))
    q_norm = k_norm = None
    if name in ("Qwen3Attention", "Olmo2Attention"):
        eq, ek = m.q_norm.variance_epsilon, m.k_norm.variance_epsilon
        if eq != ek:
            raise HFConversionError(f"{name}: q_norm eps={eq} != k_norm eps={ek}; the zoo has one qk_norm_eps")
        fields.update(qk_norm="head" if name == "Qwen3Attention" else "full", qk_norm_eps=float(eq))
        q_norm, k_norm = m.q_norm.weight.detach().clone(), m.k_norm.weight.detach().clone()
    spec = AttentionSpec(
        d_model=cfg.hidden_size,
        heads=heads,
        d_k=_d_k(cfg.hidden_size, heads, d),
        kv_heads=_kv(heads, kv_heads),
        bias=bias,
        causal=True,
        scale=_scale(m.scaling, d),
        **fields,
    )
    return spec, Projections(wq, wk, wv, wo, bq, bk, bv, bo, q_norm=q_norm, k_norm=k_norm)


def _llama_write(m: nn.Module, spec: AttentionSpec, p: Projections) -> None:
    out = m.dense if _cls(m) == "PhiAttention" else m.o_proj
    for lin, w, b, what in (
        (m.q_proj, p.w_q, p.b_q, "q_proj"),
        (m.k_proj, p.w_k, p.b_k, "k_proj"),
        (m.v_proj, p.w_v, p.b_v, "v_proj"),
        (out, p.w_o, p.b_o, "dense" if out is not getattr(m, "o_proj", None) else "o_proj"),
    ):
        _write_linear(lin, w, b, what)
    if p.q_norm is not None:
        m.q_norm.weight.copy_(p.q_norm)
        m.k_norm.weight.copy_(p.k_norm)


# BLOOM and GPT-NeoX: one fused query_key_value whose rows are (h r d), r = q/k/v inside each head.
# BloomAttention also adds its `residual` argument to the output; the block does not (see from_hf).


def _bloom_slopes(heads: int) -> Tensor:
    """BLOOM's own ALiBi slopes, read from transformers' build_alibi_tensor (key 1 of a 2-token row)."""
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    alibi = build_alibi_tensor(torch.ones(1, 2, dtype=torch.long), heads, torch.float32)
    return rearrange(alibi, "(b h) 1 s -> b h s", b=1)[0, :, 1].clone()


def _fused_read(m: nn.Module) -> tuple[AttentionSpec, Projections]:
    name = _cls(m)
    if name == "BloomAttention":  # keeps no config: its sizes are attributes
        c, heads, d = m.hidden_size, m.num_heads, m.head_dim
    else:
        c, heads, d = m.config.hidden_size, m.config.num_attention_heads, m.head_size
    w, b = _read_linear(m.query_key_value)
    wo, bo = _read_linear(m.dense)
    wq, wk, wv = rearrange(w, PER_HEAD_QKV, r=3, h=heads)
    bq = bk = bv = None
    if b is not None:
        bq, bk, bv = rearrange(b, PER_HEAD_QKV_BIAS, r=3, h=heads)
    bias, (bq, bk, bv, bo) = _complete_biases([bq, bk, bv, bo], [wq, wk, wv, wo])
    fields: dict = {}
    slopes = None
    if name == "BloomAttention":
        fields["alibi"] = True
        slopes = _bloom_slopes(heads).to(w.dtype)
        scale = m.inv_norm_factor
    else:
        fields.update(_rope(m, d, partial=True))
        if (fields["rope_dim"] or d) != m.rotary_ndims:
            raise HFConversionError(f"{name}: rotary_ndims={m.rotary_ndims} disagrees with its config")
        scale = m.scaling
    spec = AttentionSpec(
        d_model=c, heads=heads, layout="combined", bias=bias, causal=True, scale=_scale(scale, d), **fields
    )
    return spec, Projections(wq, wk, wv, wo, bq, bk, bv, bo, alibi_slopes=slopes)


def _fused_write(m: nn.Module, spec: AttentionSpec, p: Projections) -> None:
    if p.alibi_slopes is not None:
        want = _bloom_slopes(spec.heads).to(p.alibi_slopes)
        # the zoo's own slopes (fresh blocks) differ from BLOOM's fp32 powers by rounding only
        if not torch.allclose(p.alibi_slopes, want, rtol=1e-6, atol=0.0):
            raise HFConversionError(
                "the block's ALiBi slopes are not BLOOM's for its head count (heads permuted or pruned?); "
                "BloomAttention computes its slopes from n_head and cannot hold others"
            )
    w = rearrange(torch.stack([p.w_q, p.w_k, p.w_v]), ZOO_TO_PER_HEAD, h=spec.heads)
    b = None
    if p.b_q is not None:
        b = rearrange(torch.stack([p.b_q, p.b_k, p.b_v]), ZOO_TO_PER_HEAD_BIAS, h=spec.heads)
    _write_linear(m.query_key_value, w, b, "query_key_value")
    _write_linear(m.dense, p.w_o, p.b_o, "dense")


# Falcon: one query_key_value in one of three row layouts, rotary (ALiBi Falcon is refused).
#   multi_query (Falcon-7B):          [Q (h d) | K (d) | V (d)]: the zoo's combined layout with g = 1
#   new_decoder_architecture (40B):   per kv group, its r = h/g query heads then K then V: (g (r+2) d)
#   neither:                          (h 3 d), as BLOOM's
FALCON_GROUPED = "(g m d) c -> g m d c"


def _falcon_layout(m: nn.Module) -> str:
    if m.new_decoder_architecture:
        return "grouped"
    return "multi_query" if m.multi_query else "per_head"


def _falcon_read(m: nn.Module) -> tuple[AttentionSpec, Projections]:
    cfg = m.config
    if getattr(cfg, "alibi", False):
        raise HFConversionError(
            "FalconAttention with alibi=True: Falcon adds its ALiBi bias before scaling the scores "
            "(slopes / sqrt(d)) and takes dropout there; convert rotary Falcon models only"
        )
    c, heads, d = m.hidden_size, m.num_heads, m.head_dim
    w, b = _read_linear(m.query_key_value)
    wo, bo = _read_linear(m.dense)
    layout = _falcon_layout(m)
    kv = 1 if layout == "multi_query" else (m.num_kv_heads if layout == "grouped" else heads)
    if layout == "per_head":
        wq, wk, wv = rearrange(w, PER_HEAD_QKV, r=3, h=heads)
        bq, bk, bv = rearrange(b, PER_HEAD_QKV_BIAS, r=3, h=heads) if b is not None else (None, None, None)
    elif layout == "multi_query":
        wq, wk, wv = w.split([heads * d, d, d])
        bq, bk, bv = b.split([heads * d, d, d]) if b is not None else (None, None, None)
    else:
        r = heads // kv

        def split(t: Tensor) -> tuple[Tensor, Tensor, Tensor]:
            t4 = rearrange(t if t.dim() == 2 else t[:, None], FALCON_GROUPED, g=kv, m=r + 2, d=d)
            q = rearrange(t4[:, :r], "g r d c -> (g r d) c")
            k, v = (rearrange(t4[:, i], "g d c -> (g d) c") for i in (r, r + 1))
            return (q, k, v) if t.dim() == 2 else (q[:, 0], k[:, 0], v[:, 0])

        wq, wk, wv = split(w)
        bq, bk, bv = split(b) if b is not None else (None, None, None)
    bias, (bq, bk, bv, bo) = _complete_biases([bq, bk, bv, bo], [wq, wk, wv, wo])
    spec = AttentionSpec(
        d_model=c,
        heads=heads,
        d_k=_d_k(c, heads, d),
        kv_heads=_kv(heads, kv),
        layout="combined",
        bias=bias,
        causal=True,
        scale=_scale(m.inv_norm_factor, d),
        **_rope(m, d, partial=False),
    )
    return spec, Projections(wq, wk, wv, wo, bq, bk, bv, bo)


def _falcon_write(m: nn.Module, spec: AttentionSpec, p: Projections) -> None:
    layout = _falcon_layout(m)
    r = spec.group_size

    def fuse(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        if layout == "per_head":
            pattern = ZOO_TO_PER_HEAD if q.dim() == 2 else ZOO_TO_PER_HEAD_BIAS
            return rearrange(torch.stack([q, k, v]), pattern, h=spec.heads)
        if layout == "multi_query":
            return torch.cat([q, k, v])
        col = q.dim() == 1  # biases as one-column weights
        q, k, v = (t[:, None] if col else t for t in (q, k, v))
        q4 = rearrange(q, "(g r d) c -> g r d c", g=spec.kv_heads_, r=r)
        k4, v4 = (rearrange(t, "(g d) c -> g 1 d c", g=spec.kv_heads_) for t in (k, v))
        t = rearrange(torch.cat([q4, k4, v4], dim=1), "g m d c -> (g m d) c")
        return t[:, 0] if col else t

    b = fuse(p.b_q, p.b_k, p.b_v) if p.b_q is not None else None
    _write_linear(m.query_key_value, fuse(p.w_q, p.w_k, p.w_v), b, "query_key_value")
    _write_linear(m.dense, p.w_o, p.b_o, "dense")


# ViT: ViTAttention q_proj, k_proj, v_proj (biases iff qkv_bias), o_proj; bidirectional.


def _vit_read(m: nn.Module) -> tuple[AttentionSpec, Projections]:
    cfg = m.config
    heads, d = m.num_attention_heads, m.head_dim
    lins = (m.q_proj, m.k_proj, m.v_proj, m.o_proj)
    (wq, bq), (wk, bk), (wv, bv), (wo, bo) = (_read_linear(lin) for lin in lins)
    bias, (bq, bk, bv, bo) = _complete_biases([bq, bk, bv, bo], [wq, wk, wv, wo])
    spec = AttentionSpec(
        d_model=cfg.hidden_size, heads=heads, d_k=_d_k(cfg.hidden_size, heads, d), bias=bias, scale=_scale(m.scaling, d)
    )
    return spec, Projections(wq, wk, wv, wo, bq, bk, bv, bo)


def _vit_write(m: nn.Module, spec: AttentionSpec, p: Projections) -> None:
    for lin, w, b, what in (
        (m.q_proj, p.w_q, p.b_q, "q_proj"),
        (m.k_proj, p.w_k, p.b_k, "k_proj"),
        (m.v_proj, p.w_v, p.b_v, "v_proj"),
        (m.o_proj, p.w_o, p.b_o, "o_proj"),
    ):
        _write_linear(lin, w, b, what)


FAMILIES: tuple[_Family, ...] = (
    _Family(
        ("BertAttention",), _bert_read, _bert_write, "self-attention + output.dense (before its residual and LayerNorm)"
    ),
    _Family(("GPT2Attention",), _gpt2_read, _gpt2_write, "the whole module (c_attn, causal attention, c_proj)"),
    _Family(
        ("LlamaAttention", "MistralAttention", "Gemma2Attention", "Qwen3Attention", "Olmo2Attention", "PhiAttention"),
        _llama_read,
        _llama_write,
        "the whole module, with the model's rotary embedding and causal/sliding mask",
    ),
    _Family(
        ("BloomAttention", "GPTNeoXAttention"),
        _fused_read,
        _fused_write,
        "the whole module (BLOOM: without the residual it adds), with ALiBi / rotary and the causal mask",
    ),
    _Family(("FalconAttention",), _falcon_read, _falcon_write, "the whole module, rotary Falcon (MQA, GQA or MHA)"),
    _Family(("ViTAttention",), _vit_read, _vit_write, "the whole module (bidirectional)"),
)
_BY_CLASS = {name: fam for fam in FAMILIES for name in fam.classes}
# Parts of a supported module that are not the whole block: say which module to pass instead.
_PARTS = {
    "BertSelfAttention": "pass its parent BertAttention (layer.attention), which holds the output dense too",
    "BertSelfOutput": "pass its parent BertAttention (layer.attention)",
    "BertCrossAttention": "cross-attention BERT layers are not converted",
}


def supported_classes() -> dict[str, str]:
    """The transformers attention classes from_hf / to_hf accept, each with what the block covers."""
    return {name: fam.covers for fam in FAMILIES for name in fam.classes}


def _family(module: object) -> _Family:
    if not isinstance(module, nn.Module):
        raise HFTypeError(f"expected a transformers attention module, got {type(module).__name__}")
    name = _cls(module)
    if name in _PARTS:
        raise HFTypeError(f"{name}: {_PARTS[name]}")
    fam = _BY_CLASS.get(name)
    if fam is None or not type(module).__module__.startswith("transformers."):
        inside = [
            f"{n} ({_cls(c)})"
            for n, c in module.named_modules()
            if n and _cls(c) in _BY_CLASS and type(c).__module__.startswith("transformers.")
        ][:2]
        hint = f"; it holds {', '.join(inside)}: pass that" if inside else ""
        raise HFTypeError(
            f"{type(module).__module__}.{name} is not a supported transformers attention module{hint}; "
            f"supported: {', '.join(supported_classes())}"
        )
    return fam


def _derive(module: nn.Module) -> tuple[_Family, AttentionSpec, Projections]:
    fam = _family(module)
    with torch.no_grad():
        spec, p = fam.read(module)
    return fam, spec, p


def spec_from_hf(module: nn.Module) -> AttentionSpec:
    """The spec from_hf would give `module`, without copying weights (works on the meta device)."""
    return _derive(module)[1]


def from_hf(module: nn.Module) -> MultiHeadAttention:
    """A zoo block computing what the transformers attention `module` computes, weights copied.

    x (b t c) -> y (b t c). What the block covers, per class:
      BertAttention         self-attention + output.dense; BertSelfOutput's dropout, residual add
                            and LayerNorm are outside the block (they follow it in the layer)
      GPT2Attention         the whole module; Conv1D (in, out) weights become (out, in)
      LlamaAttention, MistralAttention (sliding window), Gemma2Attention (softcap, scale
      query_pre_attn_scalar**-0.5, window on the sliding layers), Qwen3Attention (QK-norm per
      head), Olmo2Attention (QK-norm over all heads), PhiAttention (partial rotary)
                            the whole module plus the model's rotary embedding and causal mask
      BloomAttention        fused QKV rows (h r d) rearranged to [Q|K|V]; ALiBi with BLOOM's
                            slopes. BloomAttention adds its `residual` argument to its output;
                            the block does not: bloom(x, residual=r, ...)[0] == block(x) + r
      GPTNeoXAttention      fused QKV rows (h r d) as BLOOM's; partial rotary
      FalconAttention       rotary Falcon: multi-query [Q|K|V] rows, grouped (g (r+2) d) rows
                            (new_decoder_architecture) or (h r d) rows; ALiBi Falcon is refused
      ViTAttention          the whole module, bidirectional

    Dropout is not modelled: the block equals the module in eval mode. Positions for RoPE/ALiBi
    are 0..t-1 unless given (`block(x, positions=...)`); padding is a key mask
    (`block(x, mask=keep[:, None, None, :])`). A module whose Q/K/V/O biases are only partly
    present (ViT without qkv_bias) gets bias=True with zeros in their place: the same function.
    Unsupported classes (HFTypeError) and config values the zoo cannot express, such as a
    rope_type other than "default" (HFConversionError), are refused, never approximated.
    """
    _, spec, p = _derive(module)
    block = build(spec, p)
    return block.eval()


def to_hf(block: MultiHeadAttention, module: nn.Module) -> nn.Module:
    """Write `block`'s weights into the transformers attention `module` (in place; returns it).

    The block must compute a function of the module's shape: the spec the module implies
    (from_hf's) and the block's must agree on every field but the layout. A bias the module
    lacks must be zero in the block; BLOOM takes only its own ALiBi slopes.
    """
    if not isinstance(block, MultiHeadAttention):
        raise HFTypeError(f"expected a zoo MultiHeadAttention block, got {type(block).__name__}")
    fam, want, _ = _derive(module)
    # Compare values, not spellings: a scale written out as the default is the default.
    have = block.spec.replace(layout=want.layout, bias=want.bias, scale=_scale(block.spec.scale_, block.spec.d_k_))
    if have != want:
        diffs = [
            f"{f}: block {getattr(have, f)!r} vs module {getattr(want, f)!r}"
            for f in want.to_dict()
            if getattr(have, f) != getattr(want, f)
        ]
        raise HFConversionError(f"the block does not fit this {_cls(module)}: " + "; ".join(diffs))
    p = get_projections(block)
    if not block.spec.bias:
        zeros = [t.new_zeros(t.shape[0]) for t in (p.w_q, p.w_k, p.w_v, p.w_o)]
        p.b_q, p.b_k, p.b_v, p.b_o = zeros
    with torch.no_grad():
        fam.write(module, want, p)
    return module


__all__ = ["HFConversionError", "HFTypeError", "from_hf", "spec_from_hf", "supported_classes", "to_hf"]
