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
    all_logits: bool = False,
) -> Path:
    """An .onnx path as given; a checkpoint folder exported whole (fp32 weights, once: export_cache.exported),
    for `provider` in `dtype` (for CUDA in float16 or bfloat16 a packed-rows export, which continuous batching
    runs on the device: serve/generate/packed.py), a model continuous batching cannot serve refused before its
    export; or a zoo name exported with the mask input (so batches can pad; for a decode model, the key_mask).
    all_logits: a folder's export returns the logits of every position (a speculating server's target)."""
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

        return exported(target, "fp32", None, check, target=folder_target(provider), dtype=dtype, all_logits=all_logits)
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


def auth_header(api_key: str | None, flag: str | None) -> str:
    """The curl header of `serve`'s example lines, so that they work as printed: none without a key; the key
    itself where --api-key gave it (the shell that runs the curls has no ATTNZOO_API_KEY then; the key is on the
    command line already); $ATTNZOO_API_KEY where the server read the key from that variable."""
    import shlex

    if not api_key:
        return ""
    if flag:
        return f"-H {shlex.quote(f'Authorization: Bearer {api_key}')} "
    return '-H "Authorization: Bearer $ATTNZOO_API_KEY" '


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


def serve_speculation(args):
    """--prompt-lookup K [--ngram N] or --draft FOLDER|MODEL.onnx [--draft-tokens K]: serve.generate.speculating's
    ServeSpeculation (a draft folder exported once, as the target is; its files travel to the replicas), or None.
    Refused before any export where it cannot run: a CUDA export takes packed rows, which speculation does not."""
    from .generate_flags import speculates

    if not speculates(args):
        for flag, value in (("--ngram", args.ngram), ("--draft-tokens", args.draft_tokens)):
            if value is not None:
                raise CliError(f"{flag} sizes speculative decoding: give --prompt-lookup K or --draft FOLDER with it")
        return None
    if folder_target(args.provider) == "cuda":
        raise CliError(
            "--prompt-lookup / --draft verify each row's candidates on a left-padded export, which --provider cuda "
            "does not serve (its exports take packed rows); serve with --provider cpu"
        )
    from serve.generate.speculating import ServeSpeculation
    from serve.replica import model_files

    files = None
    if args.draft is not None:
        from .generate_sources import source_path, whole_model

        draft = source_path(args.draft)
        if draft.is_dir():
            from .export_cache import checkpoint_config, exported

            checkpoint_config(str(draft))  # is it a checkpoint at all
            draft = exported(str(draft), "fp32", None, target="cpu", dtype=args.dtype)
        else:
            whole_model(draft)
        files = model_files(draft)
    return ServeSpeculation(args.prompt_lookup, args.ngram, files, args.draft_tokens)


__all__ = ["auth_header", "capacity_line", "folder_target", "model_path", "serve_speculation", "served_facts"]
