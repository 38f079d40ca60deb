"""The modifier protocol (`Modifier`, every hook the identity) and what the modifiers share:
head blocks, number checks, query-key distances, the relative-positions audit."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from einops import rearrange
from torch import Tensor, nn

from ..spec_fields import SpecFields
from .graph import GraphBuilder, GraphLimit, OpPart


def take_blocks(w: Tensor | None, order: Sequence[int], n: int, dim: int = 0) -> Tensor | None:
    """Reorder the n head blocks of w along `dim` (rows for W_Q/K/V and biases, columns for W_O)."""
    if w is None:
        return None
    idx = torch.as_tensor(list(order), device=w.device)
    if dim == 0:
        blocks = rearrange(w, "(n d) ... -> n d ...", n=n)
        return rearrange(blocks[idx], "n d ... -> (n d) ...")
    blocks = rearrange(w, "o (n d) -> n o d", n=n)
    return rearrange(blocks[idx], "n o d -> o (n d)")


@dataclass(frozen=True)
class PruneRefusal:
    """Why prune_heads cannot remove heads under a modifier's setting (zeroing still applies)."""

    setting: str  # the spec's value, as the user wrote it: "qk_norm='full'"
    why: str  # the reason in full, for prune_heads' error
    short: str  # the reason in a few words, for the audit's line


class Modifier(nn.Module):
    """Base: every hook is the identity, every check passes."""

    name: ClassVar[str] = ""
    # Its row's label in the lowering support table (docs/lowerings.md), in Markdown.
    label: ClassVar[str] = ""
    fields: ClassVar[tuple[str, ...]] = ()
    # A modifier SDPA cannot express (a nonlinear map of the scores) forces the explicit path.
    needs_explicit: ClassVar[bool] = False
    # A modifier that adds a mask or bias from positions: SDPA's plain is_causal cannot stand in.
    shapes_scores: ClassVar[bool] = False
    # How far y may move when every position shifts by the same amount (the relative-positions
    # audit): exact in float64, unless the modifier computes something from positions in fp32.
    shift_tolerance: ClassVar[float] = 1e-10

    def __init__(self, spec: SpecFields) -> None:
        super().__init__()
        self.spec = spec

    # -- the spec side (class-level: no module needed) ---------------------------------------

    @classmethod
    def active(cls, spec: SpecFields) -> bool:
        raise NotImplementedError

    @classmethod
    def check(cls, spec: SpecFields) -> None:
        """Raise SpecError naming the fields when the spec's values for this modifier are invalid."""

    @classmethod
    def parameters_added(cls, spec: SpecFields) -> int:
        return 0

    @classmethod
    def parameters_label(cls, spec: SpecFields) -> str:
        """Its line's label in `attnzoo show`'s parameter table (when it adds any)."""
        return f"{cls.name} weights"

    @classmethod
    def describe(cls, spec: SpecFields) -> str:
        return cls.name

    # -- the eager op (identity unless overridden) ----------------------------------------------

    def qkv_projected(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Q (b t (h dk)), K (b s (g dk)), V (b s (g dv)) straight from the projections (bias added)."""
        return q, k, v

    def qk_merged(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        return q, k

    def qk_heads(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, Tensor]:
        return q, k

    def score_allowed(self, q_pos: Tensor, k_pos: Tensor) -> Tensor | None:
        """bool (b|1, 1, t, s), True = may attend; None = no opinion."""
        return None

    def score_bias(self, q_pos: Tensor, k_pos: Tensor, dtype: torch.dtype) -> Tensor | None:
        """float (b|1, h, t, s) added to the scaled scores; None = nothing."""
        return None

    def score_map(self, scores: Tensor) -> Tensor:
        """A pointwise map of the scaled scores, before any bias or mask."""
        return scores

    def z_heads(self, z: Tensor, x: Tensor) -> Tensor:
        """Z (b h t dv) after attention, before head_mask and W_O; x (b t c) the block's input."""
        return z

    def score_sink(self) -> Tensor | None:
        """A logit per head (1, h, 1, 1) that joins each row's softmax denominator with a value of zero
        (attention sinks); None = nothing. SDPA has no input for it: a block with one takes the explicit path."""
        return None

    # -- the hand-built GroupQueryAttention graph (graph.py; nothing unless overridden) ---------------

    # What the graph cannot carry of this modifier, in a few words; None: it carries every value.
    gqa_limit: ClassVar[GraphLimit | None] = None
    # Whether ONNX Runtime's CPU kernel still gives a query row whose keys are all masked 0 with this modifier's
    # attributes on the op (a whole model's pad rows: export/gqa.py zeroes them itself where one says False).
    gqa_masked_row_zero: ClassVar[bool] = True

    @classmethod
    def gqa_refusal(cls, spec: SpecFields) -> str | None:
        """Why the hand-built graph cannot carry this modifier under `spec`, or None (it can); by
        default the limit's text where the limit holds whatever the values."""
        limit = cls.gqa_limit
        return limit.text if limit is not None and limit.always else None

    def gqa_qkv(self, g: GraphBuilder, q: str, k: str, v: str) -> tuple[str, str, str]:
        """Nodes on Q (b t (h dk)), K (b t (g dk)), V (b t (g dv)) as projected (bias added), before the op."""
        return q, k, v

    def gqa_op(self, g: GraphBuilder) -> OpPart:
        """Attributes and inputs of the GroupQueryAttention node."""
        return OpPart()

    def gqa_inside(self, g: GraphBuilder) -> OpPart | None:
        """The op's own way of doing what gqa_qkv does, at each token's cache slot instead of its
        position, or None (keep gqa_qkv). A left-padded row's slots run ahead of its positions by its
        pads, the same for its every key and query, so only a piece that depends on i - j alone (rotary)
        may move inside. Asked only of a layer in a whole model (its cache is the model's own) and only
        of the last modifier that writes on Q and K, since the op applies its piece after theirs."""
        return None

    def gqa_bias(self, g: GraphBuilder) -> str | None:
        """A term of the op's attention_bias, float32 (b|1, h|1, t, s); None = nothing."""
        return None

    def gqa_allowed(self, g: GraphBuilder) -> str | None:
        """A term of the allowed-keys rule after the op, bool (b|1, t, s); None = no opinion."""
        return None

    def gqa_z(self, g: GraphBuilder, x: str, z: str) -> str:
        """Nodes on the op's output Z (b t (h dv)), before head_mask and W_O; x (b t c) the graph's input."""
        return z

    # -- head state (zoo/heads.py) ------------------------------------------------------------------

    # The zoo.heads.Projections fields holding this modifier's learned or per-head state; none by
    # default (its behaviour follows from the spec alone, the same for every head).
    state_fields: ClassVar[tuple[str, ...]] = ()

    def head_state(self) -> dict[str, Tensor]:
        """This block's state, keyed by `state_fields` (detached copies)."""
        return {}

    def load_head_state(self, state: dict[str, Any]) -> None:
        """Write `state` (keyed by `state_fields`) into this block, under torch.no_grad()."""

    @classmethod
    def select_heads(
        cls, spec: SpecFields, state: dict[str, Any], q_heads: Sequence[int], kv_heads: Sequence[int]
    ) -> dict[str, Any]:
        """The state of query heads `q_heads` and kv heads `kv_heads` of a block of `spec`, in that
        order (a permutation or a subset); by default nothing is per head."""
        return dict(state)

    @classmethod
    def prune_refusal(cls, spec: SpecFields) -> PruneRefusal | None:
        """Why removing heads would change the remaining heads' function under `spec`; None: it would not."""
        return None

    # -- the audit ------------------------------------------------------------------------------

    # The audit's independent reference (zoo/audit.py, "inside each head"), written out without
    # the module's code, stage by stage as the forward applies them: Q and K per head, a map of
    # the scaled scores, a bias on them, the cells a query may see. p holds the block's weights
    # (zoo.heads.Projections); the defaults change nothing.
    @classmethod
    def reference_project(cls, spec: SpecFields, x: Tensor, p: Any) -> tuple[Tensor, Tensor, Tensor] | None:
        """q (b h t dk), k (b g s dk), v (b g s dv) per head from x (b t c), for a modifier that makes them
        itself (latent attention); None: the plain projections W_Q, W_K, W_V make them."""
        return None

    @classmethod
    def reference_qkv(cls, spec: SpecFields, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q (b h t dk), k (b g s dk), v (b g s dv) per head, as projected -> the same after this modifier."""
        return q, k, v

    @classmethod
    def reference_qk(cls, spec: SpecFields, q: Tensor, k: Tensor, p: Any, pos: Tensor) -> tuple[Tensor, Tensor]:
        """q (b h t dk), k (b g s dk) -> the same after this modifier; pos (1 t) positions."""
        return q, k

    @classmethod
    def reference_map(cls, spec: SpecFields, scores: Tensor) -> Tensor:
        """One head's scaled scores (b t s), before any bias or mask."""
        return scores

    @classmethod
    def reference_bias(cls, spec: SpecFields, head: int, p: Any, t: int, s: int) -> Tensor | None:
        """An additive bias (t s) on head `head`'s scores, or None."""
        return None

    @classmethod
    def reference_sink(cls, spec: SpecFields, head: int, p: Any) -> float | None:
        """Head `head`'s logit that joins each row's softmax denominator, or None."""
        return None

    @classmethod
    def reference_allowed(cls, spec: SpecFields, t: int, s: int) -> Tensor | None:
        """A bool (t s) of the cells a query may see, or None for all."""
        return None

    @classmethod
    def reference_z(cls, spec: SpecFields, z: Tensor, x: Tensor, p: Any) -> Tensor:
        """The heads' Z merged (b t (h dv)) -> what W_O reads; x (b t c) the block's input."""
        return z

    @classmethod
    def audit(cls, m: nn.Module, x: Tensor) -> tuple[str, bool, str]:
        """(title, ok, detail): a property of this modifier checked on block m (float64) at x (b t c)."""
        raise NotImplementedError


def is_number(v: Any) -> bool:
    """A finite int or float, not a bool."""
    return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)


def relative_distance(q_pos: Tensor, k_pos: Tensor) -> Tensor:
    """i - j for every (query, key) pair: (b|1, 1, t, s)."""
    return rearrange(q_pos, "b t -> b 1 t 1") - rearrange(k_pos, "b s -> b 1 1 s")


def relative_positions_audit(m: nn.Module, x: Tensor, what: str) -> tuple[str, bool, str]:
    """Only distances matter: every position + 13 gives the same y; reversed positions do not. Under chunked
    attention (absolute chunks) the shift is the next multiple of the chunk, which keeps every chunk whole."""
    t = x.shape[1]
    pos = torch.arange(t)
    y = m(x)
    c = getattr(m.spec, "chunk", None)
    shift = 13 if c is None else c * -(-13 // c)
    e_shift = (m(x, positions=pos + shift) - y).abs().max().item()
    e_given = (m(x, positions=pos) - y).abs().max().item()
    tol = max(mod.shift_tolerance for mod in m.mods.values())
    ok = e_shift < tol and e_given < 1e-12
    return (
        f"{what}: relative positions",
        ok,
        f"positions 0..{t - 1} given vs default {e_given:.1e}; shifted by {shift}: y moves {e_shift:.1e} (< {tol:g})",
    )
