"""Weight precision (export/precision.py): what each precision writes, its refusals, and the error
bounds parity holds quantized exports to, on random blocks of every registered name and on the
transformers-initialised blocks of the families from_hf supports (tests/peers/test_hf.py's cases).

The default run checks one lowering and one precision per name (rotating), a few decode exports
and a few transformers families; the rest of the matrix runs under -m slow. Each check prints the
measured relative L2 error of y (run with -s to collect them: docs/precision.md, "Error, stated")."""

from __future__ import annotations

import onnx
import pytest
import torch

import zoo
from export.choice import why_not
from export.names import LOWERINGS, PRECISIONS
from export.precision import ERROR_BOUNDS, PrecisionError, apply, rel_l2
from export.writer import export_onnx
from helpers import ALL_NAMES, REPO, small_overrides
from parity.matrix import check, check_decode
from runtime.session import OnnxSession

QUANTIZED = [p for p in PRECISIONS if p != "fp32"]
FEW_SHAPES = [(1, 7, 13), (3, 64, 64)]  # neither is the export's traced shape (2, 5, 7)


def _default_lowering(name: str) -> str:
    """The lowering a name gets in the default run: ort-gqa (built in milliseconds) where it can
    express the block, else a traced one rotating with the name's index."""
    spec = zoo.spec(name, **small_overrides(name))
    if why_not("ort-gqa", spec) is None:
        return "ort-gqa"
    traced = [lw for lw in LOWERINGS if lw != "ort-gqa" and why_not(lw, spec) is None]
    return traced[ALL_NAMES.index(name) % len(traced)]


def _random_matrix():
    """Every name x lowering x quantized precision. Default run: each name once, at its default
    lowering and one precision (alternating); a traced export costs seconds, so of the names no
    ort-gqa graph can express only one per traced lowering is in the default run."""
    params = []
    traced_seen: set[str] = set()
    for i, name in enumerate(ALL_NAMES):
        default = _default_lowering(name)
        cheap = default == "ort-gqa" or default not in traced_seen
        traced_seen.add(default)
        for lw in LOWERINGS:
            for k, prec in enumerate(QUANTIZED):
                quick = cheap and lw == default and k == i % len(QUANTIZED)
                params.append(
                    pytest.param(name, lw, prec, marks=() if quick else (pytest.mark.slow,), id=f"{name}-{lw}-{prec}")
                )
    return params


@pytest.mark.parametrize("name, lowering, precision", _random_matrix())
def test_error_bound_on_random_blocks(name, lowering, precision, tmp_path):
    row = check(
        name, lowering, precision=precision, case="plain", shapes=FEW_SHAPES, workdir=tmp_path, **small_overrides(name)
    )
    if row.status == "SKIP":
        pytest.skip(row.reason)
    print(f"precision-error random {name} {lowering} {precision} rel_l2={row.rel_l2:.5f}")
    assert row.status == "PASS", f"{name} {lowering} {precision}: {row.reason}"
    assert 0 < row.rel_l2 <= ERROR_BOUNDS[precision]


DECODE_NAMES = [n for n in ALL_NAMES if zoo.spec(n).causal and not zoo.spec(n).is_cross]
DECODE_QUICK = {("llama-3-8b", "int4"), ("mistral-7b", "int8")}  # ort-gqa: built, not traced


@pytest.mark.parametrize(
    "name, precision",
    [
        pytest.param(n, p, marks=() if (n, p) in DECODE_QUICK else (pytest.mark.slow,), id=f"{n}-{p}")
        for n in DECODE_NAMES
        for p in QUANTIZED
    ],
)
def test_error_bound_on_decode_exports(name, precision, tmp_path):
    """The default decode lowering for the CPU, prompt then single steps then chunks, b 1 and 3."""
    from export.choice import decode_order

    overrides = small_overrides(name)
    spec = zoo.spec(name, **overrides)
    lowering = next(lw for lw in decode_order("cpu", spec) if why_not(lw, spec, decode=True) is None)
    row = check_decode(name, lowering, precision=precision, workdir=tmp_path, **overrides)
    print(f"precision-error decode {name} {lowering} {precision} rel_l2={row.rel_l2:.5f}")
    assert row.status == "PASS", f"{name} {lowering} {precision}: {row.reason}"
    assert 0 < row.rel_l2 <= ERROR_BOUNDS[precision]


# -- the transformers-initialised blocks ---------------------------------------------------------

HF_QUICK = ("llama", "gpt2")  # ort-gqa by default: no torch export in the default run


def _hf_params():
    hf = pytest.importorskip("test_hf", reason="transformers is not installed")
    return [
        pytest.param(c, p, marks=() if c in HF_QUICK and p == "int4" else (pytest.mark.slow,), id=f"{c}-{p}")
        for c in hf.CASES
        for p in QUANTIZED
    ]


try:
    HF_PARAMS = _hf_params()
except pytest.skip.Exception:  # no transformers: one skipped test says so
    HF_PARAMS = [pytest.param("-", "-", marks=pytest.mark.skip(reason="transformers is not installed"))]


@pytest.mark.parametrize("case, precision", HF_PARAMS)
def test_error_bound_on_transformers_blocks(case, precision, tmp_path):
    """from_hf's block of a random transformers model, exported at the precision (its default
    lowering for the CPU); y against the transformers module's own output."""
    import test_hf

    c = test_hf.capture(case)
    block = zoo.from_hf(c.module, model=c.model)  # a later T5 layer reads its stack's table
    b, t = c.x.shape[:2]
    s = t if c.context is None else c.context.shape[1]
    mask = None if c.keep is None else c.keep[:, None, :].expand(b, t, s).contiguous()
    path = tmp_path / f"{case}-{precision}.onnx"
    r = export_onnx(block, path, precision=precision, with_mask=mask is not None)
    y = OnnxSession(path, "cpu", verbose=False).run(c.x, context=c.context, mask=mask)
    err = rel_l2(torch.as_tensor(y).numpy(), c.y.numpy())
    print(f"precision-error transformers {case} {r.lowering} {precision} rel_l2={err:.5f}")
    assert 0 < err <= ERROR_BOUNDS[precision], f"{case} {r.lowering} {precision}: rel L2 {err:.2%}"


# -- a row's answer depends on that row, a position's on what it may attend to ----------------------

# Every lowering that can be quantized, on a causal block (mha-causal: combined projection, no bias)
# and, for ort-mha, on the biased block whose Q/K/V ORT packs into com.microsoft.Attention (which
# stays fp32: its output projection is the quantized MatMul there). Default run: every int8 cell and
# int4 on ort-gqa (built, not traced); the other int4 cells under -m slow.
COUPLING_CASES = [("mha-causal", lw) for lw in LOWERINGS] + [("mha-combined-bias", "ort-mha")]


def _coupling_params(causal_only: bool = False):
    return [
        pytest.param(n, lw, p, marks=() if p == "int8" or lw == "ort-gqa" else (pytest.mark.slow,), id=f"{n}-{lw}-{p}")
        for n, lw in COUPLING_CASES
        for p in QUANTIZED
        if not causal_only or zoo.spec(n).causal
    ]


@pytest.fixture(scope="module")
def quantized_exports(tmp_path_factory):
    """(name, lowering, precision) -> (session, spec), exported once for the tests below."""
    folder, made = tmp_path_factory.mktemp("coupling"), {}

    def get(name, lowering, precision):
        if (name, lowering, precision) not in made:
            path = folder / f"{name}-{lowering}-{precision}.onnx"
            r = export_onnx(name, path, lowering=lowering, precision=precision, d_model=64, heads=4)
            assert r.lowering == lowering
            spec = zoo.spec(name, d_model=64, heads=4)
            made[name, lowering, precision] = OnnxSession(path, "cpu", verbose=False), spec
        return made[name, lowering, precision]

    return get


@pytest.mark.parametrize("name, lowering, precision", _coupling_params())
def test_quantized_row_independent_of_batch_mates(name, lowering, precision, quantized_exports):
    """A row's y is bit-equal alone and batched with a row 20x larger (dynamic int8, the former method,
    took one activation scale per tensor: row a's error went from 1.6% alone to 57% beside a 20x row)."""
    sess, spec = quantized_exports(name, lowering, precision)
    torch.manual_seed(0)
    a, big = torch.randn(1, 16, spec.d_model), 20 * torch.randn(1, 16, spec.d_model)
    alone = sess.run(a).clone()
    batched = sess.run(torch.cat([a, big])).clone()
    assert torch.equal(batched[:1], alone), f"max change {float((batched[:1] - alone).abs().max()):.3g}"
    assert torch.equal(batched[1:], sess.run(big))  # and the large row is its own answer too


@pytest.mark.parametrize("name, lowering, precision", _coupling_params(causal_only=True))
def test_quantized_causal_positions_independent_of_the_future(name, lowering, precision, quantized_exports):
    """Positions 0..7 of a causal block's 16 are bit-equal when positions 8..15 are scaled 20x (under
    dynamic int8 they moved by 20% of their scale)."""
    sess, spec = quantized_exports(name, lowering, precision)
    torch.manual_seed(1)
    x = torch.randn(2, 16, spec.d_model)
    later = x.clone()
    later[:, 8:] *= 20
    now, then = sess.run(x).clone(), sess.run(later).clone()
    assert torch.equal(then[:, :8], now[:, :8]), f"max change {float((then[:, :8] - now[:, :8]).abs().max()):.3g}"
    assert not torch.equal(then[:, 8:], now[:, 8:])  # the scaled positions did change


def test_parity_int8_checks_a_mixed_scale_batch_and_causality(monkeypatch, tmp_path):
    """parity --precision int8 runs rows of different scales in one batch and scales a causal block's
    future; a session that couples rows (its batch answered by the batch's largest row) FAILS it."""
    import parity.matrix as parity

    row = check("mha-causal", "ort-gqa", precision="int8", shapes=FEW_SHAPES, workdir=tmp_path, d_model=64, heads=4)
    assert row.status == "PASS" and row.shapes == len(FEW_SHAPES) + 2, row  # + the mixed batch + the future

    real = parity._run

    def coupled(sess, feeds, device):  # every row scaled like the batch's largest: the old per-tensor flaw
        outs = real(sess, feeds, device)
        peak = feeds["x"].abs().amax(dim=(1, 2))
        return tuple(o * (1 + 1e-3 * (peak.max() / peak).view(-1, *[1] * (o.dim() - 1))) for o in outs)

    monkeypatch.setattr(parity, "_run", coupled)
    row = check("mha-causal", "ort-gqa", precision="int8", shapes=FEW_SHAPES, workdir=tmp_path, d_model=64, heads=4)
    assert row.status == "FAIL" and "depends on its batch mates" in row.reason, row


def test_parity_int8_fails_a_session_whose_past_depends_on_the_future(monkeypatch, tmp_path):
    """The causality check itself: a session whose earlier positions move with later ones, row by row
    (so the mixed-scale batch still holds), FAILS parity naming the positions."""
    import parity.matrix as parity

    real = parity._run

    def leaky(sess, feeds, device):  # each row's first half nudged by its own second half
        outs = real(sess, feeds, device)
        x = feeds["x"]
        if x.shape[1] != parity.MIXED_T:
            return outs
        half = parity.MIXED_T // 2
        nudge = 1e-3 * x[:, half:].abs().amax(dim=(1, 2)).view(-1, 1, 1)
        y = outs[0].clone()
        y[:, :half] += nudge
        return (y, *outs[1:])

    monkeypatch.setattr(parity, "_run", leaky)
    row = check("mha-causal", "ort-gqa", precision="int8", shapes=FEW_SHAPES, workdir=tmp_path, d_model=64, heads=4)
    assert row.status == "FAIL" and "past outputs depend on future tokens" in row.reason, row


def test_parity_decode_int8_checks_a_mixed_scale_batch_and_causality(monkeypatch, tmp_path):
    """parity --decode --precision int8 runs rows of different scales through the prompt and steps, and
    scales a prompt's later positions; a session that couples rows, or leaks the future, FAILS it."""
    import parity.matrix as parity

    kw = {"precision": "int8", "workdir": tmp_path, "cache": "static", "d_model": 64, "heads": 4}
    row = check_decode("mha-causal", "ort-gqa", **kw)
    assert row.status == "PASS", row
    passed = row.shapes

    real = OnnxSession.decode

    def coupled(sess, x, *a, **k):  # every row scaled like the batch's largest: the old per-tensor flaw
        y, pk, pv = real(sess, x, *a, **k)
        peak = torch.as_tensor(x).abs().amax(dim=(1, 2))
        return y * (1 + 1e-3 * (peak.max() / peak).view(-1, 1, 1)), pk, pv

    monkeypatch.setattr(OnnxSession, "decode", coupled)
    row = check_decode("mha-causal", "ort-gqa", **kw)
    assert row.status == "FAIL" and "decode: row" in row.reason and "batch mates" in row.reason, row

    def leaky(sess, x, *a, **k):  # a prompt's first half nudged by its own second half, row by row
        y, pk, pv = real(sess, x, *a, **k)
        x = torch.as_tensor(x)
        if x.shape[1] != parity.PROMPT:
            return y, pk, pv
        half = parity.PROMPT // 2
        y = y.clone()
        y[:, :half] += 1e-4 * x[:, half:].abs().amax(dim=(1, 2)).view(-1, 1, 1)
        return y, pk, pv

    monkeypatch.setattr(OnnxSession, "decode", leaky)
    row = check_decode("mha-causal", "ort-gqa", **kw)
    assert row.status == "FAIL" and "past outputs depend on future tokens" in row.reason, row
    assert passed > 2  # the passing run counted the two checks among its shapes


# -- what an export at a precision writes ----------------------------------------------------------

QUANTIZED_OPS = {"int4": "com.microsoft::MatMulNBits", "int8": "com.microsoft::MatMulNBits"}


@pytest.mark.parametrize("precision", QUANTIZED)
def test_every_projection_is_quantized_and_recorded(precision, tmp_path):
    r = export_onnx("mha-separate-bias", tmp_path / "m.onnx", lowering="decomposed", precision=precision, d_model=64)
    assert r.precision == precision and precision in r.summary() and "precision" in r.summary()
    assert r.op_counts.get(QUANTIZED_OPS[precision]) == 4
    meta = {p.key: p.value for p in onnx.load(str(r.path)).metadata_props}
    assert meta["attnzoo.precision"] == precision
    assert meta["attnzoo.precision.quantized"] == "4 of 4 weight matrices"
    if precision == "int4":
        assert (meta["attnzoo.precision.block_size"], meta["attnzoo.precision.accuracy_level"]) == ("32", "4")
    sess = OnnxSession(r.path, "cpu", verbose=False)
    assert sess.precision.startswith(precision) and precision in sess.describe()


def test_fp32_is_the_default_and_recorded(tmp_path):
    r = export_onnx("mha-causal", tmp_path / "m.onnx", lowering="ort-gqa", d_model=64, heads=4)
    assert r.precision == "fp32"
    assert OnnxSession(r.path, "cpu", verbose=False).precision == "fp32"
    # ort-gqa: Q | K | V as one packed MatMul, then out_proj
    assert "MatMulNBits" not in str(r.op_counts) and r.op_counts["MatMul"] == 2


def test_decode_int8_is_weight_only_8_bit(tmp_path):
    r = export_onnx("llama-3-8b", tmp_path / "d.onnx", decode=True, precision="int8", **small_overrides("llama-3-8b"))
    assert r.op_counts.get("com.microsoft::MatMulNBits") == 4 and "MatMulInteger" not in r.op_counts
    model = onnx.load(str(r.path))
    bits = {a.i for n in model.graph.node if n.op_type == "MatMulNBits" for a in n.attribute if a.name == "bits"}
    assert bits == {8}


def test_attention_matmuls_stay_fp32(tmp_path):
    """The decomposed causal graph multiplies Q by K and the weights by V with MatMul: activations
    on both sides, never quantized (mha-causal is combined: one input and one output projection)."""
    r = export_onnx("mha-causal", tmp_path / "m.onnx", lowering="decomposed", precision="int4", d_model=64, heads=4)
    assert r.op_counts["com.microsoft::MatMulNBits"] == 2
    model = onnx.load(str(r.path))
    inits = {i.name for i in model.graph.initializer}
    left = [n for n in model.graph.node if n.op_type in ("MatMul", "Einsum")]
    assert left and all(not set(n.input) & inits for n in left)


def test_weights_inside_a_packed_attention_node_are_named_and_auto_goes_on(tmp_path):
    """ORT's rewriter packs a biased block's Q/K/V weights into com.microsoft.Attention, which
    neither tool quantizes: under auto the export takes the next lowering, whose projections are
    all quantized, and says why it skipped ort-mha (asked for by name, ort-mha keeps that note)."""
    r = export_onnx("mha-combined-bias", tmp_path / "m.onnx", precision="int4", d_model=64)
    assert r.lowering != "ort-mha" and r.op_counts["com.microsoft::MatMulNBits"] == 2
    note = " ".join(r.notes)
    assert "auto: skipped ort-mha" in note and "(25% of the projection weights)" in note
    assert "com.microsoft::Attention" in note
    meta = {p.key: p.value for p in onnx.load(str(r.path)).metadata_props}
    assert meta["attnzoo.precision.quantized"] == "2 of 2 weight matrices"


# -- refusals --------------------------------------------------------------------------------------


def test_unknown_precision_lists_the_choices(tmp_path):
    with pytest.raises(PrecisionError, match="fp32, int8, int4") as e:
        export_onnx("mha-causal", tmp_path / "m.onnx", precision="int2")
    assert isinstance(e.value, ValueError) and isinstance(e.value, zoo.AttnzooError)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "m.onnx").exists()


@pytest.mark.parametrize("precision", QUANTIZED)
def test_fp16_with_a_quantized_precision_is_one_line(precision, tmp_path):
    with pytest.raises(PrecisionError, match="dtype='float32'") as e:
        export_onnx("mha-causal", tmp_path / "m.onnx", precision=precision, dtype="float16")
    assert "\n" not in str(e.value)


def test_int8_full_sequence_is_weight_only_8_bit_and_not_refused_for_cuda():
    """int8 is MatMulNBits for full-sequence exports too (dynamic int8's DynamicQuantizeLinear, which
    the CUDA provider lacks, is gone), so cuda is no longer refused by the precision."""
    from export.precision import method
    from export.precision import why_not as precision_why_not

    assert method("int8") is method("int8", decode=True) and method("int8").tool == "nbits"
    assert precision_why_not("int8", dtype="float32", provider="cuda") is None


def test_a_graph_without_weights_is_refused():
    import onnx_ir as ir
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model = ir.from_proto(helper.make_model(graph, ir_version=10))
    with pytest.raises(PrecisionError, match="no projection"):
        apply(model, "int4")
    assert apply(model, "fp32")[1].method.precision == "fp32"


def test_parity_fails_over_the_bound(monkeypatch, tmp_path):
    """A bound below the measured error makes the row FAIL, naming both numbers."""
    import parity.matrix as parity

    monkeypatch.setitem(parity.ERROR_BOUNDS, "int4", 1e-4)
    row = check("mha-causal", "ort-gqa", precision="int4", shapes=FEW_SHAPES, workdir=tmp_path, d_model=64, heads=4)
    assert row.status == "FAIL" and "over the int4 bound" in row.reason and row.rel_l2 > 1e-4


# -- the command line and the task-level script -------------------------------------------------------


def test_cli_export_run_and_parity_take_precision(tmp_path, capsys):
    from cli.main import main

    out = tmp_path / "m.onnx"
    small = ["--set", "d_model=64", "--set", "heads=4"]
    assert main(["export", "mha-causal", "-o", str(out), "--lowering", "ort-gqa", "--precision", "int4", *small]) == 0
    assert "precision int4 (weight-only MatMulNBits, 4 bits, symmetric, block 32, accuracy_level 4)" in (
        capsys.readouterr().out
    )
    assert main(["run", str(out), "--provider", "cpu", "--repeats", "1", "--seq", "4"]) == 0
    assert "precision int4 (" in capsys.readouterr().out
    argv = ["parity", "mha-causal", "--lowering", "ort-gqa", "--case", "plain", "--precision", "fp32,int8", "-q"]
    assert main([*argv, "--precision", "int4", *small]) == 0
    table = capsys.readouterr().out
    assert f"(<= {ERROR_BOUNDS['int4']:.0%})" in table and "| int8 |" in table and "3 passed" in table
    with pytest.raises(SystemExit) as e:  # argparse's own one line: the choices
        main(["export", "mha-causal", "-o", str(tmp_path / "x.onnx"), "--precision", "int3"])
    assert e.value.code == 2 and "choose from 'fp32', 'int8', 'int4'" in capsys.readouterr().err


def test_task_level_script_on_tiny_induction(tmp_path):
    """scripts/precision_tasks.py: every block of tiny-induction through ONNX Runtime at each precision;
    fp32 through ONNX matches eager, and each quantized row states its loss shift."""
    import importlib.util
    import json

    path = REPO / "scripts" / "precision_tasks.py"
    spec = importlib.util.spec_from_file_location("precision_tasks", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    out = tmp_path / "tasks.json"
    argv = ["--models", "tiny-induction", "--precisions", "fp32,int4", "--batches", "1", "--batch", "16"]
    assert script.main([*argv, "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    eager, fp32, int4 = rows
    assert (eager["path"], fp32["precision"], int4["precision"]) == ("eager", "fp32", "int4")
    assert abs(eager["loss"] - fp32["loss"]) < 1e-4 and eager["accuracy"] == fp32["accuracy"]
    assert int4["loss_shift"] == pytest.approx(int4["loss"] - fp32["loss"])
    assert int4["moved"] == (abs(int4["loss_shift"]) > script.MAX_LOSS_SHIFT)


def test_bench_lays_out_precision_as_an_axis():
    """The plan without workers: each ONNX Runtime path once per precision, eager once; a quantized
    row's speed-up over the same path in fp32; an export a precision cannot have is n/a with why."""
    from bench.jobs import Budget
    from bench.plan import Export, _jobs, _rows

    spec = zoo.spec("mha-causal")
    exports = {
        "ort-gqa": Export("ort-gqa", "a.onnx"),
        "ort-gqa int4": Export("ort-gqa", "b.onnx", precision="int4"),
        "ort-gqa int8": Export("ort-gqa", None, "precision='int8' cannot run on cuda: ...", precision="int8"),
    }
    paths, precs = ["eager-sdpa", "ort-gqa"], ["fp32", "int8", "int4"]
    jobs = _jobs("mha-causal", {}, "cpu", "float32", 1, Budget(), paths, exports, [(1, 8)], precs)
    assert [(j.path, j.precision, j.model) for j in jobs] == [
        ("eager-sdpa", "fp32", ""),
        ("ort-gqa", "fp32", "a.onnx"),
        ("ort-gqa", "int4", "b.onnx"),
    ]
    measured = {(1, 8, j.path, j.precision): {"ok": True, "median_ms": ms} for j, ms in zip(jobs, (4.0, 2.0, 1.0))}
    cells = [(p, q) for p in paths for q in (precs if p != "eager-sdpa" else ["fp32"])]
    rows = _rows(spec, [(1, 8)], cells, exports, measured, {}, "cpu")
    want = [("fp32", "ok"), ("fp32", "ok"), ("int8", "n/a"), ("int4", "ok")]
    assert [(r["precision"], r["status"]) for r in rows] == want
    assert rows[3]["speedup_vs_fp32"] == 2.0 and "cuda" in rows[2]["note"]


@pytest.mark.slow  # five worker processes: about 35 s of CPU
def test_bench_takes_precision_as_an_axis(capsys):
    """bench: each ONNX Runtime path once per precision, eager once; a quantized row carries its
    speed-up over the same path in fp32 (nothing here looks at a timing's value)."""
    from bench.jobs import Budget
    from bench.plan import benchmark
    from bench.report import format_table

    report = benchmark(
        "mha-causal",
        overrides={"d_model": 64, "heads": 4},
        seqs=[8],
        paths=["eager-sdpa", "ort-gqa"],
        precisions=["fp32", "int4"],
        threads=1,
        budget=Budget(warmup=1, repeats=2, min_repeats=1, seconds=0.1),
        roofline_size=64,
        progress=False,
    )
    cells = [(r["path"], r["precision"], r["status"]) for r in report["rows"]]
    assert cells == [("eager-sdpa", "fp32", "ok"), ("ort-gqa", "fp32", "ok"), ("ort-gqa", "int4", "ok")]
    assert report["rows"][2]["speedup_vs_fp32"] > 0 and "ort-gqa int4" in report["exports"]
    assert "| ort-gqa int4 (auto) |" in format_table(report) and "vs fp32 |" in format_table(report)


def test_bench_refuses_what_it_cannot_measure(capsys):
    from cli.main import main

    assert main(["bench", "mha-causal", "--precision", "bf16", "--no-progress"]) == 2
    assert "eager half-precision rows are a --decode option" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bench", "mha-causal", "--precision", "int2"])
