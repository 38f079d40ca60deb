"""attnzoo's analysis: tiny trained models from zoo blocks, head scores, pictures, importance, ablations.

import analysis
model = analysis.load("tiny-induction")        # model(tokens, head_mask=None) -> logits (b t vocab)
maps = model.attention_maps(tokens)            # (layers b h t t)
analysis.head_scores(model, tokens)            # {"previous_token": (layers h), "induction": ..., ...}
analysis.field_scores(dates_model, sources)    # {"day"|"month"|"year": (decoder layers h)} on cross-attention
analysis.patch_heads(model, clean, corrupt, metric, location="z")   # (layers h) restored shares
analysis.WholeModel(zoo.lm_from_checkpoint(DIR), vocab)   # a whole model's heads, the same interface

Depends on `zoo`; never imported by it; does not import `export`.
"""

import importlib
from typing import Any

# name -> the analysis module that defines it, imported on first use: `import analysis` imports no
# torch, so the command line's help (which reads analysis/names.py) stays fast.
_LAZY = {
    "DatesConfig": "analysis.dates",
    "DatesModel": "analysis.dates",
    "AnalysisError": "analysis.errors",
    "LMConfig": "analysis.lm",
    "TinyLM": "analysis.lm",
    "logit_attribution": "analysis.patching",
    "patch_heads": "analysis.patching",
    "SCORE_NAMES": "analysis.scores",
    "best_scores": "analysis.scores",
    "encoder_scores": "analysis.scores",
    "field_scores": "analysis.scores",
    "format_scores": "analysis.scores",
    "head_scores": "analysis.scores",
    "punctuation_ids": "analysis.scores",
    "scores_from_maps": "analysis.scores",
    "load": "analysis.store",
    "save": "analysis.store",
    "weight_path": "analysis.store",
    "TASKS": "analysis.tasks",
    "get_task": "analysis.tasks",
    "train": "analysis.training",
    "WholeModel": "analysis.whole",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # bound once imported: later lookups are plain attribute reads
        return value
    raise AttributeError(f"module 'analysis' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
