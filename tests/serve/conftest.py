"""Exports the serve tests share: lm_cases' tiny LLaMA, exported whole once per kind per session."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "peers"))

# kind -> (lowering, padding): a left-padded ort-gqa export (the CPU's default; keys bound to their cache slots),
# a traced one (positions over real keys) and a packed-rows one
LM_KINDS = {"left-ort-gqa": ("ort-gqa", "left"), "left-traced": ("decomposed", "left"), "packed": ("ort-gqa", "packed")}


@pytest.fixture(scope="session")
def tiny_lm(tmp_path_factory):
    """tiny_lm(kind) -> an OnnxSession of lm_cases' LLaMA exported as LM_KINDS[kind], made on first use."""
    made = {}

    def get(kind: str):
        if kind not in made:
            import lm_cases

            from export import export_onnx
            from peers.lm import lm_from_hf
            from runtime.session import OnnxSession

            lowering, padding = LM_KINDS[kind]
            lm = lm_from_hf(lm_cases.hf_model("llama")).eval()
            out = tmp_path_factory.mktemp(kind) / "llama.onnx"
            path = export_onnx(lm, out, lowering=lowering, padding=padding).path
            made[kind] = OnnxSession(path, provider="cpu", verbose=False)
        return made[kind]

    return get


from openai_lm import codec, hf_lm, lm_path, other_draft, sess, spec_path, spec_sess  # noqa: E402, F401 - the /v1 tests' model (tests/serve/openai_lm.py)
