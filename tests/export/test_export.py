"""export_onnx: lowerings, metadata, interface, atomic writes, refusal to overwrite, errors."""

import json
import os

import numpy as np
import onnx
import pytest
import torch

import zoo
from cli.main import main
from export import ExportError, OnnxSession, export_onnx
from export.choice import AUTO_PREFERENCE, auto_order, why_not
from export.lowerings import FUSED_OPS
from export.names import LOWERINGS
from helpers import REPO, one_line_error


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    d = tmp_path_factory.mktemp("exp")
    out = {}
    for lw in LOWERINGS:
        if why_not(lw, zoo.spec("cross-attention")) is None:  # ort-gqa is self-attention only (test_gqa.py)
            out[lw] = export_onnx("cross-attention", d / f"{lw}.onnx", lowering=lw, with_mask=True, with_head_mask=True)
    assert set(out) == {"decomposed", "onnx-attention", "ort-mha"}
    return out


def test_result_describes_the_model(exported):
    r = exported["decomposed"]
    assert r.path.is_file() and r.opset == 18 and r.dtype == "float32"
    assert [i[0] for i in r.inputs] == ["x", "context", "mask", "head_mask"]
    assert r.inputs[0] == ("x", "float32", ("b", "t", 64))
    assert r.inputs[1] == ("context", "float32", ("b", "s", 48))
    assert r.inputs[2] == ("mask", "bool", ("b", "t", "s"))
    assert r.outputs == [("y", "float32", ("b", "t", 64))]
    assert r.parameters == zoo.count_parameters(zoo.spec("cross-attention"))
    assert sum(r.op_counts.values()) > 0 and "wrote" in r.summary()


def test_lowerings_hold_the_promised_ops(exported):
    assert "Softmax" not in exported["decomposed"].op_counts  # the explicit, NaN-safe softmax
    assert "Attention" not in exported["decomposed"].op_counts
    assert exported["onnx-attention"].op_counts.get("Attention") == 1 and exported["onnx-attention"].opset == 23
    mha = exported["ort-mha"].op_counts
    assert sum(mha.get(op, 0) for op in FUSED_OPS) == 1 and "Softmax" not in mha


def test_graph_io_and_dynamic_axes_in_the_file(exported):
    for lw, r in exported.items():
        m = onnx.load(str(r.path))
        dims = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in m.graph.input}
        assert dims == {
            "x": ["b", "t", 64],
            "context": ["b", "s", 48],
            "mask": ["b", "t", "s"],
            "head_mask": ["b", 4],
        }, lw
        outs = {o.name: [d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim] for o in m.graph.output}
        assert outs == {"y": ["b", "t", 64]}, lw
        onnx.checker.check_model(m, full_check=True)


def test_metadata_round_trip(exported):
    for lw, r in exported.items():
        meta = {p.key: p.value for p in onnx.load(str(r.path)).metadata_props}
        assert meta["attnzoo.name"] == "cross-attention" and meta["attnzoo.lowering"] == lw
        assert zoo.AttentionSpec(**json.loads(meta["attnzoo.spec"])) == zoo.spec("cross-attention")
        assert int(meta["attnzoo.parameters"]) == zoo.count_parameters(zoo.spec("cross-attention"))
        assert meta["attnzoo.version"] == zoo.__version__
        assert OnnxSession(r.path, provider="cpu", verbose=False).spec == zoo.spec("cross-attention")


def test_an_export_names_no_file_of_the_exporting_machine(exported):
    """torch's exporter records each node's Python stack (this checkout's paths); a file keeps none of it."""
    here = str(REPO).encode()
    for lw, r in exported.items():
        assert here not in r.path.read_bytes(), lw
        keys = {p.key for n in onnx.load(str(r.path)).graph.node for p in n.metadata_props}
        assert "pkg.torch.onnx.fx_node" in keys and "pkg.torch.onnx.stack_trace" not in keys, lw


def test_self_attention_key_axis_is_t(tmp_path):
    r = export_onnx("mha-causal", tmp_path / "m.onnx", lowering="decomposed", with_mask=True, need_weights=True)
    assert r.inputs[1] == ("mask", "bool", ("b", "t", "t"))
    assert r.outputs[1] == ("attn", "float32", ("b", 4, "t", "t"))


def test_refuses_to_overwrite_and_writes_atomically(tmp_path):
    p = tmp_path / "m.onnx"
    p.write_bytes(b"precious")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        export_onnx("mha-separate-bias", p)
    assert p.read_bytes() == b"precious"
    # an export that fails half way leaves the old file and no temp files behind
    with pytest.raises(ExportError):
        export_onnx("mha-separate-bias", p, lowering="onnx-attention", need_weights=True, overwrite=True)
    assert p.read_bytes() == b"precious"
    export_onnx("mha-separate-bias", p, overwrite=True)
    assert onnx.load(str(p)).graph.node
    assert sorted(os.listdir(tmp_path)) == ["m.onnx"]


def test_export_to_a_folder_is_refused(tmp_path):
    with pytest.raises(ExportError, match="is a folder"):
        export_onnx("mha-separate-bias", tmp_path)


@pytest.mark.parametrize("lowering", ["onnx-attention", "ort-mha"])
def test_weights_only_from_decomposed(lowering, tmp_path):
    assert why_not(lowering, need_weights=True)
    with pytest.raises(ExportError, match="decomposed"):
        export_onnx("mha-separate-bias", tmp_path / "w.onnx", lowering=lowering, need_weights=True)


def test_auto_picks_the_preferred_lowering(tmp_path):
    r = export_onnx("mha-separate-bias", tmp_path / "a.onnx")
    assert r.lowering == AUTO_PREFERENCE[("cpu", "unmasked")][0]
    c = export_onnx("mha-causal", tmp_path / "c.onnx")
    assert c.lowering == AUTO_PREFERENCE[("cpu", "masked")][0]
    m = export_onnx("mha-separate-bias", tmp_path / "m.onnx", with_mask=True)  # ort-gqa: causal only
    assert m.lowering == next(lw for lw in AUTO_PREFERENCE[("cpu", "masked")] if not why_not(lw, m.spec))
    w = export_onnx("mha-separate-bias", tmp_path / "w.onnx", need_weights=True)
    assert w.lowering == "decomposed"
    assert auto_order("cuda", zoo.spec("gqa"), with_mask=False) == AUTO_PREFERENCE[("cuda", "masked")]


@pytest.mark.parametrize(
    "kwargs, exc, word",
    [
        (dict(lowering="tensorrt"), ExportError, "tensorrt"),
        (dict(dtype="bfloat16"), ExportError, "bfloat16"),
        # ONNX types no Einsum for bfloat16: refused before the export, not by onnx.checker after it
        (
            dict(dtype="bfloat16", provider="cuda", lowering="decomposed"),
            ExportError,
            "Einsum, which ONNX does not type",
        ),
        (dict(provider="tpu"), ExportError, "tpu"),
        (dict(heads=5), ValueError, "heads=5"),
    ],
)
def test_bad_requests(kwargs, exc, word, tmp_path):
    with pytest.raises(exc, match=word):
        export_onnx("mha-separate-bias", tmp_path / "x.onnx", **kwargs)


def test_module_and_name_arguments(tmp_path):
    m = zoo.create("mha-separate-bias", d_model=32, heads=2).eval()
    r = export_onnx(m, tmp_path / "m.onnx", lowering="decomposed")
    assert r.name == "custom" and r.spec.d_model == 32
    with pytest.raises(TypeError, match="overrides"):
        export_onnx(m, tmp_path / "n.onnx", heads=4)
    with pytest.raises(TypeError):
        export_onnx(42, tmp_path / "n.onnx")
    with pytest.raises(zoo.UnknownNameError):
        export_onnx("nope", tmp_path / "n.onnx")


def test_overrides_reach_the_export(tmp_path):
    r = export_onnx("mha-combined-bias", tmp_path / "o.onnx", lowering="decomposed", d_model=48, heads=3)
    assert r.inputs[0][2] == ("b", "t", 48)
    sess = OnnxSession(r.path, provider="cpu", verbose=False)
    x = np.random.randn(1, 1, 48).astype(np.float32)
    torch.testing.assert_close(torch.from_numpy(sess.run(x)), r.module(torch.from_numpy(x)), rtol=1e-4, atol=1e-5)


def test_external_data_for_large_models(tmp_path, monkeypatch):
    """Over the size threshold the weights go to PATH.data beside the model (atomically too)."""
    import export.writer as writer

    monkeypatch.setattr(writer, "EXTERNAL_DATA_BYTES", 1000)
    r = export_onnx("mha-separate-bias", tmp_path / "big.onnx", lowering="decomposed")
    assert r.external_data == tmp_path / "big.onnx.data" and r.external_data.stat().st_size > 60_000
    assert r.path.stat().st_size < 60_000
    sess = OnnxSession(r.path, provider="cpu", verbose=False)
    x = torch.randn(2, 3, 64)
    torch.testing.assert_close(sess.run(x), r.module(x), rtol=1e-4, atol=1e-5)
    assert sorted(os.listdir(tmp_path)) == ["big.onnx", "big.onnx.data"]


def test_unwritable_destination_fails_before_exporting(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ExportError, match="is not a folder"):
        export_onnx("mha-separate-bias", blocker / "sub" / "m.onnx")


def test_readme_support_table_is_the_records():

    from export.lowerings import support_table

    readme = (REPO / "docs" / "lowerings.md").read_text()
    assert support_table() in readme, "docs/lowerings.md's table differs from export.lowerings.support_table()"


def test_every_lowering_is_one_record_in_the_list():
    from export.lowerings import LOWERING_LIST, RECORDS
    from export.names import LOWERINGS

    assert tuple(RECORDS) == LOWERINGS == tuple(lw.name for lw in LOWERING_LIST)
    for lw in LOWERING_LIST:  # a traced lowering has an opset torch exports at; a built one builds
        assert lw.opset >= 18 and (lw.traced or callable(lw.build))


# -- export's own refusals and notes: torch's failure, bool flags, the ort-mha note ------------


def test_torch_export_failure_is_one_line_and_full_with_verbose(monkeypatch, capsys):
    def failing_export(*a, **kw):
        raise RuntimeError("\x1b[31mFailed to export the model\x1b[0m\nline two of torch's story\nline three")

    monkeypatch.setattr(torch.onnx, "export", failing_export)
    with pytest.raises(ExportError) as ei:
        export_onnx("mha-causal", "/tmp/never-written.onnx", lowering="decomposed")
    assert "\n" not in str(ei.value) and "\x1b" not in str(ei.value)
    assert "line three" in ei.value.detail
    line = one_line_error(capsys, ["export", "mha-causal", "-o", "/tmp/never.onnx", "--lowering", "decomposed"])
    assert "Failed to export the model" in line and "--verbose" in line
    assert main(["--verbose", "export", "mha-causal", "-o", "/tmp/never.onnx", "--lowering", "decomposed"]) == 2
    assert "line three" in capsys.readouterr().err


def test_ort_mha_note_matches_the_graph(tmp_path):
    r = export_onnx("mha-combined-bias", tmp_path / "m.onnx", lowering="ort-mha")
    text = " ".join(r.notes)
    if r.op_counts.get("com.microsoft::Attention"):
        assert "packed Attention" in text and "MatMuls" not in text
    else:
        assert r.op_counts.get("MatMul", 0) >= 3 and "separate Q/K/V MatMuls" in text


@pytest.mark.parametrize("flag", ["need_weights", "with_mask", "with_head_mask", "overwrite"])
def test_export_flags_take_bools_only(flag, tmp_path):
    with pytest.raises(zoo.InputTypeError, match=flag):
        export_onnx("mha-causal", tmp_path / "m.onnx", **{flag: "no"})
    assert not (tmp_path / "m.onnx").exists()


def test_the_fast_exporter_gives_the_same_graph(tmp_path, monkeypatch):
    """export.fast_export's two settings (the torchlib registry kept for the process, torch's fake-tensor cache
    off) change nothing in the file, hold only during the export, and leave torch's own method and setting
    in place after it (a user's own exports and tracing never meet them)."""
    import contextlib

    from torch._dynamo import config
    from torch.onnx._internal.exporter import _registration

    import export.fast_export as fast

    original = _registration.ONNXRegistry.__dict__["from_torchlib"]
    cache_setting = config.fake_tensor_cache_enabled
    seen = []
    trace = torch.onnx.export

    def recording(*args, **kwargs):  # what torch's exporter runs under
        seen.append((config.fake_tensor_cache_enabled, _registration.ONNXRegistry.__dict__["from_torchlib"]))
        return trace(*args, **kwargs)

    monkeypatch.setattr(torch.onnx, "export", recording)
    block = zoo.create("mha-separate-nobias", d_model=32, heads=2).eval()
    fast._BUILT.clear()  # the first export builds its own registry, as torch does on every call
    first = export_onnx(block, tmp_path / "first.onnx", lowering="decomposed").path
    assert fast._BUILT, "the export went through torchlib_once"
    again = export_onnx(block, tmp_path / "again.onnx", lowering="decomposed").path  # the kept registry
    monkeypatch.setattr(fast, "fake_tensor_cache_off", contextlib.nullcontext)  # torch's default: the cache on
    cached = export_onnx(block, tmp_path / "cached.onnx", lowering="decomposed").path
    assert first.read_bytes() == again.read_bytes() == cached.read_bytes()
    assert [off for off, _ in seen] == [False, False, cache_setting]
    assert all(method is not original for _, method in seen)
    assert _registration.ONNXRegistry.__dict__["from_torchlib"] is original
    assert config.fake_tensor_cache_enabled == cache_setting


def test_an_exports_own_translations_stay_with_it():
    """torch's exporter registers a custom_translation_table (a whole model's spliced layers pass one,
    export/splice.py) into the registry from_torchlib gives it: each export gets its own copy of the kept one."""
    from torch.onnx._internal.exporter import _registration

    import export.fast_export as fast
    from export.splice import translation_table

    with fast.fast_export():
        first = _registration.ONNXRegistry.from_torchlib()
        for op, function in translation_table().items():
            first.register_op(op, function)
        second = _registration.ONNXRegistry.from_torchlib()
    assert "attnzoo::spliced_attention" in first.functions
    assert "attnzoo::spliced_attention" not in second.functions
    assert not any("attnzoo::spliced_attention" in kept.functions for kept in fast._BUILT.values())
    assert second.functions.keys() == next(iter(fast._BUILT.values())).functions.keys()


def test_layer_qk_norm_in_fp16_loads_and_matches(tmp_path):
    """A LayerNorm QK-norm (StableLM, Cohere) exported in fp16: ONNX Runtime's LayerNormFusion once made
    a node of mixed fp16/fp32 inputs from it and refused to load the file."""
    spec = zoo.AttentionSpec(
        d_model=16, heads=2, d_k=8, d_v=8, causal=True, qk_norm="head", qk_norm_kind="layer", qk_norm_bias=True
    )
    block = zoo.MultiHeadAttention(spec).eval()
    path = export_onnx(block, tmp_path / "ln16.onnx", lowering="decomposed", dtype="float16").path
    x = torch.randn(2, 5, 16)
    y = torch.as_tensor(OnnxSession(path, provider="cpu", verbose=False).run(x.half())).float()
    torch.testing.assert_close(y, block(x), rtol=2e-2, atol=2e-3)


def test_a_half_precision_fused_node_scores_with_the_blocks_exact_scale(tmp_path):
    """torch's SDPA export multiplies Q and K by sqrt(scale) as fp16 constants, and the rewriter's fused node
    held their product (0.0999585 for mha-scaled's 0.1; 0.0884249 for 1/sqrt(128)): it holds the block's own."""
    block = zoo.create("mha-scaled").eval()
    path = export_onnx(block, tmp_path / "s16.onnx", lowering="ort-mha", dtype="float16").path
    graph = onnx.load(str(path), load_external_data=False).graph
    scales = [onnx.helper.get_attribute_value(a) for n in graph.node for a in n.attribute if a.name == "scale"]
    assert scales == [pytest.approx(float(np.float32(0.1)), rel=1e-7)]


@pytest.mark.parametrize(
    "got, blocks, want",
    [
        (0.0884249210357666, {0.08838834764831845}, 0.08838834764831845),  # fp16-rounded sqrt, squared
        (0.09995847940444946, {0.1, 0.125}, 0.1),  # the nearest block's
        (0.5, {0.125}, 0.5),  # a scale of its own (no block's, rounded): left as it is
    ],
)
def test_exact_scales_mends_only_a_rounded_block_scale(got, blocks, want):
    import onnx_ir as ir

    from export.tracing import exact_scales

    x = ir.Value(name="x")
    node = ir.Node("com.microsoft", "MultiHeadAttention", [x, x, x], [ir.AttrFloat32("scale", got)], num_outputs=1)
    graph = ir.Graph([x], node.outputs, nodes=[node], opset_imports={"": 18, "com.microsoft": 1})
    exact_scales(ir.Model(graph, ir_version=10), blocks)
    assert node.attributes["scale"].as_float() == pytest.approx(want, rel=1e-7)
