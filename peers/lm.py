"""Whole decoder models: `lm_from_checkpoint(folder, dtype=None)` and `lm_from_hf(model)` -> zoo.lm.DecoderLM.

Each layer's attention is read exactly as one block is (peers/config.py's `prepare`/`read_stand` and
peers/checkpoint.py's tensor checks for a checkpoint; peers/transformers.py's `from_hf` for a live model);
the rest of the model comes from the family's whole-model row (peers/lm_rows.py): the embeddings, norms,
MLPs, residual arrangement, final norm and head. Every tensor is found, typed and shaped against the
module it fills, and a checkpoint tensor the row does not read is refused (it would be a part the zoo
does not model). A model_type without a row, or a configuration its row refuses, is one line.

lm_from_checkpoint reads safetensors directly (one file or shards) and needs no transformers.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import Tensor, nn

from zoo.errors import AttnzooError, CheckpointError, HFConversionError, HFTypeError
from zoo.heads import build
from zoo.lm import DecoderLM, LMSpec

from .checkpoint import FLOATS, _dtype, _Names, check_folder, load_tensors
from .config import config_dict, family_of, model_type, prepare, read_stand
from .lm_rows import LM_FAMILIES, LMRow
from .model_types import ConfigView


def lm_row(data: dict, error: type[HFConversionError] = HFConversionError) -> tuple[str, LMRow]:
    """The whole-model row of a config dict, or one line saying why there is none."""
    kind = model_type(data)
    if kind not in LM_FAMILIES:
        raise error(
            f"model_type={kind!r}: whole models are read for {', '.join(LM_FAMILIES)}; "
            f"for another family read its attention blocks (zoo.from_checkpoint / zoo.from_hf)"
        )
    return kind, LM_FAMILIES[kind]


def _fields(kind: str, row: LMRow, cfg: ConfigView, error: type[HFConversionError]) -> dict:
    try:  # a refusal reads the config as the fields do: a key missing there is the same one line
        why = row.refuse(cfg)
        fields = None if why else row.fields(cfg)
    except AttnzooError as e:
        raise error(f"{kind} config: {e}") from None
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        raise error(f"{kind} config: cannot read the whole model ({e}); is it a {kind} config?") from None
    if why:
        raise error(f"{kind} config: {why}; this model is refused whole (its attention blocks still read)")
    return fields


class _StateDict:
    """A live model's state_dict with _Names' interface (map, tensor, where)."""

    def __init__(self, sd: dict[str, Tensor]) -> None:
        self.sd = sd
        self.map = dict.fromkeys(sd, "the model's state_dict")
        self.where = "the model's state_dict"

    def tensor(self, name: str) -> Tensor:
        return self.sd[name].detach()


def _base(row: LMRow, names: Any, kind: str, error: type[HFConversionError]) -> str:
    """The prefix the model saved its body under (`model.`, `transformer.`, or nothing)."""
    suffix = f"{row.embed}.weight"
    found = {n[: -len(suffix)] for n in names.map if n.endswith(suffix)}
    found = {b for b in found if not b or b.endswith(".")}
    text = {b for b in found if "language_model" in b or "text_model" in b}
    if len(found) > 1 and len(text) == 1:
        found = text
    if len(found) != 1:
        raise error(
            f"{kind}: {'no' if not found else 'several'} token embedding '[...]{suffix}' in {names.where}"
            f"{'' if not found else ' (' + ', '.join(sorted(found)) + ')'}; a {kind} model has one"
        )
    return found.pop()


def _head(row: LMRow, names: Any) -> str:
    """The head's name in `names`: the first of the row's names present (the first when none is)."""
    return next((h for h in row.head if f"{h}.weight" in names.map), row.head[0])


def _untied(fields: dict, row: LMRow, names: Any, base: str) -> dict:
    """The row's fields, untied where the config ties the head to the token embedding but `names` holds a head
    of other values (or shape): transformers (5.25, PreTrainedModel.tie_weights) then unties them and reads the
    file's head. An equal head is the embedding, tied (a live tied model's state_dict lists both)."""
    head = f"{_head(row, names)}.weight"
    if not fields.get("tied") or head not in names.map:
        return fields
    embed, found = f"{base}{row.embed}.weight", names.tensor(head)
    if embed in names.map and torch.equal(found, names.tensor(embed)):  # False for another shape
        return fields
    return dict(fields, tied=False)


def _experts(plan: dict, param: str, moe: nn.Module, at: str, saved: str, expert_names, names: Any) -> None:
    """A mixture's tensors: saved per expert (`{saved}.experts.E.<expert_names>`: gate, up, down; `{saved}.gate`:
    the router), or as a live model holds them (`mlp.gate`, `mlp.experts.gate_up_proj` (E 2f c),
    `mlp.experts.down_proj` (E c f))."""
    fused = f"{at}mlp.experts.gate_up_proj"
    if fused in names.map:
        plan[f"{param}.router.weight"] = (f"{at}mlp.gate.weight", None)
        for e in range(len(moe.experts)):
            plan[f"{param}.experts.{e}.gate.weight"] = (fused, ("expert", e, "gate"))
            plan[f"{param}.experts.{e}.up.weight"] = (fused, ("expert", e, "up"))
            plan[f"{param}.experts.{e}.down.weight"] = (f"{at}mlp.experts.down_proj", ("expert", e, None))
    else:
        plan[f"{param}.router.weight"] = (f"{at}{saved}.gate.weight", None)
        for e in range(len(moe.experts)):
            for part, w in zip(("gate", "up", "down"), expert_names):
                plan[f"{param}.experts.{e}.{part}.weight"] = (f"{at}{saved}.experts.{e}.{w}.weight", None)
    if moe.shared is not None:  # saved and live alike
        for part, w in zip(("gate", "up", "down"), ("gate_proj", "up_proj", "down_proj")):
            plan[f"{param}.shared.{part}.weight"] = (f"{at}mlp.shared_expert.{w}.weight", None)
        plan[f"{param}.shared_gate.weight"] = (f"{at}mlp.shared_expert_gate.weight", None)


def _plan(row: LMRow, cfg: ConfigView, lm: DecoderLM, base: str, head: str, names: Any) -> dict[str, tuple]:
    """param name of the DecoderLM (all but attention) -> (tensor name, how: None, 't', 'gate', 'up')."""
    plan: dict[str, tuple[str, str | None]] = {}

    def add(param: str, module: nn.Module | None, name: str, how: str | None = None) -> None:
        if module is None:
            return
        for p_name, _ in module.named_parameters(recurse=False):
            plan[f"{param}.{p_name}"] = (f"{name}.{p_name}", how if p_name == "weight" else None)

    add("embed.tokens", lm.embed.tokens, base + row.embed)
    if row.positions:
        add("embed.positions", lm.embed.positions, base + row.positions)
    if row.embed_norm:
        add("embed.norm", lm.embed.norm, base + row.embed_norm)
    t = "t" if row.conv1d else None
    for i, layer in enumerate(lm.layers):
        at = base + row.layer.format(layer=i) + "."
        for slot, name in row.norm_names(cfg):
            add(f"layers.{i}.{slot}", getattr(layer, slot), at + name)
        for part, name in row.mlp:
            if part == "experts":
                _experts(plan, f"layers.{i}.mlp", layer.mlp, at, name, row.expert_names, names)
            elif part == "gate_up":  # Phi-3: [gate | up] along the output rows
                for half in ("gate", "up"):
                    for p_name, _ in getattr(layer.mlp, half).named_parameters():
                        plan[f"layers.{i}.mlp.{half}.{p_name}"] = (f"{at}{name}.{p_name}", half)
            else:
                add(f"layers.{i}.mlp.{part}", getattr(layer.mlp, part), at + name, t)
    if row.final_norm:
        add("norm", lm.norm, base + row.final_norm)
    if not lm.spec.tied:
        add("head", lm.head, head)
    elif lm.spec.head_bias:
        plan["head.bias"] = (f"{head}.bias", None)
    return plan


def _read(names: Any, name: str, how: str | tuple | None, shape: tuple[int, ...], kind: str) -> Tensor:
    if name not in names.map:
        raise CheckpointError(f"{kind}: tensor {name!r} is missing (looked in {names.where}); the whole model needs it")
    t = names.tensor(name)
    where = f"{names.where}: {name!r}"
    if t.dtype not in FLOATS:
        raise CheckpointError(f"{where} is {str(t.dtype).removeprefix('torch.')}; whole models hold float weights")
    if isinstance(how, tuple):  # ("expert", e, half): expert e of a fused (E ...) tensor, a half of its rows
        _, e, how = how
        t = t[e] if t.dim() == 3 and e < t.shape[0] else t
    if how == "t" and t.dim() == 2:
        t = t.t()
    elif how in ("gate", "up") and t.shape[0] % 2 == 0:
        t = t.chunk(2, dim=0)[0 if how == "gate" else 1]
    if tuple(t.shape) != tuple(shape):
        raise CheckpointError(f"{where} has shape {tuple(t.shape)}, the config implies {tuple(shape)}")
    if not bool(torch.isfinite(t).all()):
        raise CheckpointError(f"{where} holds NaN or inf; the model needs finite weights")
    return t


def _assemble(
    kind: str, row: LMRow, cfg: ConfigView, blocks: list[nn.Module], names: Any, base: str, wheres: list[str], target
) -> DecoderLM:
    """The DecoderLM of `blocks` (the layers' attention) and the row's other tensors from `names`."""
    fields = _fields(kind, row, cfg, CheckpointError if isinstance(names, _Names) else HFConversionError)
    fields = _untied(fields, row, names, base)
    try:
        attention = tuple(b.spec for b in blocks)
        spec = LMSpec(vocab=int(cfg.vocab_size), d_model=int(cfg.hidden_size), attention=attention, **fields)
    except AttnzooError as e:
        raise HFConversionError(f"{kind} config: {e}") from None
    lm = DecoderLM(spec)
    head = _head(row, names)
    plan = _plan(row, cfg, lm, base, head, names)
    params = dict(lm.named_parameters(remove_duplicate=False))
    with torch.no_grad():
        for param, (name, how) in plan.items():
            params[param].copy_(_read(names, name, how, tuple(params[param].shape), kind))
    for i, block in enumerate(blocks):
        lm.layers[i].attn = block
    used = {name for name, _ in plan.values()}
    skip = {f"{h}.weight" for h in row.head} if spec.tied else set()
    for name in names.map:
        inside = name.startswith(base) or any(name.startswith(f"{h}.") for h in row.head)
        if inside and name not in used and name not in skip and not any(name.startswith(w) for w in wheres):
            raise CheckpointError(
                f"{kind}: {names.where} holds {name!r}, which the zoo's {kind} model does not read: a part it does "
                f"not model (or a config of another model)"
            )
    return lm.to(target).eval()


def lm_from_checkpoint(folder: str | os.PathLike, dtype: Any = None) -> DecoderLM:
    """The whole decoder model in a transformers checkpoint folder (config.json + safetensors, sharded or
    not) as a zoo DecoderLM whose attention layers are zoo blocks; no transformers needed. `dtype`: None
    keeps the checkpoint's float dtype. Refusals: CheckpointError (files, tensors, shapes) and
    HFConversionError (a model_type without a whole-model row, a configuration its row refuses)."""
    want = _dtype(dtype)
    path = check_folder(folder)
    data = config_dict(path / "config.json")
    kind, row = lm_row(data)
    first = prepare(data, 0)
    _fields(kind, row, first.cfg, HFConversionError)  # refusals before any file is opened
    names = _Names(path)
    base = _base(row, names, kind, CheckpointError)
    blocks, wheres, target = [], [], want
    for i in range(int(first.cfg.num_hidden_layers)):
        st = first if i == 0 else prepare(data, i)
        tensors = load_tensors(path, st, names)
        target = target or tensors[f"{st.row.out}.weight"].dtype
        spec, p = read_stand(st, {k: v.to(target) for k, v in tensors.items()})
        if p.alibi_slopes is not None:
            p.alibi_slopes = p.alibi_slopes.to(target)
        blocks.append(build(spec, p).eval())
        wheres.append(base + st.family.where.format(layer=i) + ".")
    return _assemble(kind, row, first.cfg, blocks, names, base, wheres, target)


def lm_from_hf(model: nn.Module) -> DecoderLM:
    """The zoo DecoderLM computing what the transformers causal LM `model` computes (eval mode), weights
    copied; each layer's attention through zoo.from_hf."""
    from .transformers import from_hf

    if not isinstance(model, nn.Module) or not hasattr(model, "config"):
        raise HFTypeError(f"expected a transformers causal LM (a model with a config), got {type(model).__name__}")
    data = config_dict(model.config)
    kind, row = lm_row(data)
    fam = family_of(data)[1]
    first = prepare(data, 0)
    _fields(kind, row, first.cfg, HFConversionError)
    names = _StateDict(model.state_dict())
    base = _base(row, names, kind, HFConversionError)
    blocks, wheres = [], []
    for i in range(int(first.cfg.num_hidden_layers)):
        where = base + fam.where.format(layer=i)
        blocks.append(from_hf(model.get_submodule(where)))
        wheres.append(where + ".")
    target = next(model.parameters()).dtype
    return _assemble(kind, row, first.cfg, blocks, names, base, wheres, target)


__all__ = ["lm_from_checkpoint", "lm_from_hf", "lm_row"]
