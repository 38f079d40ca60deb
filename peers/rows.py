"""The row type of the transformers family table, and the one reader and one writer that use it.

A `Row` says, as data, where one transformers attention class keeps what a zoo block needs:
its projections (separate q/k/v or one fused projection in a named row layout), its output
projection, its sizes, scale, causality, and where the rotary / window / softcap / QK-norm /
ALiBi / clip_qkv / relative-bucket settings come from, and (cross-attention) the width of its context.
`read(row, module)` turns a module into (spec, projections) and `write(row, module, spec,
projections)` is its inverse. The rows themselves are in `peers.classes`.

transformers is imported only inside functions given transformers objects.

Axes: b batch, t query positions, s key positions, h heads, g kv heads, d per-head width,
c model channels, r the q/k/v slot of a fused projection, m a model-parallel shard (CodeGen).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from einops import rearrange
from torch import Tensor, nn

from zoo import AttentionSpec
from zoo.errors import HFConversionError
from zoo.heads import Projections

from .fused_qkv import fuse_fused, split_fused
from .rope import rope_fields

CONV1D_TO_LINEAR = "i o -> o i"  # GPT-2's Conv1D stores (in, out); nn.Linear stores (out, in)


# A value read from a module: a dotted attribute path ("config.hidden_size"; a trailing "?" means
# "None when absent"), a function of the module, or a constant.
Get = str | Callable[[nn.Module], Any] | bool | int | float | None


def value(m: nn.Module, get: Get) -> Any:
    """Resolve `get` against module `m` (see `Get`)."""
    if callable(get):
        return get(m)
    if not isinstance(get, str):
        return get
    optional = get.endswith("?")
    obj: Any = m
    for part in get.rstrip("?").split("."):
        if optional and not hasattr(obj, part):
            return None
        obj = getattr(obj, part)
    return obj


class Check(NamedTuple):
    """A config the zoo refuses: `name` says which (e.g. "clip_qkv set"); fn(module) -> the reason, or None."""

    name: str
    fn: Callable[[nn.Module], str | None]


@dataclass(frozen=True)
class Row:
    """How one transformers attention class maps to a zoo block: data, read by `read` and `write`."""

    family: str  # the model family, e.g. "LLaMA"
    cls: str  # the transformers class name
    covers: str = "the whole module"  # what of the module the block computes
    refused: str | None = None  # set: the class is refused as a whole, with this reason
    q: str = "q_proj"  # separate projections (dotted paths)
    k: str = "k_proj"
    v: str = "v_proj"
    qkv: str | None = None  # or one fused projection ...
    fused: str | Callable[[nn.Module], str] = (
        "zoo"  # ... in this row layout (fused_qkv.FUSED_LAYOUTS), or a function giving it
    )
    out: str = "o_proj"
    q_gate: bool = False  # q's rows hold each head's [query | output gate] (Qwen3-Next): output_gate
    conv1d: bool = False  # GPT-2's Conv1D (in, out) weights
    c: Get = "config.hidden_size"  # d_model
    h: Get = "config.num_attention_heads"
    g: Get = "config.num_key_value_heads?"  # None -> h
    d: Get = "head_dim"
    causal: Get = True
    context: Get = None  # cross-attention: the width of the context K/V come from (d_context); None: self
    scale: Get = "scaling"  # the score scale the module uses
    rope: str | Callable[[nn.Module, int], dict] | None = None  # "full", "partial" (config), or fields
    rope_if: Get = True  # False on layers without rotary (NoPE layers of hybrid models)
    rope_interleaved: bool = False  # rotate adjacent pairs (GPT-J, Cohere, GLM)
    rotary_ndims: Get = None  # a module attribute that must agree with the config's rotary width
    window: Get = None  # sliding window (keys, itself included), None on global layers
    softcap: Get = None
    clip_qkv: Get = None  # the clamp on the projections (OLMo, MPT); None: none
    qk_norm: str | None = None  # "head" / "per_head" / "full": the norm modules at `norms`
    qk_norm_kind: str = "rms"  # "rms" (RMSNorm) or "layer" (LayerNorm: Cohere, StableLM, Persimmon, Phi)
    qk_norm_if: Get = True  # False where the config turns the norms off (Cohere's use_qk_norm, qk_layernorm)
    norms: tuple[str, str] = ("q_norm", "k_norm")  # each one norm (weight (d) or (n d)) or per-head `.norms`
    # how a checkpoint stores each norm: "flat" (d) or (n d); "matrix" (n, d) (Cohere); "list": `.norms.i` (StableLM)
    norm_shape: str = "flat"
    norm_bias: bool = False  # the norms carry a bias (Persimmon's and Phi's nn.LayerNorm)
    norm_offset: float = 0.0  # Gemma's RMSNorm multiplies by (1 + weight)
    alibi: Callable[[nn.Module, int], Tensor] | None = None  # module, heads -> slopes (h)
    # T5's relative position bias: module, its model (or None) -> (the nn.Embedding holding the table
    # (buckets, h), whether the module owns it), or None on layers without one (cross-attention)
    rel_bias: Callable[[nn.Module, nn.Module | None], tuple[nn.Module, bool] | None] | None = None
    rel_buckets: Get = "relative_attention_num_buckets"  # read where rel_bias gives a table
    rel_max_distance: Get = "relative_attention_max_distance"
    sinks: str | None = None  # attention sinks (gpt-oss): the module's per-head softmax logits (h), a dotted path
    checks: tuple[Check, ...] = ()  # configs of this class the zoo refuses
    fields: Callable[[nn.Module], dict] | None = None  # further spec fields (no weights) read from the module
    latent: Any = None  # latent attention (a peers.latent.LatentRow): its own reader and writer, not q/k/v

    def modifiers(self) -> tuple[str, ...]:
        """The zoo modifiers this class can use (some only on some layers or configs)."""
        mods = ["latent"] if self.latent is not None else []
        if self.rope is not None:
            mods.append("rope-interleaved" if self.rope_interleaved else "rope")
        for name, on in (
            ("alibi", self.alibi),
            ("rel_buckets", self.rel_bias),
            ("window", self.window),
            ("softcap", self.softcap),
            ("qk_norm", self.qk_norm),
            ("clip_qkv", self.clip_qkv),
            ("sinks", self.sinks),
        ):
            if on is not None:
                kind = "" if self.qk_norm_kind == "rms" else f" ({self.qk_norm_kind})"
                mods.append(f"qk_norm={self.qk_norm}{kind}" if name == "qk_norm" else name)
        return tuple(mods) + (("output_gate",) if self.q_gate else ())


# -- linear layers -------------------------------------------------------------------------------


def read_linear(lin: nn.Module, conv1d: bool = False) -> tuple[Tensor, Tensor | None]:
    """(out, in) weight and bias (or None), detached copies."""
    w = lin.weight.detach()
    w = rearrange(w, CONV1D_TO_LINEAR) if conv1d else w.clone()
    b = lin.bias.detach().clone() if getattr(lin, "bias", None) is not None else None
    return w, b


def write_linear(lin: nn.Module, w: Tensor, b: Tensor | None, what: str, conv1d: bool = False) -> None:
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


def complete_biases(biases: list[Tensor | None], weights: list[Tensor]) -> tuple[bool, list[Tensor | None]]:
    """The zoo's bias flag covers all four projections. A module with biases on some only (ViT without
    qkv_bias, ...) becomes bias=True with zeros where it has none: the same function, exactly."""
    if all(b is None for b in biases):
        return False, biases
    return True, [b if b is not None else w.new_zeros(w.shape[0]) for b, w in zip(biases, weights)]


def _layout(row: Row, m: nn.Module) -> str:
    return row.fused(m) if callable(row.fused) else row.fused


def _as_col(b: Tensor | None) -> Tensor | None:
    return None if b is None else b[:, None]


# -- config values -------------------------------------------------------------------------------


def cls_name(module: nn.Module) -> str:
    return type(module).__name__


def default_scale(scale: float, d_k: int) -> float | None:
    """None when `scale` is the default 1/sqrt(d_k) (up to rounding), else the value itself."""
    return None if math.isclose(scale, d_k**-0.5, rel_tol=1e-12) else float(scale)


def layer_type(m: nn.Module) -> str | None:
    """The layer type ("sliding_attention", "full_attention") from the module or config.layer_types, or None."""
    kind = getattr(m, "layer_type", None)
    types, idx = getattr(getattr(m, "config", None), "layer_types", None), getattr(m, "layer_idx", None)
    if kind is None and types is not None and isinstance(idx, int) and idx < len(types):
        kind = types[idx]
    return kind


def config_rope(m: nn.Module, head_dim: int, *, partial: bool) -> dict:
    """rope_theta / rope_dim and the scaling fields from `config.rope_parameters`: the default rotary, "linear"
    (rope_scale), "llama3", "yarn", "longrope" (rope_scaling; peers.rope); every other rope_type is refused, named."""
    params = getattr(m.config, "rope_parameters", None)
    kind = layer_type(m)
    if isinstance(params, dict) and kind in params and isinstance(params[kind], dict):
        params = params[kind]  # per-layer-type parameters (full vs sliding layers)
    if not isinstance(params, dict) or "rope_theta" not in params:
        raise HFConversionError(f"{cls_name(m)}: config.rope_parameters={params!r} has no rope_theta")
    scaled = rope_fields(cls_name(m), params, m.config)
    factor = float(params.get("partial_rotary_factor", 1.0))
    if not partial and factor != 1.0:
        raise HFConversionError(
            f"{cls_name(m)}: partial_rotary_factor={factor} in config.rope_parameters, which this family's "
            f"rotary does not read; refusing rather than guessing which dims rotate"
        )
    rope_dim = int(head_dim * factor)
    return {"rope_theta": float(params["rope_theta"]), "rope_dim": None if rope_dim == head_dim else rope_dim, **scaled}


def _norm_parts(norm: nn.Module) -> list[nn.Module]:
    """The norm modules behind one of a row's `norms`: itself, or its per-head list (StableLM's `.norms`)."""
    parts = getattr(norm, "norms", None)
    return list(parts) if isinstance(parts, (nn.ModuleList, list, tuple)) else [norm]


def read_norm(row: Row, norm: nn.Module) -> tuple[Tensor, Tensor | None, float]:
    """(weight, bias or None, eps) of a QK-norm, flattened to the zoo's (d) or (n d) layout."""
    parts = _norm_parts(norm)
    eps = {norm_eps(p) for p in parts}
    if len(eps) != 1:
        raise HFConversionError(f"{row.cls}: its per-head norms have different eps {sorted(eps)}")
    w = torch.cat([p.weight.detach().reshape(-1) for p in parts]).clone() + row.norm_offset
    biases = [getattr(p, "bias", None) for p in parts]
    b = None if all(x is None for x in biases) else torch.cat([x.detach().reshape(-1) for x in biases]).clone()
    return w, b, eps.pop()


def norm_shapes(row: Row, path: str, n: int, d: int) -> dict[str, tuple[int, ...]]:
    """The tensors a checkpoint holds for the QK-norm at `path` over n heads of width d, and their shapes."""
    if row.norm_shape == "list":
        shapes = {f"{path}.norms.{i}.": (d,) for i in range(n)}
    else:
        shape = {"matrix": (n, d), "flat": (d,) if row.qk_norm == "head" else (n * d,)}[row.norm_shape]
        shapes = {f"{path}.": shape}
    out = {f"{name}weight": shape for name, shape in shapes.items()}
    if row.norm_bias:
        out.update({f"{name}bias": shape for name, shape in shapes.items()})
    return out


def write_norm(row: Row, norm: nn.Module, weight: Tensor, bias: Tensor | None, path: str) -> None:
    """Copy a QK-norm's flat weight (and bias) into the module(s) at `path`; a bias it lacks must be zero."""
    parts = _norm_parts(norm)
    ws, bs = weight.split(weight.numel() // len(parts)), (None,) * len(parts)
    if bias is not None:
        bs = bias.split(bias.numel() // len(parts))
    for part, w, b in zip(parts, ws, bs):
        part.weight.copy_((w - row.norm_offset).reshape(part.weight.shape))
        if getattr(part, "bias", None) is not None:
            part.bias.copy_(b.reshape(part.bias.shape) if b is not None else torch.zeros_like(part.bias))
        elif b is not None and bool((b != 0).any()):
            raise HFConversionError(f"{path} has no bias in the module but the block's QK-norm bias is nonzero")


def norm_eps(norm: nn.Module) -> float:
    """The epsilon of a norm module, under either name transformers gives it (Llama 4's weightless QK-norm
    was `eps` up to 5.24 and is `variance_epsilon` from 5.25)."""
    for name in ("variance_epsilon", "eps"):
        if isinstance(getattr(norm, name, None), float):
            return float(getattr(norm, name))
    raise HFConversionError(f"{cls_name(norm)}: no RMSNorm epsilon (variance_epsilon / eps) to read")


# -- the reader and the writer -------------------------------------------------------------------


def read(row: Row, m: nn.Module, model: nn.Module | None = None) -> tuple[AttentionSpec, Projections]:
    """(spec, projections) of module `m` as `row` describes it; refusals raise HFConversionError.
    `model`: the model `m` sits in, for a row that reads state another layer holds (T5's shared table)."""
    if row.refused is not None:
        raise HFConversionError(f"{row.cls}: {row.refused}")
    for check in row.checks:
        why = check.fn(m)
        if why:  # one line that starts with the class name
            raise HFConversionError(why if why.startswith(row.cls) else f"{row.cls}: {why}")
    if row.latent is not None:
        return row.latent.read(row, m)
    c, h, d = int(value(m, row.c)), int(value(m, row.h)), int(value(m, row.d))
    g = int(value(m, row.g) or h)
    if row.qkv is not None:
        layout = _layout(row, m)
        w, b = read_linear(value(m, row.qkv), row.conv1d)
        wq, wk, wv = split_fused(w, layout, h, g, d)
        bq, bk, bv = (x[:, 0] for x in split_fused(_as_col(b), layout, h, g, d)) if b is not None else (None,) * 3
    else:
        lins = (value(m, row.q), value(m, row.k), value(m, row.v))
        (wq, bq), (wk, bk), (wv, bv) = (read_linear(lin, row.conv1d) for lin in lins)
    wg = bg = None
    if row.q_gate:  # each head's rows [query d | gate d]: the gate's rows are W_G's (zoo/modifiers/gate.py)
        wq, wg = rearrange(wq, "(h two d) c -> two (h d) c", h=h, two=2)
        bq, bg = (None, None) if bq is None else rearrange(bq, "(h two d) -> two (h d)", h=h, two=2)
    wo, bo = read_linear(value(m, row.out), row.conv1d)
    gate = [(bg, wg)] if row.q_gate else []
    bias, (bq, bk, bv, bo, *bg_) = complete_biases([bq, bk, bv, bo, *(b for b, _ in gate)], [wq, wk, wv, wo, wg])
    bg = bg_[0] if bg_ else None
    fields: dict = {"output_gate": True} if row.q_gate else {}
    if row.rope is not None and value(m, row.rope_if):
        if callable(row.rope):
            fields.update(row.rope(m, d))
        else:
            fields.update(config_rope(m, d, partial=row.rope == "partial"))
        fields["rope_interleaved"] = row.rope_interleaved
        ndims = value(m, row.rotary_ndims)
        if ndims is not None and (fields["rope_dim"] or d) != ndims:
            raise HFConversionError(f"{row.cls}: rotary_ndims={ndims} disagrees with its config")
    for field, get in (("window", row.window), ("softcap", row.softcap), ("clip_qkv", row.clip_qkv)):
        got = value(m, get)
        if got is not None:
            fields[field] = int(got) if field == "window" else float(got)
    q_norm = k_norm = slopes = rel = None
    q_norm_bias = k_norm_bias = None
    if row.qk_norm is not None and value(m, row.qk_norm_if):
        (q_norm, q_norm_bias, eq), (k_norm, k_norm_bias, ek) = (read_norm(row, value(m, path)) for path in row.norms)
        if eq != ek:
            raise HFConversionError(f"{row.cls}: q_norm eps={eq} != k_norm eps={ek}; the zoo has one qk_norm_eps")
        if (q_norm_bias is None) != (k_norm_bias is None):
            raise HFConversionError(f"{row.cls}: one of its Q/K norms has a bias, the other none")
        if row.qk_norm_kind == "rms" and q_norm_bias is not None:
            raise HFConversionError(f"{row.cls}: its RMS QK-norm has a bias; the zoo's RMS QK-norm has none")
        fields.update(qk_norm=row.qk_norm, qk_norm_eps=eq)
        if row.qk_norm_kind != "rms":
            fields.update(qk_norm_kind=row.qk_norm_kind, qk_norm_bias=q_norm_bias is not None)
    if row.alibi is not None:
        fields["alibi"] = True
        slopes = row.alibi(m, h).to(wq.dtype)
    held = row.rel_bias(m, model) if row.rel_bias is not None else None
    if held is not None:
        fields.update(rel_buckets=int(value(m, row.rel_buckets)), rel_max_distance=int(value(m, row.rel_max_distance)))
        rel = held[0].weight.detach().clone()
    if row.fields is not None:
        fields.update(row.fields(m))
    sinks = None
    if row.sinks is not None:
        fields["sinks"] = True
        sinks = value(m, row.sinks).detach().clone()
    d_context = value(m, row.context)
    if d_context is not None:
        fields["d_context"] = int(d_context)
    spec = AttentionSpec(
        d_model=c,
        heads=h,
        d_k=None if h * d == c else d,
        kv_heads=None if g == h else g,
        layout="combined" if row.qkv is not None else "separate",
        bias=bias,
        causal=bool(value(m, row.causal)),
        scale=default_scale(float(value(m, row.scale)), d),
        **fields,
    )
    p = Projections(wq, wk, wv, wo, bq, bk, bv, bo, q_norm=q_norm, k_norm=k_norm, alibi_slopes=slopes, rel_bias=rel)
    p.q_norm_bias, p.k_norm_bias, p.sinks = q_norm_bias, k_norm_bias, sinks
    p.w_gate, p.b_gate = (wg, bg) if row.q_gate else (None, None)
    return spec, p


def write(row: Row, m: nn.Module, spec: AttentionSpec, p: Projections, model: nn.Module | None = None) -> None:
    """Write projections `p` (of a block with `spec`, the one `read` gives for `m`) into module `m`."""
    if row.latent is not None:
        return row.latent.write(row, m, spec, p)
    held = row.rel_bias(m, model) if row.rel_bias is not None and p.rel_bias is not None else None
    if held is not None and not held[1]:
        shared = held[0].weight
        if not torch.equal(p.rel_bias.to(shared), shared):
            raise HFConversionError(
                f"the block's relative bias table is not the one {row.cls} layer {getattr(m, 'layer_idx', '?')} "
                f"reads (its stack's first layer holds it for every layer); write the table through that first "
                f"layer's module, or permute/prune no heads of a layer that does not own it"
            )
    if row.alibi is not None and p.alibi_slopes is not None:
        want = row.alibi(m, spec.heads).to(p.alibi_slopes)
        # the zoo's own slopes (fresh blocks) differ from the model's fp32 powers by rounding only
        if not torch.allclose(p.alibi_slopes, want, rtol=1e-6, atol=0.0):
            raise HFConversionError(
                f"the block's ALiBi slopes are not {row.family}'s for its head count (heads permuted or pruned?); "
                f"{row.cls} computes its slopes from its head count and cannot hold others"
            )
    if row.qkv is not None:
        layout, h, g = _layout(row, m), spec.heads, spec.kv_heads_
        w = fuse_fused(p.w_q, p.w_k, p.w_v, layout, h, g)
        b = None
        if p.b_q is not None:
            b = fuse_fused(*(_as_col(x) for x in (p.b_q, p.b_k, p.b_v)), layout, h, g)[:, 0]
        write_linear(value(m, row.qkv), w, b, row.qkv, row.conv1d)
    else:
        wq, bq, h = p.w_q, p.b_q, spec.heads
        if row.q_gate:  # the gate's rows back beside each head's query rows
            wq = rearrange([p.w_q, p.w_gate], "two (h d) c -> (h two d) c", h=h)
            bq = None if bq is None else rearrange([p.b_q, p.b_gate], "two (h d) -> (h two d)", h=h)
        for path, w, b in ((row.q, wq, bq), (row.k, p.w_k, p.b_k), (row.v, p.w_v, p.b_v)):
            write_linear(value(m, path), w, b, path, row.conv1d)
    write_linear(value(m, row.out), p.w_o, p.b_o, row.out, row.conv1d)
    if held is not None and held[1]:  # the layer owns the table (T5: every layer of the stack reads it)
        held[0].weight.copy_(p.rel_bias)
    if row.sinks is not None and p.sinks is not None:
        value(m, row.sinks).copy_(p.sinks)
    if row.qk_norm is not None and p.q_norm is not None:
        for path, weight, bias in zip(row.norms, (p.q_norm, p.k_norm), (p.q_norm_bias, p.k_norm_bias)):
            write_norm(row, value(m, path), weight, bias, path)
