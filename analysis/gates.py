"""Per-head gates for training: each head's output Z^(r) is scaled by a gate at the head_mask location.

Two kinds, both ending folded into W_O (`fold`), so a trained model carries no gates:

- "l1": a gate g in [0, 1] per head, loss + lambda * sum(g). Cheap, but the network can
  shrink g and grow W_O's columns to match, so it barely separates heads.
- "l0": Louizos et al. 2018's hard-concrete gates, as Voita et al. 2019 used on heads:
  g = clamp(sigmoid((log u - log(1-u) + log_alpha) / beta) * (zeta - gamma) + gamma, 0, 1)
  with u ~ U(0, 1), and loss + lambda * sum P(g != 0). The gates are exactly 0 or 1 most of
  the time, so a head is paid for by being open at all, however W_O is scaled: a head that
  only repeats what another head already does is not worth lambda and gets shut.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

import zoo
import zoo.heads

from .errors import AnalysisError

KINDS = ("none", "l1", "l0")

# Louizos et al. 2018's constants (also Voita et al. 2019's).
BETA = 2.0 / 3.0
GAMMA = -0.1
ZETA = 1.1
LOG_ALPHA_INIT = 3.0  # P(open) ~ 0.99 at the start: every head begins in use


class HeadGates(nn.Module):
    """One gate per head of each gated layer: `gates()` -> list of (h,) tensors, `penalty()`."""

    def __init__(self, kind: str, heads: tuple[int, ...], generator: torch.Generator) -> None:
        super().__init__()
        if kind not in KINDS[1:]:
            raise AnalysisError(f"gate kind {kind!r} is not one of {KINDS[1:]}")
        self.kind = kind
        self.generator = generator
        init = LOG_ALPHA_INIT if kind == "l0" else 1.0
        self.params = nn.ParameterList(nn.Parameter(torch.full((h,), init)) for h in heads)

    def gates(self) -> list[Tensor]:
        """The gates to multiply the heads by: sampled in training (l0), deterministic otherwise."""
        if self.kind == "l1":
            return list(self.params)
        out = []
        for log_alpha in self.params:
            if self.training:
                u = torch.rand(log_alpha.shape, generator=self.generator).clamp(1e-6, 1 - 1e-6)
                s = torch.sigmoid((u.log() - (1 - u).log() + log_alpha) / BETA)
            else:
                s = torch.sigmoid(log_alpha)
            out.append((s * (ZETA - GAMMA) + GAMMA).clamp(0.0, 1.0))
        return out

    def penalty(self) -> Tensor:
        """l1: sum of the gates; l0: expected number of open gates, sum P(g != 0)."""
        if self.kind == "l1":
            return sum(g.sum() for g in self.params)
        shift = BETA * math.log(-GAMMA / ZETA)
        return sum(torch.sigmoid(a - shift).sum() for a in self.params)

    def after_step(self) -> None:
        if self.kind == "l1":
            with torch.no_grad():
                for g in self.params:
                    g.clamp_(0.0, 1.0)

    def final(self) -> list[Tensor]:
        """The deterministic gates the trained model keeps (folded into W_O)."""
        was = self.training
        self.eval()
        try:
            with torch.no_grad():
                return [g.detach().clone() for g in self.gates()]
        finally:
            self.train(was)


def fold(blocks: list[nn.Module], gates: list[Tensor]) -> None:
    """Fold the gates into the blocks, in place, so that no gate is left and the function is the same.

    Each head's columns of W_O are scaled by its gate: y = W_O (g * Z) + b. A shut head (g = 0)
    also gets its query rows of W_Q (and b_Q) zeroed: its output is zero either way, and its
    attention map becomes uniform over the keys it may see instead of a leftover of what the
    head did before it was shut (no gradient reaches a shut head's Q and K), which head scores
    and pictures would otherwise report as if it were in use.
    """
    with torch.no_grad():
        for block, g in zip(blocks, gates):
            spec = block.spec
            p = zoo.heads.get_projections(block)
            p.w_o = p.w_o * g.repeat_interleave(spec.d_v_)[None, :]
            shut = (g == 0).repeat_interleave(spec.d_k_)
            p.w_q[shut] = 0.0
            if p.b_q is not None:
                p.b_q[shut] = 0.0
            block.load_state_dict(zoo.heads.build(spec, p, like=block).state_dict())


def shut(block: nn.Module) -> list[bool]:
    """Per head of a zoo block: whether its columns of W_O are all zero, so that its output is
    zero whatever it attends to (a head shut by L0 gates, once folded)."""
    w = block.out_proj.weight.detach()
    return [bool(x) for x in (w.reshape(w.shape[0], block.spec.heads, block.spec.d_v_) == 0).all(-1).all(0)]
