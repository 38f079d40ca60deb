"""Which command runs a checkpoint folder's family: `generate` takes decoders and encoder-decoders, `embed`
encoders; a folder given to the other command is pointed at the right one, in one line."""

from __future__ import annotations

from pathlib import Path

from .common import CliError


def _tables():
    from peers.encoder_rows import ENCODER_FAMILIES
    from peers.lm_rows import LM_FAMILIES
    from peers.seq2seq_rows import SEQ2SEQ_FAMILIES

    return LM_FAMILIES, SEQ2SEQ_FAMILIES, ENCODER_FAMILIES


def _kind(data: dict) -> str:
    from peers.config import model_type

    return model_type(data)


def check_generate_family(folder: Path, data: dict) -> None:
    """CliError unless `generate` reads the folder's model_type: an encoder is pointed at `attnzoo embed`, another
    family told the decoder and encoder-decoder families."""
    decoders, pairs, encoders = _tables()
    kind = _kind(data)
    if kind in decoders or kind in pairs:
        return
    if kind in encoders:
        raise CliError(
            f"{folder} holds an encoder (model_type={kind!r}), which makes no text; for its sentence embeddings run "
            f"`attnzoo embed {folder} --text TEXT`"
        )
    raise CliError(
        f"{folder}: model_type={kind!r}: `attnzoo generate` reads decoders ({', '.join(decoders)}) and "
        f"encoder-decoders ({', '.join(pairs)}); encoders ({', '.join(encoders)}) go to `attnzoo embed`"
    )


def check_embed_family(folder: Path, data: dict) -> None:
    """CliError where `embed` is given a decoder or an encoder-decoder (pointed at `attnzoo generate`)."""
    decoders, pairs, encoders = _tables()
    kind = _kind(data)
    if kind in decoders or kind in pairs:
        what = "a decoder" if kind in decoders else "an encoder-decoder"
        raise CliError(
            f"{folder} holds {what} (model_type={kind!r}); `attnzoo embed` reads encoders ({', '.join(encoders)}); "
            f"to generate text from it run `attnzoo generate {folder} --prompt TEXT`"
        )


__all__ = ["check_embed_family", "check_generate_family"]
