"""The Triton model repository: every written config.pbtxt is parsed with Triton's own schema
(tritonclient's model_config_pb2, text format) and checked against its ONNX file. No Triton
server runs here."""

from __future__ import annotations

import pytest

from export.triton import TritonError, check_model, config_text, parse_config, write_repository

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
