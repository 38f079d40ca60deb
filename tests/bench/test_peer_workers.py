"""The benchmark's files that run under another environment's python (llama-cpp-python's, onnxruntime-genai's,
optimum-onnx's), loaded as the benchmark loads them, BY PATH, in a process where no package of attnzoo can be
imported (as in those environments): each must load, and its error paths that need no peer installed must
end in the worker's one result line, not a crash. `GGUFError(_Root, ValueError)` with `_Root = Exception`
could not be made there ("Cannot create a consistent method resolution"), and no test ran it so."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys

import pytest

from helpers import REPO

# attnzoo's packages (setup.py's TOP_LEVEL, read without running setup()): what another environment lacks
TOP_LEVEL = ast.literal_eval(re.search(r"^TOP_LEVEL = (\[.*\])$", (REPO / "setup.py").read_text(), re.M).group(1))
BENCH = REPO / "bench"
# Another environment: attnzoo's packages cannot be imported (the venv's editable install would find them).
ELSEWHERE = f"""
import importlib.abc, runpy, sys
class _NotHere(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {sorted(TOP_LEVEL)!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (another environment)", name=name)
sys.meta_path.insert(0, _NotHere())
"""


def _elsewhere(code: str, tmp_path) -> subprocess.CompletedProcess:
    """`code` under this python, isolated (-I: no PYTHONPATH, no script folder), attnzoo's packages blocked."""
    proc = subprocess.run(
        [sys.executable, "-I", "-c", ELSEWHERE + code], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    return proc


def _run_worker(name: str, job: dict, tmp_path) -> dict:
    """BENCH/name run as a script (as the benchmark spawns it) with one job; its one result line's JSON."""
    path = str(BENCH / name)
    proc = _elsewhere(
        f"sys.argv = [{path!r}, {json.dumps(job)!r}]\nrunpy.run_path({path!r}, run_name='__main__')", tmp_path
    )
    mark = re.search(r'^RESULT_MARK = "([^"]+)"', (BENCH / name).read_text(), re.M).group(1)
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith(mark)]
    return json.loads(line[len(mark) :])


def _checkpoint(tmp_path, model_type: str):
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type, "hidden_act": "silu"}))
    return str(tmp_path)


def test_zoo_cannot_be_imported_there(tmp_path):
    proc = _elsewhere("try:\n    import zoo\nexcept ModuleNotFoundError as e:\n    print('refused:', e)", tmp_path)
    assert "refused: No module named 'zoo' (another environment)" in proc.stdout


def test_gguf_llama_loads_by_path_and_its_errors_are_value_errors(tmp_path):
    """As generate_peers' build_llama loads it: GGUFError is made (a ValueError there) and raised naming the
    value; a config llama.cpp reads differently is refused before llama_cpp is imported."""
    path = str(BENCH / "gguf_llama.py")
    code = f"""
import importlib.util, json
spec = importlib.util.spec_from_file_location("attnzoo_bench_gguf_llama", {path!r})
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
print("roots", [c.__name__ for c in m.GGUFError.__mro__])
for call in (lambda: m.rope_interleave_order(2, 3), lambda: m._gguf_name("model.layers.0.odd.weight")):
    try:
        call()
    except ValueError as e:
        print("refused", type(e).__name__, e)
print("build", json.dumps(m.build_llama({{"checkpoint": {_checkpoint(tmp_path, "gpt2")!r}}})))
"""
    out = _elsewhere(code, tmp_path).stdout.splitlines()
    assert out[0] == "roots ['GGUFError', 'ValueError', 'Exception', 'BaseException', 'object']"
    assert out[1] == "refused GGUFError head_dim 3 is odd: rotary needs pairs"
    assert out[2] == "refused GGUFError tensor model.layers.0.odd.weight has no llama.cpp name here"
    assert json.loads(out[3].removeprefix("build ")) == {
        "ok": False,
        "error": "model_type 'gpt2': only 'llama' is written as a GGUF here",
    }


def test_the_gguf_error_is_attnzoos_where_attnzoo_is_importable():
    import zoo
    from bench.gguf_llama import GGUFError

    assert issubclass(GGUFError, zoo.AttnzooError) and issubclass(GGUFError, ValueError)


# (worker file, job, words of the row's error): each path's failure where its peer (or attnzoo) is missing
WORKERS = {
    "llama.cpp refuses a config": (
        "generate_peers.py",
        {"stage": "build", "path": "llama.cpp", "checkpoint": "{gpt2}", "precision": "fp32", "model": "{tmp}/m"},
        "model_type 'gpt2': only 'llama' is written as a GGUF here",
    ),
    "llama.cpp without llama-cpp-python": (
        "generate_peers.py",
        {"stage": "build", "path": "llama.cpp", "checkpoint": "{llama}", "precision": "int4", "model": "{tmp}/m"},
        "ModuleNotFoundError: No module named 'llama_cpp'",
    ),
    "llama.cpp's prompt lookup without llama-cpp-python": (
        "generate_peers.py",
        {"stage": "time", "path": "llama.cpp-prompt-lookup", "model": "{tmp}/m", "prompt": [1], "new": 2, "spec": {}},
        "ModuleNotFoundError: No module named 'llama_cpp'",
    ),
    "llama.cpp's draft refuses a draft config": (
        "generate_peers.py",
        {
            "stage": "build",
            "path": "llama.cpp-draft",
            "model": "{tmp}/m",
            "draft_only": True,
            "draft_model": "{tmp}/d.gguf",
            "spec": {"draft": "{gpt2}"},
        },
        "the draft {gpt2}: model_type 'gpt2': only 'llama' is written as a GGUF here",
    ),
    "genai's speculation without onnxruntime-genai": (
        "generate_peers.py",
        {"stage": "time", "path": "onnxruntime-genai-draft", "model": "{tmp}/m", "prompt": [1], "new": 2},
        "ModuleNotFoundError: No module named 'onnxruntime_genai'",
    ),
    "genai without onnxruntime-genai": (
        "generate_peers.py",
        {"stage": "time", "path": "onnxruntime-genai", "model": "{tmp}/m", "prompt": [1], "new": 2},
        "ModuleNotFoundError: No module named 'onnxruntime_genai'",
    ),
    "generate's attnzoo path without attnzoo": (
        "generate_peers.py",
        {"stage": "build", "path": "attnzoo", "checkpoint": "{llama}", "precision": "fp32", "model": "{tmp}/m"},
        "ModuleNotFoundError: No module named",
    ),
    "the encoders' attnzoo path without attnzoo": (
        "encoder_peers.py",
        {"path": "attnzoo", "folder": "{tmp}", "work": "{tmp}", "shapes": [[1, 4]], "texts": {}},
        "ModuleNotFoundError: No module named 'zoo' (another environment)",
    ),
    "an encoder path of no such name": ("encoder_peers.py", {"path": "nope"}, "KeyError: 'nope'"),
    "the seq2seq attnzoo path without attnzoo": (
        "seq2seq_peers.py",
        {"path": "attnzoo", "checkpoint": "{tmp}", "work": "{tmp}", "prompts": [[1]], "batches": [1]},
        "ModuleNotFoundError: No module named 'zoo' (another environment)",
    ),
}


@pytest.mark.parametrize("case", list(WORKERS))
def test_a_worker_run_by_path_elsewhere_answers_its_result_line(case, tmp_path):
    name, job, words = WORKERS[case]
    folders = {"tmp": str(tmp_path), "gpt2": _checkpoint(tmp_path / "g", "gpt2")}
    folders["llama"] = _checkpoint(tmp_path / "l", "llama")
    job = json.loads(json.dumps(job).replace("{tmp}", folders["tmp"]).replace("{gpt2}", folders["gpt2"]))
    job = json.loads(json.dumps(job).replace("{llama}", folders["llama"]))
    result = _run_worker(name, job, tmp_path)
    assert result["ok"] is False and words.format(**folders) in result["error"], result


def test_peer_spec_loads_by_path_and_counts_what_the_peers_kept(tmp_path):
    """bench/peer_spec.py as generate_peers loads it elsewhere: llama-cpp-python's rounds counted against the
    tokens its loop returned (none past the last one), onnxruntime-genai's options and its stats read."""
    path = str(BENCH / "peer_spec.py")
    code = f"""
import importlib.util, json
spec = importlib.util.spec_from_file_location("attnzoo_bench_peer_spec", {path!r})
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
# prompt 4; tokens 7 8 9 7 8: a round at length 5 proposing 8 9 5 (keeps 2), one at 8 proposing 7 8 9 (1 checked)
print(json.dumps(m.accepted_counts(4, [7, 8, 9, 7, 8], [(5, [8, 9, 5]), (8, [8, 1]), (9, [9]), (9, [])])))
print(json.dumps(m.genai_options({{"spec": {{"k": 5, "ngram": 3}}}})))
print(json.dumps(m.genai_options({{"spec": {{"k": 5, "ngram": 3, "draft": "d"}}}})))
raw = {{"target_forward_passes": 12, "standard_fallback_steps": 3, "draft_tokens_proposed": 25,
       "draft_tokens_accepted": 6, "acceptance_rate": 0.75, "draft_forward_passes": 0, "note": "x"}}
print(json.dumps(m.genai_summary(raw, 16)))
print(m.genai_folder({{"model": "/a/t", "spec": {{"draft": "d"}}, "draft_model": "/b/p/draft"}}))
"""
    out = _elsewhere(code, tmp_path).stdout.splitlines()
    assert json.loads(out[0]) == [4, 3]  # 8 9 | 5 vs 7: 2 kept of 3; 8 vs 8: 1 of 1 (1 is past the end); 9: 0 of 0
    assert json.loads(out[1]) == {"max_draft_tokens": 5, "min_adaptive_k": 0, "cooldown": False, "ngram_size": 4}
    assert json.loads(out[2]) == {"max_draft_tokens": 5, "min_adaptive_k": 0, "cooldown": False}
    summary = json.loads(out[3])
    assert {k: summary[k] for k in ("target_calls", "proposed", "accepted")} == {
        "target_calls": 14,
        "proposed": 25,
        "accepted": 6,
    }
    assert summary["acceptance_rate"] == 6 / 25 and summary["tokens_per_target_call"] == 15 / 14
    assert summary["genai"]["acceptance_rate"] == 0.75 and "note" not in summary["genai"]
    assert "draft_calls" not in summary
    assert out[4] == "/b/p/speculative"


def test_every_file_another_python_runs_is_tested_here():
    """The workers the benchmark spawns by path (bench/*.py's WORKER) and the files they load from beside them."""
    spawned = set()
    for f in BENCH.glob("*.py"):
        text = f.read_text()
        spawned |= set(re.findall(r'WORKER = Path\(__file__\)\.resolve\(\)\.parent / "(\w+\.py)"', text))
        spawned |= set(re.findall(r'os\.path\.dirname\(os\.path\.abspath\(__file__\)\), "(\w+\.py)"', text))
    tested = {name for name, _, _ in WORKERS.values()} | {"gguf_llama.py", "peer_spec.py"}
    assert spawned == tested, f"run by another python but not tested here: {sorted(spawned - tested)}"
