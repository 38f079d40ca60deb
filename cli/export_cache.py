"""A checkpoint folder's whole-model export, made once per (weights, precision, max_len, target provider, dtype,
KV precision, attnzoo version) into the cache folder (ATTNZOO_CACHE, default ~/.cache/attnzoo), so the second
`attnzoo generate` or `serve` of a folder starts at once; and the checks a folder passes first."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import zoo
from zoo.files import weights_file

from .common import CliError


def _checkpoint_folder(folder: str) -> Path:
    path = Path(folder)
    if not path.is_dir():
        raise CliError(f"{folder}: not a folder; give a checkpoint folder (config.json + *.safetensors)")
    if not (path / "config.json").is_file():
        raise CliError(f"{folder} has no config.json; give a transformers checkpoint folder")
    try:
        data = json.loads((path / "config.json").read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise CliError(f"{folder}/config.json is not JSON ({type(e).__name__})") from None
    if not isinstance(data, dict) or not isinstance(data.get("model_type"), str):
        raise CliError(f"{folder}/config.json has no model_type; attnzoo needs it to build the model")
    from peers.lm import lm_row

    lm_row(data)  # an unknown model_type: one line naming the families that take whole models
    return path


def load_lm(folder: str):
    """zoo.lm_from_checkpoint on a checked folder (its refusals, e.g. an unknown model_type, are one line)."""
    from peers.lm import lm_from_checkpoint

    return lm_from_checkpoint(_checkpoint_folder(folder))


def _cache_root() -> Path:
    return Path(os.environ.get("ATTNZOO_CACHE") or Path.home() / ".cache" / "attnzoo")


def _export_key(
    folder: Path,
    precision: str,
    max_len: int | None,
    target: str = "cpu",
    dtype: str = "float32",
    kv_precision: str = "fp32",
    all_logits: bool = False,
) -> str:
    h = hashlib.sha256()
    h.update((folder / "config.json").read_bytes())
    if (folder / "generation_config.json").is_file():
        h.update((folder / "generation_config.json").read_bytes())
    for f in sorted(folder.glob("*.safetensors")):
        st = f.stat()
        h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    cap = max_len if max_len is not None else "stored-tables"  # the default rule (default_max_len)
    # the target and dtype choose the lowering (a CUDA export keeps within its kernels' rules)
    h.update(f"{precision}:{cap}:{target}:{dtype}:{zoo.__version__}".encode())
    if kv_precision != "fp32":  # fp32 keeps the keys exports had before the option
        h.update(f"kv:{kv_precision}".encode())
    if all_logits:  # the logits at every position of a call (speculative decoding verifies k at once)
        h.update(b"all_logits")
    return h.hexdigest()[:20]


def _max_positions(folder: Path) -> int | None:
    """The checkpoint's maximum positions as the model reads its config.json (peers.config: a nested
    text_config, the config class's default where the key is missing); GPT-2's and GPT-J's n_positions."""
    from peers.config import model_type, normalized

    data = json.loads((folder / "config.json").read_text())
    value = data.get("max_position_embeddings")
    if value is None and data.get("n_positions") is not None:
        value = data["n_positions"]
    else:
        value = normalized(model_type(data), data)["max_position_embeddings"]
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def default_max_len(folder: Path, model, lowering: str = "auto", provider: str = "cpu", dtype: str = "float32"):
    """--max-len when none is given: the checkpoint's maximum positions where the export stores its rotary
    tables, else None (export.lm_export.stored_tables_max_len)."""
    from export.lm_export import stored_tables_max_len

    return stored_tables_max_len(model, _max_positions(folder), lowering=lowering, provider=provider, dtype=dtype)


def exported(
    folder: str,
    precision: str,
    max_len: int | None,
    check=None,
    *,
    target: str = "cpu",
    dtype: str = "float32",
    kv_precision: str = "fp32",
    all_logits: bool = False,
) -> Path:
    """The whole-model export of `folder` at `precision` (and `kv_precision` for its cache), for provider
    `target` in `dtype` (all_logits: the logits of every position, as speculative decoding reads them): made
    once, then found in the cache folder. `check(model)`, when given, may refuse the loaded model before its
    export."""
    from export.lm_export import export_lm

    path = _checkpoint_folder(folder)
    key = _export_key(path, precision, max_len, target, dtype, kv_precision, all_logits)
    out = _cache_root() / "lm" / f"{path.resolve().name}-{key}.onnx"
    if out.is_file() and weights_file(out).is_file():  # a graph and its weights (an older export: made again)
        return out
    model = load_lm(folder)
    if check is not None:
        check(model)
    lowering = "auto" if kv_precision == "fp32" else "decomposed"  # the lowering the int8 cache takes
    if max_len is None:
        max_len = default_max_len(path, model, lowering, provider=target, dtype=dtype)
    kv = f", {kv_precision} KV cache" if kv_precision != "fp32" else ""
    print(f"exporting {folder} ({precision}{kv}, for {target}, {dtype}) to {out} (once)")
    export_lm(
        model,
        out,
        precision=precision,
        kv_precision=kv_precision,
        lowering=lowering,
        max_len=max_len,
        provider=target,
        dtype=dtype,
        overwrite=True,
        all_logits=all_logits,
        label=str(folder),
        generation_config=generation_config(path),
    )
    return out


def generation_config(folder: Path) -> dict | None:
    """The checkpoint's generation_config.json (eos ids, sampling defaults), or None."""
    path = folder / "generation_config.json"
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise CliError(f"{path} is not JSON ({type(e).__name__})") from None
    return data if isinstance(data, dict) else None
