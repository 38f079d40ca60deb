"""Parity of exported models against eager torch, at shapes the export never saw.

One row per (variant, lowering, provider, dtype, precision, case): the max abs and max rel error
over every checked shape and output, and PASS / FAIL / SKIP with the reason. A miss is a FAIL,
never a warning. A quantized export (precision int8/int4) is compared with the fp32 eager block
under its stated bound on the relative L2 error of y of each batch row (export/precision.py,
ERROR_BOUNDS): the row carries the measured error and the bound. It is also run on a batch of rows
of different scales (each row must get its answer alone) and, when causal, with its later positions
scaled (the earlier ones must not move): MIXED_SCALES.

Here the full-sequence check (`check`) and the matrix (`run_parity`, `format_matrix`); the
token-by-token check is parity/decode.py, the row and its measures parity/rows.py.
"""

from __future__ import annotations

import itertools
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

import zoo
from export.choice import why_not
from export.lowerings import record
from export.names import LOWERINGS
from export.precision import ERROR_BOUNDS
from export.tracing import DTYPES, example_inputs
from export.writer import export_onnx
from runtime.io import interface
from runtime.session import OnnxSession

from .decode import CHUNKS, PADS, PROMPT, STEPS, check_decode
from .rows import (
    FUTURE_SCALE,
    MIXED_SCALES,
    MIXED_T,
    PROVIDERS,
    TOLERANCE,
    ParityRow,
    Tolerance,
    batch_mates,
    errors,
    export_and_open,
    future_moved,
    miss,
    module_of,
    new_row,
    reference_module,
    row_l2,
    skipped,
    spec_of,
    tolerance,
    worse,
)

# (b, t, s): b in {1, 3}, t in {1, 7, 64}; s differs from t for cross-attention. The export
# traced b=2, t=5, s=7, so none of these is an export shape.
SHAPES = [(1, 1, 5), (3, 1, 3), (1, 7, 13), (3, 7, 1), (1, 64, 33), (3, 64, 64)]
CASES = ("plain", "masked")  # masked = bool mask (one fully masked row) + head_mask (one head zeroed)


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
    tf32: bool = False,
    row_scales: tuple[float, ...] = MIXED_SCALES,
    outputs: tuple[str, ...] = ("y",),
    **overrides,
) -> ParityRow:
    """Export one variant with one lowering and compare it with eager torch at `shapes`.

    precision int8/int4: the fp32 eager block is the reference, and the relative L2 error of y
    of each batch row at each shape must be within ERROR_BOUNDS[precision] (elementwise tolerances
    do not apply); then a batch of rows scaled `row_scales` must give each row its answer alone,
    and a causal block's earlier positions must not move when later ones are scaled (_coupling).
    outputs: "y" and named locations (zoo/hooks.py), each checked against eager run_with_cache; a
    lowering that cannot produce one is a SKIP with why_not's reason."""
    name = name_or_module if isinstance(name_or_module, str) else "custom"
    row = new_row(name, lowering, provider, dtype, case, precision, tf32)
    if case not in CASES:
        raise zoo.ArgumentError(f"case={case!r} is not one of {CASES}")
    if provider not in PROVIDERS:
        raise zoo.ArgumentError(f"provider={provider!r} is not one of {PROVIDERS}")
    masked = case == "masked"
    # Weights come out of the decomposed lowering only; ask for them where they can be had.
    need_weights = masked and record(lowering).weights_out
    locations = tuple(outputs[1:])
    if locations:
        reason = why_not(lowering, spec_of(name_or_module, overrides), locations=locations)
        if reason:
            row.status, row.reason = "SKIP", reason
            return row
    if skipped(
        row, lowering, spec_of(name_or_module, overrides), need_weights=need_weights, dtype=dtype, masked=masked
    ):
        return row
    quantized = precision != "fp32"
    torch.manual_seed(seed)
    module = module_of(name_or_module, overrides)
    spec = module.spec
    tol = tolerance(dtype, provider, tf32)
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        path = Path(tmp) / f"{name}-{lowering}-{dtype}-{case}.onnx"
        export_kw = {"need_weights": need_weights, "with_mask": masked, "with_head_mask": masked}
        export_kw["precision"] = precision
        export_kw["outputs"] = tuple(outputs)
        sess = export_and_open(row, export_onnx, module, path, export_kw)
        if sess is None:
            return row
        device = "cuda" if provider == "cuda" else "cpu"
        ref_module = reference_module(module, dtype, device)
        ins, _ = interface(
            spec, need_weights=need_weights, with_mask=masked, with_head_mask=masked, locations=locations
        )
        worst_abs = worst_rel = 0.0
        all_ok = True
        varied = False  # a check whose reference is constant everywhere would prove nothing
        for b, t, s in shapes:
            feeds = example_inputs(spec, ins, DTYPES[dtype], b, t, s)
            if masked:
                feeds["mask"][0, -1, :] = False  # a query row with no allowed key
                # ablate the last head; with a single head, halve it (zeroing it would leave y = b_O)
                feeds["head_mask"][:, -1] = 0 if spec.heads > 1 else 0.5
            refs = _reference(ref_module, feeds, need_weights, device, locations)
            varied = varied or bool((refs[0] != refs[0].flatten()[0]).any())
            try:
                gots = _run(sess, feeds, device)
            except Exception as e:  # noqa: BLE001 - a runtime failure is a FAIL with its text
                row.status, row.reason = "FAIL", f"run failed at (b,t,s)={(b, t, s)}: {str(e)[:200]}"
                return row
            first_location = len(refs) - len(locations)
            for i, (o, r) in enumerate(zip(gots, refs)):
                o, r = o.float().cpu(), r.float().cpu()
                if i >= first_location:  # a location's -inf (masked scores) is compared as a finite -1e9
                    o, r = (v.masked_fill(v == float("-inf"), -1e9) for v in (o, r))
                a, rel, ok = errors(o.numpy(), r.numpy(), tol)  # NaN and inf in y stay what they are
                worst_abs, worst_rel = worse(worst_abs, a), worse(worst_rel, rel)
                all_ok = all_ok and (ok or quantized)
            l2 = row_l2(gots[0], refs[0])
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
            row.reason = row.reason or miss(row, tol)
        elif not varied:
            row.reason = "the eager output is constant at every shape: nothing was compared"
        elif sess.provider != provider:
            row.status, row.reason = "FAIL", f"ran on {sess.provider}, not {provider}"
    return row


def _reference(
    ref_module: zoo.MultiHeadAttention, feeds: dict, need_weights: bool, device: str, locations: tuple = ()
) -> tuple:
    """The eager outputs for one set of feeds, as a tuple (y, the weights when asked for, the locations)."""
    masked = "mask" in feeds
    with torch.no_grad():
        out, cache = ref_module.run_with_cache(
            feeds["x"].float().to(device),
            feeds["context"].float().to(device) if "context" in feeds else None,
            feeds["mask"][:, None].to(device) if masked else None,
            need_weights=need_weights,
            head_mask=feeds["head_mask"].float().to(device) if "head_mask" in feeds else None,
            names=locations,
        )
    return (*(out if isinstance(out, tuple) else (out,)), *(cache[loc] for loc in locations))


def _run(sess: OnnxSession, feeds: dict, device: str) -> tuple:
    """The session's outputs for one set of feeds, as a tuple of tensors of their own."""
    args = {k: v.to(device) for k, v in feeds.items()}
    got = sess.run(args["x"], args.get("context"), args.get("mask"), args.get("head_mask"))
    return tuple(g.clone() for g in (got if isinstance(got, tuple) else (got,)))


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
        row.rel_l2 = max(row.rel_l2, row_l2(batched[0][small], refs[0][small]))
    row.shapes += 1
    reason = batch_mates(batched, lambda i: _run(sess, {k: v[i : i + 1] for k, v in feeds.items()}, device), scales)
    if reason or not spec.causal or spec.is_cross:
        return reason
    first = {k: v[:1] for k, v in feeds.items()}
    later = {k: v.clone() for k, v in first.items()}
    later["x"][:, MIXED_T // 2 :] *= FUTURE_SCALE
    row.shapes += 1
    return future_moved(_run(sess, first, device)[0], _run(sess, later, device)[0], MIXED_T, "causal: positions")


def run_parity(
    pattern: str = "*",
    *,
    lowerings: Iterable[str] = LOWERINGS,
    providers: Iterable[str] = ("cpu",),
    dtypes: Iterable[str] = ("float32",),
    cases: Iterable[str] = CASES,
    precisions: Iterable[str] = ("fp32",),
    progress: Callable[[ParityRow], None] | None = None,
    tf32: bool = False,
    **overrides,
) -> list[ParityRow]:
    """The parity matrix for every registered name matching `pattern` ("decode" in `cases`: the
    token-by-token check, check_decode)."""
    names = zoo.names(pattern)
    if not names:
        raise zoo.UnknownNameError(f"no attention block matches {pattern!r}; see `attnzoo list`")
    rows = []
    grid = list(itertools.product(lowerings, providers, dtypes, precisions, cases))
    for name in names:
        for lw, prov, dt, prec, case in grid:
            kw = {"dtype": dt, "provider": prov, "precision": prec, "tf32": tf32, **overrides}
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


__all__ = [
    "CASES",
    "CHUNKS",
    "ERROR_BOUNDS",
    "FUTURE_SCALE",
    "MIXED_SCALES",
    "MIXED_T",
    "PADS",
    "PROMPT",
    "PROVIDERS",
    "SHAPES",
    "STEPS",
    "TOLERANCE",
    "ParityRow",
    "Tolerance",
    "check",
    "check_decode",
    "errors",
    "format_matrix",
    "run_parity",
]
