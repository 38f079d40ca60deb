"""What `attnzoo serve` runs for a checkpoint folder (cli/serve_model.py): an export for the provider it will run
on, in --dtype (for CUDA in float16 or bfloat16 that is a packed-rows graph, export.lm_export.packs, which
continuous batching takes: serve/generate/packed.py). Before, a folder got the CPU's fp32 export on every provider."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from cli import export_cache
from cli.serve_model import auth_header, capacity_line, folder_target, model_path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "peers"))
import lm_cases  # noqa: E402 - small random transformers models, one per family


@pytest.mark.parametrize(("provider", "dtype"), [("cpu", "float32"), ("cuda", "float16"), ("cuda", "bfloat16")])
def test_a_folder_is_exported_for_the_provider_it_is_served_on_in_its_dtype(tmp_path, monkeypatch, provider, dtype):
    asked = {}

    def exported(folder, precision, max_len, check=None, **kw):
        asked.update(kw, precision=precision)
        return tmp_path / "lm.onnx"

    monkeypatch.setattr(export_cache, "exported", exported)
    folder = lm_cases.saved("llama", tmp_path)
    assert model_path(str(folder), {}, "auto", dtype, tmp_path, False, "continuous", provider) == tmp_path / "lm.onnx"
    assert asked == {"target": provider, "dtype": dtype, "precision": "fp32", "all_logits": False}
    assert folder_target(provider) == provider


def test_a_zoo_name_in_bfloat16_is_refused_in_one_line(tmp_path):
    from cli.common import CliError

    with pytest.raises(CliError, match="--dtype bfloat16 is for a checkpoint folder"):
        model_path("mha-causal", {}, "auto", "bfloat16", tmp_path, False, "static", "cuda")


@pytest.mark.parametrize(
    "max_len, capacity, batching, words",
    [
        (
            "2048",
            4000,
            "continuous",
            "every request: prompt + max_tokens - 1 <= 2048 tokens "
            "(--capacity; --capacity 4000 is past the export's max_len 2048)",
        ),
        ("2048", 512, "static", "a /v1 request: prompt + max_tokens - 1 <= 512 tokens (--capacity)"),
        ("", 512, "continuous", "every request: prompt + max_tokens - 1 <= 512 tokens (--capacity)"),
    ],
)
def test_the_ready_lines_say_what_a_request_may_hold_and_a_lowered_capacity(max_len, capacity, batching, words):
    """A /v1 request of more than --capacity was refused with a limit the server never showed, and a --capacity
    past the export's max_len was lowered to it in silence: the ready lines say both."""
    assert capacity_line({"attnzoo.max_len": max_len}, capacity, batching) == words


@pytest.mark.parametrize("key", ["s3cret-0123", "it's $HOME"])
def test_the_ready_lines_curls_carry_the_key_they_need(key, monkeypatch):
    """With --api-key KEY the example curls carry KEY itself (the shell running them has no ATTNZOO_API_KEY, and
    $ATTNZOO_API_KEY made them 401); with the key from ATTNZOO_API_KEY, that variable; without a key, nothing."""
    import shlex
    import subprocess

    assert shlex.split(auth_header(key, key)) == ["-H", f"Authorization: Bearer {key}"]  # what curl is given
    from_env = auth_header(key, None)
    assert "$ATTNZOO_API_KEY" in from_env and key not in from_env
    shell = subprocess.run(  # the line as a shell that has the variable expands it
        ["bash", "-c", f"printf '%s\\n' {from_env}"], env={"ATTNZOO_API_KEY": key}, capture_output=True, text=True
    )
    assert shell.stdout.splitlines() == ["-H", f"Authorization: Bearer {key}"]
    assert auth_header(None, None) == ""
