"""Regression tests for issue 11: one per defect a careful user found, and the error root.

Each test is the one that would have caught its defect; the issue's item number is in its name.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import zoo
from cli.main import main
from export import ExportError, OnnxSession, export_onnx
from export import lowering as lowering_mod
from export.session import RunInputError, SessionError

ROOT = Path(__file__).resolve().parent.parent


def one_line_error(capsys, argv: list[str]) -> str:
    """Run the CLI in-process; it must exit 2 with exactly one line on stderr (no traceback)."""
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse's own usage errors exit from inside parse_args
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2, (argv, rc, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, (argv, err)
    return lines[0]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("hard")
    torch.manual_seed(0)
    self_block = zoo.create("mha-combined-bias").eval()
    cross_block = zoo.create("cross-attention").eval()
    return {
        "self": self_block,
        "cross": cross_block,
        "decomposed": export_onnx(self_block, d / "d.onnx", lowering="decomposed").path,
        "cross-decomposed": export_onnx(cross_block, d / "c.onnx", lowering="decomposed").path,
        "onnx-attention-fp16": export_onnx(self_block, d / "a16.onnx", lowering="onnx-attention", dtype="float16").path,
        "decomposed-fp16": export_onnx(self_block, d / "d16.onnx", lowering="decomposed", dtype="float16").path,
        "ort-mha-masked-fp16": export_onnx(
            self_block, d / "m16.onnx", lowering="ort-mha", dtype="float16", with_mask=True
        ).path,
    }


def test_cli_shows_a_real_bug_with_its_traceback(monkeypatch):
    # Only the error root and OSError are a user's mistake; anything else is ours and must show.
    import cli.main as cli

    def boom(args):
        raise KeyError("a bug")

    real = cli.build_parser
    monkeypatch.setattr(cli, "build_parser", lambda: _with_func(real(), boom))
    with pytest.raises(KeyError):
        main(["list"])


# -- 1. empty inputs never reach ONNX Runtime ----------------------------------------------------


@pytest.mark.parametrize("shape", [(0, 4, 64), (2, 0, 64)])
def test_1_session_refuses_empty_batch_or_sequence(models, shape):
    sess = OnnxSession(models["decomposed"], "cpu", verbose=False)
    with pytest.raises(RunInputError, match="empty input"):
        sess.run(torch.randn(*shape))  # b = 0 on the decomposed graph was a SIGFPE (exit 136)
    with pytest.raises(RunInputError, match="empty input"):
        sess.run(np.zeros(shape, dtype=np.float32))


def test_1_session_refuses_empty_context(models):
    sess = OnnxSession(models["cross-decomposed"], "cpu", verbose=False)
    with pytest.raises(RunInputError, match=r"s=0"):
        sess.run(torch.randn(2, 3, 64), torch.randn(2, 0, 48))


def test_1_empty_batch_in_a_fresh_process_is_one_error_not_a_crash(models):
    code = (
        "import torch, sys; from export import OnnxSession\n"
        f"s = OnnxSession({str(models['decomposed'])!r}, 'cpu', verbose=False)\n"
        "try:\n    s.run(torch.randn(0, 4, 64))\nexcept ValueError as e:\n    print('refused', e); sys.exit(3)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 3 and "refused" in r.stdout, (r.returncode, r.stderr[-500:])


# -- 2. the torch peer's constructor options: exact, refused, or said out loud ------------------


def test_2_sequence_first_peer_converts_with_a_warning_naming_the_layout():
    peer = nn.MultiheadAttention(64, 4).eval()  # batch_first=False is torch's default
    with pytest.warns(UserWarning, match=r"batch_first=False.*\(t, b, c\)"):
        m = zoo.from_torch_mha(peer).eval()
    x_tbc = torch.randn(7, 2, 64)
    with torch.no_grad():
        y_ref, _ = peer(x_tbc, x_tbc, x_tbc)
        y = m(x_tbc.transpose(0, 1)).transpose(0, 1)  # what the warning tells the user to do
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)


def test_2_batch_first_peer_converts_silently():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        zoo.from_torch_mha(nn.MultiheadAttention(64, 4, batch_first=True).eval())


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"add_bias_kv": True}, "add_bias_kv"),
        ({"add_zero_attn": True}, "add_zero_attn"),
        ({"kdim": 16, "vdim": 24}, "kdim=16 != vdim=24"),
    ],
)
def test_2_peer_options_the_zoo_cannot_express_are_refused(kwargs, match):
    with pytest.raises(zoo.ArgumentError, match=match):
        zoo.from_torch_mha(nn.MultiheadAttention(64, 4, batch_first=True, **kwargs))


# -- 3. fp16: where it overflows, and where it no longer does -----------------------------------


def _fp16_case(block, scale: float):
    """(x fp16, reference y in fp32 on the fp16-rounded weights) at `scale` x a unit normal."""
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(2, 7, 64, generator=g) * scale).half()
    ref = zoo.create("mha-combined-bias")
    ref.load_state_dict(block.state_dict())
    ref = ref.half().float().eval()
    with torch.no_grad():
        return x, ref(x.float())


def _rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    y = y.float()
    if not torch.isfinite(y).all():
        return float("inf")
    return float((y - ref).abs().max() / ref.abs().max())


@pytest.mark.parametrize("scale", [1.0, 300.0, 15000.0])
def test_3_eager_fp16_is_finite_on_both_paths(models, scale):
    m = zoo.create("mha-combined-bias")
    m.load_state_dict(models["self"].state_dict())
    m = m.half().eval()
    x, ref = _fp16_case(models["self"], scale)
    with torch.no_grad():
        y_fused = m(x)
        y_explicit, attn = m(x, need_weights=True)  # was inf/NaN at 300x: Q K^T in fp16
    assert _rel(y_fused, ref) < 1e-2 and _rel(y_explicit, ref) < 1e-2
    assert torch.isfinite(attn).all()


# Measured on onnxruntime 1.31 CPU (README, "Precision"), x = k * randn, fixed weights and
# input: (largest k within tolerance, a k past the limit, what happens there).
FP16_LIMITS = {
    "decomposed-fp16": (15000.0, 20000.0, "inf"),  # the fp16 projections overflow: fp16's range
    # ORT's CPU Attention forms Q K^T in fp16 (inf at 300x); the export hands it fp32 Q, K, V
    # (MultiHeadAttention.sdpa_fp32), so only the fp16 projections limit it, as for decomposed.
    "onnx-attention-fp16": (15000.0, 20000.0, "inf"),
    "ort-mha-masked-fp16": (250.0, 300.0, "wrong"),  # finite, but far off
}
CAUSAL = torch.ones(7, 7, dtype=torch.bool).tril()


def _fp16_run(models, model: str, scale: float) -> float:
    sess = OnnxSession(models[model], "cpu", verbose=False)
    masked = "masked" in model
    x, _ = _fp16_case(models["self"], scale)
    ref = zoo.create("mha-combined-bias")
    ref.load_state_dict(models["self"].state_dict())
    with torch.no_grad():
        want = ref.half().float().eval()(x.float(), mask=CAUSAL if masked else None)
    return _rel(sess.run(x, mask=CAUSAL) if masked else sess.run(x), want)


@pytest.mark.parametrize("model", sorted(FP16_LIMITS))
def test_3_fp16_exports_hold_up_to_their_documented_limit(models, model):
    for scale in (1.0, 30.0, FP16_LIMITS[model][0]):
        assert _fp16_run(models, model, scale) < 1e-2, (model, scale)


@pytest.mark.parametrize("model", sorted(FP16_LIMITS))
def test_3_fp16_exports_past_their_limit_fail_as_the_readme_says(models, model):
    # If this starts failing, ONNX Runtime (or the lowering) changed: move FP16_LIMITS and the
    # README's precision table with it; don't delete the test.
    _, past, how = FP16_LIMITS[model]
    rel = _fp16_run(models, model, past)
    if how == "inf":
        assert rel == float("inf"), (model, rel)
    else:
        assert 0.1 < rel < float("inf"), (model, rel)


def test_3_fp16_projections_overflow_is_the_real_limit(models):
    # Past ~65504 / (|x| |W|) the fp16 projections themselves are inf: fp16's range, not a bug.
    m = zoo.create("mha-combined-bias")
    m.load_state_dict(models["self"].state_dict())
    m = m.half().eval()
    x, _ = _fp16_case(models["self"], 1e5)
    with torch.no_grad():
        assert not torch.isfinite(m.qkv_proj(x)).all()


# -- 4. parity: a provider that cannot run fails -------------------------------------------------


def test_4_parity_with_an_unusable_provider_fails(capsys):
    from export.session import cuda_status

    ok, why = cuda_status()
    if ok:
        pytest.skip("this machine has a working CUDA provider")
    line = one_line_error(capsys, ["parity", "mha-causal", "--provider", "cuda", "--lowering", "decomposed", "-q"])
    assert why in line


def test_4_api_checks_skip_an_unusable_provider_alike():
    """Without the CLI's refusal, both parity checks answer SKIP with the same reason."""
    from export import parity
    from export.session import cuda_status

    ok, why = cuda_status()
    if ok:
        pytest.skip("this machine has a working CUDA provider")
    full = parity.check("mha-causal", "decomposed", provider="cuda")
    step = parity.check_decode("mha-causal", "decomposed", provider="cuda")
    for row in (full, step):
        assert row.status == "SKIP" and why in row.reason, row


# -- 5. no-overwrite cannot be raced -------------------------------------------------------------


def test_5_export_that_loses_the_race_refuses_and_leaves_the_winner(tmp_path, monkeypatch):
    target = tmp_path / "same.onnx"
    real = lowering_mod.lower

    def slow_lower(*a, **kw):
        out = real(*a, **kw)
        target.write_bytes(b"the other export's model")  # another process finished first
        return out

    monkeypatch.setattr(lowering_mod, "lower", slow_lower)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        export_onnx("mha-separate-nobias", target, lowering="decomposed")
    assert target.read_bytes() == b"the other export's model"
    assert not list(tmp_path.glob(".attnzoo-*"))


def test_5_unwritable_target_is_named_before_any_work(monkeypatch, capsys):
    def never(*a, **kw):
        raise AssertionError("the export ran before the output folder was checked")

    monkeypatch.setattr(lowering_mod, "lower", never)
    line = one_line_error(capsys, ["export", "mha-causal", "-o", "/proc/attnzoo-test.onnx"])
    assert "/proc/attnzoo-test.onnx" in line and ".attnzoo-" not in line


# -- 6. NaN in a float mask ----------------------------------------------------------------------


@pytest.mark.parametrize("need_weights", [False, True])
def test_6_nan_float_mask_is_refused_on_every_path(need_weights):
    m = zoo.create("mha-combined-bias").eval()
    mask = torch.zeros(5, 5)
    mask[2] = float("nan")
    with pytest.raises(zoo.InputError, match="NaN"):
        m(torch.randn(2, 5, 64), mask=mask, need_weights=need_weights)
    m.fused = False
    with pytest.raises(zoo.InputError, match="NaN"):
        m(torch.randn(2, 5, 64), mask=mask)


# -- 7. sizes past the machine -------------------------------------------------------------------


def test_7_show_of_a_huge_spec_allocates_nothing_and_answers(capsys):
    assert main(["show", "transformer-base", "--set", "d_model=1000000000", "--set", "heads=1"]) == 0
    out = capsys.readouterr().out
    assert "too large for torch" in out and "4,000,000,000,000,000,000" in out


@pytest.mark.parametrize(
    "argv",
    [
        ["audit", "transformer-base", "--set", "d_model=1000000", "--set", "heads=1"],
        ["export", "transformer-base", "--set", "d_model=1000000", "--set", "heads=1", "-o", "/tmp/never.onnx"],
    ],
)
def test_7_huge_width_is_refused_with_the_number(capsys, argv):
    line = one_line_error(capsys, argv)
    assert "needs about" in line and "this machine has" in line


def test_7_run_past_the_machine_is_refused_before_inputs_are_made(models, capsys):
    line = one_line_error(capsys, ["run", str(models["decomposed"]), "-b", "100000", "-t", "100000"])
    assert "needs about" in line and "(100000, 100000, 100000)" in line


def test_7_allocation_failure_that_still_happens_is_one_line(monkeypatch, capsys):
    import cli.main as cli

    def oom(args):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory")

    real = cli.build_parser
    monkeypatch.setattr(cli, "build_parser", lambda: _with_func(real(), oom))
    assert "out of memory" in one_line_error(capsys, ["list"])


def test_7_onnx_runtime_allocation_failure_is_a_resource_error(models, monkeypatch):
    sess = OnnxSession(models["decomposed"], "cpu", verbose=False)

    class FakeOrt:
        def run(self, *a, **kw):
            raise RuntimeError(
                "[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Non-zero status code returned while running "
                "MatMul node. Failed to allocate memory for requested buffer of size 1099511627776\nmore"
            )

    monkeypatch.setattr(sess, "_sess", FakeOrt())
    with pytest.raises(zoo.ResourceError, match="ran out of memory") as ei:
        sess.run(torch.randn(1, 2, 64))
    assert "\n" not in str(ei.value)


def _with_func(parser: argparse.ArgumentParser, func):
    parser.set_defaults(func=func)
    for action in parser._subparsers._group_actions:
        for sp in action.choices.values():
            sp.set_defaults(func=func)
    return parser


def test_7_check_fits_names_need_and_limit():
    from zoo.limits import check_fits, machine_memory_bytes

    assert machine_memory_bytes() and machine_memory_bytes() > 2**20
    check_fits(10, "a tiny thing", limit=100)
    with pytest.raises(zoo.ResourceError, match=r"needs about 1 kB \(1,000 bytes\).*has 100 B"):
        check_fits(1000, "a request", limit=100)


# -- 8. bench: sized to the dtype, every numeric flag checked, clean on every exit ----------------


@pytest.mark.parametrize(
    "flags, match",
    [
        (["--budget", "nan"], "--budget"),
        (["--budget", "inf"], "--budget"),
        (["--roofline-size", "0"], "--roofline-size"),
        (["--min-repeats", "10", "--repeats", "2"], "--min-repeats"),
        (["--timeout", "0"], "--timeout"),
        (["--threads", "0"], "--threads"),
        (["--warmup", "-1"], "--warmup"),
        (["--plot", "x.txt"], "--plot"),
    ],
)
def test_8_bench_flags_are_checked_before_any_work(capsys, flags, match):
    assert match in one_line_error(capsys, ["bench", "mha-causal", "--seq", "4", *flags])


def test_8_roofline_is_sized_to_the_dtype_and_machine():
    from bench import jobs as bench
    from bench.measure import _roofline

    job = bench.Job("roofline", "torch", "cpu", "float16", 1, bench.Budget(1, 3, 1, 0.05), seq=0)
    out = _roofline(job)
    n = out["n"]
    assert bench.ROOFLINE_MIN <= n <= bench.ROOFLINE_SIZE["cpu"] and n & (n - 1) == 0
    assert out["gflops"] > 0


def test_8_sigterm_unwinds_like_ctrl_c():
    from bench.plan import _terminate_as_interrupt

    with pytest.raises(KeyboardInterrupt), _terminate_as_interrupt():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_8_stale_bench_folders_are_swept(tmp_path, monkeypatch):
    import tempfile

    from bench import plan as bench

    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path))
    old, young = tmp_path / "attnzoo-bench-old", tmp_path / "attnzoo-bench-young"
    old.mkdir()
    young.mkdir()
    hours_ago = time.time() - 2 * 3600
    os.utime(old, (hours_ago, hours_ago))
    bench.sweep_stale_temp()
    assert not old.exists() and young.exists()


# -- smaller, same spirit ----------------------------------------------------------------------


def test_broken_pipe_is_quiet():
    p = subprocess.Popen(
        [sys.executable, "-m", "cli", "list"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    p.stdout.readline()
    p.stdout.close()  # `attnzoo list | head -1`
    err = p.stderr.read().decode()
    p.wait(timeout=120)
    assert "Broken pipe" not in err and "Traceback" not in err, err
    assert p.returncode in (0, 141)


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


def test_integer_x_is_told_to_convert_x_not_the_module():
    m = zoo.create("mha-combined-bias")
    with pytest.raises(TypeError, match=r"x.to\(torch.float32\)") as ei:
        m(torch.ones(1, 2, 64, dtype=torch.int64))
    assert "module.to" not in str(ei.value)


def test_seed_out_of_range_is_one_line(capsys):
    assert "--seed" in one_line_error(capsys, ["audit", "mha-causal", "--seed", "1e20"])
    assert "--seed" in one_line_error(capsys, ["audit", "mha-causal", "--seed", str(2**70)])


def test_preset_that_is_not_utf8_names_the_file(tmp_path):
    bad = tmp_path / "latin1.toml"
    bad.write_bytes('description = "caf\xe9"\n[spec]\nd_model = 64\n'.encode("latin-1"))
    with pytest.raises(zoo.PresetFileError, match=r"latin1\.toml: not UTF-8"):
        zoo.read_preset(bad)


def test_ctx_seq_on_a_self_attention_model_is_refused(models, capsys):
    assert "self-attention" in one_line_error(capsys, ["run", str(models["decomposed"]), "-s", "5"])


@pytest.mark.parametrize("flag", ["need_weights", "with_mask", "with_head_mask", "overwrite"])
def test_export_flags_take_bools_only(flag, tmp_path):
    with pytest.raises(zoo.InputTypeError, match=flag):
        export_onnx("mha-causal", tmp_path / "m.onnx", **{flag: "no"})
    assert not (tmp_path / "m.onnx").exists()


def test_session_arguments_are_checked(models):
    with pytest.raises(zoo.ArgumentError, match="threads"):
        OnnxSession(models["decomposed"], "cpu", threads=10**9)
    with pytest.raises(zoo.ArgumentError, match="provider"):
        OnnxSession(models["decomposed"], "gpu")
    with pytest.raises(zoo.InputTypeError, match="path"):
        OnnxSession(3.5, "cpu")
    with pytest.raises(SessionError, match="not an ONNX model"):
        bad = Path(models["decomposed"]).with_name("bad.onnx")
        bad.write_bytes(b"\x00not a model")
        OnnxSession(bad, "cpu")


@pytest.mark.parametrize(
    "kind, low, kw, text, words",
    [
        (int, 0, {"low_open": True}, "0", "0 must be positive"),
        (int, 0, {"low_open": True}, "2.5", "'2.5' is not an integer"),
        (float, 0, {}, "nan", "'nan' is not a finite number"),
        (float, 0, {}, "-inf", "'-inf' is not a finite number"),
        (float, 0, {"below": 1}, "1", "1.0 must be in [0, 1)"),
        (int, 0, {}, "-1", "-1 must be >= 0"),
    ],
)
def test_bounded_cli_numbers_refuse_with_the_range(kind, low, kw, text, words):
    from cli.common import number_in

    with pytest.raises(argparse.ArgumentTypeError, match=re.escape(words)):
        number_in(kind, low, **kw)(text)
    assert number_in(kind, low, **kw)("0.5" if kind is float else "1") in (0.5, 1)
