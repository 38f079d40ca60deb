"""What `attnzoo generate` reads its model from: SOURCE as a path (a folder, an .onnx, or the shipped model's bare
name; else the closest names), a whole-model export's check, and --draft's session (speculative decoding)."""

from __future__ import annotations

from pathlib import Path

from .common import CliError, refuse_hub_id, shipped_folder
from .export_cache import checkpoint_config, exported


def whole_model(source: Path) -> None:
    """CliError unless `source` is a whole-model export (read from its metadata, without its weights)."""
    from runtime.core import SessionError, onnx_metadata

    try:
        kind = onnx_metadata(source).get("attnzoo.kind")
    except SessionError as e:
        raise CliError(str(e)) from None
    if kind != "lm":
        raise CliError(f"{source} is not a whole-model export; make one: attnzoo export --checkpoint DIR --whole")


def draft_session(args):
    """--draft: a folder (exported as the target is, once) or a whole-model .onnx, opened as the target is."""
    from runtime.session import OnnxSession

    draft = source_path(args.draft)
    if draft.is_dir():
        checkpoint_config(str(draft))  # is it a checkpoint at all
        from runtime.providers import choose

        target = "cuda" if choose(args.provider)[0] else "cpu"
        path = exported(str(draft), args.precision, args.max_len, target=target, dtype=args.dtype)
    else:
        whole_model(draft)
        path = draft
    return OnnxSession(path, provider=args.provider, threads=args.threads, verbose=False)


SHIPPED = Path(__file__).resolve().parent.parent / "models"  # the checkpoints in the box (tiny-stdlib-llama)


def source_path(text: str) -> Path:
    """generate's SOURCE as a path: as given when it exists; a shipped checkpoint's bare name (as `heads` takes
    the tiny models' names) as its folder; else one line naming the closest folders and .onnx files."""
    import difflib

    given = Path(text)
    if given.exists():
        return given
    shipped = shipped_folder(text)
    if shipped is not None:
        return shipped
    refuse_hub_id(text)
    near = {}
    for folder in dict.fromkeys((given.parent, SHIPPED)):
        if folder.is_dir():
            for p in folder.iterdir():
                if (p.is_dir() and (p / "config.json").is_file()) or p.suffix == ".onnx":
                    near.setdefault(p.name, str(p) if folder == given.parent else p.name)  # a bare name: taken above
    close = difflib.get_close_matches(given.name, list(near), n=3, cutoff=0.6)
    hint = f" (closest: {', '.join(near[c] for c in close)})" if close else ""
    raise CliError(f"{text}: no such folder or file{hint}; give a checkpoint folder or a whole-model .onnx")
