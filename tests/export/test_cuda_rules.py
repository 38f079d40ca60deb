"""Every graph `auto` makes for --target cuda stays within ONNX Runtime's CUDA kernels' rules, known on the
CPU: the rules are data in the lowering records (export/lowerings/kernel_rules.py), export/cuda_check.py
reads each attention node of a graph against them statically (input by input: element types, ranks,
attributes, which optional inputs are present), and the checker fails hand-made graphs that break a rule.

The registry's blocks (at small_overrides' widths) and the whole-model families (tests/peers/lm_cases.py)
are exported in float16 (the families in bfloat16 too), as CUDA runs them; the default run takes a sample, the
rest runs under -m slow.
"""

from __future__ import annotations

import sys
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

import zoo
from export import export_onnx
from export.choice import decode_order, why_not
from export.cuda_check import RULES, attention_nodes, cuda_refusal, cuda_refusals, fast_kernels
from export.errors import ExportError
from export.lm_export import candidates
from export.lowerings import LOWERING_LIST, record
from export.names import DTYPES, PRECISIONS
from helpers import ALL_NAMES, REPO, small_overrides
from peers.lm_rows import LM_FAMILIES

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "peers"))
import lm_cases  # noqa: E402 - small random transformers models, one per family

# What a block export for CUDA may be: a prefill graph (with a mask, or the plain default), and a decode
# model with its key mask, growing or static.
KINDS = {
    "masked": dict(with_mask=True),
    "plain": {},
    "decode": dict(decode=True, with_mask=True, cache="grow"),
    "static": dict(decode=True, with_mask=True, cache="static", max_len=32),
}
# the default run's sample: graphs built by hand (milliseconds; the traced ones take 15-45 s here)
SAMPLE_NAMES = ("llama-3-8b", "gemma-2-9b")  # GQA + rope; softcap + window
SAMPLE_KINDS = ("static",)
DEFAULT_FAMILY = "llama"


def _param(name: str, kind: str):
    sample = name in SAMPLE_NAMES and kind in SAMPLE_KINDS
    return pytest.param(name, kind, marks=() if sample else pytest.mark.slow, id=f"{name}-{kind}")


@pytest.fixture(scope="session")
def cuda_exports(tmp_path_factory):
    """(what, kind[, dtype]) -> (lowering auto took, the loaded graph), each exported once for --target cuda
    (float16 unless asked)."""
    folder = tmp_path_factory.mktemp("cuda-rules")
    made: dict = {}

    def get(what: str, kind: str, dtype: str = "float16"):
        if (what, kind, dtype) not in made:
            path = folder / f"{what}-{kind}-{dtype}.onnx"
            if kind == "lm":
                from peers.lm import lm_from_hf

                model = lm_from_hf(lm_cases.hf_model(what))
                r = export_onnx(model, path, provider="cuda", dtype=dtype, max_len=32)
            else:
                r = export_onnx(what, path, provider="cuda", dtype=dtype, **KINDS[kind], **small_overrides(what))
            made[what, kind, dtype] = (r.lowering, onnx.load(path))
        return made[what, kind, dtype]

    return get


def _assert_within_rules(lowering: str, model: onnx.ModelProto) -> None:
    nodes = attention_nodes(model)
    if record(lowering).cuda:  # a fused lowering: its nodes are found, every input read
        assert nodes, f"{lowering}: no attention node found in the graph"
    for facts in nodes:
        unread = [name for name, (dtype, shape) in facts.inputs.items() if dtype is None or shape is None]
        assert not unread, f"{facts.name}: element type or shape of {unread} not read"
    assert cuda_refusals(model) == []


def _kinds(name: str) -> list[str]:
    """The kinds a block can be exported as: a decode model needs causal self-attention."""
    spec = zoo.spec(name)
    return [k for k in KINDS if not KINDS[k].get("decode") or (spec.causal and not spec.is_cross)]


@pytest.mark.parametrize("name, kind", [_param(n, k) for n in ALL_NAMES for k in _kinds(n)])
def test_auto_block_for_cuda_is_within_the_kernels_rules(name, kind, cuda_exports):
    lowering, model = cuda_exports(name, kind)
    _assert_within_rules(lowering, model)


# The whole-model families in the two float types CUDA's GroupQueryAttention runs; the default run takes
# llama in both (the spliced layers) and gemma2 in float16 (its fp32 norms: export/lm_fusions.py).
WHOLE_DTYPES = ("float16", "bfloat16")
DEFAULT_WHOLE = {(DEFAULT_FAMILY, "float16"), (DEFAULT_FAMILY, "bfloat16"), ("gemma2", "float16")}


def _family(f: str, dtype: str):
    marks = [] if (f, dtype) in DEFAULT_WHOLE else [pytest.mark.slow]
    return pytest.param(f, dtype, marks=marks, id=f"{f}-{dtype}")


@pytest.mark.parametrize("family, dtype", [_family(f, d) for f in LM_FAMILIES for d in WHOLE_DTYPES])
def test_auto_whole_model_for_cuda_is_within_the_kernels_rules(family, dtype, cuda_exports):
    lowering, model = cuda_exports(family, "lm", dtype)
    _assert_within_rules(lowering, model)
    if family == DEFAULT_FAMILY:  # GroupQueryAttention spliced into every layer, in the export's dtype
        gqa = [f for f in attention_nodes(model) if f.op.endswith("GroupQueryAttention")]
        assert lowering == "ort-gqa" and len(gqa) == lm_cases.BASE["num_hidden_layers"]
        assert all(f.dtype("query") == dtype for f in gqa)


def test_auto_for_cuda_never_takes_groupqueryattention_in_fp32():
    spec = zoo.spec("llama-3-8b", **small_overrides("llama-3-8b"))
    for dtype, first in (("float32", "onnx-attention"), ("float16", "ort-gqa")):
        request = dict(decode=True, dtype=dtype, provider="cuda", masked=True)
        assert [lw for lw in decode_order("cuda", spec) if why_not(lw, spec, **request) is None][0] == first
    assert "float16/bfloat16" in why_not("ort-gqa", spec, dtype="float32", provider="cuda")
    assert candidates([spec], "auto", "cuda", "float32") == ["decomposed"]


def test_sinks_with_a_bias_are_refused_for_cuda_before_export(tmp_path):
    """gpt-oss' sinks go in head_sink; a mask becomes attention_bias; CUDA's kernel refuses the two together."""
    spec = zoo.spec("gpt-oss-20b", **small_overrides("gpt-oss-20b"))
    reason = why_not("ort-gqa", spec, dtype="float16", provider="cuda", masked=True)
    assert "head_sink" in reason and "attention_bias" in reason and "\n" not in reason
    assert why_not("ort-gqa", spec, dtype="float16", provider="cuda") is None  # no mask, no bias
    assert why_not("ort-gqa", spec, dtype="float16", provider="cpu", masked=True) is None  # the CPU kernel takes both
    with pytest.raises(ExportError, match="head_sink") as e:
        export_onnx("gpt-oss-20b", tmp_path / "g.onnx", lowering="ort-gqa", provider="cuda", dtype="float16",
                    decode=True, with_mask=True, **small_overrides("gpt-oss-20b"))  # fmt: skip
    assert "\n" not in str(e.value) and not (tmp_path / "g.onnx").exists()
    # a whole model always has a mask: ort-gqa is refused for every layer, auto falls to the next
    with pytest.raises(ExportError, match="layer 0: .*head_sink"):
        candidates([spec, spec], "ort-gqa", "cuda", "float16")
    assert candidates([spec, spec], "auto", "cuda", "float16") == ["decomposed"]


def test_every_fused_lowering_states_its_cuda_rules_with_sources():
    for lw in LOWERING_LIST:
        assert bool(lw.cuda) == (lw.op is not None), lw.name
        for rules in lw.cuda:
            assert rules.sources and all(s.startswith("onnxruntime/") for s in rules.sources)
            assert rules.dtypes and set(rules.typed) <= set(rules.inputs) and set(rules.ranks) <= set(rules.inputs)


def test_docs_hold_the_cuda_rules_tables():
    page = (REPO / "docs" / "gpu.md").read_text()
    for rules in RULES.values():
        assert rules.table() in page, f"docs/gpu.md lacks the rules of {rules.op}; paste rules.table()"
    assert "read from source, not yet run on a GPU" in page


# -- the checker fails a graph that breaks a rule (hand-made nodes) --------------------------------------

_TYPES = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "int32": TensorProto.INT32,
          "int64": TensorProto.INT64, "bool": TensorProto.BOOL}  # fmt: skip
_GQA_SHAPES = {
    "query": ["b", "t", 64],  # 4 heads of 16, 2 kv heads
    "key": ["b", "t", 32],
    "value": ["b", "t", 32],
    "past_key": ["b", 2, "n", 16],
    "past_value": ["b", 2, "n", 16],
    "seqlens_k": ["b"],
    "total_sequence_length": [],
    "cos_cache": ["n", 8],
    "sin_cache": ["n", 8],
    "attention_bias": ["b", 1, "t", "s"],
    "head_sink": [4],
}


def _one_node(op: str, domain: str, names: tuple[str, ...], inputs: dict, attrs: dict) -> onnx.ModelProto:
    """A graph of one `op` node, its inputs graph inputs of the given (dtype, shape), by schema position."""
    vis = [helper.make_tensor_value_info(n, _TYPES[t], shape) for n, (t, shape) in inputs.items()]
    node = helper.make_node(op, [n if n in inputs else "" for n in names], ["y"], name="probe", domain=domain, **attrs)
    while node.input and node.input[-1] == "":
        node.input.pop()
    graph = helper.make_graph([node], "probe", vis, [helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)])
    opsets = [helper.make_opsetid("", 23), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def _gqa(t: str = "float16", drop=(), **changes) -> onnx.ModelProto:
    attrs = {"num_heads": 4, "kv_num_heads": 2, **changes.pop("attrs", {})}
    want = ("query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length")
    inputs = {n: (t if n not in ("seqlens_k", "total_sequence_length") else "int32", _GQA_SHAPES[n]) for n in want}
    inputs.update(changes)
    for n in drop:
        inputs.pop(n)
    return _one_node("GroupQueryAttention", "com.microsoft", RULES["com.microsoft::GroupQueryAttention"].inputs,
                     inputs, attrs)  # fmt: skip


def test_checker_passes_a_gqa_node_within_the_rules():
    assert cuda_refusals(_gqa()) == [] and cuda_refusal(_gqa()) is None
    assert fast_kernels(_gqa()) == {"probe": ("XQA", "cuDNN", "Flash", "MEA")}
    biased = _gqa(attention_bias=("float16", _GQA_SHAPES["attention_bias"]))
    assert cuda_refusals(biased) == [] and fast_kernels(biased) == {"probe": ()}  # the unfused kernel only


@pytest.mark.parametrize(
    "graph, words",
    [
        pytest.param(_gqa("float32"), ("query is float32", "float16, bfloat16"), id="fp32"),
        pytest.param(
            _gqa(attention_bias=("float16", _GQA_SHAPES["attention_bias"]), head_sink=("float16", [4])),
            ("attention_bias", "head_sink", "NOT_IMPLEMENTED"),
            id="bias-with-sinks",
        ),
        pytest.param(
            _gqa(attention_bias=("float16", _GQA_SHAPES["attention_bias"]), attrs={"smooth_softmax": 1}),
            ("smooth_softmax",),
            id="bias-with-smooth-softmax",
        ),
        pytest.param(
            _gqa(attention_bias=("float16", _GQA_SHAPES["attention_bias"]), attrs={"k_quant_type": "PER_TENSOR"}),
            ("k_quantized",),
            id="bias-with-quantized-cache",
        ),
        pytest.param(
            _gqa(attention_bias=("float32", _GQA_SHAPES["attention_bias"])),
            ("attention_bias is float32",),
            id="bias-dtype",
        ),  # fmt: skip
        pytest.param(_gqa(attention_bias=("float16", ["b", "t", "s"])), ("attention_bias has rank 3",), id="bias-rank"),
        pytest.param(_gqa(attention_bias=("float16", ["b", 3, "t", "s"])), ("1 or num_heads=4",), id="bias-heads"),
        pytest.param(_gqa(seqlens_k=("int64", ["b"])), ("seqlens_k is int64",), id="seqlens-int64"),
        pytest.param(_gqa(drop=("past_value",)), ("past_key and past_value",), id="past-alone"),
        pytest.param(_gqa(attrs={"do_rotary": 1}), ("do_rotary needs", "cos_cache"), id="rotary-without-tables"),
        pytest.param(
            _gqa(query=("float16", ["b", "t", 48]), key=("float16", ["b", "t", 24]), value=("float16", ["b", "t", 24])),
            ("head size 12", "multiple of 8"),
            id="head-12",
        ),
        pytest.param(
            _gqa(
                query=("float16", ["b", "t", 32]),
                key=("float16", ["b", "t", 16]),
                value=("float16", ["b", "t", 16]),
                past_key=("float16", ["b", 2, "n", 8]),
                past_value=("float16", ["b", 2, "n", 8]),
                cos_cache=("float16", ["n", 8]),
                sin_cache=("float16", ["n", 8]),
                attrs={"do_rotary": 1},
            ),
            ("head size 8", "multiple of 16", "cos_cache"),
            id="rotary-head-8",
        ),  # fmt: skip
    ],
)
def test_checker_names_a_broken_gqa_rule(graph, words):
    lines = cuda_refusals(graph)
    assert lines and all(w in " ".join(lines) for w in words), lines
    assert all(line.startswith("node probe (GroupQueryAttention): ") for line in lines)
    with pytest.raises(ExportError, match="probe"):
        from export.cuda_check import check

        check(graph, "cuda")


def test_checker_reads_multiheadattention_and_the_onnx_attention_op():
    mha = RULES["com.microsoft::MultiHeadAttention"]
    three = {n: ("float16", ["b", "t", 64]) for n in ("query", "key", "value")}
    ok = _one_node("MultiHeadAttention", "com.microsoft", mha.inputs, three, {"num_heads": 4})
    assert cuda_refusals(ok) == [] and fast_kernels(ok)["probe"][0] == "cuDNN"
    bad = _one_node("MultiHeadAttention", "com.microsoft", mha.inputs,
                    {**three, "key_padding_mask": ("int64", ["b", "s"])}, {"num_heads": 4})  # fmt: skip
    assert "key_padding_mask is int64" in cuda_refusal(bad) and "Flash" not in fast_kernels(bad)["probe"]
    onnx_rules = RULES["Attention"]
    qkv = {n: ("float16", ["b", 4, "t", 16]) for n in ("Q", "K", "V")}
    capped = _one_node("Attention", "", onnx_rules.inputs, qkv, {"softcap": 30.0})
    assert "softcap" in cuda_refusal(capped)
    masked = _one_node("Attention", "", onnx_rules.inputs, {**qkv, "attn_mask": ("bool", ["t", "s"])}, {})
    assert cuda_refusals(masked) == [] and "Flash" not in fast_kernels(masked)["probe"]


def test_generate_caches_one_export_per_precision_target_and_dtype(tmp_path):
    """`attnzoo generate FOLDER --provider cuda` must not run the export made for the CPU."""
    from cli.export_cache import _export_key

    folder = tmp_path / "ckpt"  # the key reads config.json and the weights files' names, sizes and times
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "llama"}')
    (folder / "model.safetensors").write_bytes(b"weights")
    combos = [(p, t, d) for p in PRECISIONS for t in ("cpu", "cuda") for d in DTYPES]
    assert len({_export_key(folder, p, None, t, d) for p, t, d in combos}) == len(combos)
    assert _export_key(folder, "fp32", None) == _export_key(folder, "fp32", None, "cpu", "float32")
