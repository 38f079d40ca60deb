"""A checkpoint folder's whole-model export, made once per (config.json, weights, precision, max_len, target
provider, dtype, KV precision, attnzoo version) into the cache folder (ATTNZOO_CACHE, default ~/.cache/attnzoo), so
the second `attnzoo generate` or `serve` of a folder starts at once; and the checks a folder passes first.

The key holds what changes the graph, nothing else: the chat template, the tokenizer and generation_config.json
are read from the folder at run time (a cached export whose recorded generation_config differs from the folder's
gets the folder's in its metadata, without a new export). A cache hit reads no model: no torch is imported."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import zoo
from zoo.files import weights_file

from .common import CliError


def _checkpoint_folder(folder: str) -> Path:
    """The folder, refused in one line where it is no checkpoint of a family whose whole model the zoo reads."""
    path, data = checkpoint_config(folder)
    from peers.lm import lm_row

    lm_row(data)  # an unknown model_type: one line naming the families that take whole models
    return path


def checkpoint_config(folder: str) -> tuple[Path, dict]:
    """(the folder, its config.json) where it is a folder with a config.json naming a model_type (no torch)."""
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
    return path, data


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
    *,
    generation: bool = False,
    all_logits: bool = False,
) -> str:
    """What the export of `folder` depends on: config.json, the weights (names, sizes, times), the options and
    attnzoo's version; with `generation`, generation_config.json too (an encoder-decoder pair records its
    generation settings for its session). A decoder's generation_config.json, chat template and tokenizer are
    read from the folder at run time and stay out of the key."""
    h = hashlib.sha256()
    h.update((folder / "config.json").read_bytes())
    if generation and (folder / "generation_config.json").is_file():
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
    """The checkpoint's maximum positions as the model reads its config.json: its max_position_embeddings (GPT-2's
    and GPT-J's n_positions), else as peers.config reads it (a nested text_config, the config class's default
    where the key is missing; that import takes torch, which the plain key does not)."""
    data = json.loads((folder / "config.json").read_text())
    value = data.get("max_position_embeddings")
    if value is None and data.get("n_positions") is not None:
        value = data["n_positions"]
    elif value is None:
        from peers.config import model_type, normalized

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
    quiet: bool = False,
    all_logits: bool = False,
) -> Path:
    """The whole-model export of `folder` at `precision` (and `kv_precision` for its cache), for provider
    `target` in `dtype` (all_logits: the logits of every position, as speculative decoding reads them): made
    once, then found in the cache folder. `check(model)`, when given, may refuse the loaded model before its
    export. Its stages show as a progress bar on a terminal, unless `quiet`."""
    hit = cached_lm(
        folder, precision, max_len, target=target, dtype=dtype, kv_precision=kv_precision, all_logits=all_logits
    )
    if hit is not None:
        return hit
    path = _checkpoint_folder(folder)
    out = _cached_path(path, precision, max_len, target, dtype, kv_precision, all_logits)
    model = load_lm(folder)
    if check is not None:
        check(model)
    lowering = "auto" if kv_precision == "fp32" else "decomposed"  # the lowering the int8 cache takes
    if max_len is None:
        max_len = default_max_len(path, model, lowering, provider=target, dtype=dtype)
    kv = f", {kv_precision} KV cache" if kv_precision != "fp32" else ""
    print(f"exporting {folder} ({precision}{kv}, for {target}, {dtype}) to {out} (once)")
    from export.lm_export import export_lm

    from .progress import export_bar

    with export_bar(quiet):  # trace, optimize, quantize, save: 30-45 s for a real model
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


def _cached_path(path: Path, precision, max_len, target, dtype, kv_precision, all_logits: bool = False) -> Path:
    key = _export_key(path, precision, max_len, target, dtype, kv_precision, all_logits=all_logits)
    return _cache_root() / "lm" / f"{path.resolve().name}-{key}.onnx"


def cached_lm(
    folder: str | Path,
    precision: str,
    max_len: int | None,
    *,
    target: str = "cpu",
    dtype: str = "float32",
    kv_precision: str = "fp32",
    all_logits: bool = False,
) -> Path | None:
    """`exported`'s answer when the cache holds it (read without the model, so without torch), else None. The
    folder's generation_config.json, where it differs from the one the export recorded, replaces it in the
    graph's metadata (the weights' file stays as it is)."""
    path = checkpoint_config(str(folder))[0]
    out = _cached_path(path, precision, max_len, target, dtype, kv_precision, all_logits)
    if not (out.is_file() and weights_file(out).is_file()):  # a graph and its weights (an older export: made again)
        return None
    _record_generation_config(out, generation_config(path))
    return out


def _record_generation_config(out: Path, config: dict | None) -> None:
    """The graph file's attnzoo.generation_config made `config` (removed for None), written atomically."""
    import onnx

    from zoo.files import write_atomic

    key = "attnzoo.generation_config"
    model = onnx.load(str(out), load_external_data=False)
    props = {p.key: p.value for p in model.metadata_props}
    want = json.dumps(config) if config else None
    if props.get(key) == want:
        return
    kept = [p for p in model.metadata_props if p.key != key]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    if want is not None:
        model.metadata_props.add(key=key, value=want)
    write_atomic(out, lambda tmp: tmp.write_bytes(model.SerializeToString()))


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
