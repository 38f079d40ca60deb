"""Parity of exported models against eager torch, at shapes the export never saw.

One row per (variant, lowering, provider, dtype, precision, case): the max abs and max rel error
over every checked shape and output, and PASS / FAIL / SKIP with the reason. A miss is a FAIL,
never a warning. A quantized export (precision int8/int4) is compared with the fp32 eager block
under its stated bound on the relative L2 error of y of each batch row (export/precision.py,
ERROR_BOUNDS): the row carries the measured error and the bound. It is also run on a batch of rows
of different scales (each row must get its answer alone) and, when causal, with its later positions
scaled (the earlier ones must not move): MIXED_SCALES.
"""

from __future__ import annotations

import copy
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

import zoo

from .choice import why_not
from .errors import ExportError
from .io import interface
from .names import DEVICES, LOWERINGS
from .precision import ERROR_BOUNDS, rel_l2
from .session import OnnxSession, SessionError, cuda_status
from .tracing import DTYPES, example_inputs
from .writer import export_onnx


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
# (b, t, s): b in {1, 3}, t in {1, 7, 64}; s differs from t for cross-attention. The export
# traced b=2, t=5, s=7, so none of these is an export shape.
SHAPES = [(1, 1, 5), (3, 1, 3), (1, 7, 13), (3, 7, 1), (1, 64, 33), (3, 64, 64)]
CASES = ("plain", "masked")  # masked = bool mask (one fully masked row) + head_mask (one head zeroed)
PROVIDERS = DEVICES  # parity compares on a concrete device
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


def _worse(a: float, b: float) -> float:
    """The larger error, NaN winning (max() would keep whichever came first)."""
    return a if a != a else b if b != b else max(a, b)


def _reference_module(module: zoo.MultiHeadAttention, dtype: str, device: str) -> zoo.MultiHeadAttention:
    """The eager reference: fp32 math on the weights the ONNX model holds (fp16-rounded for fp16)."""
    ref = copy.deepcopy(module)
    if dtype != "float32":
        ref = ref.to(DTYPES[dtype]).float()
    return ref.to(device).eval()


def _spec_of(name_or_module: str | zoo.MultiHeadAttention, overrides: dict) -> zoo.AttentionSpec:
    """The spec a check is about, without building the module (why_not decides first)."""
    return zoo.spec(name_or_module, **overrides) if isinstance(name_or_module, str) else name_or_module.spec


def _module_of(name_or_module: str | zoo.MultiHeadAttention, overrides: dict) -> zoo.MultiHeadAttention:
    """A fresh eval-mode block for a name (with spec overrides), or the given module as it is."""
    if isinstance(name_or_module, str):
        return zoo.create(name_or_module, **overrides).eval()
    if overrides:
        raise zoo.InputTypeError(f"spec overrides {sorted(overrides)} apply to a name, not to a module")
    return name_or_module


def _export_and_open(row: ParityRow, module: zoo.MultiHeadAttention, path: Path, export_kw: dict):
    """Export with the row's lowering and dtype and open it on the row's provider; None (and the
    row says FAIL or SKIP with the reason) when either step fails. A runtime without a kernel for
    the dtype is a SKIP, said as such; anything else is a FAIL."""
    try:
        export_onnx(module, path, lowering=row.lowering, dtype=row.dtype, **export_kw)
    except ExportError as e:
        row.status, row.reason = "FAIL", f"export failed: {e}"
        return None
    try:
        return OnnxSession(path, provider=row.provider, verbose=False)
    except SessionError as e:
        text = str(e)
        if "NOT_IMPLEMENTED" in text or "Could not find an implementation" in text:
            row.status = "SKIP"
            row.reason = f"ONNX Runtime {row.provider} has no {row.dtype} kernel: {text.split(': ', 2)[-1][:160]}"
        else:
            row.status, row.reason = "FAIL", text
        return None


def _skipped(row: ParityRow, lowering: str, spec: zoo.AttentionSpec, **why_not_kw) -> bool:
    """Whether the cell cannot run here (the lowering cannot express it, or CUDA was asked for
    and does not work): row stays SKIP with the reason. Both checks answer alike."""
    reason = why_not(lowering, spec, provider=row.provider, **why_not_kw)
    if not reason and row.provider == "cuda":
        ok, why = cuda_status()
        reason = None if ok else f"provider cuda asked for, but {why}"
    row.reason = reason or row.reason
    return reason is not None


def check(
    name_or_module: str | zoo.MultiHeadAttention,
    lowering: str,
    *,
    case: str = "plain",
    dtype: str = "float32",
    provider: str = "cpu",
    workdir: str | Path | None = None,
    shapes: Iterable[tuple[int, int, int]] = SHAPES,
    seed: int = 0,
    precision: str = "fp32",
    row_scales: tuple[float, ...] = MIXED_SCALES,
    **overrides,
) -> ParityRow:
    """Export one variant with one lowering and compare it with eager torch at `shapes`.

    precision int8/int4: the fp32 eager block is the reference, and the relative L2 error of y
    of each batch row at each shape must be within ERROR_BOUNDS[precision] (elementwise tolerances
    do not apply); then a batch of rows scaled `row_scales` must give each row its answer alone,
    and a causal block's earlier positions must not move when later ones are scaled (_coupling)."""
    name = name_or_module if isinstance(name_or_module, str) else "custom"
    row = _new_row(name, lowering, provider, dtype, case, precision)
    if case not in CASES:
        raise zoo.ArgumentError(f"case={case!r} is not one of {CASES}")
    if provider not in PROVIDERS:
        raise zoo.ArgumentError(f"provider={provider!r} is not one of {PROVIDERS}")
    masked = case == "masked"
    # Weights come out of the decomposed lowering only; ask for them where they can be had.
    need_weights = masked and lowering == "decomposed"
    if _skipped(row, lowering, _spec_of(name_or_module, overrides), need_weights=need_weights, dtype=dtype):
        return row
    quantized = precision != "fp32"
    torch.manual_seed(seed)
    module = _module_of(name_or_module, overrides)
    spec = module.spec
    tol = TOLERANCE[dtype]
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        path = Path(tmp) / f"{name}-{lowering}-{dtype}-{case}.onnx"
        export_kw = {"need_weights": need_weights, "with_mask": masked, "with_head_mask": masked}
        export_kw["precision"] = precision
        sess = _export_and_open(row, module, path, export_kw)
        if sess is None:
            return row
        device = "cuda" if provider == "cuda" else "cpu"
        ref_module = _reference_module(module, dtype, device)
        ins, _ = interface(spec, need_weights=need_weights, with_mask=masked, with_head_mask=masked)
        worst_abs = worst_rel = 0.0
        all_ok = True
        varied = False  # a check whose reference is constant everywhere would prove nothing
        for b, t, s in shapes:
            feeds = example_inputs(spec, ins, DTYPES[dtype], b, t, s)
            if masked:
                feeds["mask"][0, -1, :] = False  # a query row with no allowed key
                # ablate the last head; with a single head, halve it (zeroing it would leave y = b_O)
                feeds["head_mask"][:, -1] = 0 if spec.heads > 1 else 0.5
            refs = _reference(ref_module, feeds, need_weights, device)
            varied = varied or bool((refs[0] != refs[0].flatten()[0]).any())
            try:
                gots = _run(sess, feeds, device)
            except Exception as e:  # noqa: BLE001 - a runtime failure is a FAIL with its text
                row.status, row.reason = "FAIL", f"run failed at (b,t,s)={(b, t, s)}: {str(e)[:200]}"
                return row
            for o, r in zip(gots, refs):
                a, rel, ok = errors(o.float().cpu().numpy(), r.cpu().numpy(), tol)
                worst_abs, worst_rel = _worse(worst_abs, a), _worse(worst_rel, rel)
                all_ok = all_ok and (ok or quantized)
            l2 = _row_l2(gots[0], refs[0])
            row.rel_l2 = l2 if row.shapes == 0 else max(row.rel_l2, l2)
            row.shapes += 1
        if quantized and all_ok:
            try:
                row.reason = _coupling(row, sess, ref_module, spec, ins, need_weights, device, row_scales)
            except Exception as e:  # noqa: BLE001 - a runtime failure is a FAIL with its text
                row.reason = f"run failed in the mixed-scale or causality check: {str(e)[:200]}"
        row.max_abs, row.max_rel = worst_abs, worst_rel
        all_ok = all_ok and not (quantized and not row.rel_l2 <= row.bound) and not row.reason
        row.status = "PASS" if all_ok and varied else "FAIL"
        if not all_ok:
            row.reason = row.reason or _miss(row, tol)
        elif not varied:
            row.reason = "the eager output is constant at every shape: nothing was compared"
        elif sess.provider != provider:
            row.status, row.reason = "FAIL", f"ran on {sess.provider}, not {provider}"
    return row


def _reference(ref_module: zoo.MultiHeadAttention, feeds: dict, need_weights: bool, device: str) -> tuple:
    """The eager outputs for one set of feeds, as a tuple (y, and the weights when asked for)."""
    masked = "mask" in feeds
    with torch.no_grad():
        out = ref_module(
            feeds["x"].float().to(device),
            feeds["context"].float().to(device) if "context" in feeds else None,
            feeds["mask"][:, None].to(device) if masked else None,
            need_weights=need_weights,
            head_mask=feeds["head_mask"].float().to(device) if "head_mask" in feeds else None,
        )
    return out if isinstance(out, tuple) else (out,)


def _run(sess: OnnxSession, feeds: dict, device: str) -> tuple:
    """The session's outputs for one set of feeds, as a tuple of tensors of their own."""
    args = {k: v.to(device) for k, v in feeds.items()}
    got = sess.run(args["x"], args.get("context"), args.get("mask"), args.get("head_mask"))
    return tuple(g.clone() for g in (got if isinstance(got, tuple) else (got,)))


def _row_l2(got: torch.Tensor, ref: torch.Tensor) -> float:
    """The worst relative L2 error of y over the batch rows, each row against its own norm (a
    batch of small and large rows is not judged by its largest row)."""
    got, ref = got.float().cpu().numpy(), ref.float().cpu().numpy()
    return max(rel_l2(g, r) for g, r in zip(got, ref))


def _coupling(row, sess, ref_module, spec, ins, need_weights: bool, device: str, scales) -> str:
    """The mixed-scale batch and, for a causal block, the scaled future (see MIXED_SCALES); the
    row's rel_l2 takes the worst of the batch's rows at scale <= 1. '' when both hold, else the reason."""
    b = len(scales)
    feeds = example_inputs(spec, ins, torch.float32, b, MIXED_T, MIXED_T)
    for name in ("x", "context"):
        if name in feeds:
            feeds[name] *= torch.tensor(scales, dtype=torch.float32).view(b, 1, 1)
    refs = _reference(ref_module, feeds, need_weights, device)
    batched = _run(sess, feeds, device)
    small = [i for i, k in enumerate(scales) if k <= 1]  # the rows at the scale the bound is stated for
    if small:
        row.rel_l2 = max(row.rel_l2, _row_l2(batched[0][small], refs[0][small]))
    row.shapes += 1
    reason = _batch_mates(batched, lambda i: _run(sess, {k: v[i : i + 1] for k, v in feeds.items()}, device), scales)
    if reason or not spec.causal or spec.is_cross:
        return reason
    first = {k: v[:1] for k, v in feeds.items()}
    later = {k: v.clone() for k, v in first.items()}
    later["x"][:, MIXED_T // 2 :] *= FUTURE_SCALE
    row.shapes += 1
    return _future_moved(_run(sess, first, device)[0], _run(sess, later, device)[0], MIXED_T, "causal: positions")


def _batch_mates(batched: tuple, alone, scales, what: str = "") -> str:
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


def _future_moved(now: torch.Tensor, then: torch.Tensor, t: int, where: str) -> str:
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


# Decode parity: a prompt of PROMPT positions, then STEPS single-token steps; batch 1, and
# batch 3 with rows left-padded by PADS positions (ragged lengths through the key mask).
PROMPT, STEPS = 7, 25
PADS = (0, 5, 2)
# Then the same rows again in chunks: a prompt, then several positions at once after a past.
CHUNKS = (4, 13, 14, PROMPT + STEPS)


def check_decode(
    name_or_module: str | zoo.MultiHeadAttention,
    lowering: str,
    *,
    dtype: str = "float32",
    provider: str = "cpu",
    workdir: str | Path | None = None,
    seed: int = 0,
    cache: str = "grow",
    precision: str = "fp32",
    **overrides,
) -> ParityRow:
    """Export a decode model (cache="grow" or "static") and run a prompt then single-token steps under
    ONNX Runtime (the cache kept by the runtime); every row must match the eager full forward of that
    row alone (for a quantized precision: within its bound on the relative L2 error of y over each run,
    row by row).

    Batch 1, then batch 3 with left padding (key_mask); each batch again in chunks (CHUNKS: t > 1
    after a past, and one single token). The export traced b=2, t=5, p=3, so every run here is at
    shapes it never saw (p = 0 for the prompt, p >= 7 for the steps, t = 7 and 1).
    A miss is a FAIL naming the batch, the step and the max error.
    """
    name = name_or_module if isinstance(name_or_module, str) else "custom"
    case = "decode" if cache == "grow" else f"decode-{cache}"
    row = _new_row(name, lowering, provider, dtype, case, precision)
    if provider not in PROVIDERS:
        raise zoo.ArgumentError(f"provider={provider!r} is not one of {PROVIDERS}")
    spec = _spec_of(name_or_module, overrides)
    if _skipped(row, lowering, spec, decode=True, dtype=dtype, cache=cache):
        return row
    torch.manual_seed(seed)
    module = _module_of(name_or_module, overrides)
    tol = TOLERANCE[dtype]
    ref_module = _reference_module(module, dtype, "cpu")
    n = PROMPT + STEPS
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        path = Path(tmp) / f"{name}-{lowering}-{dtype}-{case}.onnx"
        export_kw = {"decode": True, "with_mask": True, "cache": cache, "precision": precision}
        if cache == "static":  # room for exactly the run: a step past it would be refused
            export_kw["max_len"] = n
        sess = _export_and_open(row, module, path, export_kw)
        if sess is None:
            return row
        worst_abs = worst_rel = 0.0
        for pads in ((0,), PADS):
            b = len(pads)
            x = torch.randn(b, n, spec.d_model)
            key_mask = torch.ones(b, n, dtype=torch.bool)
            for r, pad in enumerate(pads):
                key_mask[r, :pad] = False
            with torch.no_grad():  # each row alone, unpadded; its padded positions have no key: y = b_O
                ref = torch.zeros(b, n, spec.d_model)
                for r, pad in enumerate(pads):
                    ref[r, pad:] = ref_module(x[r : r + 1, pad:].to(torch.float32))[0]
                    ref[r, :pad] = ref_module.out_proj.bias if spec.bias else 0.0
            xd = x.to(DTYPES[dtype])
            try:
                y0, pk, pv = sess.decode(xd[:, :PROMPT], key_mask=key_mask[:, :PROMPT])
                ys, pk, pv = sess.generate_steps(xd[:, PROMPT:], pk, pv, key_mask=key_mask)
            except Exception as e:  # noqa: BLE001 - a runtime failure is a FAIL with its text
                row.status, row.reason = "FAIL", f"run failed at batch {b}: {str(e)[:200]}"
                return row
            got = torch.cat([y0, ys], 1).float()
            quantized = precision != "fp32"  # its bound is on the whole run, not elementwise per step
            if quantized and not _within_bound(row, got, ref, f"batch {b}, the prompt and {STEPS} steps"):
                return row
            for step in range(STEPS + 1 if not quantized else 0):  # step 0 is the prompt
                cols = slice(0, PROMPT) if step == 0 else slice(PROMPT + step - 1, PROMPT + step)
                a, rel, ok = errors(got[:, cols].numpy(), ref[:, cols].numpy(), tol)
                worst_abs, worst_rel = _worse(worst_abs, a), _worse(worst_rel, rel)
                if not ok:
                    where = "the prompt" if step == 0 else f"step {step} (position {PROMPT + step - 1})"
                    row.status, row.max_abs, row.max_rel = "FAIL", worst_abs, worst_rel
                    row.reason = f"batch {b}, {where}: max abs {a:.2e} outside rtol={tol.rtol:g}, atol={tol.atol:g}"
                    return row
            row.shapes += STEPS + 1
            # Chunks after a past (t > 1, p > 0) at this batch, as a server batches them.
            start, pk, pv, ys = 0, None, None, []
            try:
                for end in CHUNKS:
                    y, pk, pv = sess.decode(xd[:, start:end], pk, pv, key_mask=key_mask[:, :end])
                    ys.append(y)
                    start = end
            except Exception as e:  # noqa: BLE001
                row.status, row.reason = "FAIL", f"chunked run failed at batch {b}: {str(e)[:200]}"
                return row
            got = torch.cat(ys, 1).float()
            if quantized and not _within_bound(row, got, ref, f"batch {b}, in chunks {CHUNKS}"):
                return row
            start = 0
            for end in CHUNKS if not quantized else ():
                a, rel, ok = errors(got[:, start:end].numpy(), ref[:, start:end].numpy(), tol)
                worst_abs, worst_rel = _worse(worst_abs, a), _worse(worst_rel, rel)
                if not ok:
                    row.status, row.max_abs, row.max_rel = "FAIL", worst_abs, worst_rel
                    row.reason = (
                        f"batch {b}, the chunk of positions {start}..{end - 1} after a past of {start}: "
                        f"max abs {a:.2e} outside rtol={tol.rtol:g}, atol={tol.atol:g}"
                    )
                    return row
                start = end
            row.shapes += len(CHUNKS)
        if quantized:
            try:
                row.reason = _decode_coupling(row, sess, spec, MIXED_SCALES)
            except Exception as e:  # noqa: BLE001 - a runtime failure is a FAIL with its text
                row.reason = f"run failed in the mixed-scale or causality check: {str(e)[:200]}"
            if row.reason:
                row.status = "FAIL"
                return row
        else:
            row.max_abs, row.max_rel = worst_abs, worst_rel
        row.status = "PASS"
    return row


def _decode_coupling(row, sess, spec, scales) -> str:
    """check_decode's mixed-scale batch and scaled future, for a quantized decode export: a prompt
    then single steps on rows scaled `scales` must give each row its answer alone, and a prompt's
    earlier positions must not move when its later ones are scaled. '' when both hold, else the reason."""
    b, n = len(scales), PROMPT + 4

    def run(x):
        keep = torch.ones(x.shape[0], n, dtype=torch.bool)
        y0, pk, pv = sess.decode(x[:, :PROMPT], key_mask=keep[:, :PROMPT])
        ys, _, _ = sess.generate_steps(x[:, PROMPT:], pk, pv, key_mask=keep)
        return torch.cat([y0, ys], 1).float()

    x = torch.randn(b, n, spec.d_model) * torch.tensor(scales, dtype=torch.float32).view(b, 1, 1)
    batched = run(x)
    row.shapes += 1
    reason = _batch_mates((batched,), lambda i: (run(x[i : i + 1]),), scales, "decode: ")
    if reason:
        return reason
    keep = torch.ones(1, PROMPT, dtype=torch.bool)
    later = x[:1, :PROMPT].clone()
    later[:, PROMPT // 2 :] *= FUTURE_SCALE
    now, then = sess.decode(x[:1, :PROMPT], key_mask=keep)[0], sess.decode(later, key_mask=keep)[0]
    row.shapes += 1
    return _future_moved(now, then, PROMPT, "decode causal: prompt positions")


def run_parity(
    pattern: str = "*",
    *,
    lowerings: Iterable[str] = LOWERINGS,
    providers: Iterable[str] = ("cpu",),
    dtypes: Iterable[str] = ("float32",),
    cases: Iterable[str] = CASES,
    precisions: Iterable[str] = ("fp32",),
    progress: Callable[[ParityRow], None] | None = None,
    **overrides,
) -> list[ParityRow]:
    """The parity matrix for every registered name matching `pattern` ("decode" in `cases`: the
    token-by-token check, check_decode)."""
    names = zoo.names(pattern)
    if not names:
        raise zoo.UnknownNameError(f"no attention block matches {pattern!r}; see `attnzoo list`")
    rows = []
    import itertools

    grid = list(itertools.product(lowerings, providers, dtypes, precisions, cases))
    for name in names:
        for lw, prov, dt, prec, case in grid:
            kw = {"dtype": dt, "provider": prov, "precision": prec, **overrides}
            if case.startswith("decode"):
                cache = case.removeprefix("decode").removeprefix("-") or "grow"
                row = check_decode(name, lw, cache=cache, **kw)
            else:
                row = check(name, lw, case=case, **kw)
            rows.append(row)
            if progress:
                progress(row)
    return rows


def format_matrix(rows: list[ParityRow]) -> str:
    """A markdown table, one row per check, then a one-line tally. Quantized rows show the
    relative L2 error of y and the bound it is held to."""
    head = "| variant | lowering | provider | dtype | case | precision | max abs | max rel | rel L2 of y (bound) "
    head += "| result |"
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        nums = ("", "") if r.status == "SKIP" else (f"{r.max_abs:.1e}", f"{r.max_rel:.1e}")
        l2 = "" if r.rel_l2 != r.rel_l2 else f"{r.rel_l2:.2%}" + ("" if r.bound != r.bound else f" (<= {r.bound:.0%})")
        result = r.status + (f": {r.reason}" if r.reason else "")
        lines.append(
            f"| {r.name} | {r.lowering} | {r.provider} | {r.dtype} | {r.case} | {r.precision} | {nums[0]} | {nums[1]} "
            f"| {l2} | {result} |"
        )
    n = {s: sum(r.status == s for r in rows) for s in ("PASS", "FAIL", "SKIP")}
    lines.append("")
    lines.append(f"parity: {n['PASS']} passed, {n['FAIL']} failed, {n['SKIP']} skipped")
    return "\n".join(lines)


def _new_row(name: str, lowering: str, provider: str, dtype: str, case: str, precision: str) -> ParityRow:
    """A SKIP row for the request; an unknown precision is refused here, before any work."""
    from .precision import method

    method(precision)  # PrecisionError naming the choices
    bound = ERROR_BOUNDS[precision] if precision != "fp32" else float("nan")
    return ParityRow(name, lowering, provider, dtype, case, "SKIP", precision=precision, bound=bound)


def _miss(row: ParityRow, tol: Tolerance) -> str:
    if row.max_abs != row.max_abs:
        return "NaN in the output (or the eager reference)"
    if row.precision != "fp32":
        return f"relative L2 error of y {row.rel_l2:.2%} is over the {row.precision} bound {row.bound:.0%}"
    return f"outside rtol={tol.rtol:g}, atol={tol.atol:g}"


def _within_bound(row: ParityRow, got: torch.Tensor, ref: torch.Tensor, where: str) -> bool:
    """Quantized decode: the run's relative L2 error of y (its worst batch row) against the bound;
    False (row FAIL) on a miss."""
    a, rel, _ = errors(got.numpy(), ref.numpy(), TOLERANCE["float32"])
    l2 = _row_l2(got, ref)
    so_far = [0.0 if v != v else v for v in (row.max_abs, row.max_rel, row.rel_l2)]  # nan: nothing yet
    row.max_abs, row.max_rel, row.rel_l2 = (_worse(old, new) for old, new in zip(so_far, (a, rel, l2)))
    if l2 <= row.bound:
        return True
    row.status, row.reason = "FAIL", f"{where}: {_miss(row, TOLERANCE['float32'])}"
    return False
