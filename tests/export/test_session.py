"""OnnxSession: honest providers, input checks, torch/numpy in and out, node placement."""

import copy
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import zoo
from export import OnnxSession, export_onnx
from helpers import REPO
from runtime.session import RunInputError, SessionError, cuda_status

ROOT = REPO


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = tmp_path_factory.mktemp("sess")
    return export_onnx("cross-attention", d / "c.onnx", lowering="decomposed", with_mask=True, with_head_mask=True)


@pytest.fixture(scope="module")
def sess(model):
    return OnnxSession(model.path, provider="cpu", verbose=False)


def test_cpu_session_says_where_it_runs(sess):
    assert sess.provider == "cpu" and sess.session_providers[0] == "CPUExecutionProvider"
    assert "cross-attention" in sess.describe()


def test_auto_falls_back_with_one_line(model, capsys):
    ok, why = cuda_status()
    s = OnnxSession(model.path)  # provider="auto"
    line = capsys.readouterr().out.strip()
    assert s.provider == ("cuda" if ok else "cpu")
    assert line.startswith("attnzoo: provider auto") and "\n" not in line and why in line


def test_cuda_refused_clearly_without_a_gpu(model):
    ok, why = cuda_status()
    if ok:
        pytest.skip("this machine has a working CUDA provider")
    with pytest.raises(SessionError, match="provider='cuda'") as ei:
        OnnxSession(model.path, provider="cuda")
    assert why in str(ei.value)


@pytest.mark.cuda
def test_cuda_session_binds_cuda_tensors(model, cuda_ok):
    s = OnnxSession(model.path, provider="cuda", verbose=False)
    assert s.provider == "cuda" and s.session_providers[0] == "CUDAExecutionProvider"
    x, c = torch.randn(2, 5, 64, device="cuda"), torch.randn(2, 3, 48, device="cuda")
    y = s.run(x, c)
    assert y.is_cuda
    ref = copy.deepcopy(model.module).cuda()(x, c)  # .cuda() is in place; the fixture is shared
    torch.testing.assert_close(y, ref, rtol=1e-4, atol=1e-4)
    placed = s.summarize_placements(s.node_placements(x, c))
    assert "CUDAExecutionProvider" in placed["MatMul"]


def test_torch_and_numpy_agree_with_eager(model, sess):
    x, c = torch.randn(3, 6, 64), torch.randn(3, 2, 48)
    mask = torch.ones(3, 6, 2, dtype=torch.bool)
    mask[1, 2] = False
    hm = torch.tensor([1.0, 0.0, 1.0, 0.5])
    y_t = sess.run(x, c, mask, hm)
    assert isinstance(y_t, torch.Tensor)
    y_n = sess.run(x.numpy(), c.numpy(), mask.numpy(), hm.numpy())
    assert isinstance(y_n, np.ndarray)
    ref = model.module(x, c, mask[:, None], head_mask=hm)
    torch.testing.assert_close(y_t, ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(y_n, ref.detach().numpy(), rtol=1e-4, atol=1e-5)


def test_io_binding_path_on_cpu(model):
    """The binding path CUDA uses, exercised on the CPU: same numbers, torch out."""
    bound = OnnxSession(model.path, provider="cpu", verbose=False, io_binding=True)
    plain = OnnxSession(model.path, provider="cpu", verbose=False)
    assert bound.io_binding and not plain.io_binding
    x, c = torch.randn(2, 7, 64), torch.randn(2, 5, 48)
    mask = torch.rand(2, 7, 5) > 0.3
    y_b, y_p = bound.run(x, c, mask), plain.run(x, c, mask)
    assert isinstance(y_b, torch.Tensor) and y_b.shape == (2, 7, 64)
    torch.testing.assert_close(y_b, y_p)


def test_defaults_for_optional_inputs(model, sess):
    x, c = torch.randn(1, 4, 64), torch.randn(1, 3, 48)
    torch.testing.assert_close(sess.run(x, c), model.module(x, c), rtol=1e-4, atol=1e-5)


def test_mask_broadcasting(model, sess):
    x, c = torch.randn(2, 4, 64), torch.randn(2, 3, 48)
    keys = torch.tensor([True, True, False])
    full = keys.expand(2, 4, 3)
    ref = sess.run(x, c, full)
    for m in (keys, keys[None], keys[None, None], full[:, None]):
        torch.testing.assert_close(sess.run(x, c, m), ref)


@pytest.mark.parametrize(
    "call, exc, words",
    [
        (lambda s: s.run(torch.randn(2, 4, 63), torch.randn(2, 3, 48)), RunInputError, ["(2, 4, 63)", "64"]),
        (lambda s: s.run(torch.randn(4, 64), torch.randn(2, 3, 48)), RunInputError, ["(4, 64)"]),
        (
            lambda s: s.run(torch.randn(2, 4, 64).double(), torch.randn(2, 3, 48)),
            TypeError,
            ["float64", "float32"],
        ),
        (lambda s: s.run(torch.randn(2, 4, 64)), RunInputError, ["context"]),
        (lambda s: s.run(torch.randn(2, 4, 64), torch.randn(3, 3, 48)), RunInputError, ["batch 3"]),
        (
            lambda s: s.run(torch.randn(2, 4, 64), torch.randn(2, 3, 48), torch.ones(5, dtype=torch.bool)),
            RunInputError,
            ["(5,)", "(2, 4, 3)"],
        ),
        (lambda s: s.run(torch.randn(2, 4, 64), torch.randn(2, 3, 48), torch.ones(3)), TypeError, ["bool"]),
        (
            lambda s: s.run(torch.randn(2, 4, 64), torch.randn(2, 3, 48), head_mask=torch.ones(5)),
            RunInputError,
            ["(5,)", "(4,)"],
        ),
        (lambda s: s.run(torch.randn(2, 4, 64), np.zeros((2, 3, 48), np.float32)), TypeError, ["one kind"]),
        (lambda s: s.run([[1.0]]), TypeError, ["numpy"]),
    ],
)
def test_bad_run_inputs(sess, call, exc, words):
    with pytest.raises(exc) as ei:
        call(sess)
    for w in words:
        assert w in str(ei.value), (w, str(ei.value))


def test_inputs_the_model_lacks(tmp_path):
    r = export_onnx("mha-separate-bias", tmp_path / "p.onnx", lowering="decomposed")
    s = OnnxSession(r.path, provider="cpu", verbose=False)
    with pytest.raises(RunInputError, match="--mask"):
        s.run(torch.randn(1, 2, 64), mask=torch.ones(2, 2, dtype=torch.bool))
    with pytest.raises(RunInputError, match="context"):
        s.run(torch.randn(1, 2, 64), torch.randn(1, 2, 64))


def test_corrupt_and_missing_files(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00\x01 definitely not protobuf \xff" * 10)
    with pytest.raises(SessionError, match="not an ONNX model"):
        OnnxSession(bad, provider="cpu")
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    with pytest.raises(SessionError, match="not an ONNX model"):
        OnnxSession(empty, provider="cpu")
    with pytest.raises(FileNotFoundError, match="attnzoo export"):
        OnnxSession(tmp_path / "missing.onnx")
    with pytest.raises(ValueError, match="provider='tpu'"):
        OnnxSession(bad, provider="tpu")


def test_node_placement_shows_the_attention_node(tmp_path):
    r = export_onnx("mha-separate-nobias", tmp_path / "m.onnx", lowering="ort-mha")
    s = OnnxSession(r.path, provider="cpu", verbose=False)
    placed = s.summarize_placements(s.node_placements(torch.randn(1, 8, 64)))
    assert placed["MultiHeadAttention"] == {"CPUExecutionProvider": 1}


# -- empty inputs never reach ONNX Runtime; the session's own arguments; its out-of-memory -----


@pytest.mark.parametrize("shape", [(0, 4, 64), (2, 0, 64)])
def test_session_refuses_empty_batch_or_sequence(exports, shape):
    sess = OnnxSession(exports["decomposed"], "cpu", verbose=False)
    with pytest.raises(RunInputError, match="empty input"):
        sess.run(torch.randn(*shape))  # b = 0 on the decomposed graph was a SIGFPE (exit 136)
    with pytest.raises(RunInputError, match="empty input"):
        sess.run(np.zeros(shape, dtype=np.float32))


def test_session_refuses_empty_context(exports):
    sess = OnnxSession(exports["cross-decomposed"], "cpu", verbose=False)
    with pytest.raises(RunInputError, match=r"s=0"):
        sess.run(torch.randn(2, 3, 64), torch.randn(2, 0, 48))


def test_empty_batch_in_a_fresh_process_is_one_error_not_a_crash(exports):
    code = (
        "import torch, sys; from export import OnnxSession\n"
        f"s = OnnxSession({str(exports['decomposed'])!r}, 'cpu', verbose=False)\n"
        "try:\n    s.run(torch.randn(0, 4, 64))\nexcept ValueError as e:\n    print('refused', e); sys.exit(3)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 3 and "refused" in r.stdout, (r.returncode, r.stderr[-500:])


def test_onnx_runtime_allocation_failure_is_a_resource_error(exports, monkeypatch):
    sess = OnnxSession(exports["decomposed"], "cpu", verbose=False)

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


def test_session_arguments_are_checked(exports):
    with pytest.raises(zoo.ArgumentError, match="threads"):
        OnnxSession(exports["decomposed"], "cpu", threads=10**9)
    with pytest.raises(zoo.ArgumentError, match="provider"):
        OnnxSession(exports["decomposed"], "gpu")
    with pytest.raises(zoo.InputTypeError, match="path"):
        OnnxSession(3.5, "cpu")
    with pytest.raises(SessionError, match="not an ONNX model"):
        bad = Path(exports["decomposed"]).with_name("bad.onnx")
        bad.write_bytes(b"\x00not a model")
        OnnxSession(bad, "cpu")


@pytest.fixture(scope="module")
def failing_model(tmp_path_factory) -> Path:
    """A graph that loads and passes every input check, then fails inside ONNX Runtime: it adds a
    (3, 4) table to x (b t 4), which broadcasts only where t is 1 or 3."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "table"], ["y"], name="add_table")],
        "fails_at_run_time",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "t", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "t", 4])],
        [helper.make_tensor("table", TensorProto.FLOAT, [3, 4], [0.0] * 12)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    helper.set_model_props(model, {"attnzoo.spec": '{"d_model": 4, "heads": 1}'})  # as `attnzoo run` needs
    path = tmp_path_factory.mktemp("ort_fails") / "fails.onnx"
    onnx.save(model, path)
    return path


def _bound_run(sess: OnnxSession) -> None:
    x, y = np.zeros((1, 2, 4), np.float32), np.zeros((1, 3, 4), np.float32)  # y as ORT infers it: (b, 3, 4)
    binding = sess.new_binding()
    binding.bind_input("x", "cpu", 0, np.float32, x.shape, x.ctypes.data)
    binding.bind_output("y", "cpu", 0, np.float32, y.shape, y.ctypes.data)
    sess.run_with_iobinding(binding)


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.run(np.zeros((1, 2, 4), np.float32)),
        lambda s: s.run(torch.zeros(1, 2, 4)),
        lambda s: OnnxSession(s.path, "cpu", verbose=False, io_binding=True).run(torch.zeros(1, 2, 4)),
        lambda s: s.run_feeds({"x": np.zeros((1, 2, 4), np.float32)}),
        _bound_run,
    ],
    ids=["numpy", "torch", "torch-bound", "feeds", "iobinding"],
)
def test_a_failure_inside_onnx_runtime_is_one_line_naming_the_node(failing_model, call):
    from export import RunError

    sess = OnnxSession(failing_model, "cpu", verbose=False)
    with pytest.raises(RunError) as ei:
        call(sess)
    said = str(ei.value)
    assert "\n" not in said and "node add_table (Add)" in said and "fails.onnx" in said, said
    assert "broadcast" in said and "lowering='decomposed'" in said and "onnxruntime::" not in said, said
    assert "Non-zero status code" in ei.value.detail  # ONNX Runtime's own text, for --verbose


def test_a_failure_inside_onnx_runtime_is_one_line_on_the_command_line(failing_model, capsys):
    from helpers import one_line_error

    line = one_line_error(capsys, ["run", str(failing_model)])
    assert "add_table (Add)" in line and "(more with --verbose)" in line, line
