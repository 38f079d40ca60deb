"""`attnzoo show --config`, `export --config/--checkpoint`, `parity --checkpoint`, `preset`: on a
hand-written LLaMA-style checkpoint (tests/peers/test_checkpoint.py), no transformers needed. Mistakes
are one line on stderr with exit status 2."""

from __future__ import annotations

import pytest
import torch

import zoo
from cli.main import main
from export import OnnxSession

pytest.importorskip("safetensors")

from test_checkpoint import CONFIG, _tensors, _write  # noqa: E402


@pytest.fixture
def ckpt(tmp_path):
    block = zoo.MultiHeadAttention(zoo.spec_from_config(CONFIG, layer=1)).eval()
    _write(tmp_path / "ckpt", _tensors(block))
    return tmp_path / "ckpt", block


def _one_line_error(capsys, code: int, *words: str) -> None:
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    for w in words:
        assert w in err, err


def test_show_a_config_layer(ckpt, capsys):
    folder, block = ckpt
    assert main(["show", "--config", str(folder / "config.json"), "--layer", "1"]) == 0
    out = capsys.readouterr().out
    assert "layer 1" in out and f"{zoo.count_parameters(block.spec):,}" in out
    assert main(["show", "--config", str(folder), "--set", "heads=8", "--set", "kv_heads=4"]) == 0


def test_name_config_and_checkpoint_are_exclusive(ckpt, capsys, tmp_path):
    folder, _ = ckpt
    _one_line_error(capsys, main(["show", "mha-causal", "--config", str(folder)]), "give one of NAME, --config")
    _one_line_error(capsys, main(["show"]), "name the block: give NAME or --config")
    _one_line_error(capsys, main(["show", "mha-causal", "--layer", "1"]), "--layer picks a layer")
    out = str(tmp_path / "x.onnx")
    argv = ["export", "--config", str(folder), "--checkpoint", str(folder), "-o", out]
    _one_line_error(capsys, main(argv), "give one of --config, --checkpoint")
    _one_line_error(capsys, main(["export", "-o", out]), "give NAME or --config or --checkpoint")
    argv = ["export", "--checkpoint", str(folder), "--set", "heads=2", "-o", out]
    _one_line_error(capsys, main(argv), "--set changes a spec")
    _one_line_error(capsys, main(["parity", "mha-*", "--checkpoint", str(folder)]), "give one of PATTERN, --checkpoint")
    with pytest.raises(SystemExit) as e:  # argparse's own refusal: one line, exit 2
        main(["show", "--config", str(folder), "--layer", "-1"])
    assert e.value.code == 2 and "--layer: -1 must be >= 0" in capsys.readouterr().err


def test_export_a_checkpoint_layer_and_run_it(ckpt, capsys, tmp_path):
    folder, block = ckpt
    out = tmp_path / "layer1.onnx"
    argv = ["export", "--checkpoint", str(folder), "--layer", "1", "--lowering", "ort-gqa", "-o", str(out)]
    assert main(argv) == 0
    assert "wrote" in capsys.readouterr().out
    x = torch.randn(2, 5, 64)
    with torch.no_grad():
        err = (torch.as_tensor(OnnxSession(str(out), "cpu").run(x)) - block(x)).abs().max().item()
    assert err <= 1e-5, f"the exported checkpoint layer: max abs err {err:.2e}"
    assert main(argv) == 2 and "--force" in capsys.readouterr().err  # the output rule of every export
    _one_line_error(capsys, main([*argv[:-2], "--layer", "2", "-o", str(tmp_path / "l2.onnx")]), "out of range")
    argv = ["export", "--config", str(folder), "--layer", "0", "--lowering", "ort-gqa", "-o", str(tmp_path / "c.onnx")]
    assert main(argv) == 0 and "random weights" in capsys.readouterr().out


def test_parity_of_a_checkpoint_layer(ckpt, capsys):
    folder, _ = ckpt
    assert main(["parity", "--checkpoint", str(folder), "--layer", "1", "--lowering", "ort-gqa", "-q"]) == 0
    out = capsys.readouterr().out
    assert f"| {folder}:layer1 | ort-gqa | cpu | float32 | plain |" in out and "parity: 2 passed, 0 failed" in out
    _one_line_error(capsys, main(["parity", "--checkpoint", str(folder / "nope")]), "no such folder")


def test_preset_from_a_config(ckpt, capsys, tmp_path):
    folder, block = ckpt
    assert main(["preset", "--config", str(folder), "--name", "my-llama", "--layer", "1"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("# written by `attnzoo preset`") and "kv_heads = 2  # num_key_value_heads 2" in text
    out = tmp_path / "presets" / "my-llama.toml"
    argv = ["preset", "--config", str(folder), "--name", "my-llama", "--layer", "1", "-o", str(out)]
    assert main(argv) == 0 and out.read_text() == text
    _one_line_error(capsys, main(argv), "exists; pass --force")
    assert main([*argv, "--force"]) == 0
    bad = ["preset", "--config", str(folder), "--name", "my-llama", "-o", str(tmp_path / "other.toml")]
    _one_line_error(capsys, main(bad), "a preset's name is its file's stem")
    name, spec, _ = zoo.read_preset(out)
    assert name == "my-llama" and spec == block.spec


def _config(folder, **changes) -> None:
    import json

    (folder / "config.json").write_text(json.dumps(dict(CONFIG, **changes)))


def _every_command(folder, tmp_path) -> list[list[str]]:
    out = str(tmp_path / "every.onnx")
    return [
        ["show", "--config", str(folder), "--layer", "1"],
        ["preset", "--config", str(folder), "--name", "x", "--layer", "1"],
        ["export", "--config", str(folder), "--layer", "1", "-o", out],
        ["export", "--checkpoint", str(folder), "--layer", "1", "-o", out],
        ["parity", "--checkpoint", str(folder), "--layer", "1", "--lowering", "ort-gqa", "-q"],
    ]


@pytest.mark.parametrize("bad", [-4, 0])
def test_every_command_says_num_attention_heads_must_be_a_positive_integer(ckpt, capsys, tmp_path, bad):
    folder, _ = ckpt
    _config(folder, num_attention_heads=bad)
    for argv in _every_command(folder, tmp_path):
        _one_line_error(capsys, main(argv), f"num_attention_heads={bad} must be a positive integer")


def test_every_command_refuses_dynamic_rope_scaling_by_name(ckpt, capsys, tmp_path):
    folder, _ = ckpt
    _config(folder, rope_scaling={"rope_type": "dynamic", "factor": 4.0})  # NTK: frequencies depend on earlier calls
    for argv in _every_command(folder, tmp_path):
        _one_line_error(capsys, main(argv), "rope_type='dynamic'", "is refused")
    _config(folder, rope_scaling={"rope_type": "linear", "factor": 4.0})
    assert main(["show", "--config", str(folder), "--layer", "1"]) == 0
    assert any(line.split() == ["rope_scale", "4.0"] for line in capsys.readouterr().out.splitlines())


def test_nan_weights_are_refused_by_export_and_parity(ckpt, capsys, tmp_path):
    folder, block = ckpt
    tensors = _tensors(block)
    tensors["model.layers.1.self_attn.q_proj.weight"] = tensors["model.layers.1.self_attn.q_proj.weight"].clone()
    tensors["model.layers.1.self_attn.q_proj.weight"][0, 1] = float("nan")
    _write(folder, tensors)
    for argv in _every_command(folder, tmp_path)[3:]:
        _one_line_error(capsys, main(argv), "'model.layers.1.self_attn.q_proj.weight' holds 1 NaN")


def test_a_shard_index_naming_a_file_outside_the_folder_is_refused(ckpt, capsys, tmp_path):
    import json

    folder, _ = ckpt
    weights = ("q_proj", "k_proj", "v_proj", "o_proj")
    for shard in ("../elsewhere/x.safetensors", "/etc/passwd"):
        index = {"weight_map": {f"model.layers.1.self_attn.{w}.weight": shard for w in weights}}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))
        argv = ["export", "--checkpoint", str(folder), "--layer", "1", "-o", str(tmp_path / "o.onnx")]
        _one_line_error(capsys, main(argv), repr(shard), "outside the checkpoint folder")
        assert not (tmp_path / "o.onnx").exists()


def test_export_checkpoint_given_config_json_asks_for_the_folder(ckpt, capsys, tmp_path):
    folder, _ = ckpt
    argv = ["export", "--checkpoint", str(folder / "config.json"), "-o", str(tmp_path / "o.onnx")]
    _one_line_error(capsys, main(argv), "a file; give the checkpoint folder", f"({folder})")


def test_a_checkpoint_export_summary_names_the_checkpoint_and_layer(ckpt, capsys, tmp_path):
    folder, _ = ckpt
    out = tmp_path / "named.onnx"
    assert main(["export", "--checkpoint", str(folder), "--layer", "1", "--lowering", "ort-gqa", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"  block     {folder} layer 1: " in text and "custom" not in text
    assert OnnxSession(str(out), "cpu").metadata["attnzoo.name"] == f"{folder} layer 1"


def test_export_onnx_label_must_be_a_non_empty_string(ckpt, tmp_path):
    from export import export_onnx

    _, block = ckpt
    for bad in ("", " ", 3):
        with pytest.raises(zoo.InputTypeError, match="label=.* must be a non-empty string"):
            export_onnx(block, tmp_path / "x.onnx", label=bad)
    assert not (tmp_path / "x.onnx").exists()
