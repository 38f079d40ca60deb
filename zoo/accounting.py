"""Exact accounting for one attention block: parameters, shapes, score entries, FLOPs, bytes.

Four different quantities, never mixed: parameter entries, stored score entries,
arithmetic (FLOPs) and memory traffic (bytes). Each function says which one it counts.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from . import modifiers
from .attention_spec import AttentionSpec
from .errors import ArgumentError, InputTypeError

FLOP_CONVENTION = (
    "matmul FLOPs only, 2 per multiply-accumulate (an (m,k)x(k,n) product = 2mkn); "
    "softmax, scaling, masking and bias adds are not counted; causal masks are counted dense"
)


@dataclass(frozen=True)
class ParameterCount:
    """Parameter entries by projection; `total` is what nn.Module.parameters() holds."""

    w_q: int
    w_k: int
    w_v: int
    w_o: int
    biases: int
    modifiers: int = 0  # learned modifier weights (QK-norm, T5's bias table); RoPE and ALiBi add none

    @property
    def weights(self) -> int:
        return self.w_q + self.w_k + self.w_v + self.w_o

    @property
    def total(self) -> int:
        return self.weights + self.biases + self.modifiers


def parameter_breakdown(spec: AttentionSpec) -> ParameterCount:
    """From the formula: W_Q c x (h dk), W_K c_kv x (g dk), W_V c_kv x (g dv), W_O (h dv) x c."""
    h, g, dk, dv = spec.heads, spec.kv_heads_, spec.d_k_, spec.d_v_
    biases = (h * dk + g * dk + g * dv + spec.d_model) if spec.bias else 0
    latent = spec.kv_lora_rank is not None  # K, V (and a low-rank Q) come from the latent's weights (modifiers)
    return ParameterCount(
        w_q=0 if latent and spec.q_lora_rank is not None else spec.d_model * h * dk,
        w_k=0 if latent else spec.d_kv_in * g * dk,
        w_v=0 if latent else spec.d_kv_in * g * dv,
        w_o=h * dv * spec.d_model,
        biases=biases,
        modifiers=modifiers.parameters_added(spec),
    )


def count_parameters(spec_or_module: AttentionSpec | nn.Module) -> int:
    """Exact parameter count. A spec is counted from the formula; a module, entry by entry.

    No bias: d_model*(h*dk + g*dk + g*dv) + (h*dv)*d_model (self-attention), which is
    4*d^2 when h*dk = h*dv = d_model = d. With bias, add h*dk + g*dk + g*dv + d_model.
    QK-norm adds its weights: 2*dk ("head") or h*dk + g*dk ("full"); T5's relative buckets their table,
    rel_buckets*h. Latent attention (r = kv_lora_rank, dr = rope_dim, rq = q_lora_rank): no W_K, W_V;
    c*(r+dr) + r + r*h*(dk-dr+dv), and c*rq + rq + rq*h*dk in place of W_Q when rq is set.
    """
    if isinstance(spec_or_module, AttentionSpec):
        return parameter_breakdown(spec_or_module).total
    if isinstance(spec_or_module, nn.Module):
        return sum(p.numel() for p in spec_or_module.parameters())
    raise InputTypeError(f"count_parameters takes an AttentionSpec or nn.Module, got {type(spec_or_module).__name__}")


@dataclass(frozen=True)
class Stage:
    name: str
    axes: str
    shape: tuple[int, ...]


def key_length(spec: AttentionSpec, seq: int, ctx_seq: int | None) -> int:
    """S: the context length for cross-attention; T itself for self-attention."""
    if ctx_seq is None or ctx_seq == seq:
        return seq
    if not spec.is_cross:
        raise ArgumentError(
            f"ctx_seq={ctx_seq} differs from seq={seq}, but this is self-attention (keys are x itself, "
            f"S = T); give ctx_seq only for cross-attention"
        )
    return ctx_seq


def stage_shapes(spec: AttentionSpec, batch: int, seq: int, ctx_seq: int | None = None) -> list[Stage]:
    """The shape at each stage of the operation, labelled with the axis vocabulary."""
    b, t = batch, seq
    s = key_length(spec, seq, ctx_seq)
    h, g, dk, dv = spec.heads, spec.kv_heads_, spec.d_k_, spec.d_v_
    stages = [Stage("X", "b t c", (b, t, spec.d_model))]
    if spec.is_cross:
        stages.append(Stage("C", "b s c", (b, s, spec.d_context)))
    stages += [
        Stage("Q", "b h t dk", (b, h, t, dk)),
        Stage("K", "b g s dk", (b, g, s, dk)),
        Stage("V", "b g s dv", (b, g, s, dv)),
        Stage("A", "b h t s", (b, h, t, s)),
        Stage("Z", "b t (h dv)", (b, t, h * dv)),
        Stage("Y", "b t c", (b, t, spec.d_model)),
    ]
    return stages


def score_entries(spec: AttentionSpec, batch: int, seq: int, ctx_seq: int | None = None) -> int:
    """Entries of the dense score tensor A: b*h*t*s (one t x s map per batch item and head)."""
    s = key_length(spec, seq, ctx_seq)
    return batch * spec.heads * seq * s


@dataclass(frozen=True)
class FlopCount:
    q_proj: int
    k_proj: int
    v_proj: int
    scores: int  # Q K^T
    weighted_values: int  # A V
    out_proj: int

    @property
    def projections(self) -> int:
        return self.q_proj + self.k_proj + self.v_proj + self.out_proj

    @property
    def attention(self) -> int:
        return self.scores + self.weighted_values

    @property
    def total(self) -> int:
        return self.projections + self.attention


def flops(spec: AttentionSpec, batch: int, seq: int, ctx_seq: int | None = None) -> FlopCount:
    """FLOPs of one forward pass; see FLOP_CONVENTION."""
    b, t = batch, seq
    s = key_length(spec, seq, ctx_seq)
    h, g, dk, dv = spec.heads, spec.kv_heads_, spec.d_k_, spec.d_v_
    return FlopCount(
        q_proj=2 * b * t * spec.d_model * h * dk,
        k_proj=2 * b * s * spec.d_kv_in * g * dk,
        v_proj=2 * b * s * spec.d_kv_in * g * dv,
        scores=2 * b * h * t * s * dk,
        weighted_values=2 * b * h * t * s * dv,
        out_proj=2 * b * t * h * dv * spec.d_model,
    )


@dataclass(frozen=True)
class ByteCount:
    inputs: int  # x (and the context)
    parameters: int
    output: int  # y
    scores: int  # what an explicit (unfused) path writes once for A

    @property
    def minimum(self) -> int:
        """Compulsory traffic: read inputs and parameters once, write y once."""
        return self.inputs + self.parameters + self.output


def bytes_moved(
    spec: AttentionSpec, batch: int, seq: int, ctx_seq: int | None = None, *, itemsize: int = 4
) -> ByteCount:
    """Memory traffic in bytes (itemsize 4 = fp32, 2 = fp16)."""
    s = key_length(spec, seq, ctx_seq)
    inputs = batch * seq * spec.d_model + (batch * s * spec.d_context if spec.is_cross else 0)
    return ByteCount(
        inputs=inputs * itemsize,
        parameters=count_parameters(spec) * itemsize,
        output=batch * seq * spec.d_model * itemsize,
        scores=score_entries(spec, batch, seq, s) * itemsize,
    )


def working_set_bytes(
    spec: AttentionSpec,
    batch: int,
    seq: int,
    ctx_seq: int | None = None,
    *,
    itemsize: int = 4,
    score_copies: int = 0,
) -> int:
    """Bytes one forward pass holds at its peak, roughly: parameters, x (and the context),
    Q (b h t dk), K/V (b g s d) and their h-head repeats, Z (b t (h dv)), y, and `score_copies`
    tensors of (b h t s) where a path materializes the scores (explicit softmax: about 3).
    An estimate for refusing impossible requests up front, not a measurement."""
    s = key_length(spec, seq, ctx_seq)
    h, g, dk, dv = spec.heads, spec.kv_heads_, spec.d_k_, spec.d_v_
    acts = (
        2 * batch * seq * spec.d_model  # x and y
        + (batch * s * spec.d_context if spec.is_cross else 0)
        + batch * seq * h * dk  # Q
        + batch * s * (g + h) * (dk + dv)  # K, V and their repeat to h heads
        + batch * seq * h * dv  # Z
    )
    return (count_parameters(spec) + acts + score_copies * score_entries(spec, batch, seq, s)) * itemsize
