"""The trained models by name: their task, data, metric, training recipe.

Each task gives the same handful of things, so importance, pruning and the ablation
experiments are written once: fresh batches from a seed, a differentiable held-out loss
under a head_mask (layers h), a metric, and the training loop and the seeds live in `training.py`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import dates
from .errors import AnalysisError
from .lm import LMConfig, TinyLM
from .names import TASK_NAMES

__all__ = [
    "GATES",
    "TASKS",
    "DatesTask",
    "InductionTask",
    "Task",
    "get_task",
    "repeated_block",
    "repeated_span_batch",
    "second_copy_loss",
]


# -- induction data ------------------------------------------------------------------------------


def repeated_span_batch(gen: torch.Generator, n: int, vocab: int, t: int, min_span: int = 4) -> Tensor:
    """(n t): a random prefix, then a random block of L tokens repeated to the end.

    L is drawn from [min_span, t // 2] and the prefix length from [0, t - 2L] for every
    sequence: with one fixed period a single positional head would solve the task, and a
    1-layer control would look like an induction model.
    """
    tokens = torch.randint(vocab, (n, t), generator=gen)
    for i in range(n):
        span = int(torch.randint(min_span, t // 2 + 1, (1,), generator=gen))
        start = int(torch.randint(0, t - 2 * span + 1, (1,), generator=gen))
        block = tokens[i, start : start + span].clone()
        reps = (t - start + span - 1) // span
        tokens[i, start:] = block.repeat(reps)[: t - start]
    return tokens


def repeated_block(gen: torch.Generator, n: int, vocab: int, span: int) -> Tensor:
    """(n 2*span): a random block of `span` tokens, then the same block again (the TL/ARENA recipe)."""
    block = torch.randint(vocab, (n, span), generator=gen)
    return torch.cat([block, block], dim=1)


def second_copy_loss(logits: Tensor, tokens: Tensor, span: int) -> tuple[Tensor, Tensor]:
    """Mean loss and accuracy of predicting the second copy's tokens 2..span from the positions
    before them (the first token of the copy is not predictable, so it is left out).

    logits (b 2*span vocab), tokens (b 2*span).
    """
    pred = logits[:, span : 2 * span - 1]
    target = tokens[:, span + 1 : 2 * span]
    loss = F.cross_entropy(pred.reshape(-1, pred.shape[-1]), target.reshape(-1))
    acc = (pred.argmax(-1) == target).float().mean()
    return loss, acc


# -- the task interface ----------------------------------------------------------------------------


@dataclass
class Task:
    name: str
    description: str
    config: Any  # LMConfig or DatesConfig
    steps: int
    lr: float = 1e-3
    batch: int = 64
    metric_name: str = "accuracy"
    loss_name: str = "loss"
    procedure: str = ""
    # Per-head gates during training (analysis.gates): kind "none", "l1" or "l0"; the penalty
    # weight per open head (in nats of the mean training loss); the fraction of the steps after
    # which the gates switch on (heads train ungated before); the gates' own constant learning rate.
    gate: str = "none"
    gate_lambda: float = 0.0
    gate_from: float = 0.0
    gate_lr: float = 0.02
    threads: int = 1  # torch threads while training: fixed, the weights depend on it
    pos_lr: float = 1.0  # learning-rate multiplier of the per-head position biases (positions="relative")
    extra: dict[str, Any] = field(default_factory=dict)

    # Set per kind below.
    def build(self, config: Any = None) -> nn.Module:
        raise NotImplementedError

    def train_batch(self, gen: torch.Generator) -> Any:
        raise NotImplementedError

    def eval_batch(self, gen: torch.Generator, n: int) -> Any:
        raise NotImplementedError

    def train_loss(self, model: nn.Module, batch: Any, head_mask: Any = None) -> Tensor:
        raise NotImplementedError

    def eval_loss(self, model: nn.Module, batch: Any, head_mask: Any = None) -> Tensor:
        """The held-out loss, differentiable with respect to head_mask."""
        raise NotImplementedError

    def metric(self, model: nn.Module, batch: Any, head_mask: Any = None) -> float:
        raise NotImplementedError

    def config_with(self, heads: tuple[int, ...]) -> Any:
        raise NotImplementedError

    def logits(self, model: nn.Module, batch: Any, head_mask: Any = None) -> Tensor:
        """The model's output on a held-out batch (for comparing zeroing with pruning)."""
        raise NotImplementedError

    def attention_blocks(self, model: nn.Module) -> list[tuple[nn.Module, int, int | None]]:
        """The zoo blocks head_mask acts on, with the (t, s) they see on held-out data."""
        raise NotImplementedError

    def model_flops(self, model: nn.Module) -> int:
        raise NotImplementedError


class InductionTask(Task):
    def build(self, config: Any = None) -> TinyLM:
        return TinyLM(config or self.config)

    @property
    def span(self) -> int:
        return self.config.context // 2

    def train_batch(self, gen: torch.Generator) -> Tensor:
        c = self.config
        return repeated_span_batch(gen, self.batch, c.vocab_size, c.context)

    def eval_batch(self, gen: torch.Generator, n: int) -> Tensor:
        return repeated_block(gen, n, self.config.vocab_size, self.span)

    def train_loss(self, model: TinyLM, batch: Tensor, head_mask: Any = None) -> Tensor:
        logits = model(batch[:, :-1], head_mask=head_mask)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))

    def eval_loss(self, model: TinyLM, batch: Tensor, head_mask: Any = None) -> Tensor:
        return second_copy_loss(model(batch, head_mask=head_mask), batch, self.span)[0]

    def metric(self, model: TinyLM, batch: Tensor, head_mask: Any = None) -> float:
        with torch.no_grad():
            return float(second_copy_loss(model(batch, head_mask=head_mask), batch, self.span)[1])

    def config_with(self, heads: tuple[int, ...]) -> LMConfig:
        return dataclasses.replace(self.config, heads=heads)

    def logits(self, model: TinyLM, batch: Tensor, head_mask: Any = None) -> Tensor:
        return model(batch, head_mask=head_mask)

    def attention_blocks(self, model: TinyLM) -> list[tuple[nn.Module, int, int | None]]:
        return [(block, 2 * self.span, None) for block in model.attn]

    def model_flops(self, model: TinyLM) -> int:
        """Matmul FLOPs of one held-out sequence (b=1, t=2*span): attention (zoo.flops) + unembedding."""
        import zoo

        t, c = 2 * self.span, model.config
        total = sum(zoo.flops(block.spec, 1, t).total for block in model.attn)
        total += 2 * t * c.d_model * c.vocab_size
        if c.mlp:
            total += c.layers * 2 * 2 * t * c.d_model * 4 * c.d_model
        return total


class DatesTask(Task):
    def build(self, config: Any = None) -> dates.DatesModel:
        return dates.DatesModel(config or self.config)

    def _tensors(self, pairs: list[tuple[str, str]]) -> tuple[Tensor, Tensor, list[str]]:
        src = dates.encode_sources([s for s, _ in pairs], self.config.max_source)
        tgt = dates.DatesModel.encode_targets([t for _, t in pairs])
        return src, tgt, [s for s, _ in pairs]

    def train_batch(self, gen: torch.Generator) -> tuple[Tensor, Tensor, list[str]]:
        return self._tensors(dates.sample_dates(gen, self.batch, split="train"))

    def eval_batch(self, gen: torch.Generator, n: int) -> tuple[Tensor, Tensor, list[str]]:
        return self._tensors(dates.sample_dates(gen, n, split="test"))

    def train_loss(self, model: dates.DatesModel, batch, head_mask: Any = None) -> Tensor:
        return self.eval_loss(model, batch, head_mask)

    def eval_loss(self, model: dates.DatesModel, batch, head_mask: Any = None) -> Tensor:
        src, tgt, _ = batch
        logits = model(src, model.shift(tgt), head_mask=head_mask)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1))

    def metric(self, model: dates.DatesModel, batch, head_mask: Any = None) -> float:
        src, tgt, _ = batch
        was = model.training
        model.eval()
        try:
            out = model.generate(src, head_mask)
        finally:
            model.train(was)
        return float((out == tgt).all(dim=1).float().mean())

    def config_with(self, heads: tuple[int, ...]) -> dates.DatesConfig:
        return dataclasses.replace(self.config, cross_heads=heads)

    def logits(self, model: dates.DatesModel, batch, head_mask: Any = None) -> Tensor:
        src, tgt, _ = batch
        return model(src, model.shift(tgt), head_mask=head_mask)

    def attention_blocks(self, model: dates.DatesModel) -> list[tuple[nn.Module, int, int | None]]:
        return [(block, dates.TARGET_LEN, 18) for block in model.dec_cross]

    def model_flops(self, model: dates.DatesModel) -> int:
        """Matmul FLOPs of teacher-forced scoring of one date (s=18, t=10): every zoo block + MLPs."""
        import zoo

        s, t, c = 18, dates.TARGET_LEN, model.config
        total = sum(zoo.flops(b.spec, 1, s).total for b in model.enc_attn)
        total += sum(zoo.flops(b.spec, 1, t).total for b in model.dec_self)
        total += sum(zoo.flops(b.spec, 1, t, s).total for b in model.dec_cross)
        total += c.encoder_layers * 2 * 2 * s * c.d_model * c.d_ff + c.decoder_layers * 2 * 2 * t * c.d_model * c.d_ff
        total += 2 * t * c.d_model * len(dates.VOCAB)
        return total


# The shipped recipe; README "Heads" lists the variants tried (one run each) and what they gave.
# L0 head gates switch on at step 1,500, after the induction phase change (about step 1,000),
# and every open head costs 2 nats of mean training loss: at 1.5 two layer-1 heads stayed open
# and shared the induction job, at 2 one head does it (README "Heads").
GATES = {"gate": "l0", "gate_lambda": 2.0, "gate_from": 0.5, "gate_lr": 0.02}

TASKS: dict[str, Task] = {
    "tiny-induction": InductionTask(
        name="tiny-induction",
        description="2-layer attention-only LM on random tokens with a repeated span",
        config=LMConfig(),
        steps=3000,
        threads=2,
        **GATES,
        metric_name="accuracy (2nd copy)",
        loss_name="loss (2nd copy)",
        procedure="held-out: a random block of 32 tokens from vocab 128, then the same block again; loss and "
        "top-1 accuracy of predicting the second copy's tokens 2..32",
    ),
    "tiny-induction-1layer": InductionTask(
        name="tiny-induction-1layer",
        description="the 1-layer control: same data, budget and optimiser as tiny-induction, no head gates",
        config=LMConfig(layers=1, heads=(4,)),
        steps=3000,
        threads=2,
        # No gates: at tiny-induction's lambda all four heads of a 1-layer model are shut (measured),
        # which would make "no induction head" true for no interesting reason.
        metric_name="accuracy (2nd copy)",
        loss_name="loss (2nd copy)",
        procedure="as tiny-induction",
    ),
    "tiny-induction-shared": InductionTask(
        name="tiny-induction-shared",
        description="2-layer attention-only LM on random tokens with a repeated span, no head gates: "
        "every head stays open and the layer-1 heads share the induction job",
        # d_head 16 (d_model / heads): each head alone matches tokens too coarsely, so the layer-1
        # heads share induction (README "Heads"); no gates, so none is shut. 1 thread: at 2 threads
        # a step stalls whenever another process takes a core; 2,500 steps keep it under 5 minutes.
        config=LMConfig(d_head=16),
        steps=2500,
        threads=1,
        metric_name="accuracy (2nd copy)",
        loss_name="loss (2nd copy)",
        procedure="as tiny-induction",
    ),
    "tiny-dates": DatesTask(
        name="tiny-dates",
        description="encoder-decoder translating dates (3 source formats) to YYYY-MM-DD",
        # One decoder layer whose cross-attention reads first, with one learned query per head
        # (read_first="fixed"), so a head reads one place of the source whatever character is
        # written; one encoder layer that sees its neighbours only (encoder_window=3, |s - s'| <= 2),
        # so a field stays on its own characters and the head that wants the day reads the day's
        # span. L0 head gates from step 900 at 0.3 nats per open head shut the spares. With queries
        # from the previous character ("token", the recipe before) the day head copied whichever
        # field was written (day 0.63, year 0.62; docs/heads.md: the variants tried).
        config=dates.DatesConfig(
            encoder_layers=1, encoder_window=3, decoder_layers=1, cross_heads=(8,), read_first="fixed"
        ),
        steps=1800,
        lr=2e-3,
        gate="l0",
        gate_lambda=0.3,
        gate_from=0.5,
        gate_lr=0.02,
        metric_name="exact match",
        loss_name="loss (teacher-forced)",
        procedure="held-out: dates 1900-2099 whose day number is 7 mod 10 (never trained on), in the three "
        "source formats; greedy decoding, exact match of all 10 characters",
    ),
}

if tuple(TASKS) != TASK_NAMES:  # names.py spells them for the command line's help
    raise ImportError(f"analysis/names.py TASK_NAMES {TASK_NAMES} != analysis/tasks.py TASKS {tuple(TASKS)}")


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise AnalysisError(f"unknown model {name!r}; known: {', '.join(sorted(TASKS))}")
    return TASKS[name]
