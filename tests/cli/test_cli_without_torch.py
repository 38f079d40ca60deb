"""Running an exported model needs no torch: `attnzoo generate` of a folder whose export is cached, of a
whole-model .onnx, `attnzoo embed` of an exported encoder and the refusals on them run in a process where
`import torch` fails (a deployment without the training stack; and the import's second or more of start-up).

One child process, with torch's import blocked, runs every case in turn through the console script's entry point
(cli.entry.main), recording its exit code and output; each test reads its case."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from helpers import REPO

CHILD = textwrap.dedent(
    """
    import contextlib, io, json, sys

    class NoTorch:  # `import torch` (and torch.*) fails, as where it is not installed
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ModuleNotFoundError(f"No module named {name!r} (blocked)")

    sys.meta_path.insert(0, NoTorch())
    from cli.entry import main

    results = {}
    for name, argv in json.loads(sys.argv[1]).items():
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(argv)
            except SystemExit as e:
                rc = e.code
            except BaseException as e:
                rc, err = "raised", io.StringIO(f"{type(e).__name__}: {e}")
        results[name] = {"rc": rc, "out": out.getvalue(), "err": err.getvalue()}
    print(json.dumps(results))
    """
)


@pytest.fixture(scope="module")
def encoder_onnx(tmp_path_factory):
    """A sentence encoder exported whole (a tiny BERT), with its tokenizer beside it."""
    pytest.importorskip("transformers")
    sys.path.insert(0, str(REPO / "tests" / "peers"))
    import encoder_cases

    from cli.main import main

    root = tmp_path_factory.mktemp("torchless-embed")
    folder = encoder_cases.sentence_folder(root / "bert", "bert", "mean")
    assert main(["export", "--checkpoint", str(folder), "--whole", "-o", str(root / "bert.onnx")]) == 0
    return root / "bert.onnx"


@pytest.fixture(scope="module")
def cases(cached_tiny, encoder_onnx) -> dict:
    folder, _, onnx_path = cached_tiny
    run = ["--max-new-tokens", "3", "--no-stream"]
    return {
        "generate a cached folder": ["generate", str(folder), "--prompt", "def main(", *run],
        "generate a cached folder, a refusal": ["generate", str(folder), "--prompt-ids", "1,999", *run],
        "generate an .onnx": ["generate", str(onnx_path), "--prompt-ids", "100,101", *run],
        "generate an .onnx, a refusal": ["generate", str(onnx_path), "--prompt-ids", "1", "--precision", "int8"],
        "embed an .onnx": ["embed", str(encoder_onnx), "--text", "hello world"],  # provider auto: the CUDA probe too
        "embed an .onnx, a refusal": ["embed", str(encoder_onnx)],
        "generate a Hub id": ["generate", "meta-llama/Llama-3.2-1B", "--prompt", "hi"],
    }


@pytest.fixture(scope="module")
def runs(cases, cached_tiny) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO), "ATTNZOO_CACHE": str(cached_tiny[1])}
    p = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(cases)], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.splitlines()[-1])


@pytest.mark.parametrize("case", ["generate a cached folder", "generate an .onnx", "embed an .onnx"])
def test_an_exported_model_runs_where_torch_cannot_be_imported(runs, case):
    run = runs[case]
    assert run["rc"] == 0, run
    assert "exporting" not in run["out"], "the folder's export was cached: nothing to export"
    assert ("tokens " in run["out"]) if case.startswith("generate") else ("1 text -> " in run["out"]), run


@pytest.mark.parametrize(
    "case, words",
    [
        ("generate a cached folder, a refusal", "token id 999 is past the vocabulary"),
        ("generate an .onnx, a refusal", "--precision int8"),
        ("embed an .onnx, a refusal", "give the texts"),
        ("generate a Hub id", "huggingface-cli download"),
    ],
)
def test_refusals_on_an_exported_model_are_one_line_without_torch(runs, case, words):
    run = runs[case]
    lines = run["err"].strip().splitlines()
    assert run["rc"] == 2 and len(lines) == 1 and words in lines[0], run


def test_an_exported_encoder_at_provider_auto_leaves_an_installed_torch_unimported(encoder_onnx):
    """Where torch is installed, the CUDA probe of --provider auto does not import it either (it took an
    exported model's run 1.4 s): onnxruntime finds the nvidia-* wheels itself."""
    code = textwrap.dedent(
        f"""
        import contextlib, io, sys
        from cli.entry import main
        with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
            main(["embed", {str(encoder_onnx)!r}, "--text", "hello world"])
        print("torch" in sys.modules)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stdout.splitlines()[-1] == "False", (p.stdout[-2000:], p.stderr[-2000:])
