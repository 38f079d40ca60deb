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

from .dates import DatesConfig, DatesModel
from .errors import AnalysisError
from .lm import LMConfig, TinyLM
from .patching import logit_attribution, patch_heads
from .scores import (
    SCORE_NAMES,
    best_scores,
    encoder_scores,
    field_scores,
    format_scores,
    head_scores,
    punctuation_ids,
    scores_from_maps,
)
from .store import load, save, weight_path
from .tasks import TASKS, get_task
from .training import train
from .whole import WholeModel

__all__ = [
    "SCORE_NAMES",
    "TASKS",
    "AnalysisError",
    "DatesConfig",
    "DatesModel",
    "LMConfig",
    "TinyLM",
    "WholeModel",
    "best_scores",
    "encoder_scores",
    "field_scores",
    "format_scores",
    "get_task",
    "head_scores",
    "logit_attribution",
    "patch_heads",
    "load",
    "punctuation_ids",
    "save",
    "scores_from_maps",
    "train",
    "weight_path",
]
