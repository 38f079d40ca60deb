"""Shared fixtures (shared helpers live in helpers.py; the registry drives the parametrization)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

# A user's own presets (ATTNZOO_PRESETS) must not join the registry-driven parametrization: the
# registry reads the variable when it first loads, at collection. Tests that need it set it
# themselves (tests/zoo/test_user_presets.py, with monkeypatch and a fresh registry).
os.environ.pop("ATTNZOO_PRESETS", None)

# Under pytest-xdist each worker takes its share of the cores for torch's intra-op threads: two
# workers on two cores, each with two threads, would spend their time waiting on each other.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // _WORKERS))

# Test modules of other folders import the transformers cases (tests/peers/test_hf.py's CASES and
# capture) and the checkpoint writers (tests/peers/test_checkpoint.py): make them importable from
# any folder, whichever file runs alone.
sys.path.insert(0, str(Path(__file__).resolve().parent / "peers"))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield
    torch.set_grad_enabled(True)  # a bench job run in-process turns autograd off for its own process


@pytest.fixture
def cuda_ok():
    from runtime.session import cuda_status

    ok, why = cuda_status()
    if not ok:
        pytest.skip(f"no working CUDA provider in ONNX Runtime: {why}")
    return True


# name -> (block, file, export_onnx options) for the `exports` fixture
EXPORTS = {
    "decomposed": ("self", "d.onnx", {"lowering": "decomposed"}),
    "cross-decomposed": ("cross", "c.onnx", {"lowering": "decomposed"}),
    "onnx-attention-fp16": ("self", "a16.onnx", {"lowering": "onnx-attention", "dtype": "float16"}),
    "decomposed-fp16": ("self", "d16.onnx", {"lowering": "decomposed", "dtype": "float16"}),
    "ort-mha-masked-fp16": ("self", "m16.onnx", {"lowering": "ort-mha", "dtype": "float16", "with_mask": True}),
}


@pytest.fixture(scope="session")
def exports(tmp_path_factory):
    """Two small blocks, "self" (mha-combined-bias) and "cross" (cross-attention), and the paths of
    their ONNX exports by the names in EXPORTS, each exported on first use and shared by the run."""
    import zoo
    from export import export_onnx

    folder = tmp_path_factory.mktemp("exports")
    torch.manual_seed(0)
    blocks = {"self": zoo.create("mha-combined-bias").eval(), "cross": zoo.create("cross-attention").eval()}

    class Exports(dict):
        def __missing__(self, name: str):
            block, file, options = EXPORTS[name]
            self[name] = export_onnx(blocks[block], folder / file, **options).path
            return self[name]

    return Exports(blocks)


@pytest.fixture(scope="session")
def seq2seq_pairs(tmp_path_factory):
    """case -> (checkpoint folder, transformers model, the export's PATH) of tests/peers/seq2seq_cases.py, each
    exported once for the whole run (greedy and beam tests share them: each export is ~30 CPU-seconds)."""
    import seq2seq_cases

    from cli.main import main as cli
    from export.seq2seq_export import export_seq2seq
    from peers.seq2seq import generation_settings, seq2seq_from_checkpoint

    root = tmp_path_factory.mktemp("seq2seq_exports")
    made = {}

    def get(case: str):
        if case not in made:
            folder, hf = seq2seq_cases.checkpoint(case, root)
            path = root / f"{case}.onnx"
            if case == "bart":  # through the CLI: export --checkpoint DIR --whole -o PATH
                assert cli(["export", "--checkpoint", str(folder), "--whole", "-o", str(path)]) == 0
            else:
                model = seq2seq_from_checkpoint(folder)
                export_seq2seq(model, path, generation=generation_settings(folder))
            made[case] = folder, hf, path
        return made[case]

    return get
