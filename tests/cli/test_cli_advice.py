"""A refusal's advice is something the command can do: no flag it lacks, no fix it then refuses,
and the command that refuses names itself (`attnzoo families: error:`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli.main import build_parser, command_parsers, main
from helpers import REPO
from runtime.providers import cuda_graph_refusal, dtype_refusal


def _error(capsys, code) -> str:
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def _exit(argv) -> int:
    try:
        return main(argv)
    except SystemExit as e:  # argparse's own refusals exit from inside main
        return e.code


def test_families_extra_argument_names_the_command(capsys):
    err = _error(capsys, _exit(["families", "extra"]))
    assert err.startswith("attnzoo families: error: unrecognized arguments: extra"), err
    err = _error(capsys, _exit(["list", "mha-*", "more"]))
    assert err.startswith("attnzoo list: error: unrecognized arguments: more"), err
    err = _error(capsys, _exit(["--bogus", "list"]))  # before the command: the top level's own
    assert err.startswith("attnzoo: error: unrecognized arguments: --bogus"), err


def test_parity_checkpoint_set_suggests_no_flag_parity_lacks(capsys, tmp_path):
    err = _error(capsys, main(["parity", "--checkpoint", str(tmp_path), "--set", "heads=2"]))
    assert "--set changes a spec" in err and "--config" not in err.replace("preset --config", ""), err
    assert "attnzoo parity my-layer --set" in err  # what works: the layer as a preset takes --set
    parity = command_parsers(build_parser())["parity"]
    layer = next(a for a in parity._actions if "--layer" in a.option_strings)
    assert "--config" not in layer.help and "--checkpoint" in layer.help
    assert {"--config"}.isdisjoint(o for a in parity._actions for o in a.option_strings)
    err = _error(capsys, main(["export", "--checkpoint", str(tmp_path), "--set", "heads=2", "-o", "x.onnx"]))
    assert "use --config to change fields" in err  # export has --config: that advice stays


SMALL = ["--set", "d_model=64", "--set", "heads=4", "--set", "kv_heads=2", "--set", "d_k=16"]


@pytest.mark.parametrize("lowering", ["onnx-attention", "ort-mha"])
def test_decode_max_len_advice_works_for_the_lowering(capsys, tmp_path, lowering):
    out = tmp_path / "m.onnx"
    argv = ["export", "llama-3-8b", *SMALL, "--decode", "--max-len", "16", "-o", str(out)]
    err = _error(capsys, main([*argv, "--lowering", lowering]))
    assert f"--lowering {lowering} cannot keep one" in err and "--cache static" not in err, err
    assert "drop --max-len" in err and "use --lowering decomposed" in err and "decomposed, ort-gqa or auto" in err, err
    assert main([*argv, "--lowering", "ort-gqa"]) == 0  # a lowering that keeps one
    assert "past_len" in capsys.readouterr().out  # the static cache's input


@pytest.mark.slow  # a traced decode export: 12 s
@pytest.mark.parametrize("lowering", ["onnx-attention", "ort-mha"])
def test_decode_max_len_advice_drop_it_works(capsys, tmp_path, lowering):
    argv = ["export", "llama-3-8b", *SMALL, "--decode", "--lowering", lowering, "-o", str(tmp_path / "m.onnx")]
    assert main(argv) == 0, capsys.readouterr().err  # the advice's other half: no --max-len, its growing cache


def test_max_len_without_a_static_cache_says_what_works(capsys, tmp_path):
    out = str(tmp_path / "m.onnx")
    err = _error(capsys, main(["export", "gpt2-small", "--max-len", "16", "-o", out]))
    assert "add --decode or drop --max-len" in err, err  # not --cache static, which then wants --decode
    err = _error(capsys, main(["export", "gpt2-small", "--decode", "--cache", "grow", "--max-len", "16", "-o", out]))
    assert "pass --cache static, or drop --max-len" in err, err


def test_the_cli_spells_the_librarys_advice_its_own_way():
    from cli.main import cli_spelling

    assert cli_spelling("m.onnx exists; pass overwrite=True (CLI: --force) to replace it") == (
        "m.onnx exists; pass --force to replace it"
    )
    assert cli_spelling("pass cache='static' (CLI: --cache static), or drop max_len (--max-len)") == (
        "pass --cache static, or drop --max-len"
    )
    assert cli_spelling("the window (--max-len) stays") == "the window (--max-len) stays"  # not its own name
    said = "cannot keep one (use lowering='decomposed')"
    assert cli_spelling(said, frozenset({"--lowering"})) == "cannot keep one (use --lowering decomposed)"
    assert cli_spelling(said) == said  # a command without --lowering keeps the library's words
    flags = frozenset({"--lowering", "--provider", "--precision", "--decode"})
    for said, reads in (
        ("use lowering='onnx-attention' or 'decomposed'", "use --lowering onnx-attention or decomposed"),
        ("use provider='cpu' or 'auto'", "use --provider cpu or auto"),
        ("use precision='int4' or 'fp32' there", "use --precision int4 or fp32 there"),
        ("pass decode=True", "pass --decode"),
        ("pass decode=False", "pass decode=False"),  # no flag spells it: left as the library said it
        ("dtype='float16' is refused", "dtype='float16' is refused"),  # this command has no --dtype
        ("lowering='ort-mha' cannot export a whole model", "--lowering ort-mha cannot export a whole model"),
        (
            "past max_len 12: export it with max_len=13 (CLI: --max-len 13) or more",
            "past max_len 12: export it with --max-len 13 or more",
        ),
        ("model_type='llamaz': not a family", "model_type='llamaz': not a family"),
        ("spec.lowering='x'", "spec.lowering='x'"),  # an attribute, not a setting
    ):
        assert cli_spelling(said, flags) == reads


def test_an_existing_output_says_force_as_the_cli_spells_it(capsys, tmp_path):
    out = tmp_path / "p.toml"
    out.write_text("")
    config = Path(__file__).resolve().parents[2] / "models" / "tiny-stdlib-llama" / "config.json"
    err = _error(capsys, main(["preset", "--config", str(config), "--name", "p", "-o", str(out)]))
    assert err.endswith("exists; pass --force to replace it\n"), err


def test_verbose_works_after_the_command_too(capsys):
    assert _exit(["show", "no-such-block", "--verbose"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("attnzoo show: error: no attention block named 'no-such-block'") and len(err) == 2, err


def test_a_mistyped_spec_field_gets_the_closest_name(capsys):
    err = _error(capsys, _exit(["show", "bert-base", "--set", "dmodel=12"]))
    assert "did you mean 'd_model' for 'dmodel'?" in err, err


def test_a_picture_without_matplotlib_is_refused_before_any_work(capsys, monkeypatch, tmp_path):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else find_spec(name, *a)
    )
    for argv in (["heads", "tiny-induction"], ["importance", "tiny-induction"], ["bench", "--seq", "16"]):
        assert _exit([*argv, "--plot", str(tmp_path / "p.png")]) == 2
        out, err = capsys.readouterr()
        assert not out and "pip install 'attnzoo[plot]'" in err and err.count("\n") == 1, (argv, out, err)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    "argv, words",
    [
        (["genrate", "x"], "no command 'genrate'; did you mean generate?"),
        (["exprot", "x"], "no command 'exprot'; did you mean export?"),
        (
            ["generate", "models/tiny-stdlib-lama", "--prompt-ids", "1"],
            "(closest: models/tiny-stdlib-llama, models/tiny-stdlib-llama-draft)",
        ),
        (
            ["generate", "tiny-stdlib-lama", "--prompt-ids", "1"],
            "(closest: tiny-stdlib-llama, tiny-stdlib-llama-draft)",
        ),
    ],
)
def test_a_mistyped_command_or_model_gets_the_closest_names(capsys, argv, words):
    assert _exit(argv) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize(
    "flags, words",
    [
        ([], cuda_graph_refusal("cpu")),
        (["--provider", "cuda"], cuda_graph_refusal("cuda", "float32")),
    ],
)
def test_generate_cuda_graph_is_refused_before_any_export_where_it_cannot_replay(capsys, flags, words):
    """A CUDA graph replays a packed-rows export on CUDA: asked on the CPU, or of a folder in float32 (exported
    left-padded for CUDA), it is one line before anything is exported or any provider is asked."""
    assert _exit(["generate", "tiny-stdlib-llama", "--prompt-ids", "1", "--cuda-graph", *flags]) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1, err


def test_generate_takes_the_shipped_checkpoints_bare_name(tmp_path, monkeypatch):
    from cli.generate_sources import SHIPPED, source_path

    monkeypatch.chdir(tmp_path)  # wherever the command runs
    assert source_path("tiny-stdlib-llama") == SHIPPED / "tiny-stdlib-llama"
    (tmp_path / "tiny-stdlib-llama").mkdir()  # a folder of that name here is what it names
    assert source_path("tiny-stdlib-llama") == Path("tiny-stdlib-llama")


def test_generate_warns_past_the_models_positions_and_echoes_a_long_prompt_short(capsys, tmp_path, monkeypatch):
    """A call past max_position_embeddings runs (the user asked for it) with a warning naming the positions; the
    summary shows the new tokens in full and only the ends of the prompt's ids."""
    import json
    import shutil

    folder = tmp_path / "tiny"
    shutil.copytree(Path(__file__).resolve().parents[2] / "models" / "tiny-stdlib-llama", folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(config, max_position_embeddings=12)))
    monkeypatch.setenv("ATTNZOO_CACHE", str(tmp_path / "cache"))
    ids = ",".join(str(100 + i) for i in range(10))
    argv = ["generate", str(folder), "--prompt-ids", ids, "--max-new-tokens", "4", "--max-len", "32", "--no-stream"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "10 prompt + 4 new tokens go past the 12 positions tiny was made for" in err
    line = next(ln for ln in out.splitlines() if ln.startswith("tokens "))
    prompt, new = line.removeprefix("tokens ").split(" -> ")
    assert prompt == "100 101 102 103 104 105 ... (10 prompt ids)" and len(new.split()) == 4, line


@pytest.mark.parametrize(
    "argv, words",
    [
        (
            ["generate", "tiny-stdlib-llama", "--prompt-ids", "1", "--dtype", "bfloat16"],
            dtype_refusal("cpu", "bfloat16"),
        ),
        (["generate", "tiny-stdlib-llama", "--prompt-ids", "1", "--dtype", "float16"], dtype_refusal("cpu", "float16")),
        (["serve", "models/tiny-stdlib-llama", "--dtype", "bfloat16"], dtype_refusal("cpu", "bfloat16")),
        (["serve", "models/tiny-stdlib-llama", "--cuda-graph"], cuda_graph_refusal("cpu")),
        (["serve", "nope.onnx"], "nope.onnx: no such file"),
    ],
)
def test_what_cannot_run_here_is_refused_before_an_export_or_ray_starts(capsys, monkeypatch, argv, words):
    """A half dtype of a checkpoint on the CPU, a CUDA graph on the CPU, a missing .onnx: one line before anything
    is exported ("exporting ... (once)") or Ray starts ("starting Ray Serve")."""
    monkeypatch.chdir(REPO)
    assert _exit(argv) == 2
    out, err = capsys.readouterr()
    assert words in err and len(err.strip().splitlines()) == 1, err
    assert "exporting" not in out and "starting Ray" not in out, out


def test_serve_takes_the_shipped_checkpoints_bare_name_as_generate_does(capsys, monkeypatch, tmp_path):
    """`serve tiny-stdlib-llama` from any folder reaches the shipped folder (here: its --dtype check, before an
    export), as `generate tiny-stdlib-llama` does; it was "neither an .onnx file nor a zoo name"."""
    monkeypatch.chdir(tmp_path)
    for command in ("serve", "generate"):
        extra = ["--prompt-ids", "1"] if command == "generate" else []
        assert _exit([command, "tiny-stdlib-llama", *extra, "--dtype", "bfloat16"]) == 2
        out, err = capsys.readouterr()
        assert dtype_refusal("cpu", "bfloat16") in err and len(err.strip().splitlines()) == 1, (command, err)


def test_generate_names_a_block_export_as_such_before_asking_for_its_tokenizer(capsys, tmp_path):
    """A block export given to generate with --prompt was told it lacked a tokenizer; it is not a whole model."""
    from export import export_onnx

    block = export_onnx("mha-causal", tmp_path / "block.onnx").path
    assert _exit(["generate", str(block), "--prompt", "hi"]) == 2
    err = capsys.readouterr().err
    assert "is not a whole-model export" in err and "tokenizer" not in err and len(err.strip().splitlines()) == 1
