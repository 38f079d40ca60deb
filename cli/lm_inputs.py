"""A language model's inputs on the command line: --tokens ids, and the --clean / --corrupt pair of
`attnzoo patch` (the tiny LMs' ASCII characters, or a checkpoint's tokenizer)."""

from __future__ import annotations

import argparse
import re
from typing import TYPE_CHECKING

from .common import CliError

if TYPE_CHECKING:
    import torch


def token_ids(model, text: str) -> torch.Tensor:
    """--tokens: ids separated by commas or spaces -> (1 t), each within the model's vocabulary."""
    import torch

    from analysis import AnalysisError

    parts = [p for p in re.split(r"[,\s]+", text.strip()) if p]
    if not parts:
        raise AnalysisError("--tokens is empty; give ids such as --tokens '5 9 2 5 9 2'")
    try:
        ids = [int(p) for p in parts]
    except ValueError:
        raise AnalysisError(f"--tokens {text!r}: ids must be integers, e.g. '5 9 2'") from None
    bad = [i for i in ids if not 0 <= i < model.vocab_size]
    if bad:  # before torch.tensor, which overflows past 64 bits
        raise AnalysisError(f"--tokens: token {bad[0]} is outside the vocabulary 0..{model.vocab_size - 1}")
    return model.check_tokens(torch.tensor([ids]))


def lm_pair(model, args: argparse.Namespace, encode=None, unit: str = "character"):
    """(clean, corrupt, metric, what) for a language model: --clean and --corrupt, each encoded by
    encode(text, flag) -> (1 t) ids (default: one ASCII character per token), or the induction experiment."""
    from analysis import patching

    if args.clean is None:
        return patching.induction_experiment(model, n=args.n, span=args.span, seed=args.seed)
    if args.corrupt is None:
        raise CliError(f"--clean needs --corrupt for a language model (text of the same length in {unit}s)")
    if encode is None:

        def encode(text: str, flag: str) -> torch.Tensor:
            import torch

            return model.check_tokens(torch.tensor([[ord(ch) for ch in text]]))

    clean, corrupt = encode(args.clean, "--clean"), encode(args.corrupt, "--corrupt")
    if clean.shape != corrupt.shape:
        n, m = clean.shape[1], corrupt.shape[1]
        raise CliError(f"--clean has {n} {unit}s and --corrupt {m}; give the same length")
    differ = (clean != corrupt)[0].nonzero()
    if not len(differ) or int(differ[0]) >= clean.shape[1] - 1:
        raise CliError(
            f"--clean and --corrupt must differ before their last {unit} (the {unit}s after the first difference are "
            f"what is scored): make them differ earlier"
        )
    start = int(differ[0])
    what = f"your text; metric: mean log-probability of the clean next {unit} from position {start} on"
    return clean, corrupt, patching.next_token_metric(clean, start), what
