"""zoo.from_checkpoint and zoo.spec_from_config against transformers' own models.

Every decoder case of tests/peers/test_hf.py whose config model_type the zoo reads (peers.model_types.FAMILIES):
its model is saved with save_pretrained into a temp folder, the captured layer's block is read back
from the safetensors files, and it must compute the captured output (max abs error <= 1e-5, fp32) and
hold the very tensors from_hf copies. spec_from_config (config object, and the saved config.json) must
give from_hf's spec, and so must the preset `zoo.preset_toml` writes from the config. One sharded
checkpoint exercises the index path. Under ONNX Runtime by default: ort-gqa (built node by node) where
it applies and one traced lowering for LLaMA (the other families' traced lowerings of the same block
run in tests/peers/test_hf.py); the traced lowering of every family's checkpoint block under -m slow.
"""

from __future__ import annotations

import copy

import pytest
import torch

import peers.transformers
import zoo
from export import OnnxSession, export_onnx
from export.choice import why_not
from peers.copies import ROWS
from peers.model_types import FAMILIES

transformers = pytest.importorskip("transformers", reason="transformers is in the [hf] and [test] extras")

from test_hf import ATOL, CASES, capture  # noqa: E402  (after the importorskip)


def _family(name: str) -> str | None:
    return getattr(capture(name).model.config, "model_type", None)


def _decoder_cases() -> list[str]:
    # the model_type of a case is known only once its model is built; build from the config class
    out = []
    for name, case in CASES.items():
        kind = _kind_without_building(case)
        if kind in FAMILIES:
            out.append(name)
    return out


def _kind_without_building(case) -> str | None:
    closure = getattr(case.make, "__closure__", None) or ()
    for cell in closure:
        value = cell.cell_contents
        if isinstance(value, str) and value.endswith("Config"):
            return getattr(transformers, value).model_type
    known = {"_gpt2": "gpt2", "_bloom": "bloom", "_vit": "vit"}
    return known.get(getattr(case.make, "__qualname__", "").split(".")[0])


DECODERS = _decoder_cases()


def _layer(module: torch.nn.Module) -> int:
    for attr in ("layer_idx", "layer_id"):
        if isinstance(getattr(module, attr, None), int):
            return getattr(module, attr)
    return 0


_SAVED: dict[str, tuple] = {}


def _saved(name: str, tmp_path_factory) -> tuple:
    """(folder, layer, captured) of the case's model saved as a checkpoint (once per case)."""
    if name not in _SAVED:
        c = capture(name)
        folder = tmp_path_factory.mktemp(name)
        c.model.save_pretrained(folder)
        _SAVED[name] = (folder, _layer(c.module), c)
    return _SAVED[name]


def _key_mask(keep):
    return None if keep is None else keep[:, None, None, :]


def test_the_decoder_families_are_covered():
    covered = {_kind_without_building(CASES[n]) for n in DECODERS}
    missing = sorted(set(FAMILIES) - covered)
    assert not missing, f"model types spec_from_config reads with no saved-checkpoint case: {missing}"


@pytest.mark.parametrize("name", DECODERS)
def test_from_checkpoint_parity(name, tmp_path_factory):
    folder, layer, c = _saved(name, tmp_path_factory)
    want = zoo.from_hf(c.module).spec
    assert zoo.spec_from_config(c.model.config, layer=layer) == want
    assert zoo.spec_from_config(folder / "config.json", layer=layer) == want
    preset = folder / f"{name}.toml"  # `attnzoo preset` of the same config loads back to the same spec
    preset.write_text(zoo.preset_toml(c.model.config, name, layer=layer))
    assert zoo.read_preset(preset)[1] == want
    block = zoo.from_checkpoint(folder, layer=layer)
    assert block.spec == want
    # the very tensors from_hf copies: test_hf's ONNX checks of that block hold for this one
    ref = zoo.from_hf(c.module).state_dict()
    assert (
        all(torch.equal(v, ref[k]) for k, v in block.state_dict().items()) and ref.keys() == block.state_dict().keys()
    )
    with torch.no_grad():
        y = block(c.x, mask=_key_mask(c.keep))
    err = (y - c.y).abs().max().item()
    assert err <= ATOL, f"{name}: from_checkpoint layer {layer} max abs err {err:.2e} > {ATOL}"
    print(f"{name}: from_checkpoint layer {layer} max abs err {err:.2e}")


def test_sharded_checkpoint_opens_only_the_shards_it_needs(tmp_path):
    c = capture("llama")
    c.model.save_pretrained(tmp_path, max_shard_size="20KB")
    index = __import__("json").loads((tmp_path / "model.safetensors.index.json").read_text())
    prefix = "layers.0.self_attn."
    needed = {f for n, f in index["weight_map"].items() if n.startswith(prefix)}
    others = sorted(set(index["weight_map"].values()) - needed)
    assert len(needed) >= 2 and others, "the shard size should split the attention and leave other shards"
    for f in others:  # a shard the layer does not need may be anything: it is never opened
        (tmp_path / f).write_bytes(b"not a safetensors file")
    block = zoo.from_checkpoint(tmp_path, layer=0)
    with torch.no_grad():
        err = (block(c.x, mask=_key_mask(c.keep)) - c.y).abs().max().item()
    assert err <= ATOL, f"sharded llama: max abs err {err:.2e}"


def test_dtype_is_kept_or_converted(tmp_path):
    c = capture("qwen2")
    copy.deepcopy(c.model).to(torch.bfloat16).save_pretrained(tmp_path)  # the cached model stays fp32
    assert zoo.from_checkpoint(tmp_path).out_proj.weight.dtype == torch.bfloat16
    block = zoo.from_checkpoint(tmp_path, dtype="float32")
    assert block.out_proj.weight.dtype == torch.float32
    with torch.no_grad():
        err = (block(c.x, mask=_key_mask(c.keep)) - c.y).abs().max().item()
    assert err <= 0.1, f"bf16 weights: max abs err {err:.2e}"  # bf16 rounding of the weights only


def test_a_causal_lm_checkpoint_has_its_model_prefix(tmp_path):
    """save_pretrained of *ForCausalLM writes model.layers...; of the base model, layers..."""
    cfg = transformers.MistralConfig(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64, vocab_size=50,
        num_hidden_layers=2, sliding_window=4,
    )  # fmt: skip
    model = transformers.MistralForCausalLM(cfg).eval()
    model.save_pretrained(tmp_path)
    block = zoo.from_checkpoint(tmp_path, layer=1)
    ref = zoo.from_hf(model.model.layers[1].self_attn)
    assert block.spec == ref.spec
    x = torch.randn(2, 7, 64)
    with torch.no_grad():
        assert (block(x) - ref(x)).abs().max().item() <= 1e-6


def test_spec_from_config_refuses_what_from_hf_refuses_and_reads_clip_qkv():
    cfg = transformers.LlamaConfig(
        hidden_size=64, num_attention_heads=4, num_hidden_layers=1, intermediate_size=64, vocab_size=50,
        rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
    )  # fmt: skip
    with pytest.raises(zoo.HFConversionError, match="rope_type='dynamic'"):
        zoo.spec_from_config(cfg)
    cfg.rope_parameters = {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}  # read, as from_hf does
    assert (
        zoo.spec_from_config(cfg).rope_scale
        == 2.0
        == peers.transformers.spec_from_hf(transformers.LlamaModel(cfg).layers[0].self_attn).rope_scale
    )
    olmo = transformers.OlmoConfig(
        hidden_size=64, num_attention_heads=4, num_hidden_layers=1, intermediate_size=64, vocab_size=50, clip_qkv=8.0
    )
    assert zoo.spec_from_config(olmo).clip_qkv == 8.0  # no longer refused: the clip_qkv modifier
    assert zoo.spec_from_config(olmo.to_dict()).clip_qkv == 8.0
    mpt = {"model_type": "mpt", "d_model": 48, "n_heads": 6, "n_layers": 1, "attn_config": {"clip_qkv": 6.0}}
    assert zoo.spec_from_config(mpt).clip_qkv == 6.0
    mpt["attn_config"]["clip_qkv"] = None
    assert zoo.spec_from_config(mpt).clip_qkv is None


def _onnx(name: str, folder, layer: int, c, lowering: str, tmp_path) -> float:
    block = zoo.from_checkpoint(folder, layer=layer)
    b, t = c.x.shape[:2]
    mask = None if c.keep is None else c.keep[:, None, :].expand(b, t, t).contiguous()
    path = tmp_path / f"{name}-{lowering}.onnx"
    export_onnx(block, path, lowering=lowering, with_mask=mask is not None)
    y = OnnxSession(str(path), "cpu").run(c.x, mask=mask)
    return (torch.as_tensor(y) - c.y).abs().max().item()


def _fast_lowering(name: str, spec: zoo.AttentionSpec) -> str | None:
    if why_not("ort-gqa", spec) is None:
        return "ort-gqa"
    return "decomposed" if name == "llama" else None


@pytest.mark.parametrize("name", DECODERS)
def test_from_checkpoint_onnx(name, tmp_path, tmp_path_factory):
    folder, layer, c = _saved(name, tmp_path_factory)
    lowering = _fast_lowering(name, zoo.spec_from_config(folder, layer=layer))
    if lowering is None:
        pytest.skip(f"{name}: ort-gqa cannot express it; its traced lowering runs under -m slow")
    err = _onnx(name, folder, layer, c, lowering, tmp_path)
    assert err <= ATOL, f"{name}: from_checkpoint under ONNX Runtime ({lowering}) max abs err {err:.2e}"
    print(f"{name}: from_checkpoint {lowering} max abs err {err:.2e}")


@pytest.mark.slow
@pytest.mark.parametrize("name", DECODERS)
def test_from_checkpoint_onnx_traced(name, tmp_path, tmp_path_factory):
    folder, layer, c = _saved(name, tmp_path_factory)
    err = _onnx(name, folder, layer, c, "decomposed", tmp_path)
    assert err <= ATOL, f"{name}: from_checkpoint under ONNX Runtime (decomposed) max abs err {err:.2e}"


def test_a_multimodal_gemma3_checkpoint_reads_its_text_stack(tmp_path):
    """Gemma3ForConditionalGeneration: model_type gemma3 with a text_config; the vision tower's layer 0
    has the same attention names, the text stack's is the one read."""
    text = dict(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_hidden_layers=2,
        intermediate_size=64, vocab_size=300, sliding_window=4, query_pre_attn_scalar=16,
        layer_types=["sliding_attention", "full_attention"],
    )  # fmt: skip
    vision = dict(hidden_size=32, num_attention_heads=2, num_hidden_layers=1, intermediate_size=32, image_size=16)
    cfg = transformers.Gemma3Config(text_config=text, vision_config=dict(vision, patch_size=4), mm_tokens_per_image=4)
    model = transformers.Gemma3ForConditionalGeneration(cfg).eval()
    model.save_pretrained(tmp_path)
    x = torch.randn(2, 9, 64)
    for layer, window in ((0, 4), (1, None)):
        ref = zoo.from_hf(model.model.language_model.layers[layer].self_attn)
        block = zoo.from_checkpoint(tmp_path, layer=layer)
        assert block.spec == ref.spec == zoo.spec_from_config(cfg, layer=layer) and block.spec.window == window
        with torch.no_grad():
            assert (block(x) - ref(x)).abs().max().item() <= 1e-6


def _rope_config(**rope) -> dict:
    base = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2}
    return dict(base, num_hidden_layers=2, head_dim=16, attention_bias=False, rms_norm_eps=1e-6, **rope)


def test_rope_scaling_beside_rope_parameters_matches_the_module(tmp_path):
    """A transformers-5 config.json with rope_parameters and also rope_scaling: what transformers builds
    (the scaling applied) is what spec_from_config and from_checkpoint give, at 300 positions; yarn there is
    refused by from_hf and spec_from_config with the same line."""
    import json
    import warnings

    from safetensors.torch import save_file
    from transformers.models.llama import modeling_llama

    default = {"rope_type": "default", "rope_theta": 10000.0}
    data = _rope_config(rope_parameters=default, rope_scaling={"rope_type": "linear", "factor": 4})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = transformers.AutoConfig.for_model(**copy.deepcopy(data))
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    attn = modeling_llama.LlamaAttention(cfg, layer_idx=1).eval()
    x, pos = torch.randn(1, 300, 64), torch.arange(300)[None]
    (tmp_path / "config.json").write_text(json.dumps(data))
    tensors = {f"model.layers.1.self_attn.{k}": v.contiguous() for k, v in attn.state_dict().items()}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    block = zoo.from_checkpoint(tmp_path, layer=1)
    assert block.spec == zoo.spec_from_config(data, layer=1) == zoo.from_hf(attn).spec
    assert block.spec.rope_scale == 4.0
    with torch.no_grad():
        want = attn(x, position_embeddings=modeling_llama.LlamaRotaryEmbedding(cfg)(x, pos), attention_mask=None)[0]
        assert (block(x) - want).abs().max().item() <= ATOL
    # yarn: the same spec both ways (original_max_position_embeddings filled in as transformers does);
    # dynamic NTK: the same refusal both ways
    yarn = _rope_config(rope_parameters=default, rope_scaling={"rope_type": "yarn", "factor": 4.0})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        module = modeling_llama.LlamaAttention(transformers.AutoConfig.for_model(**copy.deepcopy(yarn)), layer_idx=1)
    spec = zoo.spec_from_config(yarn, layer=1)
    assert zoo.from_hf(module).spec == spec and spec.rope_scaling == "yarn" and spec.rope_factor == 4.0
    dynamic = _rope_config(rope_parameters=default, rope_scaling={"rope_type": "dynamic", "factor": 4.0})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = transformers.AutoConfig.for_model(**copy.deepcopy(dynamic))
    with pytest.raises(zoo.HFConversionError) as from_hf:
        zoo.from_hf(modeling_llama.LlamaAttention(cfg, layer_idx=1))
    with pytest.raises(zoo.HFConversionError) as from_config:
        zoo.spec_from_config(dynamic, layer=1)
    assert str(from_hf.value) == str(from_config.value) and "rope_type='dynamic'" in str(from_hf.value)


_DEFAULT = {"rope_type": "default", "rope_theta": 5e5}
_ROPE_VARIANTS = [
    {},
    {"rope_theta": 1234.0},
    {"rope_parameters": _DEFAULT},
    {"rope_parameters": _DEFAULT, "rope_scaling": {"rope_type": "linear", "factor": 4.0}},
    {"rope_theta": 7.0, "rope_parameters": _DEFAULT, "rope_scaling": {"type": "linear", "factor": 2.0}},
    {"rope_parameters": _DEFAULT, "rope_scaling": None},
    {"rope_parameters": _DEFAULT, "rope_scaling": {}},
    {"rope_theta": 1234.0, "rope_parameters": {"rope_type": "linear", "factor": 2.0}},
    {"partial_rotary_factor": 0.5, "rope_scaling": {"rope_type": "linear", "factor": 2.0}},
    {"rotary_emb_base": 777.0, "rotary_pct": 0.5},
    {"rope_local_base_freq": 99.0, "rope_theta": 5.0, "rope_scaling": {"rope_type": "linear", "factor": 8.0}},
    {"rope_parameters": _DEFAULT, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
    {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}},
    {
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0},
        "original_max_position_embeddings": 512,
    },
    {"rope_scaling": {"type": "su", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8}},
]


_READS_ROPE = {row.cls for row in ROWS if row.rope in ("full", "partial")}  # through peers.rows.config_rope


@pytest.mark.parametrize("kind", sorted(k for k, fam in FAMILIES.items() if fam.cls in _READS_ROPE))
def test_rope_keys_resolve_as_transformers_autoconfig(kind):
    """peers.config.rope_parameters (the one reading of the rope keys) against AutoConfig's rope_parameters, for
    each family that reads them, over the key combinations a config.json can hold."""
    import json
    import warnings

    from peers.config import rope_parameters

    base = {"model_type": kind, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2}
    base.update(num_hidden_layers=2, intermediate_size=128, vocab_size=100, max_position_embeddings=4096)
    compared = 0
    for variant in _ROPE_VARIANTS:
        data = json.loads(json.dumps(dict(base, **variant)))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                want = transformers.AutoConfig.for_model(**copy.deepcopy(data)).rope_parameters
        except Exception:  # noqa: BLE001 - a combination this config class refuses: nothing to compare
            continue
        got = rope_parameters(kind, data)
        assert got == want, (kind, variant)
        compared += 1
    assert compared >= 6, f"{kind}: transformers took only {compared} of the variants"
