"""`attnzoo export --checkpoint DIR --whole -o PATH`: a checkpoint's whole model as one graph (decoders), an
encoder-decoder pair (cli/cmd_seq2seq.py) or a sentence encoder's embeddings (cli/cmd_embed.py), with the
checkpoint's tokenizer and chat template copied beside it for `attnzoo generate MODEL.onnx --prompt TEXT`."""

from __future__ import annotations

import argparse
from pathlib import Path

from zoo.files import ensure_writable_parent, write_atomic

from .cmd_generate import tokenizer_beside
from .common import CliError
from .export_cache import default_max_len, generation_config, load_lm


def export_whole(args: argparse.Namespace) -> int:
    """`attnzoo export --checkpoint DIR --whole -o PATH`: the whole model as one graph."""
    from export.lm_export import export_lm

    if args.checkpoint is None or args.name is not None or args.config is not None:
        raise CliError("--whole exports a checkpoint's whole model: give --checkpoint DIR (not NAME or --config)")
    from . import cmd_seq2seq

    if cmd_seq2seq.is_seq2seq_folder(Path(args.checkpoint)):
        return cmd_seq2seq.export_whole(args)
    for flag, given in (
        ("--layer", args.layer is not None),
        ("--weights", args.weights),
        ("--mask", args.mask),
        ("--head-mask", args.head_mask),
        ("--set", bool(args.set)),
    ):
        if given:
            raise CliError(f"{flag} is for one block; --whole exports the whole model (its mask input is built in)")
    from peers.sentence import is_encoder_folder

    if is_encoder_folder(args.checkpoint):  # an encoder or sentence-transformers folder: its embeddings' graph
        from .cmd_embed import export_encoder_whole

        return export_encoder_whole(args)
    ensure_writable_parent(args.output)
    tokenizer = _tokenizer_to_copy(Path(args.checkpoint), Path(args.output))
    model = load_lm(args.checkpoint)
    max_len = args.max_len
    if max_len is None:
        max_len = default_max_len(Path(args.checkpoint), model, args.lowering, args.target, args.dtype)
    result = export_lm(
        model,
        args.output,
        cache=args.cache,
        max_len=max_len,
        precision=args.precision,
        kv_precision=args.kv_precision,
        padding=args.padding,
        lowering=args.lowering,
        provider=args.target,
        dtype=args.dtype,
        overwrite=args.force,
        label=args.checkpoint,
        generation_config=generation_config(Path(args.checkpoint)),
    )
    print(result.summary())
    if tokenizer is not None:
        src, dst = tokenizer
        write_atomic(dst, lambda tmp: tmp.write_bytes(src))
        print(f"tokenizer: {Path(args.checkpoint) / 'tokenizer.json'} copied to {dst} (generate --prompt reads it)")
        for name in ("tokenizer_config.json", "chat_template.jinja"):  # the chat template (generate --chat)
            if (Path(args.checkpoint) / name).is_file():
                data = (Path(args.checkpoint) / name).read_bytes()
                write_atomic(dst.with_name(Path(args.output).stem + "." + name), lambda tmp, d=data: tmp.write_bytes(d))
    return 0


def _tokenizer_to_copy(checkpoint: Path, onnx_path: Path) -> tuple[bytes, Path] | None:
    """(the checkpoint's tokenizer.json, where its export's copy goes), checked before the export so that
    nothing fails after it; None where the checkpoint has none or the export goes to a device or pipe.
    The copy is the export's own (MODEL.tokenizer.json), replaced as the export is."""
    from zoo.files import is_special, resolve_output

    src = checkpoint / "tokenizer.json"
    if not src.is_file() or is_special(resolve_output(onnx_path)):
        return None
    dst = tokenizer_beside(onnx_path)
    resolve_output(dst)  # a folder there (or a link to one): refused now, in one line
    try:
        raw = src.read_bytes()
    except OSError as e:
        raise CliError(f"cannot read {src}: {e.strerror or e}") from None
    from tokenizers import Tokenizer

    try:  # read now, as generate --prompt will: a malformed file is refused before the export, not after it
        Tokenizer.from_str(raw.decode("utf-8"))
    except Exception as e:  # noqa: BLE001 - the tokenizers library raises its own exception type (and UnicodeError)
        why = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise CliError(
            f"{src} is not a tokenizer the tokenizers library reads ({why}); fix or remove it before exporting"
        ) from None
    return raw, dst
