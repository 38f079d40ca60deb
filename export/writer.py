"""`export_onnx`: a zoo block (or a registered name) to an ONNX file, through one lowering.

The lowerings are records (export/lowerings/), the choice among them is export/choice.py, the
tracing export/tracing.py; this module checks the request, runs them, and writes the file
atomically with its metadata.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

import zoo

from . import cuda_check, saving
from .choice import TARGETS, auto_order, decode_cache, decode_order, decode_why_not, why_not
from .errors import ExportError
from .graphs import op_counts
from .lowerings import record
from .names import CACHE_CHOICES, DEFAULT_MAX_LEN, LOWERINGS, precision_words
from .precision import PrecisionError
from .precision import apply as apply_precision
from .precision import why_not as precision_why_not
from .tracing import BF16_CPU, DTYPES, EXAMPLE_B, EXAMPLE_S, EXAMPLE_T, lower, lower_decode, lower_static_decode

EXTERNAL_DATA_BYTES = saving.EXTERNAL_DATA_BYTES  # read at each save (a test lowers it)


@dataclass
class ExportResult:
    path: Path
    name: str
    lowering: str
    opset: int
    dtype: str
    spec: zoo.AttentionSpec
    inputs: list[tuple[str, str, tuple[int | str, ...]]]
    outputs: list[tuple[str, str, tuple[int | str, ...]]]
    op_counts: dict[str, int]
    parameters: int
    seconds: float
    file_bytes: int
    external_data: Path | None = None
    notes: list[str] = field(default_factory=list)
    precision: str = "fp32"  # the weights' precision (export/precision.py)
    precision_method: str = ""  # how it was made, with block size and accuracy level where they apply
    module: nn.Module | None = field(default=None, repr=False)  # the eager block exported

    def summary(self) -> str:
        def fmt(ios):
            return ", ".join(f"{n} {d}[{', '.join(map(str, s))}]" for n, d, s in ios)

        ops = ", ".join(f"{k} x{v}" for k, v in sorted(self.op_counts.items(), key=lambda kv: -kv[1]))
        size = self.file_bytes + (self.external_data.stat().st_size if self.external_data else 0)
        weights_note = f", weights in {self.external_data.name}" if self.external_data else ""
        lines = [
            f"wrote {self.path} ({size / 1e6:.2f} MB{weights_note})",
            f"  block     {self.name}: {self.spec.describe()}",
            f"  lowering  {self.lowering} (opset {self.opset}), {self.dtype}, {self.parameters:,} parameters",
            f"  precision {precision_words(self.precision, self.dtype, self.precision_method)}",
            f"  inputs    {fmt(self.inputs)}",
            f"  outputs   {fmt(self.outputs)}",
            f"  nodes     {sum(self.op_counts.values())}: {ops}",
            f"  took      {self.seconds:.1f} s",
        ]
        lines += [f"  note      {n}" for n in self.notes]
        return "\n".join(lines)


def export_onnx(
    model_or_name: str | zoo.MultiHeadAttention,
    path: str | os.PathLike,
    *,
    lowering: str = "auto",
    dtype: str = "float32",
    need_weights: bool = False,
    with_mask: bool = False,
    with_head_mask: bool = False,
    overwrite: bool = False,
    provider: str = "cpu",
    decode: bool | None = None,
    cache: str = "auto",
    max_len: int | None = None,
    precision: str = "fp32",
    label: str | None = None,
    outputs: tuple[str, ...] = ("y",),
    **overrides: Any,
) -> ExportResult:
    """Export a zoo block to ONNX with dynamic b, t (and s) axes; returns what was written.

    `model_or_name` is a registered name (with spec-field `overrides`) or a module.
    `provider` steers lowering="auto" (the measured-fastest lowering differs by provider), and a
    lowering whose node that provider has no kernel for is refused (ort-gqa in fp32 on CUDA).
    A whole decoder model (a zoo.lm.DecoderLM) is one graph of its step with a static cache
    (export/lm_export.py, where its other arguments are described); decode defaults to True for it.
    decode=True writes a token-by-token model (io.decode_interface): x, past_key, past_value
    [, key_mask (b, p+t) with with_mask=True] -> y, present_key, present_value, with b, t and the
    past length p dynamic (p = 0 allowed).
    cache="auto" (the default) takes the measured-faster kind for `provider` (choice.DECODE_CACHE: static on
    the CPU) where the lowering can keep it; cache="grow" returns a new present (b g p+t d) each call.
    cache="static" (decode only) keeps the cache in buffers of capacity n written in place
    (io.static_interface): x, past_key, past_value (b g n d), past_len [, key_mask (b, n)] -> y and
    the buffers; the session binds each buffer as input and output, so no step copies the cache.
    max_len is the capacity a session allocates (default names.DEFAULT_MAX_LEN), kept in the metadata.
    precision: "fp32" (default), "int8" or "int4": the projections' weights quantized by ONNX
    Runtime's tools after the lowering (export/precision.py says how, per kind of export); the
    metadata and ExportResult.precision say which.
    label names a module in the summary and the metadata (attnzoo.name), e.g. the checkpoint and layer it
    came from; default: the registered name, or "custom" for a module.
    outputs: "y" and any named locations of the block (zoo/hooks.py: q, k, v, scores, pattern, z,
    result), which become graph outputs of those names after y (and attn), e.g. ("y", "pattern", "z").
    """
    from .lm_export import export_lm, is_lm

    if is_lm(model_or_name):  # a whole decoder model: one graph of its step (export/lm_export.py)
        return export_lm(
            model_or_name,
            path,
            decode=True if decode is None else decode,
            cache=cache,
            max_len=max_len,
            precision=precision,
            lowering=lowering,
            provider=provider,
            dtype=dtype,
            overwrite=overwrite,
            label=label,
            **overrides,
        )
    decode = False if decode is None else decode
    started = time.perf_counter()
    _check_export_args(path, lowering, dtype, provider, need_weights, with_mask, with_head_mask, overwrite)
    if not isinstance(decode, bool):
        raise zoo.InputTypeError(f"decode={decode!r} must be True or False")
    if decode and cache == "auto" and isinstance(lowering, str) and isinstance(provider, str):
        cache = decode_cache(provider, lowering, max_len) if lowering in ("auto", *LOWERINGS) else "grow"
    max_len = _check_cache_args(decode, cache, max_len, lowering=lowering)
    locations = _check_outputs(outputs, decode)
    if decode and (need_weights or with_head_mask):
        raise ExportError("a decode model outputs y and the cache only: drop need_weights / with_head_mask")
    reason = precision_why_not(precision, dtype=dtype, provider=provider, decode=decode)
    if reason:
        raise PrecisionError(reason)
    if isinstance(model_or_name, str):  # a size past the machine is refused before any allocation
        _check_export_fits(zoo.spec(model_or_name, **overrides), dtype)
    module, name = _resolve_module(model_or_name, overrides)
    if label is not None and (not isinstance(label, str) or not label.strip()):
        raise zoo.InputTypeError(f"label={label!r} must be a non-empty string")
    if max_len is not None:  # a capacity past the machine (or past int64) cannot be served: refused here
        from zoo.cache import check_static_fits

        check_static_fits(module.spec, 1, max_len, DTYPES[dtype].itemsize, key_mask=with_mask)
    order = auto_order(provider, module.spec, with_mask=with_mask)
    path = Path(path)
    if path.is_dir():
        raise ExportError(f"{path} is a folder; give a file path such as {path / (name + '.onnx')}")
    name = label or name
    target = saving.output_target(path, overwrite)

    static = decode and cache == "static"
    if decode:
        reason = decode_why_not(module.spec)
        if reason:
            raise ExportError(f"cannot export a decode model: {reason}")
        order = decode_order(provider, module.spec, cache=cache)
    request = {
        "need_weights": need_weights,
        "decode": decode,
        "dtype": dtype,
        "provider": provider,
        "masked": with_mask,
    }
    if locations:
        request["locations"] = locations
    if static:
        request["cache"] = cache
    if lowering == "auto":
        candidates = [lw for lw in order if why_not(lw, module.spec, **request) is None]
    else:
        reason = why_not(lowering, module.spec, **request)
        if reason:
            raise ExportError(f"lowering={lowering!r} cannot express this request: {reason}")
        candidates = [lowering]

    notes: list[str] = []
    last_error: ExportError | None = None
    partial = None  # auto + a precision: the first lowering whose weights were only partly quantized
    for lw in candidates:
        try:
            if static:
                model, ins, outs = lower_static_decode(module, lw, dtype, with_mask)
            elif decode:
                model, ins, outs = lower_decode(module, lw, dtype, with_mask)
            else:
                model, ins, outs = lower(module, lw, dtype, need_weights, with_mask, with_head_mask, locations)
            quantized, applied = apply_precision(model, precision, decode=decode)
            cuda_check.check(quantized, provider)  # every attention and MatMulNBits node within the CUDA rules
        except ExportError as e:
            if lowering != "auto":
                raise
            notes.append(f"auto: skipped {lw}: {e}")
            last_error = e
            continue
        # auto prefers a lowering whose projections are all quantized (ort-mha packs a biased
        # block's Q/K/V weights into an Attention node neither tool quantizes); else the first.
        if lowering == "auto" and applied.left:
            partial = partial or (lw, model, ins, outs, quantized, applied, len(notes))
            continue
        break
    else:
        if partial is None:  # pragma: no cover - decomposed always expresses everything
            raise last_error or ExportError("no lowering could express this request")
        lw, model, ins, outs, quantized, applied, _ = partial
    if partial is not None and partial[0] != lw:
        notes.insert(partial[6], f"auto: skipped {partial[0]}: {partial[5].note()}")

    counts = op_counts(model)
    if record(lw).combined_as_separate and module.spec.layout == "combined":
        if counts.get("com.microsoft::Attention"):  # the packed op holds the Q/K/V weights itself
            notes.append("the combined projection is inside ONNX Runtime's packed Attention node")
        elif counts.get("MatMul", 0) >= 3:
            notes.append("the combined projection is written as separate Q/K/V MatMuls (same function, no Split copy)")
    model = quantized
    if applied.note():  # some weights stay fp32: say which, and how much
        notes.append(applied.note())
    counts = op_counts(model)
    _set_metadata(model, name, module.spec, lw, dtype, decode=decode)
    if static:
        # past_len's valid range, for a runtime that feeds the graph directly (t: this call's tokens)
        valid = "0 <= past_len <= max_len - t"
        static_meta = {"attnzoo.cache": "static", "attnzoo.max_len": str(max_len), "attnzoo.past_len": valid}
        model.metadata_props.update(static_meta)
    elif decode:
        model.metadata_props["attnzoo.cache"] = "grow"
    model.metadata_props.update(applied.metadata())
    external = saving.save_atomic(model, target, module, dtype, overwrite=overwrite, limit=EXTERNAL_DATA_BYTES)
    return ExportResult(
        path=path,
        name=name,
        lowering=lw,
        opset=record(lw).opset,
        dtype=dtype,
        spec=module.spec,
        inputs=[io.summary(module.spec, dtype) for io in ins],
        outputs=[io.summary(module.spec, dtype) for io in outs],
        op_counts=counts,
        parameters=zoo.count_parameters(module),
        seconds=time.perf_counter() - started,
        file_bytes=target.stat().st_size,
        external_data=external,
        notes=notes,
        module=module,
        precision=precision,
        precision_method=applied.method.describe() if applied.method.tool != "none" else "",
    )


def _check_outputs(outputs, decode: bool) -> tuple[str, ...]:
    """The named locations of export_onnx's `outputs` (after "y")."""
    from runtime.io import LOCATION_OUTPUTS

    if isinstance(outputs, str) or not isinstance(outputs, (tuple, list)) or not outputs or outputs[0] != "y":
        raise zoo.InputTypeError(f"outputs={outputs!r} must be a tuple starting with 'y', e.g. ('y', 'pattern', 'z')")
    rest = tuple(outputs[1:])
    for name in rest:
        if name not in LOCATION_OUTPUTS or rest.count(name) > 1:
            raise ExportError(
                f"outputs: {name!r} is "
                + ("named twice" if name in LOCATION_OUTPUTS else "not a location")
                + f"; after 'y' give some of {', '.join(LOCATION_OUTPUTS)}"
            )
    if rest and decode:
        raise ExportError("a decode model outputs y and the cache only: drop the locations from outputs")
    return rest


def _check_export_args(path, lowering, dtype, provider, need_weights, with_mask, with_head_mask, overwrite) -> None:
    """Types and choices of export_onnx's arguments, before any work (`with_mask='no'` is not True)."""
    if not isinstance(path, (str, os.PathLike)) or (isinstance(path, str) and not path.strip()):
        raise zoo.InputTypeError(f"path={path!r} must be a file path (str or os.PathLike), e.g. 'model.onnx'")
    flags = {
        "need_weights": need_weights,
        "with_mask": with_mask,
        "with_head_mask": with_head_mask,
        "overwrite": overwrite,
    }
    for flag, value in flags.items():
        if not isinstance(value, bool):
            raise zoo.InputTypeError(f"{flag}={value!r} must be True or False")
    for arg, value, choices in (
        ("lowering", lowering, ("auto", *LOWERINGS)),
        ("dtype", dtype, tuple(DTYPES)),
        ("provider", provider, TARGETS),
    ):
        if not isinstance(value, str) or value not in choices:
            raise ExportError(f"{arg}={value!r} is not one of {', '.join(choices)}")
    if dtype == "bfloat16" and provider == "cpu":
        raise ExportError(BF16_CPU)


def _check_cache_args(decode: bool, cache: str, max_len: int | None, *, lowering: Any = "auto") -> int | None:
    """The static cache's capacity (None for a growing cache), after checking cache and max_len; a
    max_len without a static cache is refused suggesting what works for `lowering`."""
    if not isinstance(cache, str) or cache not in CACHE_CHOICES:
        raise ExportError(f"cache={cache!r} is not one of {', '.join(CACHE_CHOICES)}")
    if cache == "auto":  # not a decode export: nothing to keep
        cache = "grow"
    if max_len is not None and (isinstance(max_len, bool) or not isinstance(max_len, int)):
        raise zoo.InputTypeError(f"max_len={max_len!r} must be an int (the static cache's capacity)")
    if cache == "static":
        if not decode:
            raise ExportError("cache='static' is for decode models: pass decode=True (CLI: --decode)")
        if max_len is not None and max_len < 1:
            raise ExportError(f"max_len={max_len} must be at least 1 (the static cache's capacity)")
        return DEFAULT_MAX_LEN if max_len is None else max_len
    if max_len is not None:
        raise ExportError(_max_len_without_static(decode, lowering))
    return None


def _max_len_without_static(decode: bool, lowering: Any) -> str:
    """What to do with a max_len the export has no static cache for: the fix that works."""
    what = "max_len is the capacity of a static cache"
    if not decode:
        return f"{what}, for decode models: add decode=True (CLI: --decode) or drop max_len (--max-len)"
    keepers = [lw for lw in LOWERINGS if record(lw).static_cache is None]
    if lowering in ("auto", *keepers):
        return f"{what}: pass cache='static' (CLI: --cache static), or drop max_len (--max-len) for a growing cache"
    return (
        f"{what}, and lowering={lowering!r} cannot keep one ({record(lowering).static_cache}): drop max_len "
        f"(--max-len) for its growing cache, or take a lowering that keeps one: {', '.join(keepers)} or auto"
    )


# Exporting holds the fp32 module, its copy in the export dtype, torch's traced program and
# the serialized ONNX model: about four copies of the parameters at once.
_EXPORT_PARAMETER_COPIES = 4


def _check_export_fits(spec: zoo.AttentionSpec, dtype: str) -> None:
    from zoo.accounting import working_set_bytes
    from zoo.limits import check_fits

    need = _EXPORT_PARAMETER_COPIES * zoo.count_parameters(spec) * 4 + working_set_bytes(
        spec, EXAMPLE_B, EXAMPLE_T, EXAMPLE_S if spec.is_cross else None, score_copies=3
    )
    check_fits(need, f"exporting {spec.describe()} ({zoo.count_parameters(spec):,} parameters, {dtype})")


def _resolve_module(model_or_name, overrides) -> tuple[zoo.MultiHeadAttention, str]:
    if isinstance(model_or_name, str):
        return zoo.create(model_or_name, **overrides).eval(), model_or_name
    if isinstance(model_or_name, zoo.MultiHeadAttention):
        if overrides:
            raise zoo.InputTypeError(f"spec overrides {sorted(overrides)} apply to a name, not to a module")
        return model_or_name, "custom"
    raise zoo.InputTypeError(
        f"export_onnx takes a zoo name or a zoo.MultiHeadAttention, got {type(model_or_name).__name__}"
    )


def _set_metadata(model, name: str, spec: zoo.AttentionSpec, lowering: str, dtype: str, *, decode: bool) -> None:
    model.metadata_props.update(
        {
            "attnzoo.kind": "decode" if decode else "full",
            "attnzoo.name": name,
            "attnzoo.spec": json.dumps(spec.to_dict(), sort_keys=True),
            "attnzoo.parameters": str(zoo.count_parameters(spec)),
            "attnzoo.version": zoo.__version__,
            "attnzoo.lowering": lowering,
            "attnzoo.dtype": dtype,
        }
    )
    model.producer_name = "attnzoo"
    model.producer_version = zoo.__version__


__all__ = ["ExportResult", "export_onnx"]
