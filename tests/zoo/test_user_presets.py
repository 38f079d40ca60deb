"""A user's own presets: folders in ATTNZOO_PRESETS or zoo.add_presets(folder), the shipped presets'
format and checks, clashes and malformed files refused in one line naming the files; and
zoo.preset_toml (`attnzoo preset`) writing a preset from a config that loads back to the same spec.

Every test here gets a fresh registry (and its own ATTNZOO_PRESETS) through `fresh`: the session's
registry, which the registry-driven tests parametrize over, never sees these presets.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import zoo
import zoo.registry
from helpers import REPO

ROOT = REPO
MINE = "description = 'mine'\nreference = 'made up'\n[spec]\nd_model = 32\nheads = 2\ncausal = true\n"


@pytest.fixture
def fresh(monkeypatch):
    """A registry that loads again (shipped presets, then ATTNZOO_PRESETS) on first use, restored after."""
    monkeypatch.setattr(zoo.registry, "_REGISTRY", {})
    monkeypatch.setattr(zoo.registry, "_loaded", False)
    monkeypatch.delenv("ATTNZOO_PRESETS", raising=False)
    return monkeypatch


def _folder(root: Path, name: str, files: dict[str, str]) -> Path:
    folder = root / name
    folder.mkdir()
    for stem, text in files.items():
        (folder / f"{stem}.toml").write_text(text)
    return folder


def test_presets_from_the_environment(fresh, tmp_path):
    a = _folder(tmp_path, "a", {"my-block": MINE})
    b = _folder(tmp_path, "b", {"my-other": MINE.replace("d_model = 32", "d_model = 48")})
    fresh.setenv("ATTNZOO_PRESETS", f"{a}{os.pathsep}{os.pathsep}{b}")  # an empty entry is skipped
    assert zoo.names("my-*") == ["my-block", "my-other"]
    assert zoo.spec("my-other").d_model == 48
    assert zoo.create("my-block").spec.causal
    assert zoo.entry("my-block").source == str(a / "my-block.toml")
    assert "transformer-base" in zoo.names()  # the shipped ones are still there


def test_add_presets_at_run_time(fresh, tmp_path):
    folder = _folder(tmp_path, "mine", {"my-block": MINE})
    assert zoo.add_presets(folder) == ["my-block"]
    assert zoo.entry("my-block").description == "mine"
    assert zoo.add_presets(str(folder)) == ["my-block"]  # the same folder again: the same presets, no clash
    with pytest.raises(zoo.PresetFileError, match="does not exist"):
        zoo.add_presets(tmp_path / "nope")
    with pytest.raises(zoo.InputTypeError, match="folder must be a path"):
        zoo.add_presets(3)


def test_a_clash_with_a_shipped_name_names_both_files(fresh, tmp_path):
    folder = _folder(tmp_path, "mine", {"gpt2-small": MINE})
    fresh.setenv("ATTNZOO_PRESETS", str(folder))
    with pytest.raises(zoo.DuplicateNameError) as e:
        zoo.names()
    msg = str(e.value)
    assert str(folder / "gpt2-small.toml") in msg and str(Path("models") / "gpt2-small.toml") in msg
    assert "\n" not in msg


def test_the_same_folder_twice_in_the_variable_is_one_folder(fresh, tmp_path):
    folder = _folder(tmp_path, "mine", {"my-block": MINE})
    (tmp_path / "link").symlink_to(folder)
    again = [str(folder), f"{folder}{os.sep}", str(tmp_path / "link")]
    fresh.setenv("ATTNZOO_PRESETS", os.pathsep.join([str(folder), *again]))
    assert zoo.names("my-*") == ["my-block"]  # not "registered twice" by one file
    assert zoo.registry.user_folders() == [folder]
    assert zoo.add_presets(folder) == ["my-block"]  # added once more at run time: still one preset
    (folder / "my-block.toml").write_text(MINE.replace("d_model = 32", "d_model = 48"))
    with pytest.raises(zoo.DuplicateNameError, match=r"my-block.toml has changed .*zoo.unregister\('my-block'\)"):
        zoo.add_presets(folder)  # edited since: not silently kept, not silently replaced
    zoo.unregister("my-block")
    assert zoo.add_presets(folder) == ["my-block"] and zoo.spec("my-block").d_model == 48


def test_add_presets_of_a_file_says_it_is_not_a_folder(fresh, tmp_path):
    folder = _folder(tmp_path, "mine", {"my-block": MINE})
    with pytest.raises(zoo.PresetFileError) as e:
        zoo.add_presets(folder / "my-block.toml")
    assert "is not a folder" in str(e.value) and f"({folder})" in str(e.value)  # the folder to give instead
    assert "does not exist" not in str(e.value)
    fresh.setattr(zoo.registry, "_REGISTRY", {})
    fresh.setattr(zoo.registry, "_loaded", False)
    fresh.setenv("ATTNZOO_PRESETS", str(folder / "my-block.toml"))
    with pytest.raises(zoo.PresetFileError, match="is not a folder"):  # the variable says the same
        zoo.names()


def test_a_preset_file_with_a_bad_name_names_its_file(fresh, tmp_path):
    folder = _folder(tmp_path, "mine", {"UPPER Case": MINE, "my-fine": MINE})
    with pytest.raises(zoo.PresetFileError) as e:
        zoo.add_presets(folder)
    msg = str(e.value)
    assert msg.startswith(str(folder / "UPPER Case.toml") + ":") and "UPPER-Case.toml" in msg and "\n" not in msg
    assert "my-fine" not in zoo.names()  # all or nothing


def test_shipped_names_are_reserved(fresh, tmp_path):
    shipped = zoo.entry("llama-3-8b")
    with pytest.raises(zoo.ArgumentError, match=r"'llama-3-8b' is a shipped preset .*name of its own"):
        zoo.unregister("llama-3-8b")
    assert zoo.entry("llama-3-8b") == shipped
    folder = _folder(tmp_path, "mine", {"llama-3-8b": MINE})
    with pytest.raises(zoo.DuplicateNameError, match="shipped names are reserved") as e:
        zoo.add_presets(folder)
    assert "rename one of them" not in str(e.value)  # the shipped one is not to be renamed
    assert str(e.value).startswith("'llama-3-8b' is a shipped preset") and "'my-llama-3-8b'" in str(e.value)
    with pytest.raises(zoo.DuplicateNameError, match="shipped names are reserved"):
        zoo.register("llama-3-8b", d_model=8, heads=2)
    zoo.register("my-tiny", d_model=8, heads=2)
    zoo.unregister("my-tiny")  # a name of the user's own still goes
    assert "my-tiny" not in zoo.names()


def test_the_shipped_name_refusal_is_one_message_everywhere(fresh, tmp_path):
    folder = _folder(tmp_path, "mine", {"llama-3-8b": MINE})
    calls = {
        "unregister": lambda: zoo.unregister("llama-3-8b"),
        "register": lambda: zoo.register("llama-3-8b", d_model=8, heads=2),
        "add_presets": lambda: zoo.add_presets(folder),
        "preset_toml": lambda: zoo.preset_toml(LLAMA, "llama-3-8b"),
    }
    src = zoo.entry("llama-3-8b").source
    for what, call in calls.items():
        with pytest.raises(zoo.AttnzooError) as e:
            call()
        head, _, tail = str(e.value).partition(": ")
        assert head == f"'llama-3-8b' is a shipped preset ({src})", (what, str(e.value))
        assert tail.endswith("; shipped names are reserved: give your variant a name of its own, e.g. 'my-llama-3-8b'")


def test_preset_refuses_a_shipped_name_when_writing(fresh, tmp_path, capsys):
    from cli.main import main

    config = tmp_path / "config.json"
    config.write_text(json.dumps(LLAMA))
    with pytest.raises(zoo.ArgumentError, match=r"'llama-3-8b' is a shipped preset .*'my-llama-3-8b'"):
        zoo.preset_toml(LLAMA, "llama-3-8b")
    out = tmp_path / "presets" / "llama-3-8b.toml"
    assert main(["preset", "--config", str(config), "--name", "llama-3-8b", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnzoo preset: error:") and "shipped names are reserved" in err and err.count("\n") == 1
    assert not out.exists() and not out.parent.exists()  # nothing written, no folder made
    assert main(["preset", "--config", str(config), "--name", "llama-3-8b"]) == 2  # printing it too


def test_a_clash_between_two_user_folders_names_both_files(fresh, tmp_path):
    a = _folder(tmp_path, "a", {"my-block": MINE})
    b = _folder(tmp_path, "b", {"my-block": MINE, "my-fine": MINE})
    zoo.add_presets(a)
    with pytest.raises(zoo.DuplicateNameError) as e:
        zoo.add_presets(b)
    assert str(a / "my-block.toml") in str(e.value) and str(b / "my-block.toml") in str(e.value)
    assert "my-fine" not in zoo.names()  # all or nothing: the folder's other preset is not added


def test_malformed_toml_is_one_line_with_the_file_and_line(fresh, tmp_path):
    folder = _folder(tmp_path, "bad", {"my-fine": MINE, "my-broken": "[spec]\nd_model = 32\nheads = = 2\n"})
    with pytest.raises(zoo.PresetFileError) as e:
        zoo.add_presets(folder)
    msg = str(e.value)
    assert msg.startswith(str(folder / "my-broken.toml")) and "line 3" in msg and "\n" not in msg
    assert "my-fine" not in zoo.names()
    _folder(tmp_path, "worse", {"my-worse": "[spec]\nd_model = 32\nheads = 3\n"})
    with pytest.raises(zoo.PresetFileError, match=r"my-worse.toml: \[spec\] .*d_model=32.*heads=3"):
        zoo.add_presets(tmp_path / "worse")  # the shipped presets' spec checks


def test_a_missing_folder_in_the_variable_is_named_at_first_use(fresh, tmp_path):
    fresh.setenv("ATTNZOO_PRESETS", str(tmp_path / "gone"))
    with pytest.raises(zoo.PresetFileError, match=r"^ATTNZOO_PRESETS: .*gone is not a folder"):
        zoo.names()


def test_the_cli_sees_user_presets(fresh, tmp_path, capsys):
    from cli.main import main

    folder = _folder(tmp_path, "mine", {"my-block": MINE})
    env = dict(os.environ, ATTNZOO_PRESETS=str(folder))
    out = subprocess.run(
        [sys.executable, "-m", "cli", "list", "my-*"], capture_output=True, text=True, env=env, cwd=ROOT
    )
    assert out.returncode == 0 and out.stdout.startswith("my-block"), out.stderr
    fresh.setenv("ATTNZOO_PRESETS", str(folder))
    assert main(["show", "my-block"]) == 0 and "mine" in capsys.readouterr().out
    fresh.setattr(zoo.registry, "_REGISTRY", {})
    fresh.setattr(zoo.registry, "_loaded", False)
    fresh.setenv("ATTNZOO_PRESETS", str(tmp_path / "gone"))
    assert main(["list"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ATTNZOO_PRESETS" in err, err


# -- preset_toml: a preset from a config, loaded back -----------------------------------------------

LLAMA = {
    "model_type": "llama",
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "head_dim": 16,
    "attention_bias": False,
    "rms_norm_eps": 1e-5,
    "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
}
CONFIGS = {
    "llama": (LLAMA, 1),
    "gemma2-sliding": (
        dict(LLAMA, model_type="gemma2", query_pre_attn_scalar=24, attn_logit_softcapping=30.0, sliding_window=8),
        0,
    ),
    "qwen3-qk-norm": (dict(LLAMA, model_type="qwen3", rms_norm_eps=1e-5), 0),
    "phi3-partial": (
        dict(
            LLAMA,
            model_type="phi3",
            rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5},
        ),
        0,
    ),
    "gpt2-inverse-layer": (
        {"model_type": "gpt2", "n_embd": 64, "n_head": 4, "n_layer": 3, "scale_attn_by_inverse_layer_idx": True},
        2,
    ),  # fmt: skip
    "mpt-alibi": ({"model_type": "mpt", "d_model": 48, "n_heads": 6, "n_layers": 1}, 0),
    "granite": (dict(LLAMA, model_type="granite", attention_multiplier=0.05), 0),
}


@pytest.mark.parametrize("case", list(CONFIGS))
def test_preset_toml_loads_back_to_the_same_spec(fresh, tmp_path, case):
    config, layer = CONFIGS[case]
    text = zoo.preset_toml(config, f"my-{case}", layer=layer)
    assert "\n# " not in text.split("[spec]")[1]  # every field line carries its own comment
    folder = tmp_path / "presets"
    folder.mkdir()
    (folder / f"my-{case}.toml").write_text(text)
    zoo.add_presets(folder)
    assert zoo.spec(f"my-{case}") == zoo.spec_from_config(config, layer=layer)


def test_preset_toml_cites_the_config_values():
    text = zoo.preset_toml(LLAMA, "my-llama", layer=0)
    assert "kv_heads = 2  # num_key_value_heads 2" in text
    assert "rope_theta = 500000.0  # rope_parameters.rope_theta 500000.0" in text
    assert "bias = false  # attention_bias false" in text
    assert 'reference = "config.json (model_type llama), layer 0: hidden_size 64' in text
    with pytest.raises(zoo.ArgumentError, match="must be a non-empty preset name"):
        zoo.preset_toml(LLAMA, "a b")
