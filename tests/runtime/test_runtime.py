"""The run time on its own: importing runtime loads no torch (a deployment is onnxruntime and numpy), and
the options a CUDA session passes its provider, checked on the CPU without creating a CUDA session."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys

import onnx
import pytest
from onnx import TensorProto, helper

import runtime
import zoo
from helpers import REPO
from parity.rows import TF32, TOLERANCE, tolerance
from runtime import core, providers
from runtime.providers import CPU, CUDA, TF32_TOLERANCE, SessionError, cuda_graph_refusal, cuda_options, providers_for
from runtime.session import OnnxSession

MODULES = sorted(f"runtime.{m.name}" for m in pkgutil.iter_modules(runtime.__path__))


def test_every_runtime_module_imports_where_torch_cannot_be_imported():
    code = (
        "import json, sys\n"
        "sys.modules['torch'] = None  # `import torch` raises ImportError from here on\n"
        f"for m in {MODULES!r}: __import__(m)\n"
        "from export import OnnxSession, SessionError, cuda_status  # export hands the run time's names on\n"
        "from runtime import OnnxSession as same\n"
        "assert OnnxSession is same\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'torch' and sys.modules[m])))\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads(p.stdout.splitlines()[-1]) == []
    assert len(MODULES) >= 10, MODULES  # the walk found the package's modules


def test_a_cuda_session_turns_tf32_off_unless_asked():
    assert cuda_options() == {"use_tf32": "0"}
    assert cuda_options(tf32=True) == {"use_tf32": "1"}
    assert providers_for(True) == [(CUDA, {"use_tf32": "0"}), CPU]
    assert providers_for(True, tf32=True) == [(CUDA, {"use_tf32": "1"}), CPU]
    assert providers_for(False) == providers_for(False, tf32=True) == [CPU]


@pytest.mark.parametrize(
    "provider, dtype, words",
    [
        ("cpu", None, "add --provider cuda (not cpu)"),
        ("cpu", "float16", "add --provider cuda (not cpu)"),
        ("cuda", "float32", "add --dtype float16 or bfloat16"),
        ("cuda", "float16", None),
        ("cuda", "bfloat16", None),
        ("cuda", None, None),  # an existing export: OnnxSession(cuda_graph=True) reads its padding when it opens
    ],
)
def test_a_cuda_graph_needs_cuda_and_for_a_checkpoint_a_half_dtype(provider, dtype, words):
    why = cuda_graph_refusal(provider, dtype)
    assert why is None if words is None else words in why


@pytest.fixture
def tiny_model(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "t", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "t", 4])],
    )
    path = tmp_path / "tiny.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), path)
    return path


@pytest.mark.parametrize("tf32", [False, True])
def test_a_session_on_cuda_hands_onnx_runtime_the_intended_provider_options(tiny_model, monkeypatch, tf32):
    """The providers list OnnxSession(provider="cuda") creates its session with, caught before ONNX Runtime
    sees it (no GPU here): CUDA first with use_tf32 set explicitly, then the CPU."""
    seen = []

    class Stop(Exception):
        pass

    class FakeOrt:
        SessionOptions = providers.ort().SessionOptions

        @staticmethod
        def InferenceSession(path, opts, providers):  # noqa: N802 - onnxruntime's name
            seen.append(providers)
            raise Stop("caught before a CUDA session is made")

    monkeypatch.setattr(core, "choose", lambda provider: (True, ""))
    monkeypatch.setattr(core, "ort", lambda: FakeOrt)
    with pytest.raises(SessionError, match="caught before"):
        OnnxSession(tiny_model, provider="cuda", tf32=tf32, verbose=False)
    assert seen == [[(CUDA, {"use_tf32": "1" if tf32 else "0"}), CPU]]


def test_a_cpu_session_passes_no_cuda_options_and_says_whether_tf32_was_asked(tiny_model):
    sess = OnnxSession(tiny_model, provider="cpu", tf32=True)
    assert sess.session_providers == [CPU] and sess.tf32 is True
    assert OnnxSession(tiny_model, provider="cpu").tf32 is False


def test_the_cuda_probe_is_quiet_where_torch_is_not_and_says_why_only_when_cuda_is_asked(tiny_model):
    """In a process without torch, onnxruntime-gpu on a machine with no GPU printed "Failed to load
    libcublasLt.so.13 ..." (its preload_dlls) for every session that asked for "auto". Now nothing of ONNX
    Runtime's reaches stdout or stderr; provider="cuda" is refused in one line that says what it said."""
    code = (
        "import sys\n"
        "sys.modules['torch'] = None  # `import torch` raises ImportError from here on\n"
        "from runtime import OnnxSession, SessionError, cuda_status\n"
        f"s = OnnxSession({str(tiny_model)!r}, provider='auto', verbose=False)\n"
        "print('auto ->', s.provider)\n"
        "ok, why = cuda_status()\n"
        "try:\n"
        f"    OnnxSession({str(tiny_model)!r}, provider='cuda', verbose=False)\n"
        "except SessionError as e:\n"
        "    print('refused:', e)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert p.returncode == 0 and p.stderr == "", p.stderr[-2000:]
    lines = p.stdout.splitlines()
    assert lines[0] in ("auto -> cpu", "auto -> cuda") and len(lines) <= 2, p.stdout
    if lines[0] == "auto -> cpu":
        (refusal,) = lines[1:]
        assert refusal.startswith("refused: provider='cuda' asked for, but "), refusal
        if "could not start" in refusal:  # the GPU build with no GPU: ONNX Runtime's first words are kept
            assert "(ONNX Runtime: " in refusal, refusal


def test_tf32_must_be_a_bool(tiny_model):
    with pytest.raises(zoo.ArgumentError, match="tf32='yes' must be True or False"):
        OnnxSession(tiny_model, provider="cpu", tf32="yes")


def test_parity_holds_fp32_on_cuda_to_tf32s_tolerance_only_when_tf32_is_asked():
    assert (TF32.rtol, TF32.atol) == TF32_TOLERANCE
    assert tolerance("float32", "cuda", tf32=True) == TF32
    assert tolerance("float32", "cuda") == tolerance("float32", "cpu", tf32=True) == TOLERANCE["float32"]
    assert tolerance("float16", "cuda", tf32=True) == TOLERANCE["float16"]
    # the worst fp32 miss measured with TF32 on (H200, 2026-12-04) is inside TF32's bound, not fp32's
    worst = 4.2e-4
    assert worst > TOLERANCE["float32"].atol and worst < TF32.atol
