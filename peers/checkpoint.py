"""`from_checkpoint(folder, layer)`: one layer's attention block, its weights read straight from the
checkpoint's safetensors files (one file, or shards with `model.safetensors.index.json`), without
transformers and without building the model. Only the shards holding that layer's tensors are opened.

Every tensor is found, typed and shaped against the config before anything is built; a refusal is
one `CheckpointError` line naming the file and the tensor. Nothing is half-loaded: the block is a
fresh module, filled only after every check has passed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from zoo import MultiHeadAttention
from zoo.errors import CheckpointError, InputTypeError
from zoo.heads import build

from .config import Stand, prepare, read_stand

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}


def _dtype(dtype: Any) -> torch.dtype | None:
    if dtype is None or dtype in FLOATS:
        return dtype
    if isinstance(dtype, str) and dtype in _DTYPES:
        return _DTYPES[dtype]
    raise InputTypeError(f"dtype must be None (the checkpoint's) or one of {sorted(_DTYPES)}, got {dtype!r}")


def _files(folder: Path) -> tuple[dict[str, str] | None, list[str]]:
    """(index weight_map or None, the safetensors files to list when there is no index)."""
    index = folder / INDEX
    if index.is_file():
        try:
            data = json.loads(index.read_text(encoding="utf-8"))
            weight_map = data["weight_map"]
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as e:
            raise CheckpointError(f"{index}: not a safetensors index ({type(e).__name__}: {e})") from None
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{index}: not a safetensors index (TypeError: weight_map is not an object)")
        weight_map = {str(k): str(v) for k, v in weight_map.items()}
        for name, shard in weight_map.items():  # every name, before any file is opened
            why = _outside(shard)
            if why:
                raise CheckpointError(
                    f"{index}: shard {shard!r} (holding {name!r}) {why}; an index names safetensors files inside "
                    f"its checkpoint folder"
                )
        return weight_map, []
    if (folder / SINGLE).is_file():
        return None, [SINGLE]
    found = sorted(p.name for p in folder.glob("*.safetensors"))
    if not found:
        raise CheckpointError(
            f"{folder}: no {SINGLE}, {INDEX} or *.safetensors file; from_checkpoint reads safetensors checkpoints "
            f"(save_pretrained writes them)"
        )
    return None, found


def _outside(shard: str) -> str | None:
    """Why a shard name in the index leaves the checkpoint folder (or cannot be a file name), or None.

    The name is judged as written, not where it leads: a symlink inside the folder (a hub cache's
    snapshot links into its blobs folder) is a shard of the folder."""
    if not shard or "\x00" in shard:
        return "is not a file name"
    if os.path.isabs(shard) or shard.startswith(("/", "\\")) or Path(shard).drive:
        return "is an absolute path, outside the checkpoint folder"
    depth = 0
    for part in shard.replace("\\", "/").split("/"):
        depth += -1 if part == ".." else 0 if part in ("", ".") else 1
        if depth < 0:
            return "resolves outside the checkpoint folder"
    return None


def _open(folder: Path, name: str):  # noqa: ANN202 - safetensors' handle
    from safetensors import safe_open

    path = folder / name
    if not path.is_file():
        raise CheckpointError(f"{path}: listed in {INDEX} but missing")
    try:
        return safe_open(str(path), framework="pt")
    except Exception as e:  # noqa: BLE001 - safetensors raises its own error types, all of them mean "unreadable"
        raise CheckpointError(f"{path}: not a readable safetensors file ({_short(e)})") from None


def _short(e: Exception) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__


class _Names:
    """Which file holds which tensor name, opening only the files it must."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.map, files = _files(folder)
        self.handles: dict[str, Any] = {}
        if self.map is None:
            self.map = {}
            for f in files:
                for key in self.handle(f).keys():
                    self.map.setdefault(key, f)
        self.where = ", ".join(sorted(set(self.map.values()))) or "(no tensors)"

    def handle(self, file: str):  # noqa: ANN201
        if file not in self.handles:
            self.handles[file] = _open(self.folder, file)
        return self.handles[file]

    def tensor(self, name: str) -> Tensor:
        file = self.map[name]
        handle = self.handle(file)
        if name not in handle.keys():
            raise CheckpointError(f"{self.folder / file}: no tensor {name!r}, though {INDEX} says it is there")
        try:
            return handle.get_tensor(name)
        except Exception as e:  # noqa: BLE001 - a truncated or corrupt file
            raise CheckpointError(f"{self.folder / file}: cannot read tensor {name!r} ({_short(e)})") from None


def _prefix(st: Stand, names: _Names, folder: Path) -> str:
    """The name prefix of layer N's attention: the family's path, under whatever the model saved it
    (`model.`, `transformer.` or nothing for a base model)."""
    where = st.family.where.format(layer=st.layer)
    heads = set()
    for rel in st.shapes():
        suffix = f"{where}.{rel}"
        for name in names.map:
            if name.endswith(suffix) and (name == suffix or name[: -len(suffix)].endswith(".")):
                heads.add(name[: -len(suffix)])
    if not heads:
        first = next(iter(st.shapes()))
        raise CheckpointError(
            f"{folder}: no tensor named '[...]{where}.{first}' in {names.where} (layer {st.layer} of a "
            f"{st.kind} checkpoint, {st.row.cls}); a missing tensor or a config of another model"
        )
    text = {h for h in heads if "language_model" in h or "text_model" in h}
    if len(heads) > 1 and len(text) == 1:  # a multimodal model: the text stack's layer N
        heads = text
    if len(heads) > 1:
        raise CheckpointError(
            f"{folder}: layer {st.layer}'s attention appears under several prefixes ({sorted(heads)}); "
            f"from_checkpoint reads single-stack checkpoints"
        )
    return heads.pop() + where + "."


def _describe(st: Stand) -> str:
    return f"hidden_size={st.c}, heads={st.h}, kv_heads={st.g}, head_dim={st.d}"


def load_tensors(folder: str | os.PathLike, st: Stand, names: _Names | None = None) -> dict[str, Tensor]:
    """The layer's tensors, each found, floating and shaped as the config says; relative names.
    `names`: the folder's index, opened once by a caller reading many layers."""
    folder = Path(folder)
    names = names or _Names(folder)
    prefix = _prefix(st, names, folder)
    out: dict[str, Tensor] = {}
    for rel, shape in st.shapes().items():
        full = prefix + rel
        if full not in names.map:
            raise CheckpointError(
                f"{folder}: tensor {full!r} is missing (looked in {names.where}); "
                f"{st.row.cls} layer {st.layer} needs it"
            )
        out[rel] = _checked(names, full, shape, st)
    biases = {rel: shape for rel, shape in st.bias_shapes().items() if prefix + rel in names.map}
    if biases and not st.bias:
        rel = next(iter(biases))
        raise CheckpointError(
            f"{folder / names.map[prefix + rel]}: holds {prefix + rel!r} but the config says the projections have "
            f"no bias ({st.family.bias}={st.cfg.get(st.family.bias) if isinstance(st.family.bias, str) else False}): "
            f"the config does not match the weights"
        )
    if st.bias and not biases:
        raise CheckpointError(
            f"{folder}: the config says the projections have biases ({st.family.bias}) but no "
            f"'{prefix}*.bias' tensor is in {names.where}: the config does not match the weights"
        )
    for rel, shape in biases.items():
        out[rel] = _checked(names, prefix + rel, shape, st)
    return out


def _checked(names: _Names, full: str, shape: tuple[int, ...], st: Stand) -> Tensor:
    t = names.tensor(full)
    file = names.folder / names.map[full]
    if t.dtype not in FLOATS:  # (checked first: isfinite below needs a float tensor)
        raise CheckpointError(
            f"{file}: {full!r} is {str(t.dtype).removeprefix('torch.')}; the block holds float weights "
            f"(float32/float16/bfloat16/float64) — quantized checkpoints are not read"
        )
    if tuple(t.shape) != tuple(shape):
        raise CheckpointError(
            f"{file}: {full!r} has shape {tuple(t.shape)}, the config implies {tuple(shape)} ({_describe(st)}): "
            f"the config does not match the weights"
        )
    finite = torch.isfinite(t)
    if not bool(finite.all()):
        nan, bad = int(torch.isnan(t).sum()), int((~finite).sum())
        what = " and ".join(f"{n} {kind}" for n, kind in ((nan, "NaN"), (bad - nan, "inf")) if n)
        first = tuple((~finite).nonzero()[0].tolist())
        raise CheckpointError(
            f"{file}: {full!r} holds {what} (the first at index {first}); the block needs finite weights: "
            f"the checkpoint is damaged or was saved after training diverged"
        )
    return t


def from_checkpoint(folder: str | os.PathLike, layer: int = 0, dtype: Any = None) -> MultiHeadAttention:
    """The zoo block of layer `layer`'s attention in a transformers checkpoint folder (config.json plus
    model.safetensors, or shards with model.safetensors.index.json), its weights read from the files.

    The block computes what `zoo.from_hf` of that layer's module computes (eval mode). `dtype`: None
    keeps the checkpoint's float dtype; "float32" etc. converts. Needs `safetensors`, not transformers.
    Refusals raise CheckpointError (a missing file or tensor, a wrong shape or dtype, a config that does
    not match the weights, a corrupt file), HFConversionError (a config the zoo cannot express)."""
    want = _dtype(dtype)
    path = check_folder(folder)
    st = prepare(path / "config.json", layer)
    tensors = load_tensors(path, st)
    target = want or tensors[f"{st.row.out}.weight"].dtype
    tensors = {k: v.to(target) for k, v in tensors.items()}
    spec, p = read_stand(st, tensors)
    if p.alibi_slopes is not None:
        p.alibi_slopes = p.alibi_slopes.to(target)
    return build(spec, p).eval()


def check_folder(folder: Any) -> Path:
    """A checkpoint folder holding config.json, with safetensors importable; CheckpointError otherwise."""
    if not isinstance(folder, (str, os.PathLike)):
        raise InputTypeError(f"folder must be a path to a checkpoint folder, got {type(folder).__name__}")
    path = Path(folder)
    if path.is_file():
        raise CheckpointError(
            f"{folder}: a file; give the checkpoint folder that holds config.json and *.safetensors "
            f"({path.parent}), not a file in it"
        )
    if not path.is_dir():
        raise CheckpointError(f"{folder}: no such folder; give a checkpoint folder (config.json + *.safetensors)")
    if not (path / "config.json").is_file():
        raise CheckpointError(f"{folder}: no config.json; a checkpoint folder holds config.json and *.safetensors")
    try:
        import safetensors  # noqa: F401
    except ImportError:
        raise CheckpointError("from_checkpoint needs the safetensors package: pip install safetensors") from None
    return path


__all__ = ["CheckpointError", "from_checkpoint"]
