"""zoo.from_hf / zoo.to_hf against transformers' own models.

Each case builds a tiny model from a config with random weights (no download), runs it with
its own masks (causal, sliding window, right padding), captures one attention module's input
and output with forward hooks, and compares the converted zoo block at max abs error <= 1e-5
(fp32): in eager torch, and under ONNX Runtime for the lowerings that can express the block
(one torch-exported lowering per family plus ort-gqa by default, all of them with -m slow).
Round trip: to_hf(from_hf(m), a fresh copy of m) computes m's output.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable
from dataclasses import dataclass

import hf_cases
import hf_cases_copies
import hf_cases_gated
import hf_cases_llama4
import hf_cases_long
import hf_cases_qknorm
import hf_cases_sinks
import pytest
import torch
from torch import Tensor, nn

import helpers
import peers.rows
import peers.transformers
import zoo
import zoo.heads  # zoo loads its modules on first use; this file reads zoo.heads directly
from export import OnnxSession, export_onnx
from export.choice import why_not
from export.names import LOWERINGS

transformers = pytest.importorskip("transformers", reason="transformers is in the [hf] and [test] extras")

ATOL = 1e-5  # fp32
B, T, VOCAB = 2, 10, 50  # T > every window below, so the windows matter
WINDOW = 4
SMALL = dict(hidden_size=64, num_attention_heads=4, intermediate_size=64, vocab_size=VOCAB)


@dataclass
class Case:
    """make() -> (model, attention module, model kwargs); text models right-pad their second row."""

    make: Callable[[], tuple[nn.Module, nn.Module, dict]]
    output_is_dense_of: Callable[[nn.Module], nn.Module] | None = None  # BERT: the output dense
    residual_kwarg: str | None = None  # BLOOM adds this argument to its output
    spec_checks: dict | None = None  # spec fields the block must hold (the config made concrete)
    variant: bool = False  # a second case of a family: its torch-exported lowerings run only when slow
    layernorm: str = "output.LayerNorm"  # with output_is_dense_of: the LayerNorm after the block
    # pre-LayerNorm BERT copies: the block's input is this submodule's (the module's LayerNorm runs before it)
    input_of: Callable[[nn.Module], nn.Module] | None = None


def _ids(keep: Tensor | None = None) -> dict:
    g = torch.Generator().manual_seed(1)
    # use_cache=False: the captured call is replayed in the round trip, and a cache would grow
    out = {"input_ids": torch.randint(0, VOCAB, (B, T), generator=g), "use_cache": False}
    if keep is not None:
        out["attention_mask"] = keep.long()
    return out


def _keep() -> Tensor:
    keep = torch.ones(B, T, dtype=torch.bool)
    keep[1, T - 3 :] = False  # right padding: the last three keys of row 1
    return keep


def _randomize(model: nn.Module, seed: int = 0) -> nn.Module:
    """Every parameter random (HF initializes biases to 0 and norms to 1, which would hide their bugs)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            centre = 1.0 if "norm" in name.lower() else 0.0  # norm weights near 1, the rest near 0
            p.copy_(centre + 0.15 * torch.randn(p.shape, generator=g))
    return model.eval()


def _causal_lm(cls_name: str, config_name: str, layer: Callable[[nn.Module], nn.Module], **cfg):
    def make():
        config = getattr(transformers, config_name)(attn_implementation="eager", **cfg)
        model = _randomize(getattr(transformers, cls_name)(config))
        return model, layer(model), _ids(_keep())

    return make


def _bert(is_decoder: bool = False):
    def make():
        cfg = transformers.BertConfig(
            **SMALL, num_hidden_layers=1, max_position_embeddings=32, is_decoder=is_decoder, attn_implementation="eager"
        )
        model = _randomize(transformers.BertModel(cfg, add_pooling_layer=False))
        return model, model.encoder.layer[0].attention, _ids(_keep())

    return make


def _gpt2():
    # layer 1 with scale_attn_by_inverse_layer_idx: its scale is 1/sqrt(d)/2, not the default
    cfg = transformers.GPT2Config(
        vocab_size=VOCAB,
        n_embd=64,
        n_layer=2,
        n_head=4,
        n_positions=32,
        scale_attn_by_inverse_layer_idx=True,
        bos_token_id=0,
        eos_token_id=0,
    )
    cfg._attn_implementation = "eager"
    model = _randomize(transformers.GPT2Model(cfg))
    return model, model.h[1].attn, _ids(_keep())


def _vit():
    cfg = transformers.ViTConfig(
        hidden_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=64,
        image_size=16,
        patch_size=4,
        qkv_bias=False,  # no q/k/v biases but an o_proj bias: the block holds zeros there
        attn_implementation="eager",
    )
    model = _randomize(transformers.ViTModel(cfg, add_pooling_layer=False))
    pixels = torch.randn(B, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    return model, model.layers[0].attention, {"pixel_values": pixels}


def _bloom(heads: int, width: int):
    def make():
        cfg = transformers.BloomConfig(vocab_size=VOCAB, hidden_size=width, n_layer=1, n_head=heads)
        cfg._attn_implementation = "eager"
        model = _randomize(transformers.BloomModel(cfg))
        return model, model.h[0].self_attention, _ids(_keep())

    return make


LLAMA = dict(SMALL, num_hidden_layers=1, num_key_value_heads=2, max_position_embeddings=64)

CASES: dict[str, Case] = {
    "bert": Case(_bert(), output_is_dense_of=lambda m: m.output.dense, spec_checks={"causal": False}),
    "bert-decoder": Case(
        _bert(is_decoder=True), output_is_dense_of=lambda m: m.output.dense, spec_checks={"causal": True}, variant=True
    ),
    "gpt2": Case(_gpt2, spec_checks={"layout": "combined", "scale": 0.125}),
    "llama": Case(
        _causal_lm(
            "LlamaModel",
            "LlamaConfig",
            lambda m: m.layers[0].self_attn,
            **LLAMA,
            attention_bias=True,
            rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
        ),
        spec_checks={"kv_heads": 2, "rope_theta": 500000.0, "bias": True},
    ),
    "mistral": Case(
        _causal_lm("MistralModel", "MistralConfig", lambda m: m.layers[0].self_attn, **LLAMA, sliding_window=WINDOW),
        spec_checks={"window": WINDOW},
    ),
    # Gemma-2: layer 0 slides, layer 1 is global; a small cap so that tanh bends the scores
    "gemma2-sliding": Case(
        _causal_lm(
            "Gemma2Model",
            "Gemma2Config",
            lambda m: m.layers[0].self_attn,
            **dict(LLAMA, num_hidden_layers=2),
            head_dim=16,
            query_pre_attn_scalar=24,
            attn_logit_softcapping=1.5,
            sliding_window=WINDOW,
        ),
        spec_checks={"window": WINDOW, "softcap": 1.5, "scale": 24**-0.5},
    ),
    "gemma2-global": Case(
        _causal_lm(
            "Gemma2Model",
            "Gemma2Config",
            lambda m: m.layers[1].self_attn,
            **dict(LLAMA, num_hidden_layers=2),
            head_dim=16,
            query_pre_attn_scalar=24,
            attn_logit_softcapping=1.5,
            sliding_window=WINDOW,
        ),
        spec_checks={"window": None, "softcap": 1.5},
        variant=True,
    ),
    "qwen3": Case(
        _causal_lm("Qwen3Model", "Qwen3Config", lambda m: m.layers[0].self_attn, **LLAMA, head_dim=16),
        spec_checks={"qk_norm": "head"},
    ),
    # Qwen3's sliding layers (layer i slides when i >= max_window_layers)
    "qwen3-sliding": Case(
        _causal_lm(
            "Qwen3Model",
            "Qwen3Config",
            lambda m: m.layers[0].self_attn,
            **LLAMA,
            head_dim=16,
            use_sliding_window=True,
            sliding_window=WINDOW,
            max_window_layers=0,
        ),
        spec_checks={"qk_norm": "head", "window": WINDOW},
        variant=True,
    ),
    "olmo2": Case(
        _causal_lm("Olmo2Model", "Olmo2Config", lambda m: m.layers[0].self_attn, **LLAMA),
        spec_checks={"qk_norm": "full", "qk_norm_eps": 1e-5},
    ),
    "bloom": Case(_bloom(4, 64), residual_kwarg="residual", spec_checks={"alibi": True, "layout": "combined"}),
    # 6 heads: not a power of two, where BLOOM's slopes take every other slope of the next power
    "bloom-6-heads": Case(_bloom(6, 48), residual_kwarg="residual", spec_checks={"alibi": True}, variant=True),
    "gpt-neox": Case(
        _causal_lm(
            "GPTNeoXModel",
            "GPTNeoXConfig",
            lambda m: m.layers[0].attention,
            **SMALL,
            num_hidden_layers=1,
            max_position_embeddings=64,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        ),
        spec_checks={"rope_dim": 4, "layout": "combined"},
    ),
    "phi": Case(
        _causal_lm("PhiModel", "PhiConfig", lambda m: m.layers[0].self_attn, **LLAMA),
        spec_checks={"rope_dim": 8, "kv_heads": 2},
    ),
    # Falcon-7B's multi-query layout, with biases; and Falcon-40B's grouped one (2 kv heads)
    "falcon-mq": Case(
        _causal_lm(
            "FalconModel",
            "FalconConfig",
            lambda m: m.h[0].self_attention,
            **SMALL,
            num_hidden_layers=1,
            multi_query=True,
            bias=True,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        ),
        spec_checks={"kv_heads": 1, "layout": "combined", "bias": True},
    ),
    "falcon-grouped": Case(
        _causal_lm(
            "FalconModel",
            "FalconConfig",
            lambda m: m.h[0].self_attention,
            **SMALL,
            num_hidden_layers=1,
            new_decoder_architecture=True,
            num_kv_heads=2,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        ),
        spec_checks={"kv_heads": 2, "bias": False},
        variant=True,
    ),
    "falcon-mha": Case(
        _causal_lm(
            "FalconModel",
            "FalconConfig",
            lambda m: m.h[0].self_attention,
            **SMALL,
            num_hidden_layers=1,
            multi_query=False,
            bias=True,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        ),
        spec_checks={"kv_heads": None, "layout": "combined"},
        variant=True,
    ),
    "vit": Case(_vit, spec_checks={"causal": False, "bias": True}),
}

# the further families (tests/hf_cases.py), each with its own tiny model
CASES.update({name: Case(**fields) for name, fields in hf_cases.CASES.items()})
# the scaled rotary kinds at 1,100 positions (tests/hf_cases_long.py)
CASES.update({name: Case(**fields) for name, fields in hf_cases_long.CASES.items()})
# the copies under new class names, at 160 positions (tests/hf_cases_copies.py)
CASES.update({name: Case(**fields) for name, fields in hf_cases_copies.CASES.items()})
# LayerNorm QK-norm (Cohere, StableLM, Persimmon, Phi), at 160 positions (tests/hf_cases_qknorm.py)
CASES.update({name: Case(**fields) for name, fields in hf_cases_qknorm.CASES.items()})
# the gated attention output (Qwen3-Next's full-attention layers), at 160 positions (tests/hf_cases_gated.py)
CASES.update({name: Case(**fields) for name, fields in hf_cases_gated.CASES.items()})
# Llama 4's chunked rotary and NoPE layers, at 160 positions (tests/hf_cases_llama4.py)
CASES.update({name: Case(**fields) for name, fields in hf_cases_llama4.CASES.items()})
# attention sinks (gpt-oss), sliding and full layers, at 200 positions (tests/hf_cases_sinks.py)
CASES.update({name: Case(**fields) for name, fields in hf_cases_sinks.CASES.items()})


@dataclass
class Captured:
    model: nn.Module
    module: nn.Module
    args: tuple
    kwargs: dict
    x: Tensor  # (b t c) the module's input
    context: Tensor | None  # (b s c) cross-attention: the encoder output the module attends to
    y: Tensor  # (b t c) what the zoo block must give
    full: Tensor  # the module's own first output (BERT: after LayerNorm; BLOOM: with the residual)
    keep: Tensor | None  # (b s) True = real token


_CACHE: dict[str, Captured] = {}


def capture(name: str) -> Captured:
    """Run the real model once and keep the attention module's input and output."""
    if name in _CACHE:
        return _CACHE[name]
    case = CASES[name]
    torch.manual_seed(0)
    model, module, inputs = case.make()
    seen: dict = {}

    def pre(mod, args, kwargs):
        seen["args"], seen["kwargs"] = args, dict(kwargs)

    def post(mod, args, kwargs, out):
        seen["full"] = out[0] if isinstance(out, (tuple, list)) else out

    hooks = [
        module.register_forward_pre_hook(pre, with_kwargs=True),
        module.register_forward_hook(post, with_kwargs=True),
    ]
    if case.output_is_dense_of is not None:
        hooks.append(case.output_is_dense_of(module).register_forward_hook(lambda m, a, out: seen.update(dense=out)))
    if case.input_of is not None:
        hooks.append(
            case.input_of(module).register_forward_pre_hook(
                lambda m, a, kw: seen.update(inner=a[0] if a else kw["hidden_states"]), with_kwargs=True
            )
        )
    with torch.no_grad():
        model(**inputs)
    for h in hooks:
        h.remove()
    args, kwargs = seen["args"], seen["kwargs"]
    x = seen["inner"] if "inner" in seen else (args[0] if args else kwargs["hidden_states"])
    # BART / Whisper encoder_attn, T5's EncDecAttention; UMT5 names it encoder_hidden_states
    context = kwargs.get("key_value_states", kwargs.get("encoder_hidden_states"))
    y = seen.get("dense", seen["full"])
    if case.residual_kwarg:
        bound = inspect.signature(module.forward).bind(*args, **kwargs)
        y = y - bound.arguments[case.residual_kwarg]
    keep = inputs["attention_mask"].bool() if "attention_mask" in inputs else None
    _CACHE[name] = Captured(model, module, args, kwargs, x, context, y, seen["full"], keep)
    return _CACHE[name]


def _key_mask(keep: Tensor | None) -> Tensor | None:
    return None if keep is None else keep[:, None, None, :]  # (b 1 1 s): padding hides keys


def eager_error(name: str) -> tuple[str, float]:
    """(class, eager max abs error) of the case: what scripts/measure_hf.py records."""
    c = capture(name)
    with torch.no_grad():
        y = zoo.from_hf(c.module, model=c.model)(c.x, c.context, mask=_key_mask(c.keep))
    return type(c.module).__name__, (y - c.y).abs().max().item()


@pytest.mark.parametrize("name", list(CASES))
def test_eager_parity(name):
    c = capture(name)
    block = zoo.from_hf(c.module, model=c.model)
    for field, value in (CASES[name].spec_checks or {}).items():
        got = getattr(block.spec, field)
        assert got == pytest.approx(value) if isinstance(value, float) else got == value, (field, got, value)
    cls, err = eager_error(name)
    scale = c.y.abs().max().item()
    assert err <= ATOL, f"{name}: eager max abs err {err:.2e} (output max {scale:.2f}) > {ATOL}"
    print(f"{name}: eager max abs err {err:.2e} (output max {scale:.2f})")
    # the error `attnzoo families` shows is this one, measured (scripts/measure_hf.py): rounding
    # may move it between machines, a different function would not stay within the factor
    recorded = peers.transformers.measured_errors().get(name)
    assert recorded is not None, f"{name}: not in peers/measured.json; run scripts/measure_hf.py"
    assert recorded["class"] == cls, (recorded, cls)
    low, high = recorded["eager_max_abs_err"] / 8 - 1e-7, recorded["eager_max_abs_err"] * 8 + 1e-7
    assert low <= err <= high, f"{name}: measured {err:.2e}, peers/measured.json says {recorded}"
    # the window, the cap, the clamp, the rope scale and T5's buckets bite at these sizes: the block
    # without them misses the reference
    for field in ("window", "softcap", "clip_qkv", "rope_scale", "rel_buckets", "chunk", "qk_l2", "temperature_floor"):
        if getattr(block.spec, field) is not None:
            off = {field: None, **({"rel_max_distance": 128} if field == "rel_buckets" else {})}
            without = zoo.heads.build(block.spec.replace(**off), zoo.get_projections(block))
            with torch.no_grad():
                miss = (without(c.x, c.context, mask=_key_mask(c.keep)) - c.y).abs().max().item()
            assert miss > 1e-3, f"{name}: {field} makes no difference here ({miss:.1e})"
    if block.spec.rope_scaling is not None:  # the scaled frequencies matter at these positions too
        off = dict.fromkeys(("rope_scaling", *zoo.modifiers.rope_scaling.ALL))
        without = zoo.heads.build(block.spec.replace(**off), zoo.get_projections(block))
        with torch.no_grad():
            miss = (without(c.x, c.context, mask=_key_mask(c.keep)) - c.y).abs().max().item()
        assert miss > 1e-3, f"{name}: rope_scaling makes no difference here ({miss:.1e})"


# torch's exporter takes seconds per lowering on 2 cores: the default run exports every case
# under one torch-exported lowering (rotating, so that each appears) plus ort-gqa (built node by
# node, fast) where it applies; the rest of the case x lowering matrix is marked slow.
TORCH_EXPORTED = [lw for lw in LOWERINGS if lw != "ort-gqa"]


def _split_lowerings(name: str, block: zoo.MultiHeadAttention) -> tuple[list[str], list[str]]:
    """(fast, slow) lowerings that can express the block."""
    allowed = [lw for lw in LOWERINGS if why_not(lw, block.spec) is None]
    rotation = list(CASES).index(name) % len(TORCH_EXPORTED)
    preferred = TORCH_EXPORTED[rotation:] + TORCH_EXPORTED[:rotation]
    first = next(lw for lw in preferred if lw in allowed)
    # One lowering per case by default (the case x lowering matrix beyond one goes under -m slow,
    # to keep the default run short): ort-gqa where it applies (built by hand, milliseconds), else one traced lowering.
    if "ort-gqa" in allowed:
        fast = ["ort-gqa"]
    else:
        fast = [first] if not CASES[name].variant else []
    return fast, [lw for lw in allowed if lw not in fast]


def _onnx_check(name: str, tmp_path, which: int) -> None:
    c = capture(name)
    block = zoo.from_hf(c.module, model=c.model)
    assert why_not("decomposed", block.spec) is None  # the plain lowering expresses every block
    lowerings = _split_lowerings(name, block)[which]
    if not lowerings:
        if which == 0:
            pytest.skip(f"{name}: a second case of its family; its exports run under -m slow")
        pytest.skip(f"{name}: no further lowering can express {block.spec.describe()}")
    errs = {}
    b, t = c.x.shape[:2]
    s = t if c.context is None else c.context.shape[1]
    mask = None if c.keep is None else c.keep[:, None, :].expand(b, t, s).contiguous()
    for lw in lowerings:
        path = tmp_path / f"{name}-{lw}.onnx"
        export_onnx(block, path, lowering=lw, with_mask=mask is not None)
        y = OnnxSession(str(path), "cpu").run(c.x, context=c.context, mask=mask)
        errs[lw] = (torch.as_tensor(y) - c.y).abs().max().item()
    msg = ", ".join(f"{lw} {e:.2e}" for lw, e in errs.items())
    assert max(errs.values()) <= ATOL, f"{name}: ONNX Runtime max abs err {msg} (> {ATOL})"
    print(f"{name}: ONNX Runtime max abs err {msg}")


@pytest.mark.parametrize("name", list(CASES))
def test_onnx_parity(name, tmp_path):
    _onnx_check(name, tmp_path, 0)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_onnx_parity_every_lowering(name, tmp_path):
    _onnx_check(name, tmp_path, 1)


def _path(c: Captured) -> str:
    return next(n for n, sub in c.model.named_modules() if sub is c.module)


def _replay(module: nn.Module, c: Captured) -> Tensor:
    with torch.no_grad():
        out = module(*c.args, **c.kwargs)
    return out[0] if isinstance(out, (tuple, list)) else out


@pytest.mark.parametrize("name", list(CASES))
def test_round_trip(name):
    """to_hf(from_hf(m), fresh) makes fresh compute m's output; the fresh weights all get overwritten."""
    c = capture(name)
    block = zoo.from_hf(c.module, model=c.model)
    # the module inside a copy of its model (T5's later layers read the first layer's table there)
    model = copy.deepcopy(c.model)
    fresh = _randomize(next(sub for n, sub in model.named_modules() if n == _path(c)), seed=7)
    if CASES[name].output_is_dense_of is not None:  # BERT's LayerNorm is outside the block: keep m's
        norm = peers.rows.value(c.module, CASES[name].layernorm)
        peers.rows.value(fresh, CASES[name].layernorm).load_state_dict(norm.state_dict())
    assert (_replay(fresh, c) - c.full).abs().max().item() > 1e-3  # fresh really differs before
    assert zoo.to_hf(block, fresh, model=model) is fresh
    err = (_replay(fresh, c) - c.full).abs().max().item()
    assert err <= 1e-6, f"{name}: round trip max abs err {err:.2e}"
    # and back again: the same block
    again = zoo.from_hf(fresh, model=model)
    for (k, v), (k2, v2) in zip(block.state_dict().items(), again.state_dict().items()):
        assert k == k2 and torch.equal(v, v2), k


def test_round_trip_from_the_other_layout():
    """A separate-layout block goes into BLOOM's fused projection, a combined one into LLaMA's."""
    bloom, llama = capture("bloom"), capture("llama")
    for c in (bloom, llama):
        block = zoo.from_hf(c.module)
        other = zoo.to_separate(block) if block.spec.layout == "combined" else zoo.to_combined(block)
        fresh = _randomize(copy.deepcopy(c.module), seed=3)
        zoo.to_hf(other, fresh)
        err = (_replay(fresh, c) - c.full).abs().max().item()
        assert err <= 1e-6, f"{type(c.module).__name__}: max abs err {err:.2e}"


# -- refusals ------------------------------------------------------------------------------------


def test_unsupported_class_is_named():
    with pytest.raises(zoo.HFTypeError, match=r"Linear is not a supported .*supported: BertAttention, GPT2Attention"):
        zoo.from_hf(nn.Linear(4, 4))
    with pytest.raises(TypeError, match="expected a transformers attention module, got str"):
        zoo.from_hf("LlamaAttention")


def test_a_lookalike_class_gets_no_hint_pointing_at_itself():
    class LlamaAttention(nn.Module):  # not transformers' own
        pass

    with pytest.raises(zoo.HFTypeError) as e:
        zoo.from_hf(LlamaAttention())
    assert "it holds" not in str(e.value) and "is not a supported transformers attention module" in str(e.value)


def test_a_scale_written_out_as_the_default_fits():
    llama = capture("llama").module
    block = zoo.from_hf(llama)
    spelled = zoo.MultiHeadAttention(block.spec.replace(scale=block.spec.scale_))
    spelled.load_state_dict(block.state_dict())
    zoo.to_hf(spelled, llama)  # "scale 0.25 vs None" before: the same number, spelled out
    with pytest.raises(zoo.HFConversionError, match="scale"):
        zoo.to_hf(zoo.MultiHeadAttention(block.spec.replace(scale=block.spec.scale_ * 2)), llama)


def test_a_whole_layer_points_to_its_attention():
    layer = capture("llama").model.layers[0]
    with pytest.raises(
        zoo.HFTypeError, match=r"LlamaDecoderLayer is not .*it holds self_attn \(LlamaAttention\): pass"
    ):
        zoo.from_hf(layer)


def test_a_part_of_a_block_points_to_the_whole():
    bert = capture("bert").module
    with pytest.raises(zoo.HFTypeError, match="BertSelfAttention: pass its parent BertAttention"):
        zoo.from_hf(bert.self)


def test_dynamic_rope_scaling_is_refused_with_its_reason():
    cfg = transformers.LlamaConfig(**LLAMA, rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4})
    attn = transformers.LlamaModel(cfg).layers[0].self_attn
    with pytest.raises(zoo.HFConversionError, match=r"rope_type='dynamic' \(NTK\) is refused: .*max_seq_len_cached"):
        zoo.from_hf(attn)


def test_linear_rope_scaling_divides_the_positions():
    """LLaMA with rope_type linear: the block's rope_scale, and the same function as the module."""
    cfg = transformers.LlamaConfig(**LLAMA, rope_parameters={"rope_type": "linear", "rope_theta": 1e4, "factor": 2.5})
    model = _randomize(transformers.LlamaModel(cfg))
    block = zoo.from_hf(model.layers[0].self_attn)
    assert block.spec.rope_scale == 2.5 and "positions/2.5" in block.spec.describe()
    x = torch.randn(2, 9, 64)
    pos = torch.arange(9)[None]
    cos_sin = model.rotary_emb(x, pos)
    with torch.no_grad():
        want = model.layers[0].self_attn(x, position_embeddings=cos_sin, attention_mask=None)[0]
        err = (block(x) - want).abs().max().item()
    assert err <= ATOL, f"linear rope: max abs err {err:.2e}"


@pytest.mark.parametrize("name", list(hf_cases_qknorm.CASES))
def test_layernorm_on_qk_is_read_and_matters(name):
    """Cohere's use_qk_norm, StableLM's, Persimmon's and Phi's qk_layernorm (once refused) are LayerNorm
    QK-norm (GLM-4-MoE's use_qk_norm RMSNorm): the block without the norm, or with RMSNorm in place of a
    LayerNorm, misses the module's output."""
    c = capture(name)
    block = zoo.from_hf(c.module, model=c.model)
    assert block.spec.qk_norm is not None
    p = zoo.get_projections(block)
    rms = dict(qk_norm_kind="rms", qk_norm_bias=False)
    for off in (dict(rms, qk_norm=None), rms) if block.spec.qk_norm_kind == "layer" else (dict(rms, qk_norm=None),):
        other = zoo.heads.build(block.spec.replace(**off), p)
        with torch.no_grad():
            miss = (other(c.x, mask=_key_mask(c.keep)) - c.y).abs().max().item()
        assert miss > 1e-3, f"{name}: {off} makes no difference here ({miss:.1e})"


def test_other_unexpressible_configs_are_refused():
    gemma = transformers.Gemma2Config(**LLAMA, head_dim=16, use_bidirectional_attention=True)
    with pytest.raises(zoo.HFConversionError, match="use_bidirectional_attention=True"):
        zoo.from_hf(transformers.Gemma2Model(gemma).layers[0].self_attn)
    falcon = transformers.FalconConfig(**SMALL, num_hidden_layers=1, alibi=True)
    with pytest.raises(zoo.HFConversionError, match="FalconAttention with alibi=True"):
        zoo.from_hf(transformers.FalconModel(falcon).h[0].self_attention)
    gpt2 = transformers.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=1, n_head=4, add_cross_attention=True)
    with pytest.raises(zoo.HFConversionError, match="is_cross_attention=True"):
        zoo.from_hf(transformers.GPT2Model(gpt2).h[0].crossattention)


def test_mismatched_block_is_refused_with_the_fields():
    mistral = capture("mistral").module
    llama_block = zoo.from_hf(capture("llama").module)
    with pytest.raises(
        zoo.HFConversionError, match=r"rope_theta: block 500000.0 vs module 10000.0; window: block None vs module 4"
    ):
        zoo.to_hf(llama_block, mistral)
    with pytest.raises(ValueError, match="does not fit this MistralAttention"):
        zoo.to_hf(zoo.create("mha-causal", d_model=64, heads=4), mistral)
    with pytest.raises(TypeError, match="expected a zoo MultiHeadAttention block, got Linear"):
        zoo.to_hf(nn.Linear(4, 4), mistral)


def test_bias_the_module_cannot_hold_is_refused():
    """ViT without qkv_bias: the block's zero q/k/v biases are fine, a nonzero one is not."""
    c = capture("vit")
    block = zoo.from_hf(c.module)
    with torch.no_grad():
        block.q_proj.bias[0] = 0.5
    with pytest.raises(zoo.HFConversionError, match="q_proj has no bias in the module but the block's is nonzero"):
        zoo.to_hf(block, copy.deepcopy(c.module))


def test_permuted_alibi_heads_do_not_fit_bloom():
    c = capture("bloom")
    block = zoo.permute_heads(zoo.from_hf(c.module), [1, 0, 2, 3])
    with pytest.raises(zoo.HFConversionError, match="ALiBi slopes are not BLOOM's"):
        zoo.to_hf(block, copy.deepcopy(c.module))


def test_a_zoo_made_alibi_block_goes_into_bloom():
    """A block from the registry (the zoo's own slopes, not copied from BLOOM) fits BLOOM."""
    c = capture("bloom-6-heads")
    block = zoo.create("bloom-560m", d_model=48, heads=6)
    fresh = zoo.to_hf(block, copy.deepcopy(c.module))
    bound = inspect.signature(fresh.forward).bind(*c.args, **c.kwargs)
    err = (_replay(fresh, c) - bound.arguments["residual"] - block(c.x, mask=_key_mask(c.keep))).abs().max().item()
    assert err <= ATOL, f"zoo-made ALiBi block in BLOOM: max abs err {err:.2e}"


def test_permuted_heads_round_trip_where_the_module_can_hold_them():
    """LLaMA holds any head order: a permuted block written back computes the same function."""
    c = capture("llama")
    block = zoo.permute_heads(zoo.from_hf(c.module), [1, 0, 3, 2])  # swaps within each kv group
    fresh = zoo.to_hf(block, copy.deepcopy(c.module))
    err = (_replay(fresh, c) - c.full).abs().max().item()
    assert err <= ATOL, f"permuted heads: max abs err {err:.2e}"


def test_zoo_imports_without_transformers():
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['transformers'] = None\n"  # any import of it now fails
        "import zoo; assert callable(zoo.from_hf) and callable(zoo.to_hf); print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


# -- the presets named after real models hold what from_hf reads from those models' configs ----

PRESET_MODULES = {
    "bert-base": ("bert", "BertAttention", "BertConfig", dict(hidden_size=768, num_attention_heads=12)),
    "gpt2-small": ("gpt2", "GPT2Attention", "GPT2Config", dict(n_embd=768, n_head=12)),
    "llama-3-8b": (
        "llama",
        "LlamaAttention",
        "LlamaConfig",
        dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, rope_theta=500000.0),
    ),
    "mistral-7b": (
        "mistral",
        "MistralAttention",
        "MistralConfig",
        dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, sliding_window=4096),
    ),
    "gemma-2-9b": (
        "gemma2",
        "Gemma2Attention",
        "Gemma2Config",
        dict(
            hidden_size=3584,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=256,
            query_pre_attn_scalar=256,
            attn_logit_softcapping=50.0,
            sliding_window=4096,
        ),
    ),
    "qwen3-8b": (
        "qwen3",
        "Qwen3Attention",
        "Qwen3Config",
        dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, head_dim=128, rope_theta=1e6),
    ),
    "olmo-2-7b": (
        "olmo2",
        "Olmo2Attention",
        "Olmo2Config",
        dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=32, rope_theta=500000.0, rms_norm_eps=1e-6),
    ),
    "bloom-560m": ("bloom", "BloomAttention", "BloomConfig", dict(hidden_size=1024, n_head=16)),
    "gpt-neox-20b": (
        "gpt_neox",
        "GPTNeoXAttention",
        "GPTNeoXConfig",
        dict(hidden_size=6144, num_attention_heads=64, rotary_pct=0.25, rotary_emb_base=10000),
    ),
    "phi-2": (
        "phi",
        "PhiAttention",
        "PhiConfig",
        dict(hidden_size=2560, num_attention_heads=32, num_key_value_heads=32, partial_rotary_factor=0.4),
    ),
    "falcon-7b": (
        "falcon",
        "FalconAttention",
        "FalconConfig",
        dict(hidden_size=4544, num_attention_heads=71, multi_query=True, bias=False),
    ),
    "vit-b16": ("vit", "ViTAttention", "ViTConfig", dict(hidden_size=768, num_attention_heads=12, qkv_bias=True)),
    "qwen2-7b": (
        "qwen2",
        "Qwen2Attention",
        "Qwen2Config",
        dict(hidden_size=3584, num_attention_heads=28, num_key_value_heads=4, rope_theta=1e6, use_sliding_window=False),
    ),
    "mixtral-8x7b": (
        "mixtral",
        "MixtralAttention",
        "MixtralConfig",
        dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, rope_theta=1e6, sliding_window=None),
    ),
    "phi-3-mini-4k": (
        "phi3",
        "Phi3Attention",
        "Phi3Config",
        dict(hidden_size=3072, num_attention_heads=32, num_key_value_heads=32, rope_theta=10000.0, sliding_window=2047),
    ),
    "gpt-j-6b": ("gptj", "GPTJAttention", "GPTJConfig", dict(n_embd=4096, n_head=16, rotary_dim=64)),
    "opt-1.3b": ("opt", "OPTAttention", "OPTConfig", dict(hidden_size=2048, num_attention_heads=32, enable_bias=True)),
    "gemma-3-12b-local": (
        "gemma3",
        "Gemma3Attention",
        "Gemma3TextConfig",
        dict(
            hidden_size=3840,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=256,
            query_pre_attn_scalar=256,
            sliding_window=1024,
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "rope_theta": 1e6, "factor": 8.0},
            },
            rms_norm_eps=1e-6,
        ),
    ),
    "gemma-3-12b-global": (
        "gemma3",
        "Gemma3Attention",
        "Gemma3TextConfig",
        dict(
            hidden_size=3840,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=256,
            query_pre_attn_scalar=256,
            sliding_window=1024,
            num_hidden_layers=1,
            layer_types=["full_attention"],  # layer 0 global here (every 6th in the real model)
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "rope_theta": 1e6, "factor": 8.0},
            },
            rms_norm_eps=1e-6,
        ),
    ),
    "llama-3.1-8b": (
        "llama",
        "LlamaAttention",
        "LlamaConfig",
        dict(
            hidden_size=4096,
            num_attention_heads=32,
            num_key_value_heads=8,
            max_position_embeddings=131072,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
        ),
    ),
    "phi-3.5-mini": (
        "phi3",
        "Phi3Attention",
        "Phi3Config",
        dict(
            hidden_size=3072,
            num_attention_heads=32,
            num_key_value_heads=32,
            max_position_embeddings=131072,
            original_max_position_embeddings=4096,
            sliding_window=262144,
            rope_parameters={
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "short_factor": list(zoo.spec("phi-3.5-mini").rope_short_factor),
                "long_factor": list(zoo.spec("phi-3.5-mini").rope_long_factor),
            },
        ),
    ),
    "starcoder2-7b": (
        "starcoder2",
        "Starcoder2Attention",
        "Starcoder2Config",
        dict(
            hidden_size=4608,
            num_attention_heads=36,
            num_key_value_heads=4,
            rope_theta=1e6,
            sliding_window=4096,
            use_bias=True,
        ),
    ),
    "llama-4-scout": (
        "llama4",
        "Llama4TextAttention",
        "Llama4TextConfig",
        dict(
            hidden_size=5120,
            num_attention_heads=40,
            num_key_value_heads=8,
            head_dim=128,
            attention_chunk_size=8192,
            use_qk_norm=True,
            rms_norm_eps=1e-5,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 16.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 1.0,
                "original_max_position_embeddings": 8192,
            },
        ),
    ),
    "deepseek-v3": (
        "deepseek_v3",
        "DeepseekV3Attention",
        "DeepseekV3Config",
        dict(
            hidden_size=7168,
            num_attention_heads=128,
            num_key_value_heads=128,
            q_lora_rank=1536,
            kv_lora_rank=512,
            qk_nope_head_dim=128,
            qk_rope_head_dim=64,
            v_head_dim=128,
            rope_interleave=True,
            max_position_embeddings=163840,
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 40.0,
                "beta_fast": 32,
                "beta_slow": 1,
                "mscale": 1.0,
                "mscale_all_dim": 1.0,
                "original_max_position_embeddings": 4096,
            },
        ),
    ),
    # GptOssConfig's defaults are gpt-oss-20b's attention values; layer 0 slides (layer_types alternate)
    "gpt-oss-20b": (
        "gpt_oss",
        "GptOssAttention",
        "GptOssConfig",
        dict(hidden_size=2880, num_attention_heads=64, num_key_value_heads=8, head_dim=64, sliding_window=128),
    ),
}


def _resolved(s: zoo.AttentionSpec) -> dict:
    """Every field with its default made concrete, so d_k=None and d_k=d_model/heads compare equal."""
    rope_dim = None if s.rope_theta is None else (s.rope_dim or s.d_k_)
    return dict(s.to_dict(), d_k=s.d_k_, d_v=s.d_v_, kv_heads=s.kv_heads_, scale=s.scale_, rope_dim=rope_dim)


@pytest.mark.parametrize("preset", list(PRESET_MODULES))
def test_preset_matches_the_real_config(preset):
    """Full-size modules on the meta device (no memory): the preset is what from_hf reads."""
    import importlib

    family, cls, config_cls, values = PRESET_MODULES[preset]
    config = getattr(transformers, config_cls)(**values)
    module_cls = getattr(importlib.import_module(f"transformers.models.{family}.modeling_{family}"), cls)
    takes_layer = "layer_idx" in helpers.init_parameters(module_cls)
    with torch.device("meta"):
        module = module_cls(config, layer_idx=0) if takes_layer else module_cls(config)
    got = peers.transformers.spec_from_hf(module)
    want = zoo.spec(preset)
    got_r, want_r = _resolved(got.replace(layout=want.layout)), _resolved(want)
    diff = {k: (got_r[k], want_r[k]) for k in want_r if got_r[k] != pytest.approx(want_r[k])}
    assert not diff, f"{preset}: from_hf reads / preset holds {diff}"


def test_every_supported_class_has_a_parity_case():
    """As optimum does for its exporters: a class from_hf accepts without a case here fails."""
    tested = {type(capture(name).module).__name__ for name in CASES}
    missing = sorted(set(peers.transformers.supported_classes()) - tested)
    assert not missing, f"supported by from_hf but not tested against its model: {missing}"


def _modernbert_base(layer: int) -> nn.Module:
    from transformers.models.modernbert.modeling_modernbert import ModernBertAttention

    cfg = transformers.ModernBertConfig(
        hidden_size=768,
        num_attention_heads=12,
        num_hidden_layers=3,
        layer_types=["full_attention", "sliding_attention", "sliding_attention"],  # every 3rd layer global
        local_attention=128,
        global_rope_theta=160000.0,
        local_rope_theta=10000.0,
        attention_bias=False,
    )
    return ModernBertAttention(cfg, layer_idx=layer)


def _whisper_base(cross: bool) -> nn.Module:
    from transformers.models.whisper.modeling_whisper import WhisperAttention

    cfg = transformers.WhisperConfig(d_model=512, encoder_attention_heads=8, decoder_attention_heads=8)
    return WhisperAttention(512, 8, is_decoder=cross, config=cfg)


def _t5_base_encoder() -> nn.Module:
    from transformers.models.t5.modeling_t5 import T5Attention

    # google-t5/t5-base: d_model 768, num_heads 12, d_kv 64, 32 buckets, max_distance 128 (the default)
    cfg = transformers.T5Config(d_model=768, num_heads=12, d_kv=64, relative_attention_num_buckets=32)
    return T5Attention(cfg, has_relative_attention_bias=True, layer_idx=0, is_causal=False)


# presets whose modules are not built from a config alone (ModernBERT's layer kinds, Whisper's
# constructor taking sizes, T5's first layer): module factory on the meta device
OTHER_PRESET_MODULES = {
    "t5-base-encoder": _t5_base_encoder,
    "modernbert-base": lambda: _modernbert_base(0),
    "modernbert-base-local": lambda: _modernbert_base(1),
    "whisper-base-encoder": lambda: _whisper_base(cross=False),
    "whisper-base-cross": lambda: _whisper_base(cross=True),
}


@pytest.mark.parametrize("preset", list(OTHER_PRESET_MODULES))
def test_other_preset_matches_the_real_module(preset):
    with torch.device("meta"):
        module = OTHER_PRESET_MODULES[preset]()
    want = zoo.spec(preset)
    got_r, want_r = _resolved(peers.transformers.spec_from_hf(module).replace(layout=want.layout)), _resolved(want)
    diff = {k: (got_r[k], want_r[k]) for k in want_r if got_r[k] != pytest.approx(want_r[k])}
    assert not diff, f"{preset}: from_hf reads / preset holds {diff}"


def test_a_later_t5_layer_reads_the_first_layers_table():
    """T5 keeps its bias table in the stack's first layer: a later layer needs model=, gets that table, and
    to_hf into it takes only that table (it cannot hold another)."""
    c = capture("t5-layer1")
    with pytest.raises(zoo.HFConversionError, match=r"^T5Attention layer 1 has no relative_attention_bias .*model="):
        zoo.from_hf(c.module)
    first = c.model.encoder.block[0].layer[0].SelfAttention
    block = zoo.from_hf(c.module, model=c.model)
    assert torch.equal(block.mods["rel_buckets"].table, first.relative_attention_bias.weight)
    other = copy.deepcopy(c.model)
    with pytest.raises(zoo.HFConversionError, match="is not inside the T5Model given as model="):
        zoo.from_hf(c.module, model=other)
    permuted = zoo.permute_heads(block, [1, 0, 2, 3])  # same function, its table's columns swapped
    with pytest.raises(zoo.HFConversionError, match="relative bias table is not the one T5Attention layer 1 reads"):
        zoo.to_hf(permuted, c.module, model=c.model)
    # into the first layer it goes, table and all (every layer of the stack reads it from there)
    owner = copy.deepcopy(first)
    zoo.to_hf(zoo.permute_heads(zoo.from_hf(first), [1, 0, 2, 3]), owner)
    assert torch.equal(owner.relative_attention_bias.weight, first.relative_attention_bias.weight[:, [1, 0, 2, 3]])
