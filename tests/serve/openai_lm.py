"""The model the /v1 tests share (tests/serve/conftest.py makes these its fixtures, one per session): a random
LLaMA over tiny-stdlib-llama's byte tokenizer (vocabulary 259), exported whole as chat.onnx with Qwen2.5's chat
template (tests/runtime/chat_templates/qwen2.5-instruct.jinja: tools as Hermes-style <tool_call> JSON) and a
generation_config without an eos id (a run goes on to its max_tokens unless a stop string, or a grammar that is
complete, ends it)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from helpers import REPO

MODEL = "chat"
TEMPLATE = (REPO / "tests" / "runtime" / "chat_templates" / "qwen2.5-instruct.jinja").read_text()


@pytest.fixture(scope="session")
def hf_lm():
    """The random LLaMA the server runs, in transformers (the eager reference for logprobs)."""
    transformers = pytest.importorskip("transformers")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "peers"))
    import lm_cases  # randomize: every parameter random

    config = transformers.LlamaConfig(
        vocab_size=259,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    config._attn_implementation = "eager"
    return lm_cases.randomize(transformers.LlamaForCausalLM(config), seed=0).eval()


@pytest.fixture(scope="session")
def lm_path(tmp_path_factory, hf_lm) -> Path:
    """chat.onnx with its chat.tokenizer.json and chat.tokenizer_config.json beside it (as export --whole
    writes them)."""
    from export.lm_export import export_lm
    from peers.lm import lm_from_hf

    folder = tmp_path_factory.mktemp("openai")
    out = folder / f"{MODEL}.onnx"
    export_lm(lm_from_hf(hf_lm).eval(), out, generation_config={"pad_token_id": 258})
    shutil.copy(REPO / "models" / "tiny-stdlib-llama" / "tokenizer.json", folder / f"{MODEL}.tokenizer.json")
    config_doc = {"bos_token": "<s>", "eos_token": "</s>", "chat_template": TEMPLATE}
    (folder / f"{MODEL}.tokenizer_config.json").write_text(json.dumps(config_doc))
    return out


@pytest.fixture(scope="session")
def spec_path(tmp_path_factory, hf_lm, lm_path) -> Path:
    """The same random LLaMA exported with the logits of every position (a speculating server's target:
    serve/generate/speculating.py), its tokenizer and chat template beside it as lm_path's."""
    from export.lm_export import export_lm
    from peers.lm import lm_from_hf

    folder = tmp_path_factory.mktemp("speculating")
    out = folder / f"{MODEL}.onnx"
    export_lm(lm_from_hf(hf_lm).eval(), out, generation_config={"pad_token_id": 258}, all_logits=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(lm_path.with_name(f"{MODEL}.{name}"), folder / f"{MODEL}.{name}")
    return out


@pytest.fixture(scope="session")
def spec_sess(spec_path):
    from runtime.session import OnnxSession

    return OnnxSession(spec_path, provider="cpu", verbose=False)


@pytest.fixture(scope="session")
def other_draft(tmp_path_factory, hf_lm):
    """A draft of the same vocabulary and other random weights (one layer): its candidates are often rejected."""
    import lm_cases
    import transformers

    from export.lm_export import export_lm
    from peers.lm import lm_from_hf
    from runtime.session import OnnxSession

    config = transformers.LlamaConfig(**{**hf_lm.config.to_dict(), "num_hidden_layers": 1})
    config._attn_implementation = "eager"
    draft = lm_cases.randomize(transformers.LlamaForCausalLM(config), seed=1).eval()
    out = export_lm(lm_from_hf(draft).eval(), tmp_path_factory.mktemp("draft") / "draft.onnx").path
    return OnnxSession(out, provider="cpu", verbose=False)


@pytest.fixture(scope="session")
def sess(lm_path):
    from runtime.session import OnnxSession

    return OnnxSession(lm_path, provider="cpu", verbose=False)


@pytest.fixture(scope="session")
def codec(lm_path):
    from runtime.stopping import Codec

    return Codec(str(lm_path.with_name(f"{MODEL}.tokenizer.json")))
