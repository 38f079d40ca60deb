"""Whole encoders: `encoder_from_checkpoint(folder, dtype=None)` -> zoo.encoder.Encoder.

The family's row (peers/encoder_rows.py) says where each tensor sits and what the config implies; every
tensor is found, typed and shaped against the module it fills (peers.lm._read), and a tensor inside the
model's base that the row does not read is refused (a part the zoo does not model), except the parts the
row names as unread (BERT's pooler, which sentence embeddings never use). Task heads outside the base
(`cls.`, `lm_head.`, `classifier.`) are ignored. safetensors are read directly: no transformers needed.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import Tensor

from zoo.attention_spec import AttentionSpec
from zoo.encoder import Encoder, EncoderSpec
from zoo.errors import AttnzooError, CheckpointError, HFConversionError
from zoo.heads import Projections, build

from .checkpoint import _dtype, _Names, check_folder
from .config import config_dict, model_type
from .encoder_rows import ENCODER_FAMILIES, SIZE_KEYS, EncoderRow
from .lm import _read
from .model_types import ConfigView


def encoder_row(data: dict) -> tuple[str, EncoderRow]:
    """The whole-encoder row of a config dict, or one line saying why there is none."""
    kind = model_type(data)
    if kind not in ENCODER_FAMILIES:
        raise HFConversionError(
            f"model_type={kind!r}: whole encoders are read for {', '.join(ENCODER_FAMILIES)} "
            f"(decoders: zoo.lm_from_checkpoint)"
        )
    return kind, ENCODER_FAMILIES[kind]


def encoder_spec(data: dict) -> tuple[str, EncoderRow, EncoderSpec]:
    """(model_type, row, EncoderSpec) of a config dict; refusals are one HFConversionError line."""
    kind, row = encoder_row(data)
    cfg = ConfigView(data)
    layers_key, width_key = SIZE_KEYS.get(kind, ("num_hidden_layers", "hidden_size"))
    try:
        why = row.refuse(cfg)
        if why:
            raise HFConversionError(f"{kind} config: {why}; this encoder is refused whole")
        d = int(getattr(cfg, width_key))
        attention = tuple(
            AttentionSpec(d_model=d, **row.attention(cfg, i)) for i in range(int(getattr(cfg, layers_key)))
        )
        spec = EncoderSpec(vocab=int(cfg.vocab_size), d_model=d, attention=attention, **row.fields(cfg))
    except HFConversionError:
        raise
    except AttnzooError as e:
        raise HFConversionError(f"{kind} config: {e}") from None
    except (AttributeError, KeyError, TypeError, ValueError, IndexError) as e:
        raise HFConversionError(f"{kind} config: cannot read the encoder ({e}); is it a {kind} config?") from None
    return kind, row, spec


def _base(row: EncoderRow, names: Any, kind: str) -> str:
    suffix = f"{row.tokens}.weight"
    found = {n[: -len(suffix)] for n in names.map if n.endswith(suffix)}
    found = {b for b in found if not b or b.endswith(".")}
    if len(found) != 1:
        what = "no" if not found else f"several ({', '.join(sorted(found))})"
        raise CheckpointError(f"{kind}: {what} token embedding '[...]{suffix}' in {names.where}; an encoder has one")
    return found.pop()


def _projections(
    names: Any, at: str, row: EncoderRow, spec: AttentionSpec, kind: str, target: torch.dtype
) -> Projections:
    d, hd = spec.d_model, spec.heads * spec.d_k_
    names_ = [at + n for n in row.attn]
    if len(names_) == 2:  # [Q | K | V] along the rows (ModernBERT's Wqkv)
        w = _read(names, f"{names_[0]}.weight", None, (3 * hd, d), kind).chunk(3)
        b = _read(names, f"{names_[0]}.bias", None, (3 * hd,), kind).chunk(3) if spec.bias else (None,) * 3
    else:
        w = [_read(names, f"{n}.weight", None, (hd, d), kind) for n in names_[:3]]
        b = [_read(names, f"{n}.bias", None, (hd,), kind) if spec.bias else None for n in names_[:3]]
    out = names_[-1]
    b_o = _read(names, f"{out}.bias", None, (d,), kind) if spec.bias else None
    w_o = _read(names, f"{out}.weight", None, (d, hd), kind)
    parts = [w[0], w[1], w[2], w_o, b[0], b[1], b[2], b_o]
    return Projections(*(t.to(target) if isinstance(t, Tensor) else None for t in parts))


def _plan(row: EncoderRow, enc: Encoder, base: str) -> dict[str, tuple[str, str | None]]:
    """Encoder parameter (all but attention) -> (tensor name, how: None, 'gate', 'up')."""
    plan: dict[str, tuple[str, str | None]] = {}

    def add(param: str, module: Any, name: str | None, how: str | None = None) -> None:
        if module is None or name is None:
            return
        for p_name, _ in module.named_parameters(recurse=False):
            plan[f"{param}.{p_name}"] = (f"{base}{name}.{p_name}", how if p_name == "weight" else None)

    add("tokens", enc.tokens, row.tokens)
    add("positions", enc.positions, row.positions)
    add("token_types", enc.token_types, row.token_types)
    add("embed_norm", enc.embed_norm, row.embed_norm)
    for i, layer in enumerate(enc.layers):
        at = row.layer.format(layer=i) + "."
        add(f"layers.{i}.attn_norm", layer.attn_norm, at + row.norms[0] if row.norms[0] else None)
        add(f"layers.{i}.mlp_norm", layer.mlp_norm, at + row.norms[1])
        up, down = row.mlp
        if layer.mlp.gate is not None:  # one tensor [act input | gate] -> the zoo's gate (activated) and up
            for half, zoo_part in (("gate", "gate"), ("up", "up")):
                for p_name, _ in getattr(layer.mlp, zoo_part).named_parameters():
                    plan[f"layers.{i}.mlp.{zoo_part}.{p_name}"] = (f"{base}{at}{up}.{p_name}", half)
        else:
            add(f"layers.{i}.mlp.up", layer.mlp.up, at + up)
        add(f"layers.{i}.mlp.down", layer.mlp.down, at + down)
    add("final_norm", enc.final_norm, row.final_norm)
    return plan


def encoder_from_checkpoint(folder: str | os.PathLike, dtype: Any = None) -> Encoder:
    """The encoder in a transformers checkpoint folder (config.json + safetensors; a sentence-transformers
    folder's root) as a zoo Encoder of zoo blocks: encoder(input_ids, attention_mask, token_type_ids) is the
    last hidden state (b t c), as transformers' AutoModel gives it. `dtype`: None keeps the checkpoint's.
    Refusals: CheckpointError (files, tensors, shapes) and HFConversionError (a model_type without a row,
    a configuration its row refuses)."""
    want = _dtype(dtype)
    path = check_folder(folder)
    kind, row, spec = encoder_spec(config_dict(path / "config.json"))
    names = _Names(path)
    base = _base(row, names, kind)
    enc = Encoder(spec)
    plan = _plan(row, enc, base)
    params = dict(enc.named_parameters())
    first = names.tensor(base + row.tokens + ".weight")
    target = want or first.dtype
    with torch.no_grad():
        for param, (name, how) in plan.items():
            params[param].copy_(_read(names, name, how, tuple(params[param].shape), kind))
        enc = enc.to(target)
        for i, a in enumerate(spec.attention):
            p = _projections(names, base + row.layer.format(layer=i) + ".", row, a, kind, target)
            enc.layers[i].attn = build(a, p).eval()
    used = {name for name, _ in plan.values()}
    for i in range(spec.layers):
        at = base + row.layer.format(layer=i) + "."
        used |= {f"{at}{n}.{w}" for n in row.attn for w in ("weight", "bias")}
    skip = tuple(base + u for u in row.unread)
    for name in names.map:
        if name.startswith(base) and name not in used and not name.startswith(skip):
            if name.endswith("position_ids"):  # a buffer older transformers saved; not a weight
                continue
            if base == "" and not any(name.startswith(p) for p in _prefixes(row)):
                continue  # a task head beside a base saved without prefix
            raise CheckpointError(
                f"{kind}: {names.where} holds {name!r}, which the zoo's {kind} encoder does not read: a part it "
                f"does not model (or a config of another model)"
            )
    return enc.eval()


def _prefixes(row: EncoderRow) -> tuple[str, ...]:
    """The top-level names a base without prefix holds (its embeddings, layers, final norm)."""
    tops = {row.tokens.split(".")[0], row.layer.split(".")[0]}
    if row.final_norm:
        tops.add(row.final_norm.split(".")[0])
    return tuple(f"{t}." for t in sorted(tops))


__all__ = ["encoder_from_checkpoint", "encoder_row", "encoder_spec"]
