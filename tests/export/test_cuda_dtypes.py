"""Whole models and blocks for CUDA in bfloat16 and float16, with int8/int4 weights (MatMulNBits), decided and
checked on the CPU: the exports are made, every node is within the CUDA kernels' rules (export/cuda_check.py),
and what the CPU can run is run.

ONNX Runtime's CPU provider has no bfloat16 MatMul, so a bf16 graph is checked through its float32 twin: the
same graph with every bfloat16 tensor, type and Cast target turned float32 (exact: every bf16 value is an fp32
value). The twin holds the graph's bf16 weights and constants and computes in fp32, so it shows the wiring
and the weights; the rounding of bf16 arithmetic on the GPU is not shown here (docs/gpu.md: unproven).
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from export import export_onnx
from export.cuda_check import attention_nodes, cuda_refusals
from export.errors import ExportError
from export.precision import NBITS_CUDA_RULES, rel_l2
from export.precision import why_not as precision_why_not
from helpers import one_line_error, small_overrides
from runtime.providers import dtype_refusal

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "peers"))
import lm_cases  # noqa: E402 - small random transformers models, one per family

# The last position's logits against the eager model: max |difference| <= this x max |logit|. The twin of a
# bf16 graph computes in fp32 with the graph's bf16 constants (rotary tables, the embedding's normalizer),
# which the eager reference computes in fp32: measured 1.5e-3 (llama) and 3.9e-3 (gemma2) of max |logit|.
LOGITS_TOLERANCE = {"float16": 1e-2, "bfloat16": 1e-2}
N = 16  # the cache capacity a CPU run allocates
# A quantized half-precision graph's error against the eager model, at most this many times the fp32 export's
QUANTIZED_RATIO = 1.5
_ORT_DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16}


def float32_twin(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with every bfloat16 initializer, value type, Cast target and constant attribute made float32."""
    twin = onnx.ModelProto()
    twin.CopyFrom(model)
    graph = twin.graph

    def f32(t: onnx.TensorProto) -> onnx.TensorProto:
        return numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float32), t.name)

    for init in graph.initializer:
        if init.data_type == TensorProto.BFLOAT16:
            init.CopyFrom(f32(init))
    for vi in (*graph.input, *graph.output, *graph.value_info):
        if vi.type.tensor_type.elem_type == TensorProto.BFLOAT16:
            vi.type.tensor_type.elem_type = TensorProto.FLOAT
    for node in graph.node:
        for a in node.attribute:
            if a.type == onnx.AttributeProto.INT and a.name == "to" and a.i == TensorProto.BFLOAT16:
                a.i = TensorProto.FLOAT
            if a.type == onnx.AttributeProto.TENSOR and a.t.data_type == TensorProto.BFLOAT16:
                a.t.CopyFrom(f32(a.t))
    return twin


def last_logits(model: onnx.ModelProto | Path, ids: torch.Tensor) -> np.ndarray:
    """The prompt's last-position logits (b v) from a whole-model graph under ONNX Runtime's CPU provider."""
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    sess = ort.InferenceSession(source, providers=["CPUExecutionProvider"])
    b, t = ids.shape
    names = {i.name for i in sess.get_inputs()}
    if "seqlens_k" in names:  # packed rows (the CUDA default): each row's slots from 0, a first prompt
        feeds = {
            "input_ids": ids.numpy(),
            "position_ids": np.broadcast_to(np.arange(t, dtype=np.int64), (b, t)).copy(),
            "seqlens_k": np.full(b, t - 1, np.int32),
            "total_sequence_length": np.array(t, np.int32),
        }
    else:
        feeds = {"input_ids": ids.numpy(), "attention_mask": np.ones((b, N), bool), "past_len": np.array(0, np.int64)}
    for i in sess.get_inputs():
        if i.name.startswith("past_key_values"):
            shape = [b if d == "b" else N if d == "n" else d for d in i.shape]
            feeds[i.name] = np.zeros(shape, _ORT_DTYPES[i.type])
    return sess.run(["logits"], feeds)[0][:, -1].astype(np.float32)  # packed: (b 1 v), each row's last


@pytest.fixture(scope="session")
def cuda_lm(tmp_path_factory):
    """(family, dtype, precision) -> (the eager model, the export's path), each exported once for --target cuda."""
    from peers.lm import lm_from_hf

    folder = tmp_path_factory.mktemp("cuda-dtypes")
    made: dict = {}

    def get(family: str, dtype: str, precision: str = "fp32"):
        key = (family, dtype, precision)
        if key not in made:
            model = lm_from_hf(lm_cases.hf_model(family)).eval()
            path = folder / f"{family}-{dtype}-{precision}.onnx"
            r = export_onnx(model, path, provider="cuda", dtype=dtype, precision=precision, max_len=32)
            assert r.dtype == dtype and r.precision == precision
            made[key] = (model, path)
            get.summaries[key] = r.summary()
        return made[key]

    get.summaries = {}
    return get


def _prompt() -> torch.Tensor:
    return torch.randint(3, lm_cases.VOCAB, (2, 9), generator=torch.Generator().manual_seed(7))


def _close(got: np.ndarray, ref: np.ndarray, dtype: str) -> None:
    worst, scale = float(np.abs(got - ref).max()), float(np.abs(ref).max())
    assert worst <= LOGITS_TOLERANCE[dtype] * scale, f"max abs {worst:.3g} against max |logit| {scale:.3g}"


def _bits(t: torch.Tensor) -> np.ndarray:
    return t.detach().contiguous().view(torch.int16).numpy()


def _holds(inits: list[np.ndarray], p: np.ndarray) -> bool:
    """Some initializer is `p` bit for bit: itself, or (a 2-D weight) a block of rows of an initializer's
    transpose (a MatMul's (in, out) weight, or Q|K|V packed into one)."""
    for a in inits:
        if a.shape == p.shape and np.array_equal(a, p):
            return True
        if p.ndim == 2 and a.ndim == 2 and a.shape[0] == p.shape[1]:
            rows = a.T
            for start in np.flatnonzero((rows == p[0]).all(axis=1)):
                if start + len(p) <= len(rows) and np.array_equal(rows[start : start + len(p)], p):
                    return True
    return False


@pytest.mark.parametrize("family", ["llama", pytest.param("gemma2", marks=pytest.mark.slow)])
def test_bfloat16_whole_model_holds_the_eager_bf16_weights_bit_for_bit(family, cuda_lm):
    """Every weight as the eager bf16 model holds it; a Gemma norm's scale as it computes it, 1 + w in fp32."""
    from zoo.lm_parts import Norm

    model, path = cuda_lm(family, "bfloat16")
    graph = onnx.load(path)
    inits = {
        kind: [numpy_helper.to_array(i).view(view) for i in graph.graph.initializer if i.data_type == kind]
        for kind, view in ((TensorProto.BFLOAT16, np.int16), (TensorProto.FLOAT, np.int32))
    }
    bf16 = copy.deepcopy(model).to(torch.bfloat16)
    in_fp32 = {f"{n}.weight" for n, m in bf16.named_modules() if isinstance(m, Norm) and m.kind == "rms_plus1"}
    missing = []
    for name, p in bf16.named_parameters():
        if name in in_fp32:
            held = _holds(inits[TensorProto.FLOAT], (1.0 + p.float()).detach().numpy().view(np.int32))
        else:
            held = _holds(inits[TensorProto.BFLOAT16], _bits(p))
        if not held:
            missing.append(name)
    assert not missing, f"not in the graph bit for bit: {missing}"


@pytest.mark.parametrize("family", ["llama", pytest.param("gemma2", marks=pytest.mark.slow)])
def test_bfloat16_whole_model_computes_the_eager_model_on_its_weights(family, cuda_lm):
    """The graph's float32 twin, run on the CPU, against the eager model with the weights rounded to bf16."""
    model, path = cuda_lm(family, "bfloat16")
    assert cuda_refusals(path) == []
    gqa = [f for f in attention_nodes(path) if f.op.endswith("GroupQueryAttention")]
    assert len(gqa) == lm_cases.BASE["num_hidden_layers"] and all(f.dtype("query") == "bfloat16" for f in gqa)
    ids = _prompt()
    reference = copy.deepcopy(model).to(torch.bfloat16).float()
    with torch.no_grad():
        ref = reference(ids)[:, -1].numpy()
    got = last_logits(float32_twin(onnx.load(path)), ids)
    _close(got, ref, "bfloat16")
    assert (got.argmax(-1) == ref.argmax(-1)).all()


def test_gemma2_float16_whole_model_loads_and_matches_eager_float16(cuda_lm):
    """Gemma's norms run in fp32 inside an fp16 model: the fused SkipSimplifiedLayerNormalization took an fp16
    input with an fp32 scale, which ONNX Runtime refused at load (export/lm_fusions.py)."""
    model, path = cuda_lm("gemma2", "float16")
    assert cuda_refusals(path) == []
    ids = _prompt()
    with torch.no_grad():
        ref = copy.deepcopy(model).half()(ids)[:, -1].float().numpy()
    _close(last_logits(path, ids), ref, "float16")  # ONNX Runtime's CPU runs an fp16 graph (casting around)
    graph = onnx.load(path, load_external_data=False)
    for node in graph.graph.node:  # every fused norm binds one type, or is the plain norm taking fp32 input
        assert node.op_type != "SkipSimplifiedLayerNormalization" or len(node.input) >= 3


@pytest.mark.parametrize("provider", ["cpu"])
def test_bfloat16_is_refused_on_the_cpu_in_one_line(provider, tmp_path):
    from peers.lm import lm_from_hf

    model = lm_from_hf(lm_cases.hf_model("llama"))
    for what in (model, "llama-3-8b"):
        with pytest.raises(ExportError, match="bfloat16") as e:
            export_onnx(what, tmp_path / "x.onnx", provider=provider, dtype="bfloat16")
        assert "\n" not in str(e.value) and "cuda" in str(e.value)
    assert not (tmp_path / "x.onnx").exists()


@pytest.mark.parametrize("name, precision", [("llama-3-8b", "fp32"), ("gemma-2-9b", "fp32"), ("llama-3-8b", "int4")])
def test_bfloat16_static_block_for_cuda_is_within_the_kernels_rules(name, precision, tmp_path):
    r = export_onnx(name, tmp_path / "b.onnx", provider="cuda", dtype="bfloat16", decode=True, with_mask=True,
                    cache="static", max_len=32, precision=precision, **small_overrides(name))  # fmt: skip
    assert r.lowering == "ort-gqa" and cuda_refusals(r.path) == []
    nodes = attention_nodes(r.path)
    assert [f.dtype("query") for f in nodes if f.op.endswith("GroupQueryAttention")] == ["bfloat16"]
    nbits = [f for f in nodes if f.op == NBITS_CUDA_RULES.op]
    assert len(nbits) == (2 if precision == "int4" else 0)  # Q|K|V packed, and W_O
    assert all(f.dtype("A") == "bfloat16" and f.attributes["bits"] == 4 for f in nbits)


# -- int8 / int4 weights with float16 / bfloat16 activations -----------------------------------------------


@pytest.mark.parametrize(
    "dtype, precision",
    [("bfloat16", "int4"), pytest.param("float16", "int8", marks=pytest.mark.slow),
     pytest.param("bfloat16", "int8", marks=pytest.mark.slow), pytest.param("float16", "int4", marks=pytest.mark.slow)],
)  # fmt: skip
def test_quantized_half_whole_model_for_cuda_is_within_the_rules(dtype, precision, cuda_lm):
    _, path = cuda_lm("llama", dtype, precision)
    assert cuda_refusals(path) == []
    nbits = [f for f in attention_nodes(path) if f.op == NBITS_CUDA_RULES.op]
    bits = {"int8": 8, "int4": 4}[precision]
    assert len(nbits) == 11  # every projection, MLP and the head: 2 layers x (qkv, o, gate, up, down) + lm_head
    for f in nbits:
        assert f.dtype("A") == dtype and f.dtype("scales") == dtype and f.attributes["bits"] == bits
    # What the CPU can run: the twin (fp32 activations, the graph's weights and scales). Its distance from the
    # eager model (weights rounded to the dtype) is the quantization's, as the fp32 export's is from the eager
    # fp32 model: relative L2 of the logits, measured on this random model (2026-12-04): int8 2.8-4.4% against
    # 3.2-3.6%, int4 38-52% against 40-49% (Gaussian weights at width 64); worst ratio 1.21.
    model, fp32 = cuda_lm("llama", "float32", precision)
    ids = _prompt()
    got = last_logits(float32_twin(onnx.load(path)), ids)
    with torch.no_grad():
        eager = copy.deepcopy(model).to(getattr(torch, dtype)).float()(ids)[:, -1].numpy()
        eager32 = model(ids)[:, -1].numpy()
    fp32_got = last_logits(fp32, ids)
    for row in range(len(ids)):
        ours, theirs = rel_l2(got[row], eager[row]), rel_l2(fp32_got[row], eager32[row])
        assert ours <= QUANTIZED_RATIO * theirs, f"row {row}: {ours:.3f} against the fp32 export's {theirs:.3f}"


@pytest.mark.parametrize(
    "precision, weights, cache", [("fp32", "bf16", "bf16"), ("int4", "int4 (weight-only MatMulNBits", "bf16")]
)
def test_a_half_exports_summary_says_its_dtype(precision, weights, cache, cuda_lm):
    """A bfloat16 export's weights and cache are bf16: its summary says so (it said fp32, the unquantized name)."""
    cuda_lm("llama", "bfloat16", precision)
    lines = dict(ln.split(None, 1) for ln in cuda_lm.summaries[("llama", "bfloat16", precision)].splitlines()[1:])
    assert lines["precision"].startswith(weights) and "fp32" not in lines["precision"], lines["precision"]
    assert lines["cache"].startswith(f"static, in place, {cache};"), lines["cache"]
    if precision != "fp32":
        assert lines["precision"].endswith(", bf16 activations")


def test_quantized_half_activations_are_for_cuda_only():
    for dtype in ("float16", "bfloat16"):
        assert precision_why_not("int4", dtype=dtype, provider="cuda") is None
        reason = precision_why_not("int4", dtype=dtype, provider="cpu")
        assert "provider='cuda'" in reason and "\n" not in reason
    assert precision_why_not("int8", dtype="float32", provider="cuda") is None


def test_matmulnbits_rules_name_a_bad_attribute_and_type():
    a = helper.make_tensor_value_info("a", TensorProto.DOUBLE, ["b", "t", 64])
    w = helper.make_tensor_value_info("w", TensorProto.UINT8, [128, 2, 16])
    s = helper.make_tensor_value_info("s", TensorProto.FLOAT16, [128, 2])
    node = helper.make_node("MatMulNBits", ["a", "w", "s"], ["y"], name="probe", domain="com.microsoft",
                            K=64, N=128, bits=3, block_size=24)  # fmt: skip
    y = helper.make_tensor_value_info("y", TensorProto.DOUBLE, None)
    model = helper.make_model(
        helper.make_graph([node], "g", [a, w, s], [y]),
        opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)],
        ir_version=10,
    )
    said = " ".join(cuda_refusals(model))
    for words in ("A is float64", "scales is float16", "bits=3", "block_size=24"):
        assert words in said, said


def test_generate_refuses_a_half_dtype_on_the_cpu_before_the_folders_export(capsys, tmp_path, monkeypatch):
    """`attnzoo generate FOLDER --dtype bfloat16` on the CPU: one line before anything is exported (it reached the
    export, which refused bf16 for the CPU after "exporting ... (once)")."""
    monkeypatch.setenv("ATTNZOO_CACHE", str(tmp_path / "cache"))
    folder = lm_cases.saved("llama", tmp_path / "ckpt")
    capsys.readouterr()  # transformers' progress bar while saving
    said = one_line_error(capsys, ["generate", str(folder), "--prompt-ids", "5,6,7", "--dtype", "bfloat16"])
    assert said == f"attnzoo generate: error: {dtype_refusal('cpu', 'bfloat16')}", said
    assert not list((tmp_path / "cache").rglob("*.onnx"))


def test_norm_rules_refuse_a_bfloat16_input_with_an_fp32_scale():
    """What the RMS fusion made of Gemma's fp32 norm in a bf16 model before it was unmixed: no CUDA kernel."""
    x = helper.make_tensor_value_info("x", TensorProto.BFLOAT16, ["b", "t", 64])
    w = helper.make_tensor_value_info("w", TensorProto.FLOAT, [64])
    node = helper.make_node("SimplifiedLayerNormalization", ["x", "w"], ["y"], name="probe", axis=-1, epsilon=1e-6)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "t", 64])
    model = helper.make_model(
        helper.make_graph([node], "g", [x, w], [y]), opset_imports=[helper.make_opsetid("", 18)], ir_version=10
    )
    said = cuda_refusals(model)
    assert len(said) == 1 and "scale is float32 with X bfloat16" in said[0], said
