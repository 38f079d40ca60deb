"""zoo.from_checkpoint's refusals and zoo.spec_from_config's arguments, without transformers.

The checkpoints here are written by hand (config.json + safetensors.torch.save_file) in LLaMA's
naming, from a zoo block: from_checkpoint must give that block back, and refuse each broken variant
(a missing tensor, a wrong shape, a truncated file, a config that does not match, int8 weights) with
one line naming the file and the tensor. tests/peers/test_checkpoint_hf.py checks transformers' own saves.
"""

from __future__ import annotations

import json

import pytest
import torch

import zoo

safetensors_torch = pytest.importorskip("safetensors.torch")

CONFIG = {
    "model_type": "llama",
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "head_dim": 16,  # rope_dim / 2 a multiple of 8: ort-gqa can take it (tests/cli/test_cli_checkpoint.py)
    "attention_bias": False,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}
PREFIX = "model.layers.1.self_attn."


def _tensors(block: zoo.MultiHeadAttention) -> dict[str, torch.Tensor]:
    p = zoo.get_projections(block)
    return {
        PREFIX + "q_proj.weight": p.w_q,
        PREFIX + "k_proj.weight": p.w_k,
        PREFIX + "v_proj.weight": p.w_v,
        PREFIX + "o_proj.weight": p.w_o,
        "model.embed_tokens.weight": torch.zeros(5, 64),
    }


def _write(folder, tensors: dict, config: dict = CONFIG) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    safetensors_torch.save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))


@pytest.fixture
def saved(tmp_path):
    spec = zoo.spec_from_config(CONFIG, layer=1)
    torch.manual_seed(0)
    block = zoo.MultiHeadAttention(spec).eval()
    folder = tmp_path / "ckpt"
    _write(folder, _tensors(block))
    return folder, block


def test_a_hand_written_checkpoint_gives_the_block_back(saved):
    folder, block = saved
    got = zoo.from_checkpoint(folder, layer=1)
    assert got.spec == block.spec
    x = torch.randn(2, 6, 64)
    with torch.no_grad():
        assert torch.equal(got(x), block(x))
    assert zoo.spec_from_config(folder, layer=1) == block.spec  # a folder holding config.json
    assert zoo.spec_from_config(str(folder / "config.json"), layer=1) == block.spec


def test_missing_folder_config_or_weights(tmp_path):
    with pytest.raises(zoo.CheckpointError, match="no such folder"):
        zoo.from_checkpoint(tmp_path / "nope")
    with pytest.raises(zoo.CheckpointError, match="no config.json"):
        zoo.from_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    with pytest.raises(zoo.CheckpointError, match=r"no model.safetensors, model.safetensors.index.json"):
        zoo.from_checkpoint(tmp_path)


def test_a_missing_tensor_is_named(saved):
    folder, block = saved
    tensors = _tensors(block)
    del tensors[PREFIX + "k_proj.weight"]
    _write(folder, tensors)
    with pytest.raises(zoo.CheckpointError, match=r"tensor 'model.layers.1.self_attn.k_proj.weight' is missing") as e:
        zoo.from_checkpoint(folder, layer=1)
    assert "model.safetensors" in str(e.value) and "\n" not in str(e.value)


def test_a_wrong_shape_is_named_with_the_config_shape(saved):
    folder, block = saved
    tensors = _tensors(block)
    tensors[PREFIX + "v_proj.weight"] = torch.zeros(24, 64)
    _write(folder, tensors)
    want = r"v_proj.weight' has shape \(24, 64\), the config implies \(32, 64\)"
    with pytest.raises(zoo.CheckpointError, match=want):
        zoo.from_checkpoint(folder, layer=1)


def test_a_config_that_does_not_match_the_weights(saved):
    folder, block = saved
    (folder / "config.json").write_text(json.dumps(dict(CONFIG, num_key_value_heads=4)))
    with pytest.raises(zoo.CheckpointError, match="kv_heads=4.*the config does not match the weights"):
        zoo.from_checkpoint(folder, layer=1)
    (folder / "config.json").write_text(json.dumps(dict(CONFIG, attention_bias=True)))
    with pytest.raises(zoo.CheckpointError, match=r"config says the projections have biases \(attention_bias\)"):
        zoo.from_checkpoint(folder, layer=1)
    tensors = _tensors(block)
    tensors[PREFIX + "q_proj.bias"] = torch.zeros(64)
    _write(folder, tensors)
    with pytest.raises(zoo.CheckpointError, match=r"holds 'model.layers.1.self_attn.q_proj.bias' but the config"):
        zoo.from_checkpoint(folder, layer=1)


def test_int8_weights_are_refused(saved):
    folder, block = saved
    tensors = _tensors(block)
    tensors[PREFIX + "q_proj.weight"] = torch.zeros(64, 64, dtype=torch.int8)
    _write(folder, tensors)
    with pytest.raises(zoo.CheckpointError, match=r"q_proj.weight' is int8; the block holds float weights"):
        zoo.from_checkpoint(folder, layer=1)


def test_a_truncated_file_is_named(saved):
    folder, _ = saved
    path = folder / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(zoo.CheckpointError, match=r"model.safetensors: not a readable safetensors file") as e:
        zoo.from_checkpoint(folder, layer=1)
    assert "\n" not in str(e.value)
    path.write_bytes(b"\x00" * 3)
    with pytest.raises(zoo.CheckpointError, match=r"model.safetensors: not a readable safetensors file"):
        zoo.from_checkpoint(folder, layer=1)


def test_a_bad_index_is_named(saved):
    folder, _ = saved
    (folder / "model.safetensors.index.json").write_text("{not json")
    with pytest.raises(zoo.CheckpointError, match=r"model.safetensors.index.json: not a safetensors index"):
        zoo.from_checkpoint(folder, layer=1)
    index = {"weight_map": {PREFIX + n: "gone.safetensors" for n in ("q_proj.weight", "k_proj.weight")}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(zoo.CheckpointError, match=r"gone.safetensors: listed in model.safetensors.index.json"):
        zoo.from_checkpoint(folder, layer=1)


def test_layer_and_dtype_arguments(saved):
    folder, _ = saved
    with pytest.raises(zoo.ArgumentError, match=r"layer=2 is out of range: the config has 2 layers \(0..1\)"):
        zoo.from_checkpoint(folder, layer=2)
    with pytest.raises(zoo.ArgumentError, match="layer=-1 must be >= 0"):
        zoo.spec_from_config(CONFIG, layer=-1)
    for bad in ("1", 1.0, True, None):
        with pytest.raises(zoo.InputTypeError, match="layer must be an int >= 0"):
            zoo.spec_from_config(CONFIG, layer=bad)
    with pytest.raises(zoo.InputTypeError, match="dtype must be None"):
        zoo.from_checkpoint(folder, layer=1, dtype="int8")
    assert zoo.from_checkpoint(folder, layer=1, dtype="float64").out_proj.weight.dtype == torch.float64


def test_spec_from_config_refusals(tmp_path):
    with pytest.raises(zoo.HFConversionError, match=r"model_type='t5': spec_from_config and from_checkpoint know"):
        zoo.spec_from_config({"model_type": "t5", "num_layers": 2})
    with pytest.raises(zoo.HFConversionError, match=r"cannot read layer 0 \(the config has no 'hidden_size'"):
        zoo.spec_from_config({k: v for k, v in CONFIG.items() if k != "hidden_size"})
    with pytest.raises(zoo.HFConversionError, match=r"rope_type='dynamic'"):
        zoo.spec_from_config(dict(CONFIG, rope_parameters={"rope_type": "dynamic", "rope_theta": 1e4, "factor": 4.0}))
    with pytest.raises(zoo.HFConversionError, match="no config.json there"):
        zoo.spec_from_config(tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(zoo.HFConversionError, match="holds a JSON object, got list"):
        zoo.spec_from_config(tmp_path)
    with pytest.raises(zoo.InputTypeError, match="config must be a transformers config, a dict or a path"):
        zoo.spec_from_config(42)


def test_an_older_config_json_is_read():
    """Hub configs written before transformers 5: rope_theta at the top, no layer_types."""
    old = {k: v for k, v in CONFIG.items() if k != "rope_parameters"}
    assert zoo.spec_from_config(dict(old, rope_theta=500000.0)).rope_theta == 500000.0
    gemma2 = dict(old, model_type="gemma2", query_pre_attn_scalar=8, sliding_window=4, attn_logit_softcapping=50.0)
    assert zoo.spec_from_config(gemma2, layer=0).window == 4  # even layers slide
    assert zoo.spec_from_config(gemma2, layer=1).window is None
    gemma3 = dict(gemma2, model_type="gemma3_text", rope_theta=1e6, rope_local_base_freq=1e4, sliding_window_pattern=2)
    gemma3["rope_scaling"] = {"rope_type": "linear", "factor": 8.0}  # the global layers' only
    local, glob = zoo.spec_from_config(gemma3, layer=0), zoo.spec_from_config(gemma3, layer=1)
    assert (local.rope_theta, local.window, local.rope_scale) == (1e4, 4, None)
    assert (glob.rope_theta, glob.window, glob.rope_scale) == (1e6, None, 8.0)
    gemma3["rope_scaling"] = {"rope_type": "dynamic", "factor": 8.0}  # NTK stays refused, named
    with pytest.raises(zoo.HFConversionError, match="rope_type='dynamic'"):
        zoo.spec_from_config(gemma3, layer=1)
    t5 = {"model_type": "t5", "d_model": 64, "num_heads": 4, "d_kv": 16, "num_layers": 2}
    with pytest.raises(zoo.HFConversionError, match=r"model_type='t5'.*use zoo.from_hf\(module\)"):
        zoo.spec_from_config(t5)


def test_no_transformers_is_needed(saved):
    import subprocess
    import sys

    folder, _ = saved
    code = (
        "import sys; sys.modules['transformers'] = None\n"  # any import of it now fails
        f"import zoo; b = zoo.from_checkpoint({str(folder)!r}, layer=1)\n"
        f"assert b.spec == zoo.spec_from_config({str(folder)!r}, layer=1); print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_rope_scaling_beside_rope_parameters_is_read_as_transformers_does(saved):
    """transformers 5 lets a non-empty rope_scaling replace rope_parameters whole (rope_theta then from the
    top-level key or the default): linear scaling is applied, other scalings are refused by name."""
    folder, block = saved
    linear = dict(CONFIG, rope_theta=500000.0, rope_scaling={"rope_type": "linear", "factor": 4})
    spec = zoo.spec_from_config(linear, layer=1)
    assert (spec.rope_scale, spec.rope_theta) == (4.0, 500000.0)
    (folder / "config.json").write_text(json.dumps(linear))
    assert zoo.from_checkpoint(folder, layer=1).spec == spec
    legacy = dict(CONFIG, rope_scaling={"type": "linear", "factor": 2.0})  # the older key name, no rope_theta
    assert (zoo.spec_from_config(legacy).rope_scale, zoo.spec_from_config(legacy).rope_theta) == (2.0, 10000.0)
    for empty in (None, {}):  # an empty rope_scaling leaves rope_parameters in charge
        assert zoo.spec_from_config(dict(CONFIG, rope_scaling=empty)) == zoo.spec_from_config(CONFIG)
    with pytest.raises(zoo.HFConversionError, match=r"rope_scaling='linear' must be an object"):
        zoo.spec_from_config(dict(CONFIG, rope_scaling="linear"))
    yarn = dict(CONFIG, rope_scaling={"rope_type": "yarn", "factor": 4.0})  # read since the scaled rotary
    assert zoo.spec_from_config(yarn, layer=1).rope_scaling == "yarn"
    ntk = dict(CONFIG, rope_scaling={"rope_type": "dynamic", "factor": 4.0})  # NTK: refused by name
    with pytest.raises(zoo.HFConversionError, match=r"rope_type='dynamic'"):
        zoo.spec_from_config(ntk, layer=1)
    (folder / "config.json").write_text(json.dumps(ntk))
    with pytest.raises(zoo.HFConversionError, match=r"rope_type='dynamic'"):
        zoo.from_checkpoint(folder, layer=1)


@pytest.mark.parametrize("field", ["hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim"])
@pytest.mark.parametrize("bad", [-4, 0, 2.5, True])
def test_config_size_fields_must_be_positive_integers(saved, field, bad):
    folder, _ = saved
    want = rf"{field}={bad!r} must be a positive integer"
    with pytest.raises(zoo.HFConversionError, match=want):
        zoo.spec_from_config(dict(CONFIG, **{field: bad}))
    (folder / "config.json").write_text(json.dumps(dict(CONFIG, **{field: bad})))
    with pytest.raises(zoo.HFConversionError, match=want):
        zoo.from_checkpoint(folder, layer=1)


def test_config_sizes_past_a_tensor_are_refused():
    with pytest.raises(zoo.HFConversionError, match=r"past what a tensor can hold"):
        zoo.spec_from_config(dict(CONFIG, head_dim=2**62))
    with pytest.raises(zoo.HFConversionError, match=r"num_hidden_layers=-1 must be a positive integer"):
        zoo.spec_from_config(dict(CONFIG, num_hidden_layers=-1))


@pytest.mark.parametrize("heads", [128, 2**31, 10**30])
def test_more_heads_than_hidden_size_names_both_fields(saved, heads):
    folder, _ = saved
    config = dict(CONFIG, num_attention_heads=heads, num_key_value_heads=None, head_dim=None)
    want = rf"hidden_size=64 over num_attention_heads={heads} leaves each head .* 0 channels; fix the config"
    with pytest.raises(zoo.HFConversionError, match=want) as e:
        zoo.spec_from_config(config)
    assert "\n" not in str(e.value)
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(zoo.HFConversionError, match=want):
        zoo.from_checkpoint(folder, layer=1)


def test_kv_heads_not_dividing_heads_names_the_config_keys():
    with pytest.raises(zoo.HFConversionError, match=r"num_key_value_heads=3 must divide num_attention_heads=4"):
        zoo.spec_from_config(dict(CONFIG, num_key_value_heads=3))


@pytest.mark.parametrize("model_type", ["mistral", "qwen2", "qwen2_moe"])
def test_sliding_window_zero_names_the_config_key(model_type):
    config = dict(CONFIG, model_type=model_type, sliding_window=0, use_sliding_window=True)
    with pytest.raises(zoo.HFConversionError, match=r"sliding_window=0 makes layer 1 slide over no keys.*give"):
        zoo.spec_from_config(config, layer=1)
    if model_type != "mistral":  # Qwen2-MoE's config class writes 0 where sliding is off: that is read
        assert zoo.spec_from_config(dict(config, use_sliding_window=False), layer=1).window is None


def _index(folder, shard: str) -> None:
    names = [PREFIX + n for n in ("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight")]
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": dict.fromkeys(names, shard)}))


@pytest.mark.parametrize("shard", ["../elsewhere/x.safetensors", "sub/../../x.safetensors", "/etc/passwd", "//x"])
def test_shard_names_outside_the_checkpoint_folder_are_refused(saved, shard, monkeypatch):
    folder, _ = saved
    outside = folder.parent / "elsewhere"
    outside.mkdir(exist_ok=True)
    (outside / "x.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
    _index(folder, shard)
    import safetensors

    opened = []
    monkeypatch.setattr(safetensors, "safe_open", lambda *a, **k: opened.append(a) or 1 / 0)
    with pytest.raises(zoo.CheckpointError, match=r"outside the checkpoint folder") as e:
        zoo.from_checkpoint(folder, layer=1)
    assert repr(shard) in str(e.value) and "\n" not in str(e.value) and not opened  # refused before any open


def test_a_symlinked_shard_inside_the_folder_is_read(saved):
    """A hub cache's snapshot: the shard is a link into a blobs folder elsewhere; the index names it inside."""
    folder, block = saved
    blobs = folder.parent / "blobs"
    blobs.mkdir()
    (folder / "model.safetensors").rename(blobs / "0123abcd")
    (folder / "model-00001-of-00001.safetensors").symlink_to(blobs / "0123abcd")
    _index(folder, "model-00001-of-00001.safetensors")
    assert torch.equal(zoo.from_checkpoint(folder, layer=1).out_proj.weight, block.out_proj.weight)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_nan_or_inf_weights_are_refused_naming_the_tensor(saved, bad):
    folder, block = saved
    tensors = _tensors(block)
    tensors[PREFIX + "k_proj.weight"] = tensors[PREFIX + "k_proj.weight"].clone()
    tensors[PREFIX + "k_proj.weight"][3, 5] = bad
    _write(folder, tensors)
    kind = "NaN" if bad != bad else "inf"
    want = rf"'model.layers.1.self_attn.k_proj.weight' holds 1 {kind} \(the first at index \(3, 5\)\)"
    with pytest.raises(zoo.CheckpointError, match=want) as e:
        zoo.from_checkpoint(folder, layer=1)
    assert "model.safetensors" in str(e.value) and "\n" not in str(e.value)


def test_a_config_json_file_is_not_a_checkpoint_folder(saved):
    folder, _ = saved
    with pytest.raises(zoo.CheckpointError, match=r"config.json: a file; give the checkpoint folder") as e:
        zoo.from_checkpoint(folder / "config.json", layer=1)
    assert f"({folder})" in str(e.value)
