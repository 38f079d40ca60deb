"""`preset_toml(config, name, layer)`: a preset file (the models/*.toml format) from a transformers config,
each spec field with a comment citing the config values it was read from (`attnzoo preset`)."""

from __future__ import annotations

import json
import os
from typing import Any

from zoo import AttentionSpec
from zoo.errors import ArgumentError
from zoo.registry import is_shipped, reserved

from .config import config_dict, normalized, prepare, spec_from_config

# spec field -> the config keys it is read from (transformers' names; the family's aliases apply)
_SOURCES = {
    "d_model": ("hidden_size",),
    "heads": ("num_attention_heads",),
    "d_k": ("head_dim", "qk_nope_head_dim", "qk_rope_head_dim"),
    "d_v": ("v_head_dim",),
    "kv_heads": ("num_key_value_heads", "num_kv_heads", "multi_query", "new_decoder_architecture"),
    "scale": ("query_pre_attn_scalar", "attention_multiplier", "scale_attn_weights", "scale_attn_by_inverse_layer_idx"),
    "rope_theta": (
        "rope_theta",
        "rope_parameters.rope_theta",
        "rope_parameters.{kind}.rope_theta",
        "no_rope_layers[{layer}]",
    ),
    "rope_dim": ("rope_parameters.partial_rotary_factor", "rotary_dim", "qk_rope_head_dim"),
    "rope_interleaved": ("rope_interleave",),
    "kv_lora_rank": ("kv_lora_rank",),
    "q_lora_rank": ("q_lora_rank",),
    "rope_scale": ("rope_parameters.factor", "rope_parameters.{kind}.factor", "rope_scaling.factor"),
    "window": ("sliding_window", "layer_types[{layer}]"),
    "softcap": ("attn_logit_softcapping",),
    "qk_norm_eps": ("rms_norm_eps", "layer_norm_eps"),
    "qk_norm": ("use_qk_norm", "qk_layernorm"),
    "qk_norm_kind": ("use_qk_norm", "qk_layernorm"),
    "clip_qkv": ("clip_qkv", "attn_config.clip_qkv"),
}
# the scaled rotary kinds' fields: the rope_parameters key each is read from (peers/rope.py)
for _fld, _key in (
    ("rope_scaling", "rope_type"),
    ("rope_factor", "factor"),
    ("rope_original_max", "original_max_position_embeddings"),
    ("rope_low_freq", "low_freq_factor"),
    ("rope_high_freq", "high_freq_factor"),
    ("rope_beta_fast", "beta_fast"),
    ("rope_beta_slow", "beta_slow"),
    ("rope_truncate", "truncate"),
    ("rope_attention", "attention_factor"),
    ("rope_short_factor", "short_factor"),
    ("rope_long_factor", "long_factor"),
):
    _SOURCES[_fld] = (f"rope_parameters.{_key}", f"rope_parameters.{{kind}}.{_key}")
_SOURCES["rope_factor"] += ("max_position_embeddings",)  # yarn / longrope without a factor: the ratio
_SOURCES["rope_attention"] += ("rope_parameters.mscale", "rope_parameters.mscale_all_dim")


def _lookup(data: dict, path: str) -> Any:
    """data["a"]["b"] for "a.b", data["a"][2] for "a[2]"; None when absent."""
    obj: Any = data
    for part in path.split("."):
        key, _, idx = part.partition("[")
        obj = obj.get(key) if isinstance(obj, dict) else None
        if idx and isinstance(obj, list) and int(idx[:-1]) < len(obj):
            obj = obj[int(idx[:-1])]
        elif idx:
            obj = None
    return obj


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (tuple, list)):  # longrope's factor lists
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return json.dumps(str(v))


def _cite(v: Any) -> str:
    return json.dumps(v) if isinstance(v, (bool, type(None), list, dict)) else str(v)


def preset_toml(config: Any, name: str, layer: int = 0) -> str:
    """A preset file (models/*.toml format) holding layer `layer`'s spec from `config`, each field with a
    comment citing the config values it was read from. `zoo.add_presets` on its folder registers it
    under its file's stem, which should be `name`; a shipped preset's name is refused (it is reserved)."""
    if not isinstance(name, str) or not name or any(ch in name for ch in "*?[] \t/\\"):
        raise ArgumentError(f"name={name!r} must be a non-empty preset name without spaces, slashes or wildcards")
    if is_shipped(name):  # it would not load: shipped names are reserved
        raise ArgumentError(reserved(name, "a preset file written under its name would not load"))
    spec = spec_from_config(config, layer)
    st = prepare(config, layer)
    raw = config_dict(config)
    # cite the config's own keys where it has them; rope_parameters as resolved (rope_scaling may replace it)
    data = {**normalized(st.kind, dict(raw)), **{k: v for k, v in raw.items() if k != "rope_parameters"}}
    where = str(config) if isinstance(config, (str, os.PathLike)) else f"a {type(config).__name__}"

    def cited(fld: str) -> list[str]:
        keys = list(_SOURCES.get(fld, ()))
        if fld == "bias" and isinstance(st.family.bias, str):
            keys.append(st.family.bias)
        out = []
        for key in keys:
            key = key.format(layer=layer, kind=st.attrs.get("layer_type"))
            head = key.split(".")[0].split("[")[0]
            got = _lookup(data, key.replace(head, st.key(head), 1))
            if got is not None:
                out.append(f"{st.key(head)}{key[len(head) :]} {_cite(got)}")
        return out

    defaults = AttentionSpec()
    norm_name = "LayerNorm" if spec.qk_norm_kind == "layer" else "RMSNorm"
    lines, refs = [], []
    for fld, v in spec.to_dict().items():
        if v == getattr(defaults, fld) or v is None:
            continue
        why = cited(fld)
        refs += [c for c in why if c not in refs]
        note = "; ".join(why) or {
            "layout": f"{st.row.cls} holds one fused q/k/v projection",
            "causal": f"{st.row.cls} is a causal decoder layer",
            "bias": f"{st.row.cls} has no projection biases",
            "alibi": f"{st.row.cls} adds ALiBi (slopes from the head count)",
            "qk_norm": f"{st.row.cls} normalizes Q and K ({norm_name})",
            "qk_norm_bias": f"{st.row.cls}'s LayerNorm on Q and K has a bias",
            "rope_interleaved": f"{st.row.cls} rotates adjacent pairs",
        }.get(fld, f"read by the {st.row.family} row")
        lines.append(f"{fld} = {_toml_value(v)}  # {note}")
    head = [
        f"# written by `attnzoo preset` from {where}: model_type {st.kind}, layer {layer} ({st.row.cls})",
        f"description = {json.dumps(f'{st.row.family} layer {layer} attention: {spec.describe()}')}",
        f"reference = {json.dumps(f'config.json (model_type {st.kind}), layer {layer}: ' + ', '.join(refs))}",
        "",
        "[spec]",
    ]
    return "\n".join(head + lines) + "\n"


__all__ = ["preset_toml"]
