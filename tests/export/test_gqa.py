"""The ort-gqa lowering's conventions, each pinned by a test (they were measured, and releases move)."""

import numpy as np
import pytest
import torch

import zoo
from export import OnnxSession, export_onnx
from export.choice import why_not


def _run(tmp_path, block, x, **kw):
    r = export_onnx(block, tmp_path / "g.onnx", lowering="ort-gqa", overwrite=True, **kw)
    assert r.op_counts.get("com.microsoft::GroupQueryAttention") == 1
    return OnnxSession(r.path, provider="cpu", verbose=False)


def test_local_window_size_is_window_keys_itself_included(tmp_path):
    """local_window_size = W: query i sees keys i-W+1..i, the zoo's (and HF's) `window`."""
    block = zoo.create("mha-separate-bias", causal=True, window=4).eval()
    x = torch.randn(1, 12, 64)
    sess = _run(tmp_path, block, x)
    torch.testing.assert_close(sess.run(x), block(x), rtol=1e-4, atol=1e-5)
    wider = zoo.create("mha-separate-bias", causal=True, window=5).eval()
    wider.load_state_dict(block.state_dict())
    assert (wider(x) - block(x)).abs().max() > 1e-3  # W and W+1 differ at this length


def test_softcap_before_the_mask_and_empty_rows_are_zero(tmp_path):
    block = zoo.create("gqa", d_model=128, causal=True, softcap=0.3, rope_theta=1e4).eval()  # d_k 16
    x = torch.randn(2, 9, 128) * 3
    sess = _run(tmp_path, block, x, with_mask=True)
    mask = torch.rand(2, 9, 9) > 0.3
    mask[..., 0] = True
    mask[1, 4] = False  # a query row with no allowed key
    y = sess.run(x, mask=mask)
    y_ref = block(x, mask=mask[:, None])
    torch.testing.assert_close(y, y_ref, rtol=1e-4, atol=1e-5)
    b_o = block.out_proj.bias.detach() if block.spec.bias else torch.zeros(128)
    torch.testing.assert_close(y[1, 4], b_o)  # Z = 0: y is W_O's bias


def test_why_not_names_what_the_op_cannot_do():
    assert "causal only" in why_not("ort-gqa", zoo.spec("mha-separate-bias"))
    assert "cross-attention" in why_not("ort-gqa", zoo.spec("cross-attention"))
    assert "d_v == d_k" in why_not("ort-gqa", zoo.spec("mha-separate-bias-dv", causal=True))
    assert "longrope" in why_not("ort-gqa", zoo.spec("phi-3.5-mini"))
    assert why_not("ort-gqa", zoo.spec("phi-2", rope_dim=8)) is None  # any rope_dim: RotaryEmbedding before the op
    assert why_not("ort-gqa", zoo.spec("phi-2")) is None  # 32 rotated dims: 16 pairs
    assert why_not("ort-gqa", zoo.spec("gemma-2-9b")) is None
    with pytest.raises(ValueError, match="cannot express"):
        export_onnx("mha-separate-bias", "/tmp/never.onnx", lowering="ort-gqa")


def test_cuda_has_no_fp32_kernel(tmp_path):
    """ORT registers CUDA GroupQueryAttention for fp16/bf16 only: an fp32 ort-gqa model for CUDA is
    refused, and auto for CUDA in fp32 takes the next lowering instead."""
    spec = zoo.spec("llama-3-8b", d_model=64, heads=4, kv_heads=2)
    assert "float16/bfloat16" in why_not("ort-gqa", spec, dtype="float32", provider="cuda")
    assert why_not("ort-gqa", spec, dtype="float16", provider="cuda") is None
    assert why_not("ort-gqa", spec, dtype="float32", provider="cpu") is None
    with pytest.raises(ValueError, match="float16/bfloat16"):
        export_onnx(zoo.MultiHeadAttention(spec), tmp_path / "never.onnx", lowering="ort-gqa", provider="cuda")
    res = export_onnx(zoo.MultiHeadAttention(spec), tmp_path / "auto.onnx", decode=True, provider="cuda")
    assert res.lowering != "ort-gqa"


def test_fp16_graph(tmp_path):
    block = zoo.create("qwen3-8b", d_model=64, heads=4, kv_heads=2, d_k=16).eval()
    r = export_onnx(block, tmp_path / "h.onnx", lowering="ort-gqa", dtype="float16")
    sess = OnnxSession(r.path, provider="cpu", verbose=False)
    x = np.random.randn(1, 7, 64).astype(np.float16)
    y = sess.run(x)
    ref = block(torch.from_numpy(x).float()).detach().numpy()
    assert np.abs(y.astype(np.float32) - ref).max() < 4e-3


@pytest.mark.parametrize("d_k", [4, 12, 20])
def test_head_size_not_a_multiple_of_8_is_refused_by_name(d_k):
    spec = zoo.spec("mha-causal", d_model=2 * d_k, heads=2, alibi=True)
    reason = why_not("ort-gqa", spec, dtype="float32", provider="cpu")
    assert reason and "multiple of 8" in reason and f"d_k={d_k}" in reason


def test_auto_passes_gqa_by_for_a_head_size_its_kernel_refuses(tmp_path):
    # ONNX Runtime accepted the model and only failed at run time: "head_size must be a multiple of 8".
    block = zoo.create("mha-causal", d_model=24, heads=2, alibi=True).eval()  # d_k 12
    r = export_onnx(block, tmp_path / "a.onnx", lowering="auto")
    assert r.lowering != "ort-gqa"
    x = torch.randn(2, 6, 24)
    torch.testing.assert_close(
        OnnxSession(r.path, provider="cpu", verbose=False).run(x), block(x), rtol=1e-4, atol=1e-5
    )


def test_t5_buckets_are_refused_by_the_record_and_by_the_builder():
    """The ort-gqa record names T5's bias (export_onnx and auto read it); a direct call of the builder
    refuses too, rather than building a graph without the bias."""
    from export import gqa
    from export.errors import ExportError
    from runtime.io import interface

    block = zoo.create("mha-causal", d_model=32, heads=2, rel_buckets=8, rel_max_distance=12).eval()
    assert "T5's bucketed bias" in why_not("ort-gqa", block.spec)
    ins, outs = interface(block.spec, need_weights=False, with_mask=False, with_head_mask=False)
    with pytest.raises(ExportError, match="no T5 relative-bucket bias"):
        gqa.build(block, "float32", ins, outs)


def test_the_records_limits_are_the_modifiers_own():
    """One source: the ort-gqa record's per-modifier limits are the modifiers' gqa_limit and gqa_refusal."""
    from export.lowerings import RECORDS

    limits = RECORDS["ort-gqa"].modifiers
    own = {mod.name: mod for mod in zoo.modifiers.MODIFIERS if mod.gqa_limit is not None}
    assert set(limits) == set(own) == {"rope", "window", "rel_buckets", "latent"}
    for name, mod in own.items():
        assert limits[name].text == mod.gqa_limit.text and limits[name].never == mod.gqa_limit.always
    spec = zoo.spec("phi-3.5-mini")
    assert why_not("ort-gqa", spec) == zoo.modifiers.Rotary.gqa_refusal(spec)


def test_the_graph_builder_names_no_modifier():
    """export/gqa.py reads no modifier field and names no modifier: each modifier brings its own pieces."""
    from pathlib import Path

    from export import gqa

    src = Path(gqa.__file__).read_text()
    for mod in zoo.modifiers.MODIFIERS:
        assert mod.__name__ not in src and f'"{mod.name}"' not in src
        assert not [f for f in mod.fields if f in src], mod.fields


def test_two_modifiers_may_not_set_one_attribute(monkeypatch):
    from export import gqa
    from export.errors import ExportError
    from runtime.io import interface
    from zoo.modifiers import OpPart, Window

    block = zoo.create("gqa", d_model=128, causal=True, softcap=0.3, window=4).eval()
    monkeypatch.setattr(Window, "gqa_op", lambda self, g: OpPart({"softcap": 1.0}))
    ins, outs = interface(block.spec, need_weights=False, with_mask=False, with_head_mask=False)
    with pytest.raises(ExportError, match="'softcap'"):
        gqa.build(block, "float32", ins, outs)


@pytest.mark.parametrize("norm, bias", [("head", True), ("per_head", False), ("full", True)])
def test_layernorm_qk_norm_is_layer_normalization_nodes(tmp_path, norm, bias):
    """LayerNorm QK-norm (Persimmon/Phi "head" with a bias, Cohere/StableLM "per_head", over all heads)
    comes into the graph as two LayerNormalization nodes before the op, exact against eager."""
    kw = dict(qk_norm=norm, qk_norm_kind="layer", qk_norm_bias=bias)
    block = zoo.create("gqa", d_model=128, causal=True, rope_theta=1e4, **kw).eval()
    with torch.no_grad():
        for p in block.mods["qk_norm"].parameters():
            p.copy_(torch.rand_like(p) + 0.5)
    r = export_onnx(block, tmp_path / "n.onnx", lowering="ort-gqa", overwrite=True)
    assert r.op_counts.get("LayerNormalization") == 2 and "ReduceMean" not in r.op_counts
    x = torch.randn(2, 9, 128)
    y = OnnxSession(r.path, provider="cpu", verbose=False).run(x)
    torch.testing.assert_close(torch.as_tensor(y), block(x), rtol=1e-4, atol=1e-5)


def test_sinks_are_the_ops_head_sink_input(tmp_path):
    """Attention sinks (gpt-oss) go into GroupQueryAttention's `head_sink` input (onnxruntime 1.31: "a smooth
    factor adding to the denominator of softmax", per head): exact against eager, full sequence with a
    query row that has no allowed key, and decode with the growing and the static cache."""
    from parity.matrix import check_decode

    torch.manual_seed(0)
    block = zoo.create("gqa", d_model=64, heads=4, kv_heads=2, causal=True, window=5, rope_theta=1e4, sinks=True)
    with torch.no_grad():
        block.mods["sinks"].logits.mul_(3.0)
    block.eval()
    x = torch.randn(2, 11, 64)
    sess = _run(tmp_path, block, x, with_mask=True)
    mask = torch.ones(2, 11, 11, dtype=torch.bool)
    mask[1, 4] = False  # a query row with no allowed key: Z = 0
    y = torch.as_tensor(sess.run(x, mask=mask))
    torch.testing.assert_close(y, block(x, mask=mask[:, None]), rtol=1e-4, atol=1e-5)
    for cache in ("grow", "static"):
        row = check_decode(block, "ort-gqa", cache=cache, workdir=tmp_path)
        assert row.status == "PASS", f"{cache}: {row.reason} (max abs {row.max_abs:.2e})"


@pytest.mark.parametrize(
    "name, overrides, inside, split",
    [
        ("llama-3-8b", dict(d_model=64, heads=4, kv_heads=2), True, False),  # d_k 16: Q|K|V packed, no nodes
        ("qwen3-8b", dict(d_model=64, heads=4, kv_heads=2), True, True),  # QK-norm's nodes first, rope inside
        ("llama-3-8b", dict(d_model=32, heads=4, kv_heads=2), False, True),  # d_k 8: the op's rotary wants 16
        ("phi-2", dict(d_model=128, heads=4, rope_dim=8), False, True),  # 4 pairs: its cos table wants 8 columns
        ("llama-4-scout", dict(d_model=128, heads=4, kv_heads=2), False, True),  # qk_l2 after rope: rope stays out
    ],
)
def test_in_a_whole_model_the_op_rotates_when_rope_is_the_last_piece_it_can_do(name, overrides, inside, split):
    """gqa_inside: in a whole model's layer the op's own rotary (do_rotary, at cache slots) replaces the
    RotaryEmbedding nodes where rope is the last modifier on Q and K and its tables fit the kernel; a
    block export keeps them (its cache is the eager one)."""
    from export import gqa
    from runtime.io import static_interface

    block = zoo.create(name, causal=True, **overrides).eval()
    ins, outs = static_interface(block.spec, with_key_mask=True)
    for in_model in (False, True):
        graph = gqa.build(block, "float32", ins, outs, in_model=in_model).graph
        ops = [n.op_type for n in graph.node]
        (node,) = [n for n in graph.node if n.op_type == "GroupQueryAttention"]
        rotary = {a.name: a.i for a in node.attribute}.get("do_rotary", 0)
        assert rotary == int(in_model and inside), ops
        assert ("RotaryEmbedding" in ops) == (not (in_model and inside)), ops
        assert ("Split" in ops) == (split or not in_model), ops
        assert ("ReduceMax" in ops) == (not in_model), ops  # pad rows zeroed in a block only
    # With a max_len the rotary tables, the op's or RotaryEmbedding's, are constants of that many rows:
    # no Cos and no Sin each call.
    graph = gqa.build(block, "float32", ins, outs, in_model=True, max_positions=40).graph
    ops = [n.op_type for n in graph.node]
    tables = [list(i.dims) for i in graph.initializer if i.name.startswith(("rope_cos", "rope_sin"))]
    assert "Cos" not in ops and "Sin" not in ops, ops
    assert tables == [[40, zoo.modifiers.Rotary.rotated(block.spec) // 2]] * 2, tables


@pytest.mark.parametrize(
    "name, overrides",
    [
        ("llama-3-8b", dict(d_model=128, heads=4, kv_heads=2)),  # halves, d_k 32
        ("gpt-j-6b", dict(d_model=128, heads=4, rope_dim=16)),  # interleaved pairs, partial: 8 of 16 pairs
        ("phi-2", dict(d_model=128, heads=4, rope_dim=16)),  # halves, partial
        ("qwen3-8b", dict(d_model=128, heads=4, kv_heads=2)),  # QK-norm's nodes, then the op's rotary
    ],
)
@pytest.mark.parametrize("max_positions", [None, 12], ids=["tables-per-call", "constant-tables"])
def test_the_ops_own_rotary_in_a_whole_models_layer_is_the_eager_block(name, overrides, max_positions):
    """A layer built with in_model=True, run as a whole model runs it (static buffers, key mask, past_len):
    a prompt and a step equal the eager block, and a left-padded row equals its run alone (its slots lead
    its positions by its pads), its pad rows finite (the op's 0 for a row whose bias is all -inf: the
    layer does not zero them). With max_positions (a whole model's max_len) the rotary tables are constants."""
    import onnxruntime as ort

    from export import gqa
    from runtime.io import static_interface

    torch.manual_seed(0)
    block = zoo.create(name, causal=True, **overrides).eval()
    ins, outs = static_interface(block.spec, with_key_mask=True)
    proto = gqa.build(block, "float32", ins, outs, in_model=True, max_positions=max_positions)
    assert any(a.name == "do_rotary" and a.i == 1 for n in proto.graph.node for a in n.attribute)
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    g, dk, n = block.spec.kv_heads_, block.spec.d_k_, 12

    def run(x, key_mask, past_len, cache):
        feeds = {"x": x.numpy(), "key_mask": key_mask, "past_len": np.array(past_len, np.int64)}
        y, pk, pv = sess.run(None, {**feeds, "past_key": cache[0], "past_value": cache[1]})
        return torch.from_numpy(y), (pk, pv)

    x = torch.randn(2, 7, 128)
    empty = (np.zeros((2, g, n, dk), np.float32), np.zeros((2, g, n, dk), np.float32))
    mask = np.ones((2, n), np.bool_)
    y, cache = run(x[:, :6], mask, 0, empty)
    step, _ = run(x[:, 6:], mask, 6, cache)
    with torch.no_grad():
        full = block(x)
    torch.testing.assert_close(y, full[:, :6], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(step, full[:, 6:], rtol=1e-4, atol=1e-5)
    # row 1 left-padded by 2: its 4 real tokens at slots 2..5
    padded = x[:, :6].clone()
    padded[1, :2] = 0.0
    mask[1, :2] = False
    y, _ = run(padded, mask, 0, empty)
    with torch.no_grad():
        alone = block(x[1:, 2:6])
    torch.testing.assert_close(y[1, 2:], alone[0], rtol=1e-4, atol=1e-5)
    assert torch.isfinite(y).all()
