"""Which lowering: what each can express for a request (`why_not`, read from the records in
export/lowerings/), and the measured order `auto` tries them in, per provider and kind of block.

The preference tables hold only orders, as measured (CUDA: one expected order per table until a GPU
measures the kinds apart); what a lowering can do comes from its record (a static cache's candidates
are the tables' lowerings whose record keeps one: export/names.py's STATIC_CACHE_LOWERINGS, checked
against the records). A lowering no measurement has placed has no row,
and `auto` does not take it."""

from __future__ import annotations

import zoo

from .errors import ExportError
from .names import DEVICES, LOWERINGS, STATIC_CACHE_LOWERINGS

# The records (export/lowerings/: torch and onnx) are imported where a rule reads one, so that the
# command line's help reads these tables without them.

# Which lowering "auto" takes, fastest first, per provider and per kind of request, from
# `attnzoo bench` (README, "Choosing a lowering"); the first that can express it wins.
# ORT's CPU MultiHeadAttention has a flash path only without masks: with a causal or user
# mask it materializes the scores, and the standard Attention op then does better. For a
# causal block GroupQueryAttention beats both by far (RoPE+GQA, T=4096: 335 ms, +119 MB against
# the Attention op's 943 ms, +814 MB; with a 256-key window 493 ms against 1477 ms); it cannot
# take a non-causal mask, so a masked non-causal request falls through to the Attention op.
AUTO_PREFERENCE = {
    ("cpu", "unmasked"): ("ort-mha", "onnx-attention", "decomposed"),
    ("cpu", "masked"): ("ort-gqa", "onnx-attention", "ort-mha", "decomposed"),
    # Not yet measured on a GPU: ORT's fused CUDA kernels first, on the design's expectation.
    **dict.fromkeys((("cuda", "unmasked"), ("cuda", "masked")), ("ort-mha", "onnx-attention", "decomposed")),
}
TARGETS = DEVICES  # the providers lowering="auto" can optimise for


def auto_order(provider: str, spec: zoo.AttentionSpec, *, with_mask: bool) -> tuple[str, ...]:
    """The lowerings "auto" tries, in order, for a request on `provider`."""
    if provider not in TARGETS:
        raise ExportError(f"provider={provider!r} is not one of {', '.join(TARGETS)}")
    return AUTO_PREFERENCE[(provider, "masked" if spec.causal or with_mask else "unmasked")]


def why_not(
    lowering: str,
    spec: zoo.AttentionSpec | None = None,
    *,
    need_weights: bool = False,
    decode: bool = False,
    dtype: str | None = None,
    provider: str | None = None,
    cache: str = "grow",
    locations: tuple[str, ...] = (),
    masked: bool = False,
) -> str | None:
    """The one-line reason `lowering` cannot express a request for `spec`, or None if it can.

    `locations`: named locations (zoo/hooks.py) asked for as extra outputs; a graph built by hand
    holds none, and scores and pattern exist only where the lowering can output the weights.

    `provider` ("cpu"/"cuda"; None = any) adds what that provider's kernels cannot run: on CUDA, the
    record's CUDA rules (export/lowerings/kernel_rules.py) read the node it would write, with a bias where
    a mask is fed (`masked`: a mask or key mask input, as every whole model has).

    The lowering's record (export/lowerings/) says what it cannot express, per modifier too.
    """
    from .lowerings import record

    rec = record(lowering)
    if decode and cache == "static" and rec.static_cache is not None:
        return f"{rec.name} cannot keep a static cache: {rec.static_cache}"
    if need_weights and not rec.weights_out:
        return f"{rec.op} does not output the softmax weights; use lowering='decomposed' for need_weights"
    if locations and not rec.traced:
        return (
            f"{rec.name} computes attention inside one {rec.op} node: no named location ({', '.join(locations)}) "
            "is a tensor of its graph; use lowering='decomposed'"
        )
    inner = [loc for loc in locations if loc in ("scores", "pattern")]
    if inner and not rec.weights_out:
        return (
            f"{rec.op} does not output the softmax weights, so {' and '.join(inner)} cannot be outputs; "
            "use lowering='decomposed'"
        )
    if spec is None:
        return None
    if decode:
        reason = decode_why_not(spec)
        if reason:
            return reason
    return rec.why_not(spec, dtype=dtype, provider=provider, masked=masked)


# Which lowering a decode model takes under "auto", fastest first (`attnzoo bench --decode`).
# Measured with `attnzoo bench NAME --decode --past 128,1024,4096,16384 --batch 1,8` (README,
# "Generation"; docs/bench/decode-*.md): on the CPU, with kv heads shared (GQA/MQA) ort-gqa is the
# fastest at every past length, while the traced lowerings repeat K and V per query head and fall
# behind eager; with one kv head per query head the standard Attention op is fastest (2.3x eager
# at past 4096 for gpt2-small, ort-gqa 2.2x). CUDA: not measured yet (scripts/gpu_check.sh).
DECODE_PREFERENCE = {
    ("cpu", "gqa"): ("ort-gqa", "onnx-attention", "decomposed", "ort-mha"),
    ("cpu", "mha"): ("onnx-attention", "ort-gqa", "decomposed", "ort-mha"),
    **dict.fromkeys((("cuda", "gqa"), ("cuda", "mha")), ("ort-gqa", "onnx-attention", "ort-mha", "decomposed")),
}


# Which cache a decode export keeps under cache="auto", per provider (`attnzoo bench NAME --decode`,
# README "Generation"): on the CPU the static cache (buffers written in place, each kv head read once)
# beats every growing-cache lowering at every past length measured; CUDA: not measured yet, so the
# fused ops' growing cache stays (scripts/gpu_check.sh).
DECODE_CACHE = {"cpu": "static", "cuda": "grow"}


def decode_cache(provider: str, lowering: str, max_len: int | None) -> str:
    """What cache="auto" means for an export: static where the provider's measurements prefer it
    (or max_len asks for it) and the lowering can keep one, else the growing cache."""
    from .lowerings import record

    want = "static" if max_len is not None else DECODE_CACHE.get(provider, "grow")
    if want == "static" and lowering != "auto" and record(lowering).static_cache is not None:
        return "grow"
    return want


# With a static cache, the lowerings that keep one, measured (`attnzoo bench NAME --decode --paths
# ort-gqa-static,ort-decomposed-static`; README "Generation", docs/bench/decode-static-lowerings.md):
# on the CPU the folded decomposed graph reads each kv head once, GroupQueryAttention's kernel once per
# query head (GQA block, past 16384: 12.9 against 27.3 ms at B 1, 83 against 151 ms at B 8); the op
# reads only the written prefix, so it wins at short pasts (past 128: 2.8 against 3.2 ms), and with one
# kv head per query head the two are within 15% either way, so one order serves both kinds of block.
# CUDA: not measured; the shared buffer is ORT's own decode design there.
STATIC_DECODE_PREFERENCE = {"cpu": ("decomposed", "ort-gqa"), "cuda": ("ort-gqa", "decomposed")}

# A whole model (export/lm_export.py) on the CPU: GroupQueryAttention spliced into every layer
# (export/splice.py) first. A model step is many small nodes around its matrices, and the op takes
# the mask and the cache write inside one node per layer: on the random LLaMA (8 layers,
# prompt 128, 64 new tokens) 175 nodes against 754 folded-decomposed ones, and end to end from 0.74x
# onnxruntime-genai's tokens/s to level with it or ahead (docs/bench/generate-llama.md). The folded
# graph still reads each kv head once at long pasts; lowering="decomposed" asks for it.
LM_PREFERENCE = {"cpu": ("ort-gqa", "decomposed"), "cuda": ("ort-gqa", "decomposed")}

_UNKNOWN = {
    lw
    for table in (AUTO_PREFERENCE, DECODE_PREFERENCE, STATIC_DECODE_PREFERENCE, LM_PREFERENCE)
    for order in table.values()
    for lw in order
} - set(LOWERINGS)
if _UNKNOWN:  # a preference names only records (export/lowerings/; LOWERINGS spells their names)
    raise ExportError(f"export/choice.py's preference tables name {sorted(_UNKNOWN)}, which no record is")


def decode_order(provider: str, spec: zoo.AttentionSpec, *, cache: str = "grow") -> tuple[str, ...]:
    """The lowerings "auto" tries for a decode model, in order (a static cache: those that keep one)."""
    if provider not in TARGETS:
        raise ExportError(f"provider={provider!r} is not one of {', '.join(TARGETS)}")
    if cache == "static":
        return tuple(lw for lw in STATIC_DECODE_PREFERENCE[provider] if lw in STATIC_CACHE_LOWERINGS)
    return DECODE_PREFERENCE[(provider, "gqa" if spec.group_size > 1 else "mha")]


def lm_order(provider: str) -> tuple[str, ...]:
    """The lowerings "auto" tries for every layer of a whole model, in order (export/lm_export.py)."""
    if provider not in TARGETS:
        raise ExportError(f"provider={provider!r} is not one of {', '.join(TARGETS)}")
    return LM_PREFERENCE[provider]


def decode_why_not(spec: zoo.AttentionSpec) -> str | None:
    """Why a block cannot decode token by token, or None."""
    if spec.is_cross:
        return "decoding with a KV cache is for causal self-attention; this block is cross-attention"
    if not spec.causal:
        return "decoding with a KV cache is for causal self-attention; this block has causal=False"
    return None


def lowerings_to_try(lowering, order, reason, *, none: str, refused: str) -> list[str]:
    """The lowerings a model of several layers may take, in order: under "auto" each of `order` whose
    reason(lw) is None (ExportError `none` when there is none), else the one named (ExportError
    "lowering=... `refused`: why" when it cannot)."""
    if lowering == "auto":
        found = [lw for lw in order if reason(lw) is None]
        if not found:
            raise ExportError(none)
        return found
    if not isinstance(lowering, str) or lowering not in LOWERINGS:
        raise ExportError(f"lowering={lowering!r} is not one of {', '.join(('auto', *LOWERINGS))}")
    why = reason(lowering)
    if why:
        raise ExportError(f"lowering={lowering!r} {refused}: {why}")
    return [lowering]


def first_that_exports(order, lowering: str, build, what: str):
    """(lowering, build(lowering), notes) for the first lowering of `order` whose build(lw) raises no
    ExportError. A lowering asked for by name raises its own refusal; under "auto" each refusal becomes a
    note ("auto: skipped LW: why") and the next is tried, the last refusal raised when none exports."""
    notes, error = [], None
    for lw in order:
        try:
            return lw, build(lw), notes
        except ExportError as e:
            if lowering != "auto":
                raise
            notes.append(f"auto: skipped {lw}: {e}")
            error = e
    raise error or ExportError(f"no lowering could export this {what}")
