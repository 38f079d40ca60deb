"""Readers and refusal checks that rows of the transformers family table (`peers.classes`) share.

Each function takes the transformers module a row describes; a `Check` returns the reason a
configuration is refused (one line naming the field), or None.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from einops import rearrange
from torch import Tensor, nn

from zoo.errors import HFConversionError

from .rows import Check, cls_name, norm_eps


def _bidirectional(m: nn.Module) -> str | None:
    if not getattr(m, "is_causal", True) or getattr(m.config, "use_bidirectional_attention", None):
        return "use_bidirectional_attention=True is not converted (the zoo converts causal layers)"
    return None


BIDIRECTIONAL = Check("use_bidirectional_attention=True", _bidirectional)


def cross(attr: str, child: str | None = None) -> Check:
    """Cross-attention layers are refused: the flag `attr` is set, or the `child` module's class says so."""

    def fn(m: nn.Module) -> str | None:
        if child is not None:
            inner = getattr(m, child)
            if "Cross" in cls_name(inner):
                return (
                    f"holds {cls_name(inner)}: cross-attention layers are not converted (the zoo's cross-attention "
                    f"takes its keys from a context of width d_context; convert self-attention)"
                )
            return None
        if getattr(m, attr, False):
            return f"{attr}=True: cross-attention layers are not converted; convert self-attention"
        return None

    return Check("cross-attention", fn)


def bloom_slopes(m: nn.Module, heads: int) -> Tensor:
    """BLOOM's own ALiBi slopes, read from transformers' build_alibi_tensor (key 1 of a 2-token row)."""
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    alibi = build_alibi_tensor(torch.ones(1, 2, dtype=torch.long), heads, torch.float32)
    return rearrange(alibi, "(b h) 1 s -> b h s", b=1)[0, :, 1].clone()


def falcon_layout(m: nn.Module) -> str:
    # multi_query (Falcon-7B): [Q (h d) | K (d) | V (d)]; new_decoder_architecture (40B): grouped; else (h r d)
    if m.new_decoder_architecture:
        return "grouped"
    return "zoo" if m.multi_query else "per_head"


def falcon_kv(m: nn.Module) -> int:
    layout = falcon_layout(m)
    return 1 if layout == "zoo" else (m.num_kv_heads if layout == "grouped" else m.num_heads)


def falcon_alibi(m: nn.Module) -> str | None:
    if getattr(m.config, "alibi", False):
        return (
            "FalconAttention with alibi=True: Falcon adds its ALiBi bias before scaling the scores "
            "(slopes / sqrt(d)) and takes dropout there; convert rotary Falcon models only"
        )
    return None


def mpt_slopes(m: nn.Module, heads: int) -> Tensor:
    """MPT's ALiBi slopes (the model builds them with alibi_bias_max=8 whatever its config says)."""
    from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

    bias = build_mpt_alibi_tensor(heads, 2)  # (h 1 s): slope * (j - 1)
    return (bias[:, 0, 1] - bias[:, 0, 0]).float().clone()


def fixed_rope(m: nn.Module, head_dim: int) -> dict:
    """GPT-J / CodeGen: base 10000 (fixed in the model), rotary_dim leading dims (None: all)."""
    rd = m.rotary_dim
    return {"rope_theta": 10000.0, "rope_dim": None if rd is None or rd == head_dim else int(rd)}


def flag(name: str, what: str, where: str = "config", is_set: Callable[[object], bool] = bool) -> Check:
    """Refuse when the config (or module) value `name` is set: truthy, or as `is_set` says (e.g. "not None"
    where the model acts on 0.0 too)."""

    def fn(m: nn.Module) -> str | None:
        got = getattr(m.config if where == "config" else m, name, None)
        return f"{name}={got!r}: {what}" if is_set(got) else None

    return Check(f"{name} set", fn)


def encoder_attn_width(m: nn.Module) -> int | None:
    """BART-style classes are one class for all three attentions; the decoder's encoder_attn (built with
    is_decoder=True, is_causal=False) takes its keys and values from the encoder output, of width embed_dim."""
    if getattr(m, "is_decoder", False) and not getattr(m, "is_causal", False):
        return int(m.embed_dim)
    return None


def beit_bias(m: nn.Module) -> str | None:
    cfg = m.config
    for flag in ("use_relative_position_bias", "use_shared_relative_position_bias"):
        if getattr(cfg, flag, False):
            return f"{flag}=True: BEiT's relative position bias table is not a zoo modifier yet"
    return None


def clip_config(m: nn.Module) -> str | None:
    name = type(m.config).__name__
    if name not in ("CLIPTextConfig", "CLIPVisionConfig"):
        return (
            f"config is a {name}, neither CLIPTextConfig (whose model masks causally) nor CLIPVisionConfig; "
            f"the module alone does not say whether it is causal"
        )
    return None


def clip_causal(m: nn.Module) -> bool:
    # CLIPAttention is one class for both towers; the text model builds a causal mask around it
    return type(m.config).__name__ == "CLIPTextConfig"


def codegen_shards(m: nn.Module) -> str | None:
    return None if m.mp_num == 4 else f"mp_num={m.mp_num}: the zoo reads CodeGen's fused rows in 4 shards"


def t5_context(m: nn.Module) -> int | None:
    """T5's EncDecAttention (a decoder layer's module that is not causal) takes its keys and values from
    the encoder output, of width d_model; its self-attention modules take none."""
    if getattr(m, "is_decoder", False) and not getattr(m, "is_causal", False):
        return int(m.d_model)
    return None


def t5_bias(m: nn.Module, model: nn.Module | None) -> tuple[nn.Module, bool] | None:
    """The relative bias table T5's self-attention `m` reads: its own (the stack's first layer, every UMT5
    layer), or the first layer's, found in `model` (T5 and MT5 share it down the stack). None for
    cross-attention, which has no distances and no bias."""
    if t5_context(m) is not None:
        return None
    if getattr(m, "has_relative_attention_bias", False):
        return m.relative_attention_bias, True
    name = f"{cls_name(m)} layer {getattr(m, 'layer_idx', '?')}"
    if model is None:
        raise HFConversionError(
            f"{name} has no relative_attention_bias of its own: it reads its stack's first layer's table; "
            f"pass the model it sits in: from_hf(module, model=model)"
        )
    for stack in model.modules():
        blocks = getattr(stack, "block", None)
        if isinstance(blocks, nn.ModuleList) and any(sub is m for sub in blocks.modules()):
            owners = [
                sub
                for sub in blocks.modules()
                if type(sub) is type(m) and getattr(sub, "has_relative_attention_bias", False)
            ]
            if owners:
                return owners[0].relative_attention_bias, False
            raise HFConversionError(f"{name}: no layer of its stack holds a relative_attention_bias table")
    raise HFConversionError(f"{name} is not inside the {type(model).__name__} given as model=; pass its own model")


def llama4_fields(m: nn.Module) -> dict:
    """Llama 4's layer settings beside its projections, with its config class's defaults: the chunk of a
    chunked layer (layer_types; without them a rotary layer where attention_chunk_size is set), the weightless
    QK-norm's eps where the module has one (rotary layers with use_qk_norm), and the query temperature of a
    NoPE layer (attn_temperature_tuning: floor_scale, attn_scale)."""
    cfg, out = m.config, {}
    size = getattr(cfg, "attention_chunk_size", 8192)
    kinds = getattr(cfg, "layer_types", None)
    chunked = kinds[m.layer_idx] == "chunked_attention" if kinds else bool(m.use_rope) and size is not None
    if chunked:
        out["chunk"] = int(size)
    norm = getattr(m, "qk_norm", None)
    if norm is not None:
        out["qk_l2"] = norm_eps(norm)
    if getattr(cfg, "attn_temperature_tuning", True) and not m.use_rope:
        out.update(temperature_floor=int(getattr(cfg, "floor_scale", 8192)))
        out.update(temperature_scale=float(getattr(cfg, "attn_scale", 0.1)))
    return out
