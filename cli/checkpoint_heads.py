"""`attnzoo heads --checkpoint DIR` and `attnzoo patch --checkpoint DIR`: a whole model's heads on text
read with the folder's tokenizer.json."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from .common import CliError
from .lm_inputs import lm_pair, token_ids


def load_whole(folder: str):
    """(analysis.WholeModel, tokenizer or None) for a checkpoint folder, in float32."""
    from analysis import WholeModel

    from .cmd_generate import _tokenizer
    from .export_cache import _checkpoint_folder

    path = _checkpoint_folder(folder)
    from peers.lm import lm_from_checkpoint

    lm = lm_from_checkpoint(path, dtype=torch.float32)
    tok = _tokenizer(path)
    vocab = None if tok is None else [tok.decode([i]) for i in range(lm.spec.vocab)]
    return WholeModel(lm, vocab, name=Path(folder).name or str(folder)), tok


def label(text: str) -> str:
    """A token's text as a picture's axis shows it: whitespace made visible."""
    return text.replace("\n", "\\n").replace("\t", "\\t").replace(" ", "·") or "∅"


def text_ids(model, tok, text: str, flag: str) -> torch.Tensor:
    if tok is None:
        raise CliError(f"{flag} TEXT needs a tokenizer.json in the checkpoint folder; give --tokens ids instead")
    if not text:
        raise CliError(f"{flag} is empty; give some text")
    ids = tok.encode(text).ids
    if not ids:
        raise CliError(f"{flag} {text[:40]!r} has no tokens")
    return model.check_tokens(torch.tensor([ids]))


def whole_tokens(model, tok, args: argparse.Namespace) -> tuple[torch.Tensor, list[str]]:
    """(1 t) tokens and their labels from --text (the tokenizer) or --tokens (ids)."""
    if args.tokens is not None:
        tokens = token_ids(model, args.tokens)
    elif args.text is not None:
        tokens = text_ids(model, tok, args.text, "--text")
    else:
        raise CliError("a checkpoint's heads are read on your input: give --text TEXT (or --tokens ids)")
    vocab = getattr(model, "vocab", None)
    labels = [label(vocab[i]) if vocab else str(i) for i in tokens[0].tolist()]
    return tokens, labels


def clean_corrupt(model, tok, args: argparse.Namespace):
    """(clean, corrupt, metric, what) for `attnzoo patch --checkpoint`: your two texts of one length in
    tokens (read with the folder's tokenizer), or the induction experiment on random tokens."""
    if args.clean is None and args.corrupt is not None:
        raise CliError("--corrupt needs --clean")
    return lm_pair(model, args, encode=lambda text, flag: text_ids(model, tok, text, flag), unit="token")
