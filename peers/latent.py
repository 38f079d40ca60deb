"""The rows of the latent-attention classes (DeepSeek-V2/V3, MiniCPM3; Kimi-K2 is a deepseek_v3 config): how their
modules map to a zoo block with `kv_lora_rank` (zoo/modifiers/latent.py), read and written as data like every row.

    q_proj                (h dk) x c                   when config.q_lora_rank is None, else
    q_a_proj, q_a_layernorm, q_b_proj                  rq x c, (rq), (h dk) x rq
    kv_a_proj_with_mqa    (r + dr) x c                 [latent | rotary key]
    kv_a_layernorm        (r)
    kv_b_proj             (h (dn + dv)) x r            per head [k_nope | v]
    o_proj                c x (h dv)

The modules build their RMSNorms on the latents with the default epsilon (1e-6), not config.rms_norm_eps.
transformers is not imported here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from zoo import AttentionSpec
from zoo.errors import HFConversionError
from zoo.heads import Projections

from .rows import cls_name, config_rope, default_scale, read_linear, value, write_linear

LATENT_EPS = 1e-6  # DeepseekV3RMSNorm(kv_lora_rank) and its copies: the default epsilon, whatever the config says
# the module paths a latent row reads, beside o_proj
PATHS = ("q_proj", "q_a_proj", "q_a_layernorm", "q_b_proj", "kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj")


@dataclass(frozen=True)
class LatentRow:
    """What differs between the latent classes: how their rotary pairs are laid out."""

    interleaved: str | bool  # True: adjacent pairs (DeepSeek-V2's complex rotary), or the config key saying so

    def rope_interleaved(self, m: nn.Module) -> bool:
        if isinstance(self.interleaved, bool):
            return self.interleaved
        return bool(getattr(m.config, self.interleaved, True))

    # peers.rows.read / write hand a latent row here
    def read(self, row: Any, m: nn.Module) -> tuple[AttentionSpec, Projections]:
        return read(row, m)

    def write(self, row: Any, m: nn.Module, spec: AttentionSpec, p: Projections) -> None:
        write(row, m, spec, p)

    shapes = staticmethod(lambda m: shapes(m))
    paths = PATHS


def yarn_scale(params: dict, scale: float) -> float:
    """The score scale under a scaled rotary (transformers' yarn_apply_mscale): with mscale_all_dim set, the
    scale times (0.1 * mscale_all_dim * ln(factor) + 1)^2 (factor > 1)."""
    if params.get("rope_type", "default") == "default":
        return scale
    m, factor = params.get("mscale_all_dim", 0), params.get("factor", 1.0)
    if not m or factor <= 1:
        return scale
    return scale * (0.1 * m * math.log(factor) + 1.0) ** 2


def attrs(cfg: Any, i: int) -> dict:
    """What the latent classes' __init__ computes from the config (peers.model_types's Family.attrs)."""
    dk = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
    params = cfg.get("rope_parameters") or {}
    return dict(
        layer_idx=i,
        hidden_size=cfg.hidden_size,
        num_heads=cfg.num_attention_heads,
        q_lora_rank=cfg.get("q_lora_rank"),
        kv_lora_rank=cfg.kv_lora_rank,
        qk_rope_head_dim=cfg.qk_rope_head_dim,
        qk_nope_head_dim=cfg.qk_nope_head_dim,
        qk_head_dim=dk,
        v_head_dim=cfg.get("v_head_dim") or cfg.qk_nope_head_dim,
        scaling=yarn_scale(params, dk**-0.5),
    )


def shapes(m: Any) -> dict[str, tuple[int, ...]]:
    """The tensors a latent module holds, from its attributes (spec_from_config's meta tensors)."""
    c, h, rq, r = m.hidden_size, m.num_heads, m.q_lora_rank, m.kv_lora_rank
    dk, dr, dv = m.qk_head_dim, m.qk_rope_head_dim, m.v_head_dim
    out: dict[str, tuple[int, ...]] = {}
    if rq is None:
        out["q_proj.weight"] = (h * dk, c)
    else:
        out.update({"q_a_proj.weight": (rq, c), "q_a_layernorm.weight": (rq,), "q_b_proj.weight": (h * dk, rq)})
    out.update(
        {
            "kv_a_proj_with_mqa.weight": (r + dr, c),
            "kv_a_layernorm.weight": (r,),
            "kv_b_proj.weight": (h * (dk - dr + dv), r),
            "o_proj.weight": (c, h * dv),
        }
    )
    return out


def _eps(norm: Any) -> float:
    eps = getattr(norm, "variance_epsilon", LATENT_EPS)
    return float(eps)


def read(row: Any, m: nn.Module) -> tuple[AttentionSpec, Projections]:
    """(spec, projections) of a latent module (row.latent says how its rotary pairs lie)."""
    lat: LatentRow = row.latent
    h, dk, dr = int(m.num_heads), int(m.qk_head_dim), int(m.qk_rope_head_dim)
    lora = m.q_lora_rank is not None
    linears = {p: value(m, p + "?") for p in PATHS}
    biases = {p: read_linear(lin)[1] for p, lin in linears.items() if lin is not None and "layernorm" not in p}
    biases["o_proj"] = read_linear(m.o_proj)[1]
    with_bias = sorted(p for p, b in biases.items() if b is not None)
    if with_bias:
        raise HFConversionError(
            f"{cls_name(m)}: attention_bias=True puts biases on {', '.join(with_bias)}; a latent block has none "
            f"(DeepSeek-V2/V3 and MiniCPM3 ship attention_bias=False)"
        )
    norms = [n for n in (linears["q_a_layernorm"], linears["kv_a_layernorm"]) if n is not None]
    eps = {_eps(n) for n in norms}
    if len(eps) != 1:
        raise HFConversionError(f"{cls_name(m)}: q_a_layernorm and kv_a_layernorm differ in epsilon {sorted(eps)}")
    rope = config_rope(m, dr, partial=False)
    spec = AttentionSpec(
        d_model=int(m.hidden_size),
        heads=h,
        d_k=dk,
        d_v=int(m.v_head_dim),
        bias=False,
        causal=True,
        scale=default_scale(float(m.scaling), dk),
        rope_theta=rope["rope_theta"],
        rope_dim=dr,
        rope_interleaved=lat.rope_interleaved(m),
        **{k: v for k, v in rope.items() if k not in ("rope_theta", "rope_dim")},  # linear or scaled rotary
        kv_lora_rank=int(m.kv_lora_rank),
        q_lora_rank=int(m.q_lora_rank) if lora else None,
        latent_eps=eps.pop(),
    )
    w_o = read_linear(m.o_proj)[0]
    none = w_o.new_zeros(0, spec.d_model)

    def w(path: str) -> Tensor:
        return linears[path].weight.detach().clone()

    p = Projections(
        w_q=none if lora else w("q_proj"),
        w_k=none,
        w_v=none.clone(),
        w_o=w_o,
        q_a=w("q_a_proj") if lora else None,
        q_a_norm=w("q_a_layernorm") if lora else None,
        q_b=w("q_b_proj") if lora else None,
        kv_a=w("kv_a_proj_with_mqa"),
        kv_a_norm=w("kv_a_layernorm"),
        kv_b=w("kv_b_proj"),
    )
    return spec, p


def write(row: Any, m: nn.Module, spec: AttentionSpec, p: Projections) -> None:
    """Write a latent block's projections `p` into module `m` (of the spec `read` gives for it)."""
    if (spec.q_lora_rank is None) != (m.q_lora_rank is None):
        raise HFConversionError(
            f"{cls_name(m)}: the block has q_lora_rank={spec.q_lora_rank}, the module {m.q_lora_rank}"
        )
    if spec.q_lora_rank is None:
        write_linear(m.q_proj, p.w_q, None, "q_proj")
    else:
        write_linear(m.q_a_proj, p.q_a, None, "q_a_proj")
        write_linear(m.q_b_proj, p.q_b, None, "q_b_proj")
        _copy(m.q_a_layernorm.weight, p.q_a_norm, "q_a_layernorm")
    write_linear(m.kv_a_proj_with_mqa, p.kv_a, None, "kv_a_proj_with_mqa")
    write_linear(m.kv_b_proj, p.kv_b, None, "kv_b_proj")
    _copy(m.kv_a_layernorm.weight, p.kv_a_norm, "kv_a_layernorm")
    write_linear(m.o_proj, p.w_o, p.b_o, "o_proj")


def _copy(dst: Tensor, src: Tensor, what: str) -> None:
    if tuple(dst.shape) != tuple(src.shape):
        raise HFConversionError(f"{what}: module weight has shape {tuple(dst.shape)}, block's is {tuple(src.shape)}")
    with torch.no_grad():
        dst.copy_(src)
