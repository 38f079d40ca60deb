"""The analysis' names, spelled once and without torch, so that the command line's help reads them
with no model code loaded (`attnzoo --help` imports no torch). The modules that define what they
name check against them at import: tasks.py its TASKS, patching.py its locations."""

TASK_NAMES = ("tiny-induction", "tiny-induction-1layer", "tiny-induction-shared", "tiny-dates")  # tasks.TASKS
EVAL_SEED = 12345  # every check of the shipped weights draws from it; no training run ever used it
PATCH_LOCATIONS = ("q", "k", "v", "scores", "pattern", "z", "result")  # where patching may replace a head
