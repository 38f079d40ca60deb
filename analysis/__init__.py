"""attnzoo's analysis: tiny trained models from zoo blocks, head scores, pictures, importance, ablations.

import analysis
model = analysis.load("tiny-induction")        # model(tokens, head_mask=None) -> logits (b t vocab)
maps = model.attention_maps(tokens)            # (layers b h t t)
analysis.head_scores(model, tokens)            # {"previous_token": (layers h), "induction": ..., ...}

Depends on `zoo`; never imported by it; does not import `export`.
"""

from .dates import DatesConfig, DatesModel
from .errors import AnalysisError
from .lm import LMConfig, TinyLM
from .scores import head_scores
from .store import load, save, weight_path
from .tasks import TASKS, get_task, train

__all__ = [
    "TASKS",
    "AnalysisError",
    "DatesConfig",
    "DatesModel",
    "LMConfig",
    "TinyLM",
    "get_task",
    "head_scores",
    "load",
    "save",
    "train",
    "weight_path",
]
