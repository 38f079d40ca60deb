"""A whole decoder model of zoo blocks: `LMSpec` (the model as data) and `DecoderLM` (the module).

    h = embed(input_ids, positions)                 tokens (+ learned positions) (* scale) (-> norm)
    for each layer:  h = layer(h)                   attention is a zoo.MultiHeadAttention per layer
    logits = head(final_norm(h)) * scale, softcap   (b t vocab)

A layer's residual arrangement (`RESIDUALS`) says which norms it holds and how attention and MLP meet:

  sequential           h += attn(n1(h)) * r;  h += mlp(n2(h)) * r         (r: Granite's residual_multiplier)
  parallel             x = n1(h);  h += attn(x) + mlp(x)                  (GPT-J, Phi, Falcon, Cohere)
  parallel_two_norms   h += attn(n1(h)) + mlp(n2(h))                      (GPT-NeoX use_parallel_residual)
  sandwich             h += p1(attn(n1(h)));  h += p2(mlp(n2(h)))         (Gemma-2, Gemma-3)
  post_norms           h += p1(attn(h));  h += p2(mlp(h))                 (OLMo-2)

The interface other rooms build on (export traces `step`, the benchmark runs `generate`):

    logits = lm(input_ids, attention_mask=None)                       (b t) int64 -> (b t vocab)
    logits, keys, values = lm.step(input_ids, keys, values, past_len, key_mask, in_place=...)
    cache = lm.new_cache(batch, max_len)                              zeroed buffers, one pair per layer
    tokens = lm.generate(input_ids, max_new_tokens, attention_mask, eos_token_id, pad_token_id)

`step` is the ONE function of a decode call, eager (in_place=True: the buffers written in place) and
traced (in_place=False: functional writes, no Python branch on a tensor value), exactly as
zoo.attention.static_step is for one block; keys[i] (b g n dk), values[i] (b g n dv) of capacity n,
past_len a 0-d int64 tensor, key_mask (b n) bool over the capacity. Padding follows the cache's rule
(zoo.attend.key_positions): a row's positions count its real tokens, for rotary and for learned
position embeddings alike, so a left-padded row computes what it would alone.

`generate` is greedy and returns (b, t + n): the prompt, then n <= max_new_tokens tokens. With
eos_token_id, a row that has ended is padded with pad_token_id (default: eos) while others go on, and
generation stops early once every row has ended, as transformers' generate does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch
from torch import Tensor, nn

from .attend import key_positions
from .attention import MultiHeadAttention, static_step
from .attention_spec import AttentionSpec
from .cache import GrowingCache
from .errors import InputError, InputTypeError, SpecError
from .generation_inputs import left_padded_mask, new_token_count, token_id
from .hooks import HookedModel, layer_blocks
from .limits import check_fits, check_room
from .lm_parts import ACTIVATIONS, MLP, MLPS, NORMS, Embedding, MoE, Norm
from .spec_fields import rope_switch_at

# arrangement -> the norms a layer holds (before attention, after it, before the MLP, after it)
RESIDUALS = {
    "sequential": ("attn_norm", "mlp_norm"),
    "parallel": ("attn_norm",),
    "parallel_two_norms": ("attn_norm", "mlp_norm"),
    "sandwich": ("attn_norm", "attn_post", "mlp_norm", "mlp_post"),
    "post_norms": ("attn_post", "mlp_post"),
}
NORM_SLOTS = ("attn_norm", "attn_post", "mlp_norm", "mlp_post")


@dataclass(frozen=True)
class LMSpec:
    """A decoder model as data; every field is checked when made."""

    vocab: int
    d_model: int
    attention: tuple[AttentionSpec, ...]  # one per layer: windows, rotary bases and softcaps may differ
    d_ff: int  # the MLP's inner width
    norm: str = "rms"  # NORMS: every norm of the model is of this kind (OLMo's "layer_plain": no weight, no bias)
    norm_eps: float = 1e-6
    norm_bias: bool = False  # LayerNorm with a bias (GPT-2, NeoX, ...); Cohere's has none
    mlp: str = "gated"  # MLPS
    act: str = "silu"  # lm_parts.ACTIVATIONS
    mlp_bias: bool = False
    experts: int = 0  # a mixture of this many gated experts in place of the MLP (Mixtral); 0: a dense MLP
    experts_per_token: int = 0  # the router's top k
    expert_renorm: bool = True  # the top k weights renormalized to sum 1 (Mixtral; Qwen2-MoE's norm_topk_prob)
    shared_expert_d_ff: int = 0  # Qwen2-MoE's sigmoid-gated shared expert of this width; 0: none
    residual: str = "sequential"  # RESIDUALS
    residual_multiplier: float = 1.0  # Granite scales each branch before it is added
    max_positions: int | None = None  # learned absolute positions (GPT-2, OPT); None: none (rotary or ALiBi)
    position_offset: int = 0  # OPT's table starts 2 rows in
    embed_norm: bool = False  # BLOOM's LayerNorm on the embeddings
    embed_scale: float = 1.0  # Gemma's sqrt(d_model); Granite's embedding_multiplier
    embed_scale_in_dtype: bool = False  # Gemma casts its normalizer to the model's dtype first
    final_norm: bool = True
    tied: bool = True  # the head reads the token embedding's weights
    head_bias: bool = False  # GPT-J's and Phi's heads carry a bias
    logit_scale: float = 1.0  # Cohere's logit_scale; Granite's 1 / logits_scaling
    logit_softcap: float | None = None  # Gemma-2: cap * tanh(logits / cap)
    # Phi-3's generate: the first step past a longrope switch re-runs the sequence, every key with the long set
    longrope_recompute: bool = False

    def __post_init__(self) -> None:
        for name in ("vocab", "d_model", "d_ff"):
            _positive_int(name, getattr(self, name))
        _positive_int("max_positions", self.max_positions, optional=True)
        offset = self.position_offset
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise SpecError(f"position_offset={self.position_offset!r} must be an integer >= 0")
        if not isinstance(self.attention, tuple) or not self.attention:
            raise SpecError(
                f"attention must be a non-empty tuple of AttentionSpec (one per layer), got {self.attention!r}"
            )
        for i, a in enumerate(self.attention):
            if not isinstance(a, AttentionSpec):
                raise SpecError(f"attention[{i}] is a {type(a).__name__}; give an AttentionSpec per layer")
            if a.d_model != self.d_model or not a.causal or a.is_cross:
                raise SpecError(
                    f"attention[{i}] ({a.describe()}) must be causal self-attention of d_model={self.d_model}"
                )
        choices = (("norm", NORMS), ("mlp", MLPS), ("act", tuple(ACTIVATIONS)), ("residual", tuple(RESIDUALS)))
        for name, allowed in choices:
            if getattr(self, name) not in allowed:
                raise SpecError(f"{name}={getattr(self, name)!r} is not one of {', '.join(map(repr, allowed))}")
        for name in ("experts", "experts_per_token", "shared_expert_d_ff"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise SpecError(f"{name}={v!r} must be an integer >= 0 (experts=0: a dense MLP)")
        if self.shared_expert_d_ff and not self.experts:
            raise SpecError(
                f"shared_expert_d_ff={self.shared_expert_d_ff} without experts: a shared expert is a mixture's"
            )
        if self.experts and (self.mlp != "gated" or not 1 <= self.experts_per_token <= self.experts):
            raise SpecError(
                f"experts={self.experts} needs mlp='gated' and experts_per_token in 1..{self.experts}, got "
                f"mlp={self.mlp!r}, experts_per_token={self.experts_per_token!r}"
            )
        flags = ("expert_renorm", "norm_bias", "mlp_bias", "embed_norm", "embed_scale_in_dtype", "final_norm", "tied")
        flags += ("longrope_recompute",)
        for name in (*flags, "head_bias"):
            if not isinstance(getattr(self, name), bool):
                raise SpecError(f"{name}={getattr(self, name)!r} must be True or False")
        for name in ("norm_eps", "residual_multiplier", "embed_scale", "logit_scale", "logit_softcap"):
            v = getattr(self, name)
            if name == "logit_softcap" and v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise SpecError(f"{name}={v!r} must be a positive finite number")
        if self.norm_bias and self.norm != "layer":
            raise SpecError(f"norm_bias=True needs norm='layer' (a {self.norm!r} norm has no bias), or norm_bias=False")
        if self.position_offset and self.max_positions is None:
            raise SpecError(f"position_offset={self.position_offset} without max_positions: there is no position table")

    @property
    def layers(self) -> int:
        return len(self.attention)

    @property
    def recompute_at(self) -> int | None:
        """The cache length at which generate re-runs the whole sequence (longrope_recompute), or None."""
        if not self.longrope_recompute:
            return None
        switches = [rope_switch_at(a.rope_scaling, a.rope_original_max) for a in self.attention]
        return min((n for n in switches if n is not None), default=None)

    def describe(self) -> str:
        """One line, e.g. 'vocab=100 d_model=64 layers=2 rms gated/silu sequential tied'."""
        parts = [f"vocab={self.vocab}", f"d_model={self.d_model}", f"layers={self.layers}", f"d_ff={self.d_ff}"]
        parts += [self.norm, f"{self.mlp}/{self.act}", self.residual, "tied" if self.tied else "untied"]
        defaults = {f.name: f.default for f in fields(self)}
        shown = ("experts", "experts_per_token", "max_positions", "position_offset", "embed_norm", "embed_scale")
        for name in (*shown, "residual_multiplier", "logit_scale", "logit_softcap"):
            if getattr(self, name) != defaults[name]:
                parts.append(f"{name}={getattr(self, name)}")
        return " ".join(parts)


def _positive_int(name: str, v: object, *, optional: bool = False) -> None:
    if v is None and optional:
        return
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise SpecError(f"{name}={v!r} must be a positive integer")


class DecoderLayer(nn.Module):
    """One layer: `attn` (a zoo block), `mlp`, and the norms its residual arrangement holds (others None)."""

    def __init__(self, spec: LMSpec, attn: AttentionSpec) -> None:
        super().__init__()
        self.attn = MultiHeadAttention(attn)
        if spec.experts:
            s = spec
            k, shared = s.experts_per_token, s.shared_expert_d_ff
            self.mlp = MoE(s.d_model, s.d_ff, s.act, s.experts, k, s.expert_renorm, shared)
        else:
            self.mlp = MLP(spec.mlp, spec.d_model, spec.d_ff, spec.act, spec.mlp_bias)
        held = RESIDUALS[spec.residual]
        for slot in NORM_SLOTS:
            norm = Norm(spec.norm, spec.d_model, spec.norm_eps, spec.norm_bias) if slot in held else None
            setattr(self, slot, norm)
        self.parallel = spec.residual.startswith("parallel")
        self.r = spec.residual_multiplier

    def forward(self, h: Tensor, attend) -> Tensor:  # noqa: ANN001 - attend(x) -> y runs self.attn on a cache
        x = self.attn_norm(h) if self.attn_norm is not None else h
        a = attend(x)
        if self.attn_post is not None:
            a = self.attn_post(a)
        if self.parallel:
            m = self.mlp(self.mlp_norm(h) if self.mlp_norm is not None else x)
            return h + (a + m)
        h = h + (a * self.r if self.r != 1.0 else a)
        m = self.mlp(self.mlp_norm(h) if self.mlp_norm is not None else h)
        if self.mlp_post is not None:
            m = self.mlp_post(m)
        return h + (m * self.r if self.r != 1.0 else m)


@dataclass
class LMCache:
    """A static cache of the whole model: keys[i] (b g n dk), values[i] (b g n dv) per layer, capacity n;
    `length` positions written (generate advances it)."""

    keys: tuple[Tensor, ...]
    values: tuple[Tensor, ...]
    length: int = 0

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2]


class DecoderLM(HookedModel, nn.Module):
    """A decoder language model of zoo blocks for one `LMSpec` (see the module docstring).

    Named locations (zoo/hooks.py): `run_with_cache` / `run_with_hooks` by "L{layer}.{location}" for each
    layer's attention, and "L{layer}.resid_pre" / ".resid_post" for the residual stream around it."""

    def __init__(self, spec: LMSpec) -> None:
        super().__init__()
        if not isinstance(spec, LMSpec):
            raise InputTypeError(f"spec must be an LMSpec, got {type(spec).__name__}")
        self.spec = spec
        s = spec
        embed_norm = Norm(s.norm, s.d_model, s.norm_eps, s.norm_bias) if s.embed_norm else None
        self.embed = Embedding(
            s.vocab,
            s.d_model,
            max_positions=s.max_positions,
            position_offset=s.position_offset,
            norm=embed_norm,
            scale=s.embed_scale,
            scale_in_dtype=s.embed_scale_in_dtype,
        )
        self.layers = nn.ModuleList(DecoderLayer(s, a) for a in s.attention)
        self.norm = Norm(s.norm, s.d_model, s.norm_eps, s.norm_bias) if s.final_norm else None
        self.head = nn.Linear(s.d_model, s.vocab, bias=s.head_bias)
        if s.tied:
            self.head.weight = self.embed.tokens.weight

    def extra_repr(self) -> str:
        return self.spec.describe()

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.tokens.weight.dtype

    def logits(self, h: Tensor) -> Tensor:
        """h (b t c) -> logits (b t vocab): final norm, head, scale, softcap."""
        if self.norm is not None:
            h = self.norm(h)
        x = self.head(h)
        if self.spec.logit_scale != 1.0:
            x = x * self.spec.logit_scale
        if self.spec.logit_softcap is not None:
            cap = self.spec.logit_softcap
            x = torch.tanh(x / cap) * cap
        return x

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """input_ids (b t) int64 -> logits (b t vocab). attention_mask (b t), 1/True = a real token: padded
        rows follow the cache's rule (a row's positions count its real tokens), as transformers' generate
        places them."""
        key_mask = self._check_ids(input_ids, attention_mask)
        t = input_ids.shape[1]
        pos = torch.arange(t, device=input_ids.device)[None] if key_mask is None else key_positions(key_mask)
        h = self.embed(input_ids, pos)
        cache = GrowingCache(None, None, key_mask)
        for i, layer in enumerate(self.layers):
            h = self.resid(f"L{i}.resid_pre", h)
            h = layer(h, lambda x, blk=layer.attn: blk.step(x, cache)[0])
            h = self.resid(f"L{i}.resid_post", h)
        return self.logits(h)

    def hook_blocks(self) -> dict[str, nn.Module]:
        return layer_blocks(self.layers)

    def step(
        self,
        input_ids: Tensor,
        keys: tuple[Tensor, ...] | list[Tensor],
        values: tuple[Tensor, ...] | list[Tensor],
        past_len: Tensor,
        key_mask: Tensor | None = None,
        *,
        in_place: bool,
        all_logits: bool = False,
        rows: tuple[Tensor, Tensor, Tensor] | None = None,
        last: Tensor | None = None,
    ) -> tuple[Tensor, tuple[Tensor, ...], tuple[Tensor, ...]]:
        """input_ids (b t) at cache indices past_len..past_len+t-1 -> (logits (b 1 vocab), or (b t vocab) with
        all_logits; the keys and values written: the same tensors when in_place).

        Traced packed rows (export/lm_export.py): rows = (position_ids (b t), seqlens_k, total_sequence_length),
        the positions for the embedding and all three for the spliced layers; past_len (b) each row's first
        slot; last (b) the index in the call of each row's last real token, whose logits are returned."""
        if len(keys) != len(self.layers) or len(values) != len(self.layers):
            raise InputError(
                f"keys and values need one buffer per layer ({len(self.layers)}), got {len(keys)}, {len(values)}"
            )
        t, n = input_ids.shape[1], keys[0].shape[2]
        if in_place:  # eager: checked here; traced, the blocks guard past_len themselves
            self._check_ids(input_ids, None)
            if not isinstance(past_len, Tensor) or past_len.dim() != 0 or past_len.dtype != torch.long:
                raise InputTypeError(f"past_len must be a 0-d int64 tensor, got {past_len!r}")
            check_room(n, int(past_len), t, fix="make the cache with a larger max_len")
        idx = (past_len.unsqueeze(-1) + torch.arange(t, device=input_ids.device)).clamp(0, n - 1)  # (t) | (b t)
        if rows is not None:
            pos = rows[0]
        elif key_mask is None:
            pos = idx if idx.dim() == 2 else idx[None]
        else:
            pos = key_positions(key_mask).index_select(1, idx)
        h = self.embed(input_ids, pos)
        new_k: list[Tensor] = []
        new_v: list[Tensor] = []

        def attend(x: Tensor, i: int) -> Tensor:
            y, k, v = static_step(
                self.layers[i].attn, x, keys[i], values[i], past_len, key_mask, in_place=in_place, rows=rows
            )
            new_k.append(k)
            new_v.append(v)
            return y

        for i, layer in enumerate(self.layers):
            h = self.resid(f"L{i}.resid_pre", h)
            h = layer(h, lambda x, i=i: attend(x, i))
            h = self.resid(f"L{i}.resid_post", h)
        if not all_logits:
            h = h[:, -1:] if last is None else h.gather(1, last.view(-1, 1, 1).expand(-1, 1, h.shape[-1]))
        return self.logits(h), tuple(new_k), tuple(new_v)

    def new_cache(self, batch: int, max_len: int, dtype: torch.dtype | None = None) -> LMCache:
        """Zeroed static buffers of capacity max_len for every layer, in the model's dtype (or `dtype`)."""
        for name, v in (("batch", batch), ("max_len", max_len)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InputError(f"{name}={v!r} must be a positive integer")
        dtype = dtype or self.dtype
        if not isinstance(dtype, torch.dtype):
            raise InputTypeError(f"dtype={dtype!r} must be a torch.dtype")
        device = self.embed.tokens.weight.device
        need = sum(batch * a.kv_heads_ * max_len * (a.d_k_ + a.d_v_) * dtype.itemsize for a in self.spec.attention)
        if device.type != "meta":
            check_fits(need, f"a static cache of {self.spec.layers} layers (batch={batch}, max_len={max_len})")
        specs = self.spec.attention
        keys = tuple(torch.zeros(batch, a.kv_heads_, max_len, a.d_k_, dtype=dtype, device=device) for a in specs)
        values = tuple(torch.zeros(batch, a.kv_heads_, max_len, a.d_v_, dtype=dtype, device=device) for a in specs)
        return LMCache(keys, values)

    @torch.no_grad()
    def generate(
        self,
        input_ids: Tensor,
        max_new_tokens: int,
        attention_mask: Tensor | None = None,
        eos_token_id: int | None = None,
        pad_token_id: int | None = None,
    ) -> Tensor:
        """Greedy decoding on a static cache of prompt + max_new_tokens: (b, t + n) int64, n <= max_new_tokens.
        With spec.longrope_recompute, the step at cache length spec.recompute_at runs the whole sequence."""
        max_new_tokens = new_token_count(max_new_tokens)
        eos_token_id = token_id(eos_token_id, self.spec.vocab, "eos_token_id")
        pad_token_id = token_id(pad_token_id, self.spec.vocab, "pad_token_id")
        self._check_ids(input_ids, None)
        b, t = input_ids.shape
        given = None
        if attention_mask is not None:  # the one rule of every generate (zoo/generation_inputs.py): 0/1, left
            if not isinstance(attention_mask, Tensor):
                raise InputTypeError(f"attention_mask must be a tensor (b t), got {type(attention_mask).__name__}")
            real = left_padded_mask(attention_mask.detach().cpu().numpy(), (b, t))
            given = torch.from_numpy(real).to(input_ids.device)
        cache = self.new_cache(b, t + max_new_tokens)
        key_mask = torch.zeros(b, cache.capacity, dtype=torch.bool, device=input_ids.device)
        key_mask[:, :t] = True if given is None else given
        pad = eos_token_id if pad_token_id is None else pad_token_id
        done = torch.zeros(b, dtype=torch.bool, device=input_ids.device)
        out, ids = [input_ids], input_ids
        for _ in range(max_new_tokens):
            if cache.length and cache.length == self.spec.recompute_at:
                # transformers' Phi-3 generate drops its cache at the first step past original_max and runs the
                # whole sequence again: every key takes the long factors, not only the new ones
                ids, cache.length = torch.cat(out, dim=1), 0
            past_len = torch.tensor(cache.length, dtype=torch.long, device=input_ids.device)
            check_room(cache.capacity, cache.length, ids.shape[1], fix="generate sizes its cache itself; report this")
            logits, _, _ = self.step(ids, cache.keys, cache.values, past_len, key_mask, in_place=True)
            cache.length += ids.shape[1]
            ids = logits[:, -1].argmax(-1, keepdim=True)
            if eos_token_id is not None:
                ids = torch.where(done[:, None], torch.full_like(ids, pad), ids)
                done = done | (ids[:, 0] == eos_token_id)
            out.append(ids)
            if eos_token_id is not None and bool(done.all()):
                break
            key_mask[:, cache.length] = True
        return torch.cat(out, dim=1)

    def _check_ids(self, input_ids: Tensor, attention_mask: Tensor | None) -> Tensor | None:
        """Eager checks of a call's token ids and mask; the mask as (b t) bool (None: every token real)."""
        if not isinstance(input_ids, Tensor) or input_ids.dtype != torch.long or input_ids.dim() != 2:
            what = type(input_ids).__name__
            if isinstance(input_ids, Tensor):
                what = f"{input_ids.dtype} {tuple(input_ids.shape)}"
            raise InputTypeError(f"input_ids must be an int64 tensor (b t), got {what}")
        if input_ids.numel() == 0:
            raise InputError(f"input_ids {tuple(input_ids.shape)} is empty; give at least one token per row")
        lo, hi = int(input_ids.min()), int(input_ids.max())
        if lo < 0 or hi >= self.spec.vocab:
            raise InputError(f"input_ids hold {lo if lo < 0 else hi}, outside the vocabulary 0..{self.spec.vocab - 1}")
        if attention_mask is None:
            return None
        if not isinstance(attention_mask, Tensor) or tuple(attention_mask.shape) != tuple(input_ids.shape):
            got = tuple(attention_mask.shape) if isinstance(attention_mask, Tensor) else type(attention_mask).__name__
            raise InputError(f"attention_mask must be a tensor of input_ids' shape {tuple(input_ids.shape)}, got {got}")
        if attention_mask.dtype != torch.bool:
            if attention_mask.is_floating_point() or bool(((attention_mask != 0) & (attention_mask != 1)).any()):
                raise InputError("attention_mask must hold 0/1 (or bool): 1 = a real token, 0 = padding")
            attention_mask = attention_mask.bool()
        return attention_mask


__all__ = ["RESIDUALS", "DecoderLM", "DecoderLayer", "LMCache", "LMSpec"]
