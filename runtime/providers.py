"""Where an ONNX Runtime session runs: the CUDA probe and the provider policy.

`get_available_providers()` lists CUDA on any machine with the GPU wheel installed, GPU or
not, and ONNX Runtime then quietly falls back to the CPU. So "CUDA works" is judged on a
created session: its `get_providers()` must start with CUDAExecutionProvider.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import re
import sys
import tempfile
from pathlib import Path

import zoo

CUDA, CPU = "CUDAExecutionProvider", "CPUExecutionProvider"


class SessionError(zoo.AttnzooError, RuntimeError):
    """The model cannot be loaded, or the asked-for provider does not really work here."""


class RunError(zoo.AttnzooError, RuntimeError):
    """ONNX Runtime failed inside a node while running a model whose inputs passed attnzoo's checks; the
    message names the node and what to try, `detail` keeps ONNX Runtime's full text (CLI: --verbose)."""

    detail: str = ""


# "[ONNXRuntimeError] : 1 : FAIL : Non-zero status code returned while running Reshape node. Name:'split'
# Status Message: /src/.../reshape_helper.h:84 onnxruntime::ReshapeHelper::...(...) cond was false. Why"
_NODE = re.compile(r"running (\w+) node\. Name:'([^']*)'(?: Status Message: (.*))?", re.S)
_SOURCE = re.compile(r"^\S+\.(?:h|cc|cpp|cu|cuh):\d+ .*?\)\s+")  # the C++ file, line and function


def run_failure(e: BaseException, what: str, provider: str) -> zoo.AttnzooError:
    """The one-line refusal for an exception ONNX Runtime raised while running `what` (a file's name):
    zoo.ResourceError for an allocation failure, else RunError naming the node, its operator and why."""
    text = str(e).strip()
    if "allocate" in text.lower() or "bad_alloc" in text.lower():
        first = text.splitlines()[0][:200] if text else type(e).__name__
        return zoo.ResourceError(f"ONNX Runtime ran out of memory running {what}: {first}")
    m = _NODE.search(text)
    if m:
        op, node, status = m.group(1), m.group(2), (m.group(3) or "").strip()
        status = status.splitlines()[0] if status else ""
        if _SOURCE.match(status):  # an ORT_ENFORCE: the source place, the function, the condition, the reason
            parts = status.split(" was false. ", 1)
            status = parts[1] if len(parts) == 2 else _SOURCE.sub("", status)
        status = status.strip().rstrip(".")
        where = f"in node {node or '(unnamed)'} ({op})"
    else:
        status = (text.splitlines()[0] if text else type(e).__name__).removeprefix("[ONNXRuntimeError] : ")
        where = ""
    other = "run it with provider='cpu', or " if provider == "cuda" else ""
    err = RunError(
        f"ONNX Runtime failed {where + ' ' if where else ''}running {what} on {provider}: {status[:300]}; "
        f"the inputs passed attnzoo's checks, so this graph cannot run them here: {other}export it again "
        f"with lowering='decomposed', and report it with ONNX Runtime's full text"
    )
    err.detail = text
    return err


def ort():
    """onnxruntime, imported on first use (so `attnzoo list` stays quick)."""
    import onnxruntime

    return onnxruntime


@functools.lru_cache(maxsize=1)
def cuda_status() -> tuple[bool, str]:
    """(usable, one-line reason): can ONNX Runtime really run a CUDA session here? Asked quietly: what ONNX
    Runtime prints while it looks (its preload_dlls' "Failed to load libcublasLt.so.13 ..." on stdout, its
    logger on stderr) is kept, not shown; `probe_said()` gives its first line, for a refusal of provider='cuda'."""
    said: list[str] = []
    try:
        with quietly(said):
            return _probe()
    finally:
        _SAID[:] = said


_SAID: list[str] = []  # what the last probe printed, kept


def probe_said() -> str:
    """The first line ONNX Runtime printed while the CUDA probe ran ('' for none): a missing library, say."""
    lines = [line.strip() for text in _SAID for line in text.splitlines() if line.strip()]
    first = next((line for line in lines if line.startswith("Failed to load")), lines[0] if lines else "")
    return re.sub(r"\x1b\[[0-9;]*m", "", first)[:200]


@contextlib.contextmanager
def quietly(sink: list[str]):
    """What is printed inside, by Python (sys.stdout/sys.stderr) or by a C library (file descriptors 1 and 2), goes
    to `sink` instead of the terminal. For the one-time probe only: another thread's output meanwhile goes there too."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    saved: list[tuple[int, int]] = []
    with tempfile.TemporaryFile() as caught, io.StringIO() as py:
        try:
            for fd in (1, 2):
                with contextlib.suppress(OSError):
                    saved.append((fd, os.dup(fd)))
                    os.dup2(caught.fileno(), fd)
            with contextlib.redirect_stdout(py), contextlib.redirect_stderr(py):
                yield
        finally:
            for fd, old in saved:
                os.dup2(old, fd)
                os.close(old)
            caught.seek(0)
            sink.append(py.getvalue() + caught.read().decode("utf-8", "replace"))


def _probe() -> tuple[bool, str]:
    rt = ort()
    if CUDA not in rt.get_available_providers():
        return False, f"onnxruntime {rt.__version__} ({rt.get_device()} build) has no CUDA provider"
    # torch only where the process has it already (its CUDA build says where the nvidia-* wheels are, and the GPU's
    # name): importing it here cost an exported model's CLI run 1.4 s; without it onnxruntime finds the wheels itself
    torch = sys.modules.get("torch")
    if hasattr(rt, "preload_dlls") and (torch is None or torch.version.cuda is not None):
        try:
            rt.preload_dlls()  # CUDA/cuDNN from the nvidia-* wheels beside torch
        except Exception:  # noqa: BLE001 - best effort; the probe below decides
            pass
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["a"], ["b"])],
        "probe",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("b", TensorProto.FLOAT, [1])],
    )
    # IR 10 / opset 18: what older runtimes (onnxruntime-gpu trails onnxruntime) accept.
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    opts = rt.SessionOptions()
    opts.log_severity_level = 4
    try:
        rt.set_default_logger_severity(4)
        sess = rt.InferenceSession(model.SerializeToString(), opts, providers=[CUDA, CPU])
    except Exception as e:  # noqa: BLE001
        return False, f"CUDA session failed to start: {str(e).splitlines()[0][:200]}"
    finally:
        rt.set_default_logger_severity(2)
    del onnx
    used = sess.get_providers()
    if not used or used[0] != CUDA:
        return False, (
            "the CUDA provider is installed but could not start (no GPU, or no CUDA/cuDNN "
            f"libraries it can load); a test session fell back to {used}"
        )
    gpu = torch.cuda.get_device_name(0) if torch is not None and torch.cuda.is_available() else "device 0"
    return True, f"CUDA works ({gpu}, onnxruntime {rt.__version__})"


def choose(provider: str) -> tuple[bool, str]:
    """(use CUDA, note) for a session asked to run on `provider` ("auto", "cpu" or "cuda").

    The note says what "auto" chose and why ('' for a concrete provider); "cuda" where CUDA does
    not really work is a SessionError naming the reason (and what ONNX Runtime said while it looked)."""
    if provider == "cpu":
        return False, ""
    ok, why = cuda_status()
    if provider == "cuda" and not ok:
        said = probe_said()
        said = f" (ONNX Runtime: {said})" if said else ""
        raise SessionError(f"provider='cuda' asked for, but {why}{said}; use provider='cpu' or 'auto'")
    return ok, f"provider auto -> {'cuda' if ok else 'cpu'}: {why}" if provider == "auto" else ""


def announce(note: str) -> None:
    """Say a session's provider note on stdout, as one line (OnnxSession(..., verbose=True))."""
    print(f"attnzoo: {note}")


# TF32 (the CUDA provider's `use_tf32`, on by default in ONNX Runtime: cuda_provider_options.h) rounds
# the inputs of fp32 MatMul/Gemm to a 10-bit mantissa, so a product carries ~2**-10 ~ 1e-3 relative
# error. A session turns it off unless asked (fp32 means fp32); tf32=True opts in for speed, and parity
# then holds fp32 to TF32_TOLERANCE (parity/rows.py): (rtol, atol) = (2e-3, 2e-3), about 5x the worst
# miss measured with TF32 on, on an H200 on 2026-12-04 (max abs 1.6e-4 .. 4.2e-4 over 140 fp32 cases).
TF32_TOLERANCE = (2e-3, 2e-3)


def cuda_graph_refusal(provider: str, dtype: str | None = None) -> str | None:
    """Why `--cuda-graph` cannot replay a whole model's decode step with this provider and, for a checkpoint that
    attnzoo exports first, this dtype (None: an existing export, which OnnxSession(cuda_graph=True) checks when it
    opens it); None where it can. A CUDA graph replays a packed-rows export on CUDA, and a checkpoint is exported so
    for CUDA only in a half dtype: packed rows ride on GroupQueryAttention, which has no float32 CUDA kernel (a
    float32 CUDA export is left-padded). The one rule `generate` and `bench --generate` both state."""
    if provider != "cuda":
        return f"--cuda-graph captures the decode step on CUDA: add --provider cuda (not {provider})"
    if dtype == "float32":
        return (
            "--cuda-graph needs a packed-rows export, which a checkpoint gets for CUDA in a half dtype: add --dtype "
            "float16 or bfloat16 (GroupQueryAttention has no float32 CUDA kernel; a float32 CUDA export is left-padded)"
        )
    return None


def dtype_refusal(provider: str, dtype: str) -> str | None:
    """Why a checkpoint cannot be exported whole in `dtype` to run with `provider` ("cpu", "cuda"; "auto" once
    resolved), before its export; None where it can. ONNX Runtime's CPU provider runs whole models in float32."""
    if provider == "cpu" and dtype != "float32":
        return (
            f"--dtype {dtype} exports a checkpoint for CUDA: add --provider cuda (the CPU provider runs whole models "
            "in float32; --precision int8 or int4 makes the weights smaller)"
        )
    return None


def cuda_options(tf32: bool = False, cuda_graph: bool = False) -> dict[str, str]:
    """The CUDA provider's options a session passes, set explicitly (never the provider's defaults).
    cuda_graph: `enable_cuda_graph` (cuda_provider_options.h), which captures a run's kernels once and replays
    them; ONNX Runtime captures a graph id's third run (two plain runs first: min_num_runs_before_cuda_graph_capture_)
    and runs whose run option gpu_graph_id is -1 are never captured (runtime/device_decode.py feeds both)."""
    return {"use_tf32": "1" if tf32 else "0", **({"enable_cuda_graph": "1"} if cuda_graph else {})}


def providers_for(use_cuda: bool, *, tf32: bool = False, cuda_graph: bool = False) -> list:
    """The provider list a session is created with, in priority order (the CPU always last); CUDA comes
    with its options, cuda_options(tf32, cuda_graph)."""
    return ([(CUDA, cuda_options(tf32, cuda_graph))] if use_cuda else []) + [CPU]


def device_of(used: list[str]) -> str:
    """Where a created session whose providers are `used` runs: "cuda" or "cpu"."""
    return "cuda" if used[0] == CUDA else "cpu"


def session_options(threads: int | None, *, profile: bool, spin: bool = False):
    """ONNX Runtime's options for a session: quiet logs, `threads` intra-op threads (None: ORT's
    default), idle threads that yield unless `spin`, and profiling to a temp file when asked."""
    opts = ort().SessionOptions()
    # Fatal only: a failing node's error is raised to us (RunError says it in one line, --verbose in full),
    # and its duplicate in ORT's log would be a second, colored copy on stderr.
    opts.log_severity_level = 4
    # Idle ORT threads spin by default, stealing the cores torch (or a second session) in the
    # same process needs; measured no slower for a block alone, faster when they alternate. A
    # generation loop is ORT alone, step after step, each step ~150 small nodes: there spinning
    # threads start each node's work at once (runtime/core.py decides).
    opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    if threads is not None:
        opts.intra_op_num_threads = threads
    if profile:
        opts.enable_profiling = True
        opts.profile_file_prefix = str(Path(tempfile.gettempdir()) / f"attnzoo-profile-{os.getpid()}")
    return opts


__all__ = [
    "RunError",
    "SessionError",
    "announce",
    "TF32_TOLERANCE",
    "choose",
    "cuda_options",
    "cuda_status",
    "device_of",
    "ort",
    "probe_said",
    "providers_for",
    "run_failure",
    "session_options",
]
