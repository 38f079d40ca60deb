"""The parts of a decoder layer besides attention, each chosen by a value of `zoo.lm.LMSpec`:

  Norm        "rms"         x / rms(x) * w                    (LLaMA, Mistral, Qwen, Phi-3, OLMo-2, Granite)
              "rms_plus1"   x / rms(x) * (1 + w), in fp32      (Gemma, Gemma-2, Gemma-3)
              "layer"       LayerNorm, with or without bias    (GPT-2, NeoX, GPT-J, OPT, BLOOM, Falcon, Phi, ...)
              "layer_plain" LayerNorm, no weight or bias, fp32 (OLMo)
  MLP         "gated"       down(act(gate(x)) * up(x))         (a fused gate_up is split when read)
              "plain"       down(act(up(x)))                   (Conv1D layouts are transposed when read)
  Embedding   tokens, learned absolute positions (with an offset: OPT's 2), a LayerNorm on the
              embeddings (BLOOM), a scale (Gemma's sqrt(d), cast to the model's dtype; Granite's multiplier)

Every weight is an nn.Linear (out, in) or a vector; no part branches on tensor values, so a step
of the whole model traces as it runs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

NORMS = ("rms", "rms_plus1", "layer", "layer_plain")
MLPS = ("gated", "plain")
# the activations transformers' ACT2FN names, by what they compute
ACTIVATIONS = {
    "silu": F.silu,
    "swish": F.silu,
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
}
# transformers' names for the same functions (gelu_new, gelu_fast, BLOOM's gelu: the tanh form)
ACT_ALIASES = {
    "gelu_new": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "bloom_gelu": "gelu_tanh",
}


class Norm(nn.Module):
    """One normalization over the last axis (c): kind in NORMS."""

    def __init__(self, kind: str, dim: int, eps: float, bias: bool) -> None:
        super().__init__()
        self.kind, self.dim, self.eps = kind, dim, eps
        weight = None if kind == "layer_plain" else torch.zeros(dim) if kind == "rms_plus1" else torch.ones(dim)
        self.weight = nn.Parameter(weight) if weight is not None else None
        self.bias = nn.Parameter(torch.zeros(dim)) if kind == "layer" and bias else None

    def forward(self, x: Tensor) -> Tensor:
        if self.kind == "layer":
            return F.layer_norm(x, x.shape[-1:], self.weight, self.bias, self.eps)
        if self.kind == "layer_plain":  # OLMo: in fp32, cast back after
            return F.layer_norm(x.float(), x.shape[-1:], None, None, self.eps).to(x.dtype)
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.kind == "rms_plus1":  # Gemma: the scale in fp32, cast back after
            return (h * (1.0 + self.weight.float())).to(x.dtype)
        return self.weight * h.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.kind}, {self.dim}, eps={self.eps:g}"


class MLP(nn.Module):
    """x (b t c) -> (b t c): kind in MLPS, act a key of ACTIVATIONS, width d_ff."""

    def __init__(self, kind: str, d_model: int, d_ff: int, act: str, bias: bool) -> None:
        super().__init__()
        self.kind, self.act_name = kind, act
        self.act = ACTIVATIONS[act]
        self.gate = nn.Linear(d_model, d_ff, bias=bias) if kind == "gated" else None
        self.up = nn.Linear(d_model, d_ff, bias=bias)
        self.down = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        if self.gate is not None:
            return self.down(self.act(self.gate(x)) * self.up(x))
        return self.down(self.act(self.up(x)))

    def extra_repr(self) -> str:
        return f"{self.kind}, act={self.act_name}"


class Embedding(nn.Module):
    """input_ids (b t) and their token positions (b|1 t) -> h (b t c)."""

    def __init__(
        self,
        vocab: int,
        d_model: int,
        *,
        max_positions: int | None,
        position_offset: int,
        norm: Norm | None,
        scale: float,
        scale_in_dtype: bool,
    ) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, d_model)
        self.positions = nn.Embedding(max_positions + position_offset, d_model) if max_positions else None
        self.offset = position_offset
        self.norm = norm
        self.scale = scale
        # Gemma multiplies by its normalizer cast to the model's dtype (Granite by the plain float):
        # the scale as each dtype holds it, read by dtype at run time (no tensor made while tracing)
        dtypes = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
        self.scales = {dt: float(torch.tensor(scale, dtype=dt)) if scale_in_dtype else scale for dt in dtypes}

    def forward(self, input_ids: Tensor, positions: Tensor) -> Tensor:
        h = self.tokens(input_ids)
        if self.scale != 1.0:
            h = h * self.scales[h.dtype]
        if self.positions is not None:
            # padding sits at position -1 (zoo.attend.key_positions); it is never read, keep its index in range
            at = (positions.clamp(min=0) + self.offset).clamp(max=self.positions.num_embeddings - 1)
            h = h + self.positions(at)
        if self.norm is not None:
            h = self.norm(h)
        return h


class MoE(nn.Module):
    """A sparse mixture of gated experts (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE): router (c -> E), softmax in fp32,
    the top k probabilities (renormalized to sum 1 with `renorm`), out = sum_e w_e * expert_e(x) (+ a gated shared
    expert).

    Every expert runs on every token and an unchosen one weighs exactly 0, in expert order as transformers
    adds them: the same sum, no data-dependent shapes (the step traces as it runs)."""

    def __init__(self, d_model: int, d_ff: int, act: str, experts: int, top_k: int, renorm: bool, shared: int) -> None:
        super().__init__()
        self.top_k, self.renorm = top_k, renorm
        self.router = nn.Linear(d_model, experts, bias=False)
        self.experts = nn.ModuleList(MLP("gated", d_model, d_ff, act, False) for _ in range(experts))
        # Qwen2-MoE's shared expert of width `shared`, gated by sigmoid(shared_gate(x)); 0: none
        self.shared = MLP("gated", d_model, shared, act, False) if shared else None
        self.shared_gate = nn.Linear(d_model, 1, bias=False) if shared else None

    def forward(self, x: Tensor) -> Tensor:
        probs = torch.softmax(self.router(x).float(), dim=-1)  # (b t E)
        top, idx = probs.topk(self.top_k, dim=-1)
        if self.renorm:
            top = top / top.sum(dim=-1, keepdim=True)
        weights = torch.zeros_like(probs).scatter(-1, idx, top)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            out = out + (expert(x) * weights[..., e : e + 1]).to(x.dtype)
        if self.shared is not None:
            out = out + torch.sigmoid(self.shared_gate(x)) * self.shared(x)
        return out
