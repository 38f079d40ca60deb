"""What `attnzoo serve PATH_OR_NAME` runs: an .onnx as given, a checkpoint folder exported whole for the provider
it will run on, or a zoo name exported with its mask input."""

from __future__ import annotations

from pathlib import Path

import zoo
from export.names import SESSION_DTYPES

from .common import CliError


def folder_target(provider: str) -> str:
    """The provider a folder's export is made for: cuda for --provider cuda (the replicas' GPUs, which may be on
    another machine: --address), what auto finds here, else cpu."""
    if provider == "auto":
        from runtime.providers import cuda_status

        return "cuda" if cuda_status()[0] else "cpu"
    return provider


def model_path(
    target: str,
    overrides: dict,
    lowering: str,
    dtype: str,
    folder: Path,
    decode: bool,
    batching: str,
    provider: str = "cpu",
) -> Path:
    """An .onnx path as given; a checkpoint folder exported whole (fp32 weights, once: export_cache.exported),
    for `provider` in `dtype` (for CUDA in float16 or bfloat16 a packed-rows export, which continuous batching
    runs on the device: serve/generate/packed.py), a model continuous batching cannot serve refused before its
    export; or a zoo name exported with the mask input (so batches can pad; for a decode model, the key_mask)."""
    path = Path(target)
    if path.is_dir():
        if overrides or decode:
            raise CliError("--set and --decode apply to a zoo name, not to a checkpoint folder")
        from peers.sentence import is_encoder_folder

        if is_encoder_folder(path):  # sentence embeddings: POST /v1/embeddings
            from .cmd_embed import exported_encoder

            return exported_encoder(target)
        from runtime.providers import dtype_refusal
        from serve.generate.continuous import check_continuous_layers

        from .export_cache import exported

        why = dtype_refusal(folder_target(provider), dtype)
        if why:
            raise CliError(why)

        def check(model) -> None:
            if batching == "continuous":
                check_continuous_layers(model.spec.attention, target)

        return exported(target, "fp32", None, check, target=folder_target(provider), dtype=dtype)
    if path.suffix == ".onnx" and not path.is_file():
        raise CliError(f"{path}: no such file; give an .onnx export (attnzoo export ... -o {path.name})")
    if path.suffix == ".onnx" or path.exists():
        if overrides or decode:
            raise CliError("--set and --decode apply to a zoo name, not to an .onnx file")
        return path
    if target not in zoo.names():
        raise CliError(f"{target!r} is neither an .onnx file nor a zoo name (see `attnzoo list`)")
    if dtype not in SESSION_DTYPES:
        raise CliError(
            f"--dtype {dtype} is for a checkpoint folder; a zoo name is exported in {' or '.join(SESSION_DTYPES)}"
        )
    from export.writer import export_onnx

    out = folder / f"{target}.onnx"
    result = export_onnx(
        target, out, lowering=lowering, dtype=dtype, with_mask=True, decode=decode, overwrite=True, **overrides
    )
    print(result.summary())
    return out


def served_facts(path: Path) -> tuple[int | str | None, dict[str, str]]:
    """(the block's d_model for the example request, None for a whole-model export, "embed" for a sentence
    encoder; the export's metadata)."""
    from runtime.session import OnnxSession

    sess = OnnxSession(path, provider="cpu", verbose=False)
    if sess.is_lm:
        return None, sess.metadata
    if sess.metadata.get("attnzoo.kind") == "sentence_encoder":
        return "embed", sess.metadata
    return (sess.spec.d_model if sess.spec else "C"), sess.metadata


def capacity_line(metadata: dict[str, str], capacity: int, batching: str) -> str:
    """What one continuously batched request may hold (every /v1 request is), and where --capacity was past the
    export's max_len (the replicas lower it to that)."""
    raw = metadata.get("attnzoo.max_len", "")
    cap = min(capacity, int(raw)) if raw.isdigit() else capacity
    lowered = f"; --capacity {capacity} is past the export's max_len {cap}" if cap < capacity else ""
    where = "every request" if batching == "continuous" else "a /v1 request"
    return f"{where}: prompt + max_tokens - 1 <= {cap} tokens (--capacity{lowered})"


__all__ = ["capacity_line", "folder_target", "model_path", "served_facts"]
