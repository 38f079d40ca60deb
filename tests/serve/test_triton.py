"""The Triton model repository: every written config.pbtxt is parsed with Triton's own schema
(tritonclient's model_config_pb2, text format) and checked against its ONNX file. No Triton
server runs here."""

from __future__ import annotations

import pytest

from serve.triton import TritonError, check_model, config_text, parse_config, write_repository

model_config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("triton") / "repo"
    written = write_repository(["mha-combined-bias", "cross-attention"], root, max_batch=4, instances=2, kind="cpu")
    return root, written


def test_layout_and_configs_parse_with_tritons_schema(repo):
    root, written = repo
    assert [w.name for w in written] == ["mha-combined-bias", "cross-attention"]
    for w in written:
        assert (root / w.name / "1" / "model.onnx").is_file()
        cfg = parse_config(root / w.name / "config.pbtxt")
        assert cfg.name == w.name and cfg.backend == "onnxruntime" and cfg.max_batch_size == 4
        assert [(g.count, model_config_pb2.ModelInstanceGroup.Kind.Name(g.kind)) for g in cfg.instance_group] == [
            (2, "KIND_CPU")
        ]
        assert cfg.dynamic_batching.max_queue_delay_microseconds == 5000
        assert check_model(root / w.name) == []
    assert not [p for p in root.iterdir() if p.name.startswith(".")]  # no temp folders left


def test_the_batch_axis_is_tritons(repo):
    root, _ = repo
    cfg = parse_config(root / "cross-attention" / "config.pbtxt")
    dims = {t.name: (model_config_pb2.DataType.Name(t.data_type), list(t.dims)) for t in [*cfg.input, *cfg.output]}
    # x (b, t, 64), context (b, s, 48), y (b, t, 64): b is left out, t and s stay dynamic.
    assert dims == {"x": ("TYPE_FP32", [-1, 64]), "context": ("TYPE_FP32", [-1, 48]), "y": ("TYPE_FP32", [-1, 64])}


def test_a_config_that_disagrees_with_its_model_is_caught(repo, tmp_path):
    import shutil

    root, _ = repo
    bad = tmp_path / "mha-combined-bias"
    shutil.copytree(root / "mha-combined-bias", bad)
    text = (bad / "config.pbtxt").read_text()
    (bad / "config.pbtxt").write_text(
        text.replace("dims: [ -1, 64 ]", "dims: [ -1, 65 ]", 1).replace("TYPE_FP32", "TYPE_FP16", 1)
    )
    problems = check_model(bad)
    assert any("dims [-1, 65]" in p for p in problems) and any("TYPE_FP16" in p for p in problems)
    (bad / "config.pbtxt").write_text(text.replace("max_batch_size: 4", "max_batch_sise: 4"))
    with pytest.raises(TritonError, match="not a valid Triton model config"):
        parse_config(bad / "config.pbtxt")


def test_bad_requests_are_refused_before_exporting(tmp_path):
    with pytest.raises(TritonError, match="kind='tpu'"):
        write_repository(["mha-causal"], tmp_path, kind="tpu")
    with pytest.raises(TritonError, match="max_batch=-1"):
        write_repository(["mha-causal"], tmp_path, max_batch=-1)
    with pytest.raises(TritonError, match="repeat"):
        write_repository(["mha-causal", "mha-causal"], tmp_path)
    with pytest.raises(TritonError, match="at least one"):
        write_repository([], tmp_path)
    (tmp_path / "mha-causal").mkdir()
    with pytest.raises(FileExistsError, match="--force"):
        write_repository(["mha-causal"], tmp_path)
    with pytest.raises(TritonError, match="batch axis"):
        config_text("m", [("x", "float32", (5, "t", 64))], [], max_batch=2, instances=1, kind="cpu")


def test_cli_writes_checks_and_says_how_to_serve(tmp_path, capsys):
    """Also the other corner: no batching (the batch axis stays in dims), a mask, fp16, GPU."""
    from cli.main import main

    argv = ["triton", "gqa", "-o", str(tmp_path / "r"), "--max-batch", "0", "--kind", "gpu", "--mask"]
    rc = main([*argv, "--dtype", "float16", "--lowering", "decomposed", "--set", "d_model=32"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "config vs model (Triton's schema): OK" in out and "tritonserver --model-repository" in out
    cfg = parse_config(tmp_path / "r" / "gqa" / "config.pbtxt")
    assert cfg.max_batch_size == 0 and not cfg.HasField("dynamic_batching")
    assert model_config_pb2.ModelInstanceGroup.Kind.Name(cfg.instance_group[0].kind) == "KIND_GPU"
    got = {t.name: (model_config_pb2.DataType.Name(t.data_type), list(t.dims)) for t in cfg.input}
    assert got == {"x": ("TYPE_FP16", [-1, -1, 32]), "mask": ("TYPE_BOOL", [-1, -1, -1])}
    assert check_model(tmp_path / "r" / "gqa") == []
    assert main(argv) == 2  # the folder exists and there is no --force
    assert "exists" in capsys.readouterr().err


@pytest.mark.parametrize(
    "flag, value, words",
    [
        ("--batch-wait-us", "-5", "--batch-wait-us: -5 must be an integer in 0..60000000"),
        ("--max-batch", "-1", "--max-batch: -1 must be an integer in 0..2147483647"),
        ("--batch-wait-us", "nan", "not an integer"),
    ],
)
def test_a_bad_number_replaces_nothing_even_with_force(repo, capsys, flag, value, words):
    """Refused in one line before anything is written: the valid model folder stays as it was."""
    from cli.main import main

    root, _ = repo
    config = root / "mha-combined-bias" / "config.pbtxt"
    before = (config.read_bytes(), config.stat().st_mtime_ns)
    try:
        rc = main(["triton", "mha-combined-bias", "-o", str(root), "--force", flag, value])
    except SystemExit as e:  # argparse's usage errors exit from inside parse_args
        rc = e.code
    err = capsys.readouterr().err.strip()
    assert rc == 2 and words in err and len(err.splitlines()) == 1, err
    assert (config.read_bytes(), config.stat().st_mtime_ns) == before


def test_the_library_validates_everything_before_the_first_write(repo):
    root, _ = repo
    config = root / "mha-combined-bias" / "config.pbtxt"
    before = (config.read_bytes(), config.stat().st_mtime_ns)
    for kw, words in (
        ({"batch_wait_us": -5}, "batch_wait_us=-5"),
        ({"batch_wait_us": 2**64}, "batch_wait_us="),
        ({"max_batch": 2**40}, "max_batch="),
        ({"instances": 2**40}, "instances="),
    ):
        with pytest.raises(TritonError, match=words):
            write_repository(["mha-combined-bias"], root, overwrite=True, **kw)
    assert (config.read_bytes(), config.stat().st_mtime_ns) == before
    assert not [p for p in root.iterdir() if p.name.startswith(".")]


def test_an_empty_repository_path_is_refused(capsys, tmp_path, monkeypatch):
    from cli.main import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(TritonError, match="repository's folder"):
        write_repository(["mha-causal"], "")
    try:
        rc = main(["triton", "mha-causal", "-o", ""])
    except SystemExit as e:
        rc = e.code
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "-o model_repo" in err and len(err.splitlines()) == 1, err
    assert list(tmp_path.iterdir()) == []  # nothing written into the current folder


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_model_folders_and_files_get_the_users_umask(tmp_path, umask):
    import os
    import stat

    old = os.umask(umask)
    try:
        write_repository(["mha-causal"], tmp_path / "r")
    finally:
        os.umask(old)
    folder = tmp_path / "r" / "mha-causal"
    modes = {p.relative_to(folder).as_posix(): stat.S_IMODE(p.stat().st_mode) for p in [folder, *folder.rglob("*")]}
    want_dir, want_file = 0o777 & ~umask, 0o666 & ~umask
    assert modes == {".": want_dir, "1": want_dir, "1/model.onnx": want_file, "config.pbtxt": want_file}, {
        k: oct(v) for k, v in modes.items()
    }
