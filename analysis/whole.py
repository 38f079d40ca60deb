"""The heads of a whole model (zoo.DecoderLM, e.g. read from a checkpoint by zoo.lm_from_checkpoint),
behind the interface the tiny LMs give head_scores, patch_heads and logit_attribution.

    model = analysis.WholeModel(zoo.lm_from_checkpoint("models/tiny-stdlib-llama"), vocab=strings)
    analysis.head_scores(model, ids)          # {"previous_token": (layers h), "induction": ..., ...}
    analysis.patch_heads(model, clean, corrupt, metric, location="z")

Its heads are the decoder layers' attention, named "L{layer}.{location}" as on the DecoderLM itself;
no head is shut (no training gates). `vocab` gives each token id its text (the tokenizer's decoding of
that id alone), so punctuation and characters can be named; without it token ids stand for themselves.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from zoo.lm import DecoderLM

from .errors import AnalysisError
from .lm import check_token_ids

PUNCTUATION = " ,.:;()[]{}\n"  # the default set the punctuation score reads, where the vocabulary has it


class WholeModel(nn.Module):
    """A DecoderLM seen as the analysis functions see a TinyLM: model(tokens) -> logits (b t vocab)."""

    kind = "lm"
    punctuation = PUNCTUATION

    def __init__(self, lm: DecoderLM, vocab: Sequence[str] | None = None, name: str = "model") -> None:
        super().__init__()
        if not isinstance(lm, DecoderLM):
            raise AnalysisError(f"WholeModel takes a zoo.DecoderLM, got {type(lm).__name__}")
        self.lm = lm.eval()
        self.name = name
        self.heads_per_layer = [layer.attn.spec.heads for layer in lm.layers]
        self.layers = len(self.heads_per_layer)
        self.heads = max(self.heads_per_layer)
        self.vocab_size = lm.spec.vocab
        self.context = lm.spec.max_positions or 1 << 20
        if vocab is not None:
            if len(vocab) != self.vocab_size:
                raise AnalysisError(f"vocab has {len(vocab)} entries for a vocabulary of {self.vocab_size}")
            self.vocab = list(vocab)
        if lm.spec.logit_softcap is not None:
            self.attribution_refusal = "its final logit softcap is not linear in the residual stream"
        elif lm.norm is None:
            self.attribution_refusal = "it has no final norm to linearise"
        else:
            self.attribution_refusal = None
        self.final_norm = lm.norm
        self.unembed = lm.head
        self.logit_scale = lm.spec.logit_scale

    def forward(self, tokens: Tensor) -> Tensor:
        return self.lm(tokens)

    def hook_blocks(self) -> dict[str, nn.Module]:
        return self.lm.hook_blocks()

    def run_with_cache(self, *args, **kwargs):
        return self.lm.run_with_cache(*args, **kwargs)

    def run_with_hooks(self, *args, **kwargs):
        return self.lm.run_with_hooks(*args, **kwargs)

    def shut_heads(self) -> list[list[bool]]:
        return [[False] * n for n in self.heads_per_layer]

    def check_tokens(self, tokens: Tensor) -> Tensor:
        return check_token_ids(tokens, self.vocab_size, self.context)

    @torch.no_grad()
    def attention_maps(self, tokens: Tensor) -> Tensor:
        """(layers b h t t): each layer's pattern; a layer with fewer heads than the widest is NaN-padded."""
        tokens = self.check_tokens(tokens)
        _, cache = self.lm.run_with_cache(tokens, names=[f"L{i}.pattern" for i in range(self.layers)])
        b, t = tokens.shape
        out = torch.full((self.layers, b, self.heads, t, t), torch.nan)
        for i, n in enumerate(self.heads_per_layer):
            out[i, :, :n] = cache[f"L{i}.pattern"].float()
        return out
