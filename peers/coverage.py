"""Which causal LMs of the installed transformers the zoo takes: one row per model type with a
`*ForCausalLM` class (transformers' own auto mapping, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES), with the
attention classes its modeling module defines and a status:

    exact          every attention class of the module has a row of the family table (peers.copies.ROWS), save
                   the parts, cross-attention and other towers of a class that has one. A hybrid model's
                   row is exact when its attention layers are: `reason` then holds a note naming the
                   state-space / convolution / linear-attention layers that stay outside the zoo
                   (peers.copies.STATE_SPACE; from_hf refuses them by name)
    refused        some has none (or a refused row): `reason` names the one missing feature where it is
                   known (REASONS), else the classes without a row
    not-attention  the module defines no attention class (state-space and recurrent models)

`attnzoo families --coverage [--json PATH]` prints it; peers/coverage.json is the committed copy, which
tests/peers/test_coverage.py holds against the installed transformers. Importing every modeling module
takes a minute or two: this runs on demand, never at import.
"""

from __future__ import annotations

import importlib
import inspect
import json
import warnings
from pathlib import Path

from .copies import BY_CLASS, STATE_SPACE

COVERAGE_JSON = Path(__file__).with_name("coverage.json")

# The one feature the zoo lacks, per refused model type, where it is known (issue 28's list).
_MLA = "multi-head latent attention (compressed KV latent, decoupled rotary)"
# Zamba's attention reads the concatenation of the layer input and the original embeddings (2 * hidden_size)
_ZAMBA = "attention from a 2 * hidden_size input to hidden_size (the zoo's block maps d_model to d_model)"
REASONS: dict[str, str] = {
    **dict.fromkeys(("deepseek_v2", "deepseek_v3", "kimi_k2", "minicpm3", "longcat_flash", "sarvam_mla"), _MLA),
    "diffllama": "differential attention (two softmax maps subtracted with a learned lambda)",
    "dbrx": "a fused Wqkv with clip_qkv after the fused projection",
    "hunyuan_v1_dense": "QK-norm after the rotary (the zoo normalizes before it)",
    "hunyuan_v1_moe": "QK-norm after the rotary (the zoo normalizes before it)",
    # -- beside the copies of peers/copies.py: the classes that are no copy, each with the one thing it adds
    **dict.fromkeys(("zamba", "zamba2"), _ZAMBA),
    "nanochat": "QK-norm after the rotary (the zoo normalizes before it), weightless",
    **dict.fromkeys(
        ("flint", "mimo_v2_flash"),
        "attention sinks (a learned per-head logit in each softmax denominator)",
    ),
    "ministral3": "a query scale growing with log position (Llama 4's llama_4_scaling_beta)",
    **dict.fromkeys(
        ("afmoe", "laguna", "dory", "beam", "hrm_text", "lfm3"),
        "a gated attention output (a sigmoid or softplus gate on Z from a projection of its own)",
    ),
    "bitnet": "an RMSNorm on Z before o_proj (attn_sub_norm)",
    "zaya": "a CCA projection (convolved, compressed Q/K/V) in place of q/k/v_proj",
    # -- new in transformers 5.25
    "ergo": "no family row yet: a fused qkv_proj with per-head QK-norm, and on global layers Q and K each scaled "
    "by sqrt(global_attention_scale) after the rotary",
    "kolibri1_1": "a learned top-k key selection (an indexer) with NVFP4-rounded keys and values on its NoPE "
    "layers, and K/V shared across layers (kv_sharing_modes)",
    "minicpm5_moe": "a gated attention output (a sigmoid gate on Z, from the second half of q_gate_proj)",
}


# Classes that are part of a covered class (BERT's SelfAttention: from_hf points to the whole), its
# cross-attention (refused by name when asked), or another tower of a multimodal model.
_PARTS = ("SelfAttention", "CrossAttention", "VisionAttention", "AudioAttention")


def installed_version() -> str:
    """The installed transformers' version (the coverage table is made from one)."""
    import transformers

    return transformers.__version__


def load(path: Path = COVERAGE_JSON) -> tuple[str, list[dict]]:
    """(the transformers version the table was made from, its rows) from a table written by `to_json`."""
    data = json.loads(path.read_text())
    return data["transformers"], data["rows"]


def to_json(rows: list[dict]) -> str:
    """The table as written to peers/coverage.json: the installed transformers' version beside the rows."""
    return json.dumps({"transformers": installed_version(), "rows": rows}, indent=1) + "\n"


def causal_lm_types() -> dict[str, str]:
    """model_type -> its *ForCausalLM class name, from transformers' auto mapping (one entry, the first, where
    the mapping gives several)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    out = {}
    for kind, names in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items():
        out[kind] = names[0] if isinstance(names, (list, tuple)) else names
    return out


def _modeling(lm_class: str):
    """The LM class's own modeling module; None when transformers cannot import the class here."""
    import transformers

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cls = getattr(transformers, lm_class)
            return importlib.import_module(cls.__module__)
    except Exception:  # noqa: BLE001 - an optional dependency missing, a remote-code-only type: not importable
        return None


def outside_layers(lm_class: str) -> list[str]:
    """The classes of a hybrid's other layers (peers.copies.STATE_SPACE) the LM class's modeling module defines."""
    module = _modeling(lm_class)
    return sorted(name for name in vars(module) if name in STATE_SPACE) if module is not None else []


def attention_classes(lm_class: str) -> list[str] | None:
    """The attention classes (names ending in "Attention") the LM class's own modeling module defines, less a
    hybrid's linear-attention layers (peers.copies.STATE_SPACE); None when transformers cannot import it here."""
    import torch.nn as nn

    module = _modeling(lm_class)
    if module is None:
        return None
    return sorted(
        name
        for name, obj in vars(module).items()
        if inspect.isclass(obj)
        and obj.__module__ == module.__name__
        and issubclass(obj, nn.Module)
        and name.endswith("Attention")
        and name not in STATE_SPACE
    )


def row(kind: str, lm_class: str) -> dict:
    """One model type's row: model_type, causal_lm, attention_classes, status, reason (a refusal's reason, or an
    exact hybrid's note on its layers outside the zoo)."""
    classes = attention_classes(lm_class)
    out = {"model_type": kind, "causal_lm": lm_class, "attention_classes": classes or []}
    if classes is None:
        return dict(out, status="refused", reason=f"transformers cannot import {lm_class} here")
    if not classes:
        return dict(out, status="not-attention", reason=None)
    missing = [c for c in classes if c not in BY_CLASS or BY_CLASS[c].refused is not None]
    if len(missing) < len(classes):  # the parts and the other towers of a covered class need no row of their own
        missing = [c for c in missing if not c.endswith(_PARTS)]
    if not missing:
        outside = outside_layers(lm_class)
        note = "; ".join(f"{c} ({STATE_SPACE[c]})" for c in outside)
        return dict(out, status="exact", reason=f"attention exact; outside the zoo: {note}" if outside else None)
    reason = REASONS.get(kind) or f"no family row for {', '.join(missing)}"
    return dict(out, status="refused", reason=reason)


def coverage() -> list[dict]:
    """Every causal-LM model type of the installed transformers, sorted by model_type."""
    return [row(kind, lm) for kind, lm in sorted(causal_lm_types().items())]


def counts(rows: list[dict]) -> dict[str, int]:
    out = {"exact": 0, "refused": 0, "not-attention": 0}
    for r in rows:
        out[r["status"]] += 1
    return out


def markdown(rows: list[dict]) -> str:
    c = counts(rows)
    lines = [
        f"{len(rows)} causal-LM model types: {c['exact']} exact, {c['refused']} refused, "
        f"{c['not-attention']} without attention",
        "",
        "| model_type | attention classes | status | reason |",
        "|---|---|---|---|",
    ]
    for r in rows:
        classes = ", ".join(f"`{x}`" for x in r["attention_classes"]) or "-"
        lines.append(f"| {r['model_type']} | {classes} | {r['status']} | {r['reason'] or '-'} |")
    return "\n".join(lines)


__all__ = [
    "COVERAGE_JSON",
    "REASONS",
    "attention_classes",
    "causal_lm_types",
    "counts",
    "coverage",
    "installed_version",
    "load",
    "to_json",
    "markdown",
    "outside_layers",
    "row",
]
