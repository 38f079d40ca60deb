"""The lowerings, one record each (base.Lowering), in one list. Adding a lowering is a new file
here and one line in LOWERING_LIST."""

from __future__ import annotations

import zoo
from runtime.lowering_facts import RUN_FACTS

from ..errors import ExportError
from ..names import LOWERINGS, STATIC_CACHE_LOWERINGS
from .base import Limit, Lowering
from .decomposed import LOWERING as DECOMPOSED
from .onnx_attention import LOWERING as ONNX_ATTENTION
from .ort_gqa import LOWERING as ORT_GQA
from .ort_mha import FUSED_OPS
from .ort_mha import LOWERING as ORT_MHA

LOWERING_LIST: tuple[Lowering, ...] = (DECOMPOSED, ONNX_ATTENTION, ORT_MHA, ORT_GQA)
RECORDS = {lw.name: lw for lw in LOWERING_LIST}
if tuple(RECORDS) != LOWERINGS:  # export/names.py spells the vocabulary for the CLI and the API
    raise ImportError(f"export/names.py LOWERINGS {LOWERINGS} != the records {tuple(RECORDS)}")
_STATIC = tuple(lw.name for lw in LOWERING_LIST if lw.static_cache is None)
if _STATIC != STATIC_CACHE_LOWERINGS:  # the same, for the lowerings that keep a static cache
    raise ImportError(f"export/names.py STATIC_CACHE_LOWERINGS {STATIC_CACHE_LOWERINGS} != the records' {_STATIC}")
if set(RUN_FACTS) != set(LOWERINGS):  # what a session knows of each lowering (runtime/lowering_facts.py)
    raise ImportError(f"runtime/lowering_facts.py RUN_FACTS {sorted(RUN_FACTS)} != LOWERINGS {sorted(LOWERINGS)}")


def able(field: str) -> tuple[str, ...]:
    """The names of the lowerings whose record says they can (`field`: encoder_decoder, int8_cache), in order."""
    return tuple(name for name, lw in RECORDS.items() if getattr(lw, field))


def record(name: str) -> Lowering:
    try:
        return RECORDS[name]
    except KeyError:
        raise ExportError(f"lowering={name!r} is not one of {', '.join(RECORDS)} or 'auto'") from None


def support_table() -> str:
    """The README's "what each lowering cannot express" table, from the records."""
    head = "| | " + " | ".join(f"`{lw.name}`" for lw in LOWERING_LIST) + " |"
    lines = [head, "|---" * (len(LOWERING_LIST) + 1) + "|"]

    def cell(limit: Limit | None) -> str:
        if limit is None:
            return "yes"
        return f"no: {limit.text}" if limit.never else f"yes, {limit.text}"

    for mod in zoo.modifiers.MODIFIERS:  # one row per modifier, labelled by the modifier itself
        lines.append(f"| {mod.label} | " + " | ".join(cell(lw.modifiers.get(mod.name)) for lw in LOWERING_LIST) + " |")
    lines.append("| non-causal, cross-attention, `d_v != d_k` | " + " | ".join(lw.kinds for lw in LOWERING_LIST) + " |")
    lines.append("| fp16 | " + " | ".join(lw.fp16 for lw in LOWERING_LIST) + " |")
    for what, field in (("whole encoder-decoders (bias + cross-attention)", "encoder_decoder"),
                        ("int8 KV cache (whole models)", "int8_cache")):  # fmt: skip
        lines.append(f"| {what} | " + " | ".join("yes" if getattr(lw, field) else "no" for lw in LOWERING_LIST) + " |")
    lines.append("| static KV cache (decode) | " + " | ".join(_static_cell(lw) for lw in LOWERING_LIST) + " |")
    lines.append(
        "| attention weights out | " + " | ".join("yes" if lw.weights_out else "no" for lw in LOWERING_LIST) + " |"
    )
    return "\n".join(lines)


def _static_cell(lw: Lowering) -> str:
    if lw.static_cache is None:
        return "yes"
    return f"no: {lw.static_cache_note or lw.static_cache}"


__all__ = ["FUSED_OPS", "LOWERING_LIST", "RECORDS", "Limit", "Lowering", "able", "record", "support_table"]
