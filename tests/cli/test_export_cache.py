"""The export cache's key (cli/export_cache.py) holds what changes the graph: a folder's chat template, tokenizer
and generation_config.json are read at run time, so changing them finds the export already made; changing the
config or the weights makes a new one."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from cli import export_cache
from runtime.core import onnx_metadata


@pytest.fixture
def cached_copy(cached_tiny, tmp_path, monkeypatch):
    """The cached folder and its cache, copied (times kept) so this test may change them; exports refused."""
    folder, cache, _ = cached_tiny
    shutil.copytree(folder, tmp_path / folder.name)
    shutil.copytree(cache, tmp_path / "cache")
    monkeypatch.setenv("ATTNZOO_CACHE", str(tmp_path / "cache"))

    def no_export(*args, **kwargs):
        raise AssertionError("the cache missed: the folder was exported again")

    monkeypatch.setattr("export.lm_export.export_lm", no_export)
    return tmp_path / folder.name


def test_a_template_tokenizer_or_generation_config_change_finds_the_export(cached_copy):
    folder = cached_copy
    before = export_cache.exported(str(folder), "fp32", None)
    (folder / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }}\n{% endfor %}")
    tok_config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**tok_config, "chat_template": "{{ messages }}"}))
    settings = {**json.loads((folder / "generation_config.json").read_text()), "do_sample": True, "top_k": 7}
    (folder / "generation_config.json").write_text(json.dumps(settings))
    after = export_cache.exported(str(folder), "fp32", None)
    assert after == before
    recorded = onnx_metadata(after)["attnzoo.generation_config"]  # what a server of the folder reads
    assert json.loads(recorded) == settings
    (folder / "generation_config.json").unlink()
    assert "attnzoo.generation_config" not in onnx_metadata(export_cache.exported(str(folder), "fp32", None))


@pytest.mark.parametrize("change", ["config", "weights"])
def test_a_config_or_weights_change_misses(cached_copy, change):
    folder = cached_copy
    assert export_cache.cached_lm(folder, "fp32", None) is not None
    if change == "config":
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, "rms_norm_eps": 1e-5}))
    else:
        weights = folder / "model.safetensors"
        os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 1))
    assert export_cache.cached_lm(folder, "fp32", None) is None
    with pytest.raises(AssertionError, match="cache missed"):
        export_cache.exported(str(folder), "fp32", None)
