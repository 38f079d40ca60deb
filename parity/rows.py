"""What a parity check reports and how it measures: the row (ParityRow), the tolerances and
errors, the mixed-scale rules of a quantized export, and the steps both checks take (skip, export
and open, the eager reference). The checks themselves are parity/matrix.py (full sequence) and
parity/decode.py (token by token).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

import zoo
from export.choice import why_not
from export.errors import ExportError
from export.precision import ERROR_BOUNDS, rel_l2
from export.tracing import DTYPES
from runtime.names import DEVICES
from runtime.providers import TF32_TOLERANCE, cuda_status
from runtime.session import OnnxSession, SessionError


@dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float


# fp32: ORT and torch sum in different orders; 1e-5 absolute is ~100 ulps at |y| ~ 1.
# fp16: 10-bit mantissa; the reference uses the same fp16-rounded weights computed in fp32.
TOLERANCE = {
    "float32": Tolerance(rtol=1e-4, atol=1e-5),
    "float16": Tolerance(rtol=1e-2, atol=4e-3),
}
# fp32 on CUDA with TF32 opted in (OnnxSession(..., tf32=True), CLI --tf32): MatMul/Gemm inputs rounded to
# a 10-bit mantissa; runtime/providers.py states the bound and what it rests on.
TF32 = Tolerance(*reversed(TF32_TOLERANCE))  # TF32_TOLERANCE is (rtol, atol); Tolerance(rtol, atol)
PROVIDERS = DEVICES  # parity compares on a concrete device


def tolerance(dtype: str, provider: str, tf32: bool = False) -> Tolerance:
    """What a row is held to: its dtype's tolerance, or TF32's for fp32 on CUDA with TF32 opted in."""
    return TF32 if tf32 and dtype == "float32" and provider == "cuda" else TOLERANCE[dtype]


# A quantized export is also run on a batch of rows of different scales (row i's inputs times
# MIXED_SCALES[i]): each row's answer must equal that row run alone (fp32 tolerances), and a row
# at scale <= 1 is held to the bound on its own error, whatever its batch mates. (A row scaled up
# has a sharper softmax, which passes more of the quantization error on, alone or batched: README,
# "Precision".) A causal self-attention block is run once more with positions MIXED_T // 2 onward
# scaled by FUTURE_SCALE: the earlier positions must not move.
MIXED_SCALES = (1.0, 4.0, 20.0)
MIXED_T = 16
FUTURE_SCALE = 20.0


@dataclass
class ParityRow:
    name: str
    lowering: str
    provider: str
    dtype: str
    case: str
    status: str  # PASS | FAIL | SKIP
    max_abs: float = float("nan")
    max_rel: float = float("nan")
    shapes: int = 0
    reason: str = ""
    precision: str = "fp32"
    rel_l2: float = float("nan")  # the worst relative L2 error of y, ||y - y_eager|| / ||y_eager||
    bound: float = float("nan")  # what a quantized precision is held to (ERROR_BOUNDS); nan for fp32
    tf32: bool = False  # the session let fp32 products run in TF32 (CUDA only; tolerance() follows)

    def to_dict(self) -> dict:
        return asdict(self)


def errors(out: np.ndarray, ref: np.ndarray, tol: Tolerance) -> tuple[float, float, bool]:
    """(max abs error, max rel error, all within atol + rtol*|ref|).

    The relative error skips entries near zero (|ref| below atol or 1% of the tensor's largest
    |ref|), where any rounding looks huge; the pass/fail test itself covers every entry.
    """
    out = out.astype(np.float64)
    ref = ref.astype(np.float64)
    if out.shape != ref.shape:
        return float("inf"), float("inf"), False
    diff = np.abs(out - ref)
    if np.isnan(out).any() or np.isnan(ref).any():  # NaN is shown as NaN, not as inf
        return float("nan"), float("nan"), False
    if not np.isfinite(out).all():
        return float("inf"), float("inf"), False
    max_abs = float(diff.max()) if diff.size else 0.0
    scale = float(np.abs(ref).max()) if ref.size else 0.0
    big = np.abs(ref) > max(tol.atol, 0.01 * scale)
    max_rel = float((diff[big] / np.abs(ref[big])).max()) if big.any() else 0.0
    ok = bool((diff <= tol.atol + tol.rtol * np.abs(ref)).all())
    return max_abs, max_rel, ok


def worse(a: float, b: float) -> float:
    """The larger error, NaN winning (max() would keep whichever came first)."""
    return a if a != a else b if b != b else max(a, b)


def reference_module(module: zoo.MultiHeadAttention, dtype: str, device: str) -> zoo.MultiHeadAttention:
    """The eager reference: fp32 math on the weights the ONNX model holds (fp16-rounded for fp16)."""
    ref = copy.deepcopy(module)
    if dtype != "float32":
        ref = ref.to(DTYPES[dtype]).float()
    return ref.to(device).eval()


def spec_of(name_or_module: str | zoo.MultiHeadAttention, overrides: dict) -> zoo.AttentionSpec:
    """The spec a check is about, without building the module (why_not decides first)."""
    return zoo.spec(name_or_module, **overrides) if isinstance(name_or_module, str) else name_or_module.spec


def module_of(name_or_module: str | zoo.MultiHeadAttention, overrides: dict) -> zoo.MultiHeadAttention:
    """A fresh eval-mode block for a name (with spec overrides), or the given module as it is."""
    if isinstance(name_or_module, str):
        return zoo.create(name_or_module, **overrides).eval()
    if overrides:
        raise zoo.InputTypeError(f"spec overrides {sorted(overrides)} apply to a name, not to a module")
    return name_or_module


def export_and_open(row: ParityRow, export: Callable, module: zoo.MultiHeadAttention, path: Path, export_kw: dict):
    """Export with `export` (export_onnx, as the calling check names it) at the row's lowering and
    dtype and open it on the row's provider; None (and the row says FAIL or SKIP with the reason)
    when either step fails. A runtime without a kernel for
    the dtype is a SKIP, said as such; anything else is a FAIL."""
    try:
        export(module, path, lowering=row.lowering, dtype=row.dtype, **export_kw)
    except ExportError as e:
        row.status, row.reason = "FAIL", f"export failed: {e}"
        return None
    try:
        return OnnxSession(path, provider=row.provider, verbose=False, tf32=row.tf32)
    except SessionError as e:
        text = str(e)
        if "NOT_IMPLEMENTED" in text or "Could not find an implementation" in text:
            row.status = "SKIP"
            row.reason = f"ONNX Runtime {row.provider} has no {row.dtype} kernel: {text.split(': ', 2)[-1][:160]}"
        else:
            row.status, row.reason = "FAIL", text
        return None


def skipped(row: ParityRow, lowering: str, spec: zoo.AttentionSpec, **why_not_kw) -> bool:
    """Whether the cell cannot run here (the lowering cannot express it, or CUDA was asked for
    and does not work): row stays SKIP with the reason. Both checks answer alike."""
    reason = why_not(lowering, spec, provider=row.provider, **why_not_kw)
    if not reason and row.provider == "cuda":
        ok, why = cuda_status()
        reason = None if ok else f"provider cuda asked for, but {why}"
    row.reason = reason or row.reason
    return reason is not None


def row_l2(got: torch.Tensor, ref: torch.Tensor) -> float:
    """The worst relative L2 error of y over the batch rows, each row against its own norm (a
    batch of small and large rows is not judged by its largest row)."""
    got, ref = got.float().cpu().numpy(), ref.float().cpu().numpy()
    return max(rel_l2(g, r) for g, r in zip(got, ref))


def batch_mates(batched: tuple, alone, scales, what: str = "") -> str:
    """'' when row i of every output in `batched` equals `alone(i)` (that row run alone) at fp32
    tolerances; else the reason, naming the row and its scale."""
    shown = ", ".join(f"{k:g}x" for k in scales)
    for i in range(len(scales)):
        for o, a in zip(batched, alone(i)):
            diff, _, ok = errors(o[i : i + 1].float().cpu().numpy(), a.float().cpu().numpy(), TOLERANCE["float32"])
            if not ok:
                return (
                    f"{what}row {i} (inputs scaled {scales[i]:g}x) in a batch of rows scaled {shown} differs from "
                    f"that row alone by max abs {diff:.2e}: a row's answer depends on its batch mates"
                )
    return ""


def future_moved(now: torch.Tensor, then: torch.Tensor, t: int, where: str) -> str:
    """'' when positions 0..t/2-1 of `then` (positions t/2.. of its input scaled FUTURE_SCALE) equal
    those of `now` at fp32 tolerances; else the reason."""
    half = t // 2
    diff, _, ok = errors(
        then[:, :half].float().cpu().numpy(), now[:, :half].float().cpu().numpy(), TOLERANCE["float32"]
    )
    if ok:
        return ""
    return (
        f"{where} 0..{half - 1} moved by max abs {diff:.2e} when positions {half}..{t - 1} were scaled "
        f"{FUTURE_SCALE:g}x: past outputs depend on future tokens"
    )


def new_row(
    name: str, lowering: str, provider: str, dtype: str, case: str, precision: str, tf32: bool = False
) -> ParityRow:
    """A SKIP row for the request; an unknown precision or a dtype no session here feeds is refused here,
    before any work."""
    from export.names import SESSION_DTYPES
    from export.precision import method

    method(precision)  # PrecisionError naming the choices
    if dtype not in SESSION_DTYPES:  # numpy has no bfloat16: a session here can neither feed nor read one
        raise zoo.ArgumentError(
            f"dtype={dtype!r} is not one parity runs: one of {', '.join(SESSION_DTYPES)} (a bfloat16 export "
            "is checked by export.cuda_check and against its float32 twin: docs/gpu.md)"
        )
    bound = ERROR_BOUNDS[precision] if precision != "fp32" else float("nan")
    if not isinstance(tf32, bool):
        raise zoo.ArgumentError(f"tf32={tf32!r} must be True or False")
    return ParityRow(name, lowering, provider, dtype, case, "SKIP", precision=precision, bound=bound, tf32=tf32)


def miss(row: ParityRow, tol: Tolerance) -> str:
    if row.max_abs != row.max_abs:
        return "NaN in the output (or the eager reference)"
    if row.precision != "fp32":
        return f"relative L2 error of y {row.rel_l2:.2%} is over the {row.precision} bound {row.bound:.0%}"
    return f"outside rtol={tol.rtol:g}, atol={tol.atol:g}"
