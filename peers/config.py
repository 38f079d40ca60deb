"""A transformers config (object, dict or config.json) and a layer in, the spec out: no model built.

The family table's rows (`peers.classes`) say how a live attention module maps to a block. What a row
reads from the module besides its weights (head_dim, scaling, sliding_window, use_rope, ...) is
what the module's __init__ computes from its config. `peers.model_types.FAMILIES` holds that computation,
once per config `model_type`, with where the layer's attention sits in a checkpoint. `_Standin` builds an
object that looks like the module (those attributes, its config, its projections as tensors), and
`peers.rows.read` reads it as it reads the real module: one reader for from_hf, spec_from_config and
from_checkpoint (and, through `peers.preset`, preset_toml). tests/peers/test_checkpoint_hf.py holds
spec_from_config to from_hf's spec, case by case.

transformers is never imported here: a config object is read through its `to_dict()`.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import numbers
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from zoo import AttentionSpec
from zoo.errors import ArgumentError, AttnzooError, HFConversionError, InputTypeError
from zoo.modifiers import alibi_slopes

from .config_keys import KV_HEADS_UNREAD, refuse, with_defaults
from .copies import BY_CLASS
from .model_types import DEFAULT_TRUE, FAMILIES, MAX_POSITIONS, ConfigView, Family
from .rows import Row, norm_shapes, read, value

# -- reading a config --------------------------------------------------------------------------------


def config_dict(config: Any) -> dict:
    """A config object (`to_dict()`), a dict, or a path to config.json (or a folder holding one) -> a dict."""
    if isinstance(config, dict):
        return dict(config)
    if isinstance(config, (str, os.PathLike)):
        path = Path(config)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise HFConversionError(f"{config}: no config.json there; give a transformers config.json or its folder")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise HFConversionError(f"{path}: not a JSON config ({e})") from None
        if not isinstance(data, dict):
            raise HFConversionError(f"{path}: a config.json holds a JSON object, got {type(data).__name__}")
        return data
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict) and type(config).__module__.startswith("transformers."):
        return dict(to_dict())
    raise InputTypeError(
        f"config must be a transformers config, a dict or a path to config.json, got {type(config).__name__}"
    )


def _check_layer(layer: Any) -> int:
    if isinstance(layer, bool) or not isinstance(layer, numbers.Integral):
        raise InputTypeError(f"layer must be an int >= 0, got {type(layer).__name__} {layer!r}")
    if layer < 0:
        raise ArgumentError(f"layer={layer} must be >= 0")
    return int(layer)


def model_type(data: dict) -> str | None:
    """A config dict's model_type, a multimodal Gemma 3's or Llama 4's text stack as its own ("gemma3_text")."""
    kind = data.get("model_type")
    if kind in ("gemma3", "llama4") and isinstance(data.get("text_config"), dict):
        return f"{kind}_text"
    return kind


def family_of(data: dict) -> tuple[str, Family]:
    kind = model_type(data)
    if kind not in FAMILIES:
        raise HFConversionError(
            f"model_type={kind!r}: spec_from_config and from_checkpoint know the decoder families "
            f"{', '.join(sorted(FAMILIES))}; for others build the model and use zoo.from_hf(module)"
        )
    return kind, FAMILIES[kind]


def normalized(kind: str, data: dict) -> dict:
    """transformers 5's config fields from an older config.json: rope_parameters, text_config."""
    if kind in ("gemma3_text", "llama4_text") and isinstance(data.get("text_config"), dict):
        data = dict(data["text_config"], model_type=kind)
    if kind in DEFAULT_TRUE:
        data.setdefault(DEFAULT_TRUE[kind], True)
    data = with_defaults(kind, data)  # the config class's values where config.json leaves a key out
    if kind in KV_HEADS_UNREAD:
        data.pop("num_key_value_heads", None)
    return dict(data, rope_parameters=rope_parameters(kind, data), max_position_embeddings=_max_positions(kind, data))


_LAYER_KINDS = ("full_attention", "sliding_attention")


def rope_parameters(kind: str, data: dict) -> dict:
    """config.rope_parameters as transformers 5 resolves it from a config.json (its
    `convert_rope_params_to_dict`), so spec_from_config and from_checkpoint read what from_hf reads:

    - a non-empty `rope_scaling` replaces `rope_parameters` whole (Gemma 3: it updates the global layers');
    - rope_theta, where the chosen dict lacks it, is the top-level `rope_theta` (GPT-NeoX: `rotary_emb_base`;
      Gemma 3's sliding layers: `rope_local_base_freq`), else the family's default;
    - partial_rotary_factor likewise (GPT-NeoX: `rotary_pct`), where the family has one;
    - rope_type is `rope_type`, else the legacy `type`, else "default" (Phi-3 calls su/yarn longrope);
    - llama3 / yarn / longrope: original_max_position_embeddings as `standardize_rope_params` fills it in.
    Per-layer-type dicts ({"full_attention": {...}, "sliding_attention": {...}}) get each of these."""
    fam = FAMILIES[kind]
    scaling, given = data.get("rope_scaling"), data.get("rope_parameters")
    for key, v in (("rope_scaling", scaling), ("rope_parameters", given)):
        if v is not None and not isinstance(v, dict):
            raise HFConversionError(f"{kind} config: {key}={v!r} must be an object (a dict of rotary settings) or null")
    theta_key, partial_key = fam.rope_keys
    if kind == "gemma3_text":
        params = copy.deepcopy(given) if isinstance(given, dict) else {}
        for k in _LAYER_KINDS:
            if not isinstance(params.get(k), dict):
                params[k] = {"rope_type": "default"}
        if isinstance(scaling, dict):
            params["full_attention"].update(scaling)
        params["full_attention"].setdefault("rope_theta", data.get("rope_theta", fam.theta))
        params["sliding_attention"].setdefault("rope_theta", data.get("rope_local_base_freq", 10000.0))
    else:
        chosen = scaling or given or fam.rope
        params = copy.deepcopy(chosen) if isinstance(chosen, dict) else {}
        partial = data.get(partial_key, fam.partial)
        for p in _rope_dicts(params, data):
            p.setdefault("rope_theta", data.get(theta_key, fam.theta))
            if partial is not None:
                p.setdefault("partial_rotary_factor", partial)
    dicts = _rope_dicts(params, data)
    for p in dicts:
        p.setdefault("rope_type", p.get("type", "default"))
        if kind == "phi3" and p["rope_type"] in ("su", "yarn"):
            p["rope_type"] = "longrope"
        if p["rope_type"] in ("llama3", "yarn", "longrope"):
            # the pretraining length: Phi-3's config class has a top-level original_max_position_embeddings
            # (default 4096), which wins over the dict's for a flat dict; other classes ignore a top-level one
            # (it is not yet an attribute when transformers resolves the dict); else max_position_embeddings
            top = data.get("original_max_position_embeddings", 4096) if kind == "phi3" else None
            # (per-layer-type dicts get theirs when the rotary is built: peers.rope reads max_position_embeddings)
            if top is not None and dicts == [params]:
                p["original_max_position_embeddings"] = top
            elif dicts == [params]:
                p.setdefault("original_max_position_embeddings", _max_positions(kind, data))
    return params


def _max_positions(kind: str, data: dict) -> int:
    got = data.get("max_position_embeddings")
    return got if got is not None else MAX_POSITIONS.get(kind, 2048)


def _rope_dicts(params: dict, data: dict) -> list[dict]:
    """The per-layer-type dicts of a nested rope_parameters, or [params] for a flat one."""
    labels = set(_LAYER_KINDS) | set(data.get("layer_types") or ())
    nested = [params[k] for k in params if k in labels]
    return [p for p in nested if isinstance(p, dict)] if nested else [params]


@dataclass
class Stand:
    """What spec_from_config and from_checkpoint share: the family, the module's attributes, the layer."""

    kind: str
    family: Family
    row: Row
    cfg: ConfigView
    attrs: dict
    layer: int
    c: int
    h: int
    g: int
    d: int
    bias: bool

    def key(self, name: str) -> str:
        """The config's own name for a transformers config key (Family.key)."""
        return self.family.key(name)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """The tensors the row reads, relative to the attention module, with the shapes the config implies."""
        row, c, h, g, d = self.row, self.c, self.h, self.g, self.d
        if row.latent is not None:  # latent attention: its own projections (peers/latent.py)
            return row.latent.shapes(_Part.of(self.attrs))
        out: dict[str, tuple[int, ...]] = {}

        def lin(path: str, rows: int, cols: int) -> None:
            out[f"{path}.weight"] = (cols, rows) if row.conv1d else (rows, cols)

        if row.qkv is not None:
            lin(row.qkv, (h + 2 * g) * d, c)
        else:
            lin(row.q, h * d * (2 if row.q_gate else 1), c)  # Qwen3-Next: each head [query | gate]
            lin(row.k, g * d, c)
            lin(row.v, g * d, c)
        lin(row.out, c, h * d)
        if row.sinks is not None:
            out[row.sinks] = (h,)
        probe = _Standin.make(row, self.cfg, self.attrs, {}, self.family)
        if row.qk_norm is not None and value(probe, row.qk_norm_if):
            for path, n in zip(row.norms, (h, g)):
                out.update(norm_shapes(row, path, n, d))
        return out

    def bias_shapes(self) -> dict[str, tuple[int]]:
        """Every bias the row could read (a family may carry only some of them)."""
        return {
            name[: -len("weight")] + "bias": (shape[-1] if self.row.conv1d else shape[0],)
            for name, shape in self.shapes().items()
            if name.endswith(".weight") and not any(name.startswith(n + ".") for n in self.row.norms)
        }


def prepare(config: Any, layer: Any) -> Stand:
    """Read the config and the layer; refusals (unknown model_type, layer out of range) raise here."""
    layer = _check_layer(layer)
    data = config_dict(config)
    kind, fam = family_of(data)
    full = normalized(kind, data)
    cfg = ConfigView(full, fam.aliases)
    _check_sizes(kind, cfg, fam)
    refuse(kind, full, cfg)  # a key the zoo does not apply, set to change the math (peers.config_keys)
    _check_head_width(kind, cfg, fam)
    try:
        n = int(cfg.num_hidden_layers)
        if layer >= n:
            raise ArgumentError(f"layer={layer} is out of range: the config has {n} layers (0..{n - 1})")
        attrs = fam.attrs(cfg, layer)
        row = BY_CLASS[fam.cls]
        probe = _Standin.make(row, cfg, attrs, {}, fam)
        c, h, d = int(value(probe, row.c)), int(value(probe, row.h)), int(value(probe, row.d))
        g = int(value(probe, row.g) or h)
        if row.window is not None and value(probe, row.window) == 0:
            raise HFConversionError(
                f"{kind} config: sliding_window=0 makes layer {layer} slide over no keys (a window counts the keys "
                f"a query sees, itself included); give sliding_window a positive integer, or null "
                f"(or use_sliding_window=false where the config has it) for no window"
            )
    except AttnzooError:
        raise
    except (AttributeError, KeyError, IndexError, TypeError, ValueError, ArithmeticError) as e:
        raise HFConversionError(
            f"{kind} config: cannot read layer {layer} ({_reason(e)}); is it a {kind} config?"
        ) from None
    st = Stand(kind, fam, row, cfg, attrs, layer, c, h, g, d, fam.has_bias(cfg))
    for name, shape in st.shapes().items():
        if math.prod(shape) >= 2**63:
            raise HFConversionError(
                f"{kind} config: its sizes ({st.key('hidden_size')}={c}, {st.key('num_attention_heads')}={h}, "
                f"{st.key('num_key_value_heads')}={g}, head_dim={d}) make {name} "
                f"{shape}, past what a tensor can hold (2**63 elements); fix the config's size fields"
            )
    return st


# the size fields a family reads (transformers' names; the family's aliases apply): a positive integer where given
SIZE_FIELDS = (
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "num_kv_heads",
    "head_dim",
    "num_hidden_layers",
    "rotary_dim",
    "sliding_window",
    "sliding_window_pattern",
)

_ZERO_MEANS_OFF = {"sliding_window"}  # Qwen2-MoE's config class defaults it to 0 where no layer slides


def _check_sizes(kind: str, cfg: ConfigView, fam: Family) -> None:
    """Every size field the config gives is a positive integer (null: the family's default), before any is used."""
    for name in SIZE_FIELDS:
        v = cfg.get(name)
        if v is None:
            continue
        floor = 0 if name in _ZERO_MEANS_OFF else 1
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < floor:
            key, what = fam.key(name), "a positive integer" if floor else "an integer >= 0 (0: off)"
            raise HFConversionError(f"{kind} config: {key}={v!r} must be {what}; fix it in the config")


def _check_head_width(kind: str, cfg: ConfigView, fam: Family) -> None:
    """Where the config leaves head_dim out, the family derives it as hidden_size // num_attention_heads:
    more heads than channels leave each head none."""
    c, h, g = cfg.get("hidden_size"), cfg.get("num_attention_heads"), cfg.get("num_key_value_heads")
    hk, ck = fam.key("num_attention_heads"), fam.key("hidden_size")
    for name in ("hidden_size", "num_attention_heads", "num_hidden_layers"):  # no default to fall back on
        key = fam.key(name)
        if cfg.get(name, 0) is None:
            raise HFConversionError(f"{kind} config: {key}=null has no default; give it a positive integer")
    if isinstance(h, int) and isinstance(g, int) and h % g:
        raise HFConversionError(
            f"{kind} config: num_key_value_heads={g} must divide {hk}={h} (each kv head serves the same number of "
            f"query heads); fix one of them in the config"
        )
    if cfg.get("head_dim") is not None or not isinstance(c, int) or not isinstance(h, int) or c // h >= 1:
        return
    raise HFConversionError(
        f"{kind} config: {ck}={c} over {hk}={h} leaves each head {c} // {h} = 0 channels; "
        f"fix the config: {hk} at most {ck} (a divisor of it, e.g. {_divisor_near(c, h)}), or give head_dim"
    )


def _divisor_near(c: int, h: int) -> int:
    """The largest divisor of c not above min(h, 64) (a head count to suggest)."""
    return max(k for k in range(1, min(h, 64, c) + 1) if c % k == 0)


def _reason(e: Exception) -> str:
    if isinstance(e, KeyError):
        return f"no {e.args[0]!r}"
    text = str(e).splitlines()[0] if str(e) else type(e).__name__
    return f"{type(e).__name__}: {text}" if isinstance(e, (ValueError, ArithmeticError)) else text


def read_stand(st: Stand, tensors: dict[str, Tensor]) -> tuple[AttentionSpec, Any]:
    """peers.rows.read on a stand-in holding `tensors` (names relative to the attention module)."""
    probe = _Standin.make(st.row, st.cfg, st.attrs, tensors, st.family)
    row = st.row
    if row.alibi is not None:  # the rows' slope readers call transformers; these do not
        row = _replace_alibi(row, st.family)
    try:
        return read(row, probe)
    except AttnzooError:
        raise
    except (AttributeError, KeyError, IndexError, TypeError, ValueError, ArithmeticError) as e:
        raise HFConversionError(f"{st.kind} config: cannot read layer {st.layer} ({_reason(e)})") from None


def _replace_alibi(row: Row, fam: Family) -> Row:
    slopes = fam.slopes or (lambda h: torch.tensor(alibi_slopes(h), dtype=torch.float32))
    return dataclasses.replace(row, alibi=lambda m, h: slopes(h))


class _Standin:
    """Looks like the family's attention module to `peers.rows.read`: its attributes, `config`, and the
    projections and norms as objects holding `weight` / `bias` tensors."""

    @staticmethod
    def make(row: Row, cfg: ConfigView, attrs: dict, tensors: dict[str, Tensor], fam: Family) -> _Standin:
        cls = type(row.cls, (_Standin,), {})  # messages name the class, as from_hf's do
        obj = cls()
        obj.__dict__.update(attrs)
        obj.config = cfg
        eps = cfg.get("layer_norm_eps", 1e-5) if row.qk_norm_kind == "layer" else cfg.get("rms_norm_eps", 1e-6)
        latent = row.latent.paths if row.latent is not None else ()
        for path in {p for p in (row.q, row.k, row.v, row.qkv, row.out, *row.norms, *latent) if p}:
            w = tensors.get(f"{path}.weight")
            if w is not None:
                node = _Part(w, tensors.get(f"{path}.bias"), float(eps))
            elif f"{path}.norms.0.weight" in tensors:  # a norm per head (StableLM's `.norms`)
                node = _Part(None, None, float(eps))
                count = sum(1 for name in tensors if name.startswith(f"{path}.norms.") and name.endswith(".weight"))
                node.norms = [
                    _Part(tensors[f"{path}.norms.{i}.weight"], tensors.get(f"{path}.norms.{i}.bias"), float(eps))
                    for i in range(count)
                ]
            else:
                continue
            parent = obj
            *parents, last = path.split(".")
            for p in parents:
                parent.__dict__.setdefault(p, _Part(None, None, 0.0))
                parent = parent.__dict__[p]
            parent.__dict__[last] = node
        if row.sinks is not None and row.sinks in tensors:  # a parameter, not a module
            obj.__dict__[row.sinks] = tensors[row.sinks]
        return obj


class _Part:
    def __init__(self, weight: Tensor | None, bias: Tensor | None, eps: float) -> None:
        self.weight, self.bias, self.eps = weight, bias, eps

    @staticmethod
    def of(attrs: dict) -> _Part:
        """An object holding `attrs` as attributes (a module's sizes, for a row's shapes)."""
        part = _Part(None, None, 0.0)
        part.__dict__.update(attrs)
        return part


def spec_from_config(config: Any, layer: int = 0) -> AttentionSpec:
    """The spec of layer `layer`'s attention, from a transformers config object, a dict, or a path to
    config.json (or its folder): the spec `from_hf` gives that layer's module, without building it.

    Layers differ (sliding and global layers, layers without rotary, per-layer rope bases): say which.
    Refusals (a model_type the zoo does not read, a layer out of range, a config value the zoo cannot
    express) raise HFConversionError / ArgumentError naming the field and what to do instead."""
    st = prepare(config, layer)
    meta = {name: torch.empty(shape, device="meta") for name, shape in st.shapes().items()}
    if st.bias:
        meta.update({name: torch.empty(shape, device="meta") for name, shape in st.bias_shapes().items()})
    spec, _ = read_stand(st, meta)
    return spec


__all__ = ["Stand", "config_dict", "prepare", "read_stand", "rope_parameters", "spec_from_config"]
