"""The spec's fields and the values they resolve to, with no checks: what the modifiers read.

`zoo.attention_spec.AttentionSpec` is these fields with their checks (the modifiers' among them), and it is
the only kind of spec ever made; the modifiers take it typed as this base, so that they sit below
the spec that calls them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def rope_switch_at(kind: str | None, original_max: int | None) -> int | None:
    """The call length (largest position + 1) past which a rotary layer of this `rope_scaling` kind takes other
    frequencies: original_max for longrope (its long set: zoo/modifiers/rope_scaling.py), None for every other
    kind (theirs do not depend on the call). What a caller that runs a call in pieces, or shares one between
    requests, must keep on one side of; here, without torch, for those that run exports without it."""
    return original_max if kind == "longrope" else None


@dataclass(frozen=True)
class SpecFields:
    """One multi-head attention block. Every default says why it is what it is."""

    d_model: int = 512  # width of x and y; 512 is the original Transformer's base size
    heads: int = 8  # h, query heads; 8 gives the classic 64-wide heads at d_model=512
    d_k: int | None = None  # per-head query/key width; None -> d_model // heads (API convention)
    d_v: int | None = None  # per-head value width; None -> d_k (the common choice, not a law)
    kv_heads: int | None = None  # g, key/value heads (GQA/MQA); None -> heads (plain MHA)
    layout: str = "separate"  # "separate" W_Q/W_K/W_V or "combined" [Q|K|V] input projection
    bias: bool = True  # biases on all four projections, or none (torch's nn.Linear default)
    causal: bool = False  # built-in lower-triangular mask; only meaningful for self-attention
    d_context: int | None = None  # width of the cross-attention context; None -> self-attention
    scale: float | None = None  # score scale; None -> 1/sqrt(d_k) as in "Attention Is All You Need"
    # Position and score modifiers (zoo/modifiers/ holds each one's math, checks and limits).
    # All off by default, so every spec above keeps its meaning.
    rope_theta: float | None = None  # rotary positions on Q and K, base theta (LLaMA: 500000.0); None = off
    rope_dim: int | None = None  # rotated leading dims of each head, even; None = all of d_k (NeoX: partial)
    rope_interleaved: bool = False  # False: rotate halves (NeoX/LLaMA); True: adjacent pairs (GPT-J)
    rope_scale: float | None = None  # linear rope scaling: positions divided by it (Gemma-3 global: 8.0); None = 1
    # Scaled rotary frequencies as transformers' rope_type (zoo/modifiers/rope_scaling.py): None = off
    rope_scaling: str | None = None  # "llama3" (bands by wavelength), "yarn" (ramp + mscale), "longrope" (2 lists)
    rope_factor: float | None = None  # llama3 / yarn: the factor; longrope: only for its attention factor's default
    rope_original_max: int | None = None  # original_max_position_embeddings (the pretraining length)
    rope_low_freq: float | None = None  # llama3 low_freq_factor; None = 1.0 (Llama 3.1's)
    rope_high_freq: float | None = None  # llama3 high_freq_factor; None = 4.0 (Llama 3.1's)
    rope_beta_fast: float | None = None  # yarn beta_fast; None = 32
    rope_beta_slow: float | None = None  # yarn beta_slow; None = 1
    rope_truncate: bool | None = None  # yarn: floor/ceil the correction range; None = True
    rope_attention: float | None = None  # yarn / longrope: cos and sin multiplied by it; None = the kind's formula
    rope_short_factor: tuple[float, ...] | None = None  # longrope: per-pair divisors while positions < original_max
    rope_long_factor: tuple[float, ...] | None = None  # longrope: per-pair divisors once a call passes original_max
    alibi: bool = False  # per-head linear distance bias, Press et al./BLOOM slopes
    rel_buckets: int | None = None  # T5's learned per-head bias over bucketed key - query distances; None = off
    rel_max_distance: int = 128  # T5's max_distance: distances this far or farther share the last bucket
    window: int | None = None  # |i - j| < window: causal, `window` keys with itself (HF); else symmetric (ModernBERT)
    chunk: int | None = None  # Llama 4's chunked attention: i sees j iff i // chunk == j // chunk; None = off
    softcap: float | None = None  # scores -> cap * tanh(scores / cap) after scaling, before masks (Gemma-2)
    sinks: bool = False  # a learned logit per head that joins each row's softmax denominator (gpt-oss)
    # A norm on Q and K: "head" over d_k, one weight (Qwen3), "per_head" over d_k, a weight per head
    # (Cohere, StableLM), or "full" over h*d_k (OLMo-2); None = off
    qk_norm: str | None = None
    qk_norm_eps: float = 1e-6  # the norm's epsilon (Qwen3 and OLMo-2 use 1e-6)
    qk_norm_kind: str = "rms"  # "rms" (RMSNorm, the common one) or "layer" (LayerNorm: mean removed; Cohere, Phi)
    qk_norm_bias: bool = False  # LayerNorm's learned bias on Q and K (Persimmon, Phi); RMSNorm has none
    qk_l2: float | None = None  # Llama 4's weightless QK-norm after the rotary: its eps (1e-5); None = off
    # Llama 4's attention temperature on NoPE layers: q * (1 + scale * log1p(floor((pos + 1) / floor)))
    temperature_floor: int | None = None  # its floor_scale (8192); None = off
    temperature_scale: float = 0.1  # its attn_scale (Llama 4: 0.1)
    clip_qkv: float | None = None  # Q, K, V clamped to [-c, c] after the projections, before QK-norm/RoPE (OLMo, MPT)
    # Multi-head latent attention (DeepSeek-V2/V3, MiniCPM3): K and V come up from one RMS-normed latent of this
    # width; each head's first rope_dim query/key dims are the decoupled rotary part (one rotary key for all heads)
    kv_lora_rank: int | None = None  # the KV latent's width (DeepSeek-V3: 512); None = off
    q_lora_rank: int | None = None  # the query's low-rank width under a latent (DeepSeek-V3: 1536); None = plain q_proj
    latent_eps: float = 1e-6  # the latents' RMSNorm epsilon (DeepSeek's rms_norm_eps is 1e-6)
    # Qwen3-Next's gated output: Z * sigmoid(x W_G + b_G) per head and channel before W_O (W_G: c -> (h dv))
    output_gate: bool = False

    # Resolved values: the defaults above made concrete. Trailing underscore = "resolved".
    @property
    def d_k_(self) -> int:
        return self.d_k if self.d_k is not None else self.d_model // self.heads

    @property
    def d_v_(self) -> int:
        return self.d_v if self.d_v is not None else self.d_k_

    @property
    def kv_heads_(self) -> int:
        return self.kv_heads if self.kv_heads is not None else self.heads

    @property
    def d_kv_in(self) -> int:
        """Width of the tensor K and V are projected from (x, or the context)."""
        return self.d_context if self.d_context is not None else self.d_model

    @property
    def scale_(self) -> float:
        return self.scale if self.scale is not None else 1.0 / math.sqrt(self.d_k_)

    @property
    def is_cross(self) -> bool:
        return self.d_context is not None

    @property
    def cache_widths_(self) -> tuple[int, int, int]:
        """(heads, key width, value width) a decode cache holds per position: (g, dk, dv); under a KV latent
        one head of the rotary key (rope_dim) and the normalized latent (kv_lora_rank)."""
        if self.kv_lora_rank is not None:
            return 1, self.rope_dim or 0, self.kv_lora_rank
        return self.kv_heads_, self.d_k_, self.d_v_

    @property
    def group_size(self) -> int:
        """Query heads per kv head: query head r reads kv head r // group_size."""
        return self.heads // self.kv_heads_
