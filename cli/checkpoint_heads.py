"""`attnzoo heads --checkpoint DIR` and `attnzoo patch --checkpoint DIR`: a whole model's heads on text
read with the folder's tokenizer.json."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import torch

from .common import CliError


def load_whole(folder: str):
    """(analysis.WholeModel, tokenizer or None) for a checkpoint folder, in float32."""
    from analysis import WholeModel

    from .cmd_generate import _checkpoint_folder, _tokenizer

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
        parts = [p for p in re.split(r"[,\s]+", args.tokens.strip()) if p]
        try:
            ids = [int(p) for p in parts]
        except ValueError:
            raise CliError(f"--tokens {args.tokens!r}: ids must be integers, e.g. '5 9 2'") from None
        if not ids:
            raise CliError("--tokens is empty; give ids such as --tokens '5 9 2 5 9 2'")
        tokens = model.check_tokens(torch.tensor([ids]))
    elif args.text is not None:
        tokens = text_ids(model, tok, args.text, "--text")
    else:
        raise CliError("a checkpoint's heads are read on your input: give --text TEXT (or --tokens ids)")
    vocab = getattr(model, "vocab", None)
    labels = [label(vocab[i]) if vocab else str(i) for i in tokens[0].tolist()]
    return tokens, labels


def clean_corrupt(model, tok, args: argparse.Namespace):
    """(clean, corrupt, metric, what) for `attnzoo patch --checkpoint`: your two texts of one length in
    tokens, or the induction experiment on random tokens."""
    from analysis import patching

    if args.clean is None:
        if args.corrupt is not None:
            raise CliError("--corrupt needs --clean")
        return patching.induction_experiment(model, n=args.n, span=args.span, seed=args.seed)
    if args.corrupt is None:
        raise CliError("--clean needs --corrupt (text of the same length in tokens)")
    clean, corrupt = text_ids(model, tok, args.clean, "--clean"), text_ids(model, tok, args.corrupt, "--corrupt")
    if clean.shape != corrupt.shape:
        raise CliError(f"--clean has {clean.shape[1]} tokens and --corrupt {corrupt.shape[1]}; give the same length")
    differ = (clean != corrupt)[0].nonzero()
    if not len(differ) or int(differ[0]) >= clean.shape[1] - 1:
        raise CliError("--clean and --corrupt must differ before their last token")
    start = int(differ[0])
    what = f"your text; metric: mean log-probability of the clean next token from position {start} on"
    return clean, corrupt, patching.next_token_metric(clean, start), what
