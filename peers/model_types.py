"""What each transformers family's attention module computes from its config, once per `model_type`.

A row of the family table (`peers.classes`) reads a live module: its projections and attributes such as
`head_dim`, `scaling`, `sliding_window`, `use_rope`. Those attributes are what the module's __init__
computes from the config; `FAMILIES[model_type].attrs(config, layer)` computes the same from a config
alone, so `peers.config` can hand the row a stand-in for the module (see there). Each `Family` also says
which config key turns the projection biases on and where layer N's attention sits in a checkpoint.

No transformers here: configs are dicts (read through `ConfigView`, with the family's aliases).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor

from zoo.errors import HFConversionError
from zoo.modifiers import alibi_slopes

from . import latent


class ConfigView:
    """Attribute access over a config dict, with the family's aliases (GPT-2's n_embd is hidden_size)."""

    def __init__(self, data: dict, aliases: dict[str, str] | None = None) -> None:
        self._data, self._aliases = data, aliases or {}

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        key = self._aliases.get(name, name)
        if key not in self._data:
            raise AttributeError(f"the config has no {key!r}")
        return self._data[key]

    def get(self, name: str, default: Any = None) -> Any:
        return getattr(self, name, default)


# -- what each family's attention __init__ computes from its config -------------------------------


def _head_dim(cfg: ConfigView) -> int:
    return cfg.get("head_dim") or cfg.hidden_size // cfg.num_attention_heads


def _layer_types(cfg: ConfigView, fallback: Callable[[ConfigView, int], str] | None, n: int) -> list[str] | None:
    types = cfg.get("layer_types")
    if types is None and fallback is not None:  # configs written before layer_types existed
        types = [fallback(cfg, i) for i in range(n)]
    return types


def _every(pattern_key: str | None, default: int) -> Callable[[ConfigView, int], str]:
    """Every `pattern_key`-th layer (1-based) is global, the others slide."""

    def fn(cfg: ConfigView, i: int) -> str:
        every = (cfg.get(pattern_key) if pattern_key else None) or default
        return "sliding_attention" if (i + 1) % every else "full_attention"

    return fn


def _from_max_window_layers(cfg: ConfigView, i: int) -> str:
    on = cfg.get("sliding_window") is not None and cfg.get("use_sliding_window", True)
    return "sliding_attention" if on and i >= cfg.get("max_window_layers", 0) else "full_attention"


def _all_if_windowed(cfg: ConfigView, i: int) -> str:
    """Qwen3-MoE: with use_sliding_window, every layer slides (its module keeps config.sliding_window)."""
    on = cfg.get("sliding_window") is not None and cfg.get("use_sliding_window", False)
    return "sliding_attention" if on else "full_attention"


def llama_like(
    *,
    scaling: Callable[[ConfigView, int], float] | None = None,
    kinds: Callable[[ConfigView, int], str] | None = None,
    extra: Callable[[ConfigView, int, dict], dict] | None = None,
) -> Callable[[ConfigView, int], dict]:
    """Attributes of a LLaMA-style attention module: head_dim, scaling, layer_type, sliding_window."""

    def fn(cfg: ConfigView, i: int) -> dict:
        d = _head_dim(cfg)
        types = _layer_types(cfg, kinds, cfg.num_hidden_layers)
        kind = types[i] if types is not None else None
        window = cfg.get("sliding_window") if kind == "sliding_attention" else None
        attrs = dict(
            layer_idx=i,
            head_dim=d,
            scaling=scaling(cfg, d) if scaling else d**-0.5,
            is_causal=not cfg.get("use_bidirectional_attention", False),
            layer_type=kind,
            sliding_window=window,
            is_sliding=kind == "sliding_attention",
        )
        return extra(cfg, i, attrs) if extra else attrs

    return fn


def _gemma_scaling(cfg: ConfigView, d: int) -> float:
    return cfg.query_pre_attn_scalar**-0.5


def _rotary_ndims(cfg: ConfigView, i: int, attrs: dict) -> dict:
    factor = _rope(cfg).get("partial_rotary_factor", 1.0)
    return dict(attrs, rotary_ndims=int(attrs["head_dim"] * factor), qk_layernorm=cfg.get("qk_layernorm", False))


def _softcap(cfg: ConfigView, i: int, attrs: dict) -> dict:
    return dict(attrs, attn_logit_softcapping=cfg.get("attn_logit_softcapping"))


def _use_rope(cfg: ConfigView, i: int) -> bool:
    """Layer i's rotary from no_rope_layers (1 = rotary), or, where the config leaves it out, its config
    class's default: a NoPE layer every no_rope_layer_interval layers (4), the last of each run of 4."""
    every = cfg.get("no_rope_layer_interval", 4)
    n = cfg.num_hidden_layers
    return bool((cfg.get("no_rope_layers") or [int((j + 1) % every != 0) for j in range(n)])[i])


def _smollm3_kind(cfg: ConfigView, i: int) -> str:
    """SmolLM3Config's layer_types where the config leaves them out: its NoPE layers slide (with
    use_sliding_window and a sliding_window), its rotary layers do not."""
    on = cfg.get("use_sliding_window", False) and cfg.get("sliding_window") is not None
    return "sliding_attention" if on and not _use_rope(cfg, i) else "full_attention"


def _smollm3(cfg: ConfigView, i: int, attrs: dict) -> dict:
    window = attrs["sliding_window"] if cfg.get("use_sliding_window", False) else None
    return dict(attrs, use_rope=_use_rope(cfg, i), sliding_window=window)


def _exaone4(cfg: ConfigView, i: int, attrs: dict) -> dict:
    return dict(attrs, sliding_window=cfg.get("sliding_window"))


def _qwen3_next(cfg: ConfigView, i: int, attrs: dict) -> dict:
    """Its full-attention layers only: the others are gated delta-rule layers (a recurrent state), outside the zoo."""
    every = cfg.get("full_attention_interval", 4)
    n = cfg.num_hidden_layers
    default = ["full_attention" if (j + 1) % every == 0 else "linear_attention" for j in range(n)]
    kinds = cfg.get("layer_types") or default
    if kinds[i] != "full_attention":
        full = [j for j, k in enumerate(kinds) if k == "full_attention"]
        raise HFConversionError(
            f"qwen3_next config: layer {i} is a {kinds[i]} layer (Qwen3NextGatedDeltaNet, a recurrent gated delta "
            f"rule), outside the zoo; its full-attention layers are {full}"
        )
    return attrs


def _llama4(cfg: ConfigView, i: int, attrs: dict) -> dict:
    """use_rope from no_rope_layers (1 = rotary; its config class's default: every 4th layer NoPE), and the
    weightless QK-norm (its eps) on rotary layers with use_qk_norm."""
    use_rope = _use_rope(cfg, i)
    norm = SimpleNamespace(eps=cfg.get("rms_norm_eps", 1e-5)) if use_rope and cfg.get("use_qk_norm", True) else None
    return dict(attrs, use_rope=use_rope, **({"qk_norm": norm} if norm is not None else {}))


def _plain(cfg: ConfigView, i: int) -> dict:
    """The GPT-2-era modules: sizes as module attributes, the head width from the model width."""
    c, h = cfg.hidden_size, cfg.num_attention_heads
    d = c // h
    return dict(
        layer_idx=i,
        layer_id=i,
        embed_dim=c,
        hidden_size=c,
        num_heads=h,
        n_heads=h,
        head_dim=d,
        head_size=d,
        scaling=d**-0.5,
        inv_norm_factor=d**-0.5,
        is_causal=True,
        is_cross_attention=False,
        rotary_dim=cfg.get("rotary_dim"),
        mp_num=4,
    )


def _gpt2(cfg: ConfigView, i: int) -> dict:
    attrs = _plain(cfg, i)
    scaling = attrs["scaling"] if cfg.get("scale_attn_weights", True) else 1.0
    if cfg.get("scale_attn_by_inverse_layer_idx", False):
        scaling /= float(i + 1)
    return dict(attrs, scaling=scaling)


def _gpt_bigcode(cfg: ConfigView, i: int) -> dict:
    attrs = _plain(cfg, i)
    mq = cfg.get("multi_query", True)
    scaling = attrs["scaling"] if cfg.get("scale_attn_weights", True) else 1.0
    return dict(attrs, multi_query=mq, kv_heads=1 if mq else attrs["num_heads"], scaling=scaling)


def _gpt_neox(cfg: ConfigView, i: int) -> dict:
    attrs = _plain(cfg, i)
    return dict(attrs, rotary_ndims=int(attrs["head_size"] * _rope(cfg).get("partial_rotary_factor", 1.0)))


def _gpt_neo(cfg: ConfigView, i: int) -> dict:
    layers = cfg.get("attention_layers")
    if layers is None:
        layers = [kind for kinds, times in cfg.attention_types for _ in range(times) for kind in kinds]
    return dict(_plain(cfg, i), attention_type=layers[i])


def _falcon(cfg: ConfigView, i: int) -> dict:
    new, mq = cfg.get("new_decoder_architecture", False), cfg.get("multi_query", True)
    kv = cfg.get("num_kv_heads") or cfg.num_attention_heads
    return dict(_plain(cfg, i), new_decoder_architecture=new, multi_query=mq, num_kv_heads=kv if (new or not mq) else 1)


def _mpt(cfg: ConfigView, i: int) -> dict:
    attrs, attn = _plain(cfg, i), cfg.get("attn_config") or {}
    scale = attn.get("softmax_scale") or 1 / math.sqrt(attrs["hidden_size"] / attrs["num_heads"])
    return dict(attrs, softmax_scale=scale, clip_qkv=attn.get("clip_qkv"))


def _mpt_slopes(heads: int) -> Tensor:
    """MPT's ALiBi slopes (alibi_bias_max=8): for a head count that is not a power of two, the
    odd then the even slopes of the next power of two (BLOOM's rule differs)."""
    p = 2 ** math.ceil(math.log2(heads))
    slopes = 1.0 / torch.pow(2.0, torch.arange(1, p + 1, dtype=torch.float32) * (8.0 / p))
    if p != heads:
        slopes = torch.cat([slopes[1::2], slopes[::2]])[:heads]
    return slopes


def _rope(cfg: ConfigView) -> dict:
    params = cfg.get("rope_parameters")
    return params if isinstance(params, dict) else {}


# -- the families ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Family:
    """One config model_type: its row, its module's attributes, its bias flag, where its attention sits."""

    cls: str  # the family table row (peers.classes) it reads with
    attrs: Callable[[ConfigView, int], dict]  # config, layer -> the attention module's own attributes
    bias: str | bool = "attention_bias"  # the config key saying the projections carry biases, or a constant
    where: str = "layers.{layer}.self_attn"  # the layer's attention module in the model (checkpoint names)
    aliases: dict[str, str] = field(default_factory=dict)
    slopes: Callable[[int], Tensor] | None = None  # ALiBi slopes without transformers
    # the rotary defaults of its transformers config class where rope_parameters leaves them out: the
    # top-level keys read for rope_theta and partial_rotary_factor, and their defaults (None: unset)
    theta: float = 10000.0
    partial: float | None = None
    rope_keys: tuple[str, str] = ("rope_theta", "partial_rotary_factor")
    # the rope_parameters its config class fills in where a config.json gives none (gpt-oss: yarn); None: default
    rope: dict | None = None

    def has_bias(self, cfg: ConfigView) -> bool:
        return bool(cfg.get(self.bias, False)) if isinstance(self.bias, str) else self.bias

    def key(self, name: str) -> str:
        """The config's own name for a transformers config key (GPT-2's n_embd for hidden_size)."""
        return self.aliases.get(name, name)


LLAMA = llama_like()
# GptOssConfig's rope_parameters where a config gives none (transformers 5.24)
GPT_OSS_ROPE = {
    "rope_type": "yarn",
    "factor": 32.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 4096,
}
SLIDING = llama_like(kinds=_from_max_window_layers)
GPT = {"hidden_size": "n_embd", "num_attention_heads": "n_head", "num_hidden_layers": "n_layer"}

FAMILIES: dict[str, Family] = {
    "llama": Family("LlamaAttention", LLAMA),
    "mistral": Family("MistralAttention", LLAMA, bias=False),
    "mixtral": Family("MixtralAttention", LLAMA, bias=False, theta=1e6),
    "gemma": Family("GemmaAttention", LLAMA),
    "gemma2": Family("Gemma2Attention", llama_like(scaling=_gemma_scaling, kinds=_every(None, 2), extra=_softcap)),
    "gemma3_text": Family(
        "Gemma3Attention", llama_like(scaling=_gemma_scaling, kinds=_every("sliding_window_pattern", 6)), theta=1e6
    ),
    "qwen2": Family("Qwen2Attention", SLIDING, bias=True),
    "qwen2_moe": Family("Qwen2MoeAttention", SLIDING, bias="qkv_bias"),
    "qwen3": Family("Qwen3Attention", SLIDING),
    "qwen3_moe": Family("Qwen3MoeAttention", llama_like(kinds=_all_if_windowed)),
    "llama4_text": Family("Llama4TextAttention", llama_like(extra=_llama4), theta=500000.0),
    "qwen3_next": Family("Qwen3NextAttention", llama_like(extra=_qwen3_next), partial=0.25),
    "olmo": Family("OlmoAttention", LLAMA),
    "olmo2": Family("Olmo2Attention", LLAMA),
    "olmoe": Family("OlmoeAttention", LLAMA),
    "phi": Family("PhiAttention", llama_like(extra=_rotary_ndims), bias=True, partial=0.5),
    "phi3": Family("Phi3Attention", LLAMA, bias=False, partial=1.0),
    "cohere": Family("CohereAttention", LLAMA, theta=5e5),
    "cohere2": Family("Cohere2Attention", llama_like(kinds=_every("sliding_window_pattern", 4))),
    "stablelm": Family("StableLmAttention", llama_like(extra=_rotary_ndims), bias="use_qkv_bias", partial=0.25),
    "starcoder2": Family("Starcoder2Attention", LLAMA, bias="use_bias"),
    "granite": Family("GraniteAttention", llama_like(scaling=lambda cfg, d: cfg.attention_multiplier)),
    "persimmon": Family("PersimmonAttention", llama_like(extra=_rotary_ndims), bias=True, partial=0.5),
    "helium": Family("HeliumAttention", LLAMA, theta=1e5),
    "nemotron": Family("NemotronAttention", LLAMA, partial=0.5),
    "smollm3": Family("SmolLM3Attention", llama_like(kinds=_smollm3_kind, extra=_smollm3), theta=2e6),
    "exaone4": Family("Exaone4Attention", llama_like(kinds=_every("sliding_window_pattern", 4), extra=_exaone4)),
    "glm": Family("GlmAttention", LLAMA, partial=0.5),
    "gpt_neox": Family(
        "GPTNeoXAttention",
        _gpt_neox,
        where="layers.{layer}.attention",
        partial=0.25,
        rope_keys=("rotary_emb_base", "rotary_pct"),
    ),
    # attention sinks; layer_types alternate sliding and full where the config leaves them out
    "gpt_oss": Family("GptOssAttention", llama_like(kinds=_every(None, 2)), theta=150000.0, rope=GPT_OSS_ROPE),
    # latent attention (peers/latent.py): Kimi-K2 ships a deepseek_v3 config
    "deepseek_v3": Family("DeepseekV3Attention", latent.attrs),
    "deepseek_v2": Family("DeepseekV2Attention", latent.attrs),
    "minicpm3": Family("MiniCPM3Attention", latent.attrs),
    "gpt2": Family("GPT2Attention", _gpt2, bias=True, where="h.{layer}.attn", aliases=GPT),
    "bloom": Family(
        "BloomAttention",
        _plain,
        bias=True,
        where="h.{layer}.self_attention",
        aliases={"num_attention_heads": "n_head", "num_hidden_layers": "n_layer"},
        slopes=lambda h: torch.tensor(alibi_slopes(h), dtype=torch.float32),
    ),
    "falcon": Family("FalconAttention", _falcon, bias="bias", where="h.{layer}.self_attention"),
    "gptj": Family("GPTJAttention", _plain, bias=False, where="h.{layer}.attn", aliases=GPT),
    "codegen": Family("CodeGenAttention", _plain, bias=False, where="h.{layer}.attn", aliases=GPT),
    "gpt_neo": Family(
        "GPTNeoSelfAttention",
        _gpt_neo,
        bias=True,
        where="h.{layer}.attn.attention",
        aliases={"num_attention_heads": "num_heads", "num_hidden_layers": "num_layers"},
    ),
    "gpt_bigcode": Family("GPTBigCodeAttention", _gpt_bigcode, bias=True, where="h.{layer}.attn", aliases=GPT),
    "opt": Family("OPTAttention", _plain, bias="enable_bias", where="decoder.layers.{layer}.self_attn"),
    "mpt": Family(
        "MptAttention",
        _mpt,
        bias=False,
        where="blocks.{layer}.attn",
        aliases={"num_attention_heads": "n_heads", "hidden_size": "d_model", "num_hidden_layers": "n_layers"},
        slopes=_mpt_slopes,
    ),
}
# max_position_embeddings where a config.json leaves it out: its transformers config class's default
# (5.24), which fills in a scaled rotary's original_max_position_embeddings and yarn's factor; else 2048
MAX_POSITIONS = {
    **dict.fromkeys(("mistral", "mixtral", "gemma3_text", "glm", "llama4_text", "gpt_oss"), 131072),
    **dict.fromkeys(("gemma", "gemma2", "cohere", "cohere2"), 8192),
    **dict.fromkeys(("qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "qwen3_next", "smollm3"), 32768),
    **dict.fromkeys(("phi3", "stablelm", "starcoder2", "helium", "nemotron", "olmoe"), 4096),
    "persimmon": 16384,
}
# the keys whose transformers default is True when a config.json leaves them out
DEFAULT_TRUE = {"gpt_neox": "attention_bias", "opt": "enable_bias", "gpt_oss": "attention_bias"}

# -- copies and the attention of hybrid models (peers/copies.py), read from a config as their family is
FAMILIES.update(
    {
        "solar_open": Family("SolarOpenAttention", LLAMA, bias=False, theta=1e6),
        "hyperclovax": Family("HyperCLOVAXAttention", llama_like(scaling=lambda cfg, d: cfg.attention_multiplier)),
        "minimax": Family("MiniMaxAttention", LLAMA, bias=False, theta=1e6),
        "jamba": Family("JambaAttention", LLAMA, bias=False),  # no rotary: its row reads none
        "falcon_h1": Family(
            "FalconH1Attention", llama_like(extra=lambda cfg, i, attrs: dict(attrs, key_multiplier=cfg.key_multiplier))
        ),
        "lfm2": Family("Lfm2Attention", LLAMA, bias=False, theta=1e6, aliases={"rms_norm_eps": "norm_eps"}),
    }
)
