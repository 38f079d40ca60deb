"""The /v1 tests' shared model (tests/serve/openai_lm.py), one export per session."""

from openai_lm import codec, hf_lm, lm_path, sess  # noqa: F401 - fixtures
