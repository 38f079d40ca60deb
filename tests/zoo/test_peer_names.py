"""zoo hands on the names of `peers` (transformers, checkpoints, torch.nn.MultiheadAttention), importing
peers on first use: `import zoo` imports neither peers nor transformers nor safetensors, and the
interop's error classes live in zoo.errors, so catching them imports nothing. zoo's own names load on
first use too: `import zoo` imports no torch (an export's session runs on onnxruntime and numpy)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import zoo
from helpers import REPO

# name -> the module of peers that defines it
HANDED_ON = {
    "from_hf": "peers.transformers",
    "to_hf": "peers.transformers",
    "from_checkpoint": "peers.checkpoint",
    "lm_from_checkpoint": "peers.lm",
    "lm_from_hf": "peers.lm",
    "encoder_from_checkpoint": "peers.encoder",
    "sentence_encoder": "peers.sentence",
    "seq2seq_from_checkpoint": "peers.seq2seq",
    "spec_from_config": "peers.config",
    "preset_toml": "peers.preset",
    "from_torch_mha": "peers.torch_mha",
    "to_torch_mha": "peers.torch_mha",
}
HEAVY = ("peers", "transformers", "safetensors", "torch")


def _loaded_after(code: str) -> dict[str, list[str]]:
    """Run `code` in a fresh interpreter; {label: the HEAVY modules loaded} at each `seen(label)`."""
    prelude = (
        "import json, sys\n"
        "out = {}\n"
        f"def seen(label): out[label] = sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", prelude + code + "\nprint(json.dumps(out))"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.splitlines()[-1])


def test_import_zoo_imports_neither_peers_nor_transformers_nor_safetensors():
    got = _loaded_after(
        "import zoo\nseen('import')\n"
        "try:\n    raise zoo.CheckpointError('x')\nexcept (zoo.HFConversionError, zoo.HFTypeError):\n    pass\n"
        "seen('errors')\n"
        "zoo.from_hf, zoo.from_checkpoint, zoo.spec_from_config, zoo.from_torch_mha\nseen('names')\n"
    )
    assert got["import"] == [], f"import zoo loaded {got['import']}"
    assert got["errors"] == [], f"catching the interop's errors loaded {got['errors']}"
    # peers loads on first use (with torch, which its modules build on); transformers and safetensors
    # only inside the functions that read them
    late = [m for m in got["names"] if m.split(".")[0] not in ("peers", "torch")]
    assert "peers" in got["names"] and not late, got["names"]


def test_import_zoo_imports_no_torch_until_a_name_needs_it():
    got = _loaded_after("import zoo\nzoo.InputError, zoo.AttnzooError\nseen('errors')\nzoo.names()\nseen('registry')\n")
    assert got["errors"] == [], f"import zoo and its errors loaded {got['errors']}"
    assert "torch" in got["registry"]


@pytest.mark.parametrize("name", sorted(zoo._LAZY))
def test_every_name_zoo_loads_on_first_use_is_its_modules_own(name):
    import importlib

    assert getattr(zoo, name) is getattr(importlib.import_module(zoo._LAZY[name]), name)
    assert name in dir(zoo) and name in zoo.__all__


def test_zoo_spec_is_the_registry_function_whatever_was_imported_first():
    import zoo.attention_spec  # noqa: F401 - the module that defines AttentionSpec, imported by name

    assert zoo.spec("mha-combined-bias").d_model > 0


@pytest.mark.parametrize("name", sorted(HANDED_ON))
def test_every_name_zoo_hands_on_is_peers_own(name):
    import importlib

    assert getattr(zoo, name) is getattr(importlib.import_module(HANDED_ON[name]), name)
    assert name in dir(zoo)
    namespace: dict = {}
    exec(f"from zoo import {name}", namespace)
    assert namespace[name] is getattr(zoo, name)


def test_the_handed_on_table_is_zoos():
    assert zoo._PEERS == HANDED_ON


def test_zoo_all_keeps_the_interop_names():
    assert {"from_checkpoint", "from_torch_mha", "to_torch_mha", "preset_toml", "spec_from_config"} <= set(zoo.__all__)
    assert "CheckpointError" in zoo.__all__
    assert all(hasattr(zoo, n) for n in zoo.__all__)


def test_interop_errors_are_zoos_and_peers_alike():
    import peers
    import peers.checkpoint

    assert zoo.CheckpointError is peers.CheckpointError is peers.checkpoint.CheckpointError
    assert issubclass(zoo.CheckpointError, zoo.HFConversionError)
    assert issubclass(zoo.HFConversionError, (zoo.AttnzooError, ValueError))
    assert issubclass(zoo.HFTypeError, (zoo.AttnzooError, TypeError))
    assert zoo.HFConversionError.__module__ == "zoo.errors"


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="module 'zoo' has no attribute 'from_nowhere'"):
        zoo.from_nowhere  # noqa: B018
