"""Decode parity: a decode export (a growing or a static cache) run under ONNX Runtime token by
token, every row against the eager full forward of that row alone (check_decode)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

import zoo
from export.tracing import DTYPES
from export.writer import export_onnx

from .rows import (
    FUTURE_SCALE,
    MIXED_SCALES,
    PROVIDERS,
    TOLERANCE,
    ParityRow,
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
    tf32: bool = False,
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
    row = new_row(name, lowering, provider, dtype, case, precision, tf32)
    if provider not in PROVIDERS:
        raise zoo.ArgumentError(f"provider={provider!r} is not one of {PROVIDERS}")
    spec = spec_of(name_or_module, overrides)
    if skipped(row, lowering, spec, decode=True, dtype=dtype, cache=cache, masked=True):
        return row
    torch.manual_seed(seed)
    module = module_of(name_or_module, overrides)
    tol = tolerance(dtype, provider, tf32)
    ref_module = reference_module(module, dtype, "cpu")
    n = PROMPT + STEPS
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        path = Path(tmp) / f"{name}-{lowering}-{dtype}-{case}.onnx"
        export_kw = {"decode": True, "with_mask": True, "cache": cache, "precision": precision}
        if cache == "static":  # room for exactly the run: a step past it would be refused
            export_kw["max_len"] = n
        sess = export_and_open(row, export_onnx, module, path, export_kw)
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
                worst_abs, worst_rel = worse(worst_abs, a), worse(worst_rel, rel)
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
                worst_abs, worst_rel = worse(worst_abs, a), worse(worst_rel, rel)
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
    reason = batch_mates((batched,), lambda i: (run(x[i : i + 1]),), scales, "decode: ")
    if reason:
        return reason
    keep = torch.ones(1, PROMPT, dtype=torch.bool)
    later = x[:1, :PROMPT].clone()
    later[:, PROMPT // 2 :] *= FUTURE_SCALE
    now, then = sess.decode(x[:1, :PROMPT], key_mask=keep)[0], sess.decode(later, key_mask=keep)[0]
    row.shapes += 1
    return future_moved(now, then, PROMPT, "decode causal: prompt positions")


def _within_bound(row: ParityRow, got: torch.Tensor, ref: torch.Tensor, where: str) -> bool:
    """Quantized decode: the run's relative L2 error of y (its worst batch row) against the bound;
    False (row FAIL) on a miss."""
    a, rel, _ = errors(got.numpy(), ref.numpy(), TOLERANCE["float32"])
    l2 = row_l2(got, ref)
    so_far = [0.0 if v != v else v for v in (row.max_abs, row.max_rel, row.rel_l2)]  # nan: nothing yet
    row.max_abs, row.max_rel, row.rel_l2 = (worse(old, new) for old, new in zip(so_far, (a, rel, l2)))
    if l2 <= row.bound:
        return True
    row.status, row.reason = "FAIL", f"{where}: {miss(row, TOLERANCE['float32'])}"
    return False
