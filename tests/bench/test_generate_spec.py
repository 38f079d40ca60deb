"""`attnzoo bench --generate --speculative` (bench/generate_spec.py) with scripted workers: which paths run with
which job, the one all_logits target every attnzoo row shares, the workloads' prompts, the rows' equality with
their plain path, the table and the refusals. Nothing here looks at a timing."""

from __future__ import annotations

import pytest

from bench.checkpoints import prompt_ids
from bench.generate import benchmark_generate
from bench.generate_spec import GROUNDED_REPEAT, format_speculative_table
from bench.jobs import BenchError
from helpers import one_line_error


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    pytest.importorskip("transformers")
    from bench.checkpoints import random_llama

    shape = dict(vocab_size=300, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2)
    return random_llama(tmp_path_factory.mktemp("ckpt") / "tiny", seed=0, intermediate_size=64, **shape)


def test_a_speculative_run_takes_its_paths_jobs_and_prompts(tiny_checkpoint, monkeypatch):
    import bench.generate as generate

    builds, times = [], []

    def spawn(python, job, timeout):
        if job["stage"] == "build":
            builds.append((job["path"], job["precision"], job.get("spec"), job.get("draft_only", False)))
            return {"ok": True}
        times.append(job)
        spec = "spec" in job
        c, ids = GROUNDED_REPEAT, job["prompt"]
        tokens = ids[c : c + 2] if ids[-c:] == ids[:c] else [1, 2]  # a grounded prompt: re-write its text
        tokens = tokens + ([3] if job["path"] != "transformers-prompt-lookup" else [-4])  # grounded: 2 re-written
        row = {"ok": True, "end_to_end_s": 0.5 if spec else 1.0, "tokens": tokens, "tokens_per_s": 6.0}
        row |= {"prefill_s": 0.1, "decode_ms_per_token": 1.0, "peak_rss_mb": 100.0}
        if spec:
            row["speculation"] = {"acceptance_rate": 0.5, "tokens_per_target_call": 2.0}
        return row

    monkeypatch.setattr(generate, "_spawn", spawn)
    speculative = {"k": 6, "ngram": 3, "draft": str(tiny_checkpoint), "workloads": ["grounded", "free"]}
    report = benchmark_generate(
        str(tiny_checkpoint), prompts=[80], new=3, precisions=["fp32"], progress=False, speculative=speculative
    )
    # one all_logits target (the prompt-lookup path's), the draft path exporting its draft only, plain nothing
    assert builds == [
        ("attnzoo-prompt-lookup", "fp32", {"k": 6, "ngram": 3}, False),
        ("attnzoo-draft", "fp32", {"k": 6, "ngram": 3, "draft": str(tiny_checkpoint)}, True),
    ]
    models = {j["path"]: j["model"] for j in times}
    assert models["attnzoo"] == models["attnzoo-prompt-lookup"] == models["attnzoo-draft"]
    paths = [j["path"] for j in times]
    assert paths[:6] == [
        "attnzoo",
        "attnzoo-prompt-lookup",
        "attnzoo-draft",
        "transformers-dynamic",
        "transformers-prompt-lookup",
        "transformers-assistant",
    ]
    prompts = {r["prompt"] for r in report["rows"]}
    assert prompts == {"80 grounded", "80 free"}
    grounded = next(j["prompt"] for j in times if j["path"] == "attnzoo")
    text = prompt_ids(str(tiny_checkpoint), 80 - GROUNDED_REPEAT)
    assert grounded == text + text[:GROUNDED_REPEAT]
    equal = {(r["prompt"], r["path"]): r.get("equal_to_plain") for r in report["rows"]}
    assert equal["80 free", "attnzoo-prompt-lookup"] is True and equal["80 free", "attnzoo"] is None
    assert equal["80 free", "transformers-prompt-lookup"] is False  # its tokens differ from its plain path's
    table = format_speculative_table(report)
    assert "| 80 grounded | fp32 | attnzoo-prompt-lookup | 0.500 | 6 | 2.00x | 0.50 | 2.00 | yes | 2 of 3 |" in table
    # how far each grounded row re-writes the prompt's text (its tokens after the repeated start); free rows: not asked
    assert {r["prompt"]: r.get("rewritten") for r in report["rows"] if r["path"] == "attnzoo"} == {
        "80 grounded": 2,
        "80 free": None,
    }


def test_speculative_flags_are_refused_in_one_line(capsys, tiny_checkpoint):
    base = ["bench", "--generate", "--checkpoint", str(tiny_checkpoint), "--speculative"]
    assert "--spec-k 0 is outside" in one_line_error(capsys, [*base, "--spec-k", "0"])
    assert "--draft nowhere has no config.json" in one_line_error(capsys, [*base, "--draft", "nowhere"])
    assert "not one of grounded, free" in one_line_error(capsys, [*base, "--workload", "chat"])
    assert "go(es) with --generate" in one_line_error(capsys, ["bench", "--speculative"])
    with pytest.raises(BenchError, match="need --draft DIR"):
        benchmark_generate(
            str(tiny_checkpoint),
            prompts=[40],
            new=2,
            precisions=["fp32"],
            paths=["attnzoo-draft"],
            speculative={"k": 2, "ngram": 2, "draft": None, "workloads": ["free"]},
        )


def _scripted(builds: list, times: list, tokens_of=lambda job: [1, 2, 3]):
    """A _spawn that records each job and answers as a worker would (no process, no timing looked at)."""

    def spawn(python, job, timeout):
        if job["stage"] == "build":
            builds.append(job)
            return {"ok": True}
        times.append(job)
        row = {"ok": True, "end_to_end_s": 0.5 if "spec" in job else 1.0, "tokens": tokens_of(job)}
        row |= {"tokens_per_s": 6.0, "prefill_s": 0.1, "decode_ms_per_token": 1.0, "peak_rss_mb": 100.0}
        if "spec" in job:
            row["speculation"] = {"acceptance_rate": 0.25, "tokens_per_target_call": 1.5}
        return row

    return spawn


def test_the_peers_speculation_runs_on_their_plain_models(tiny_checkpoint, monkeypatch, tmp_path):
    """--llama-python and --genai-python with --speculative: each peer's plain path, its prompt lookup on the same
    GGUF / genai folder (nothing built for it), its draft path building only its draft, in its own folder; every
    peer row's tokens against its own plain row's."""
    import sys

    import bench.generate as generate

    builds, times = [], []
    # llama.cpp's own tokens (its draft path's too) differ from the others'; its prompt lookup's from its plain's
    tokens = {"llama.cpp": [4, 5, 6], "llama.cpp-draft": [4, 5, 6], "llama.cpp-prompt-lookup": [4, 5, 7]}
    tokens_of = lambda job: tokens.get(job["path"], [1, 2, 3])  # noqa: E731
    monkeypatch.setattr(generate, "_spawn", _scripted(builds, times, tokens_of))
    speculative = {"k": 6, "ngram": 3, "draft": str(tiny_checkpoint), "workloads": ["grounded"]}
    report = benchmark_generate(
        str(tiny_checkpoint),
        prompts=[80],
        new=3,
        precisions=["fp32", "int4"],
        progress=False,
        speculative=speculative,
        genai_python=sys.executable,
        llama_python=sys.executable,
    )
    built = [(j["path"], j["precision"], j.get("draft_only", False)) for j in builds if "attnzoo" not in j["path"]]
    assert built == [
        ("onnxruntime-genai", "fp32", False),
        ("onnxruntime-genai", "int4", False),
        ("llama.cpp", "fp32", False),
        ("llama.cpp", "int4", False),
        ("onnxruntime-genai-draft", "fp32", True),
        ("onnxruntime-genai-draft", "int4", True),
        ("llama.cpp-draft", "fp32", True),
        ("llama.cpp-draft", "int4", True),
    ]
    by = {(j["path"], j["precision"]): j for j in builds}
    for peer in ("llama.cpp", "onnxruntime-genai"):
        for precision in ("fp32", "int4"):
            draft = by[f"{peer}-draft", precision]
            assert draft["model"] == by[peer, precision]["model"]  # the plain path's model, not built again
            assert draft["spec"] == {"k": 6, "ngram": 3, "draft": str(tiny_checkpoint)}
            assert draft["draft_model"].endswith(
                f"{peer}-draft-{precision}/" + ("draft.gguf" if peer[0] == "l" else "draft")
            )
    timed = {(j["path"], j["precision"]): j for j in times}
    for path in ("llama.cpp-prompt-lookup", "llama.cpp-draft", "onnxruntime-genai-prompt-lookup"):
        plain = path.rsplit("-", 2)[0] if path.endswith("lookup") else path.rsplit("-", 1)[0]
        assert timed[path, "int4"]["model"] == timed[plain, "int4"]["model"]
    assert timed["llama.cpp-prompt-lookup", "fp32"]["spec"] == {"k": 6, "ngram": 3}
    assert timed["llama.cpp-draft", "fp32"]["draft_model"] == by["llama.cpp-draft", "fp32"]["draft_model"]
    assert "spec" not in timed["llama.cpp", "fp32"] and "spec" not in timed["onnxruntime-genai", "fp32"]
    equal = {(r["path"], r["precision"]): r.get("equal_to_plain") for r in report["rows"]}
    assert equal["llama.cpp-prompt-lookup", "int4"] is False  # against llama.cpp's own plain tokens
    assert equal["llama.cpp-draft", "int4"] is equal["onnxruntime-genai-prompt-lookup", "fp32"] is True
    assert equal["llama.cpp", "fp32"] is None
    table = format_speculative_table(report)
    assert "| 80 grounded | int4 | onnxruntime-genai-draft | 0.500 | 6 | 2.00x | 0.25 | 1.50 | yes |" in table
    assert "| 80 grounded | fp32 | llama.cpp-prompt-lookup | 0.500 | 6 | 2.00x | 0.25 | 1.50 | no |" in table


def test_the_peers_speculating_rows_say_why_they_were_skipped(tiny_checkpoint, monkeypatch):
    import sys

    import bench.generate as generate

    monkeypatch.setattr(generate, "_spawn", _scripted([], []))
    speculative = {"k": 17, "ngram": 3, "draft": None, "workloads": ["free"]}
    report = benchmark_generate(
        str(tiny_checkpoint), prompts=[40], new=2, precisions=["fp32"], progress=False, speculative=speculative,
        genai_python=sys.executable,
    )  # fmt: skip
    why = {s["path"]: s["why"] for s in report["skipped"]}
    assert why["llama.cpp-prompt-lookup"].startswith("no --llama-python given")
    assert why["onnxruntime-genai-prompt-lookup"] == "onnxruntime-genai's max_draft_tokens is 1 to 16; --spec-k 17"
    assert "onnxruntime-genai" not in why and "llama.cpp-draft" not in why  # no --draft: no draft paths at all
    table = format_speculative_table(report)
    assert "| | fp32 | llama.cpp-prompt-lookup | skipped: no --llama-python given" in table
    speculative |= {"k": 4, "ngram": 16}
    report = benchmark_generate(
        str(tiny_checkpoint), prompts=[40], new=2, precisions=["fp32"], progress=False, speculative=speculative,
        genai_python=sys.executable, paths=["onnxruntime-genai-prompt-lookup"],
    )  # fmt: skip
    assert report["skipped"] == [
        {
            "path": "onnxruntime-genai-prompt-lookup",
            "precision": "fp32",
            "why": "onnxruntime-genai's ngram_size (--ngram + 1) is 2 to 16; --ngram 16",
        }
    ]
    with pytest.raises(BenchError, match="llama.cpp-draft need --draft DIR"):
        benchmark_generate(
            str(tiny_checkpoint), prompts=[40], new=2, precisions=["fp32"], paths=["llama.cpp-draft"],
            speculative=speculative,
        )  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(
    "peer, variable", [("llama.cpp", "ATTNZOO_LLAMA_PYTHON"), ("onnxruntime-genai", "ATTNZOO_GENAI_PYTHON")]
)
def test_a_peers_own_speculation_gives_its_plain_greedy_tokens(peer, variable, tmp_path):
    """The real peer from its environment (the variable names its python): its prompt lookup and its draft path,
    the checkpoint as its own draft (which keeps every candidate), each give the peer's plain greedy tokens."""
    import os

    from bench.checkpoints import random_llama

    python = os.environ.get(variable)
    if not python:
        pytest.skip(f"set {variable} to the python of {peer}'s environment (docs/benchmarks.md)")
    shape = dict(vocab_size=300, hidden_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2)
    tiny_checkpoint = random_llama(tmp_path / "tiny", seed=0, intermediate_size=64, **shape)  # head_dim 16: genai's
    speculative = {"k": 4, "ngram": 2, "draft": str(tiny_checkpoint), "workloads": ["grounded"]}
    report = benchmark_generate(
        str(tiny_checkpoint), prompts=[80], new=8, precisions=["fp32"], threads=1, warmup=0, repeats=1,
        paths=[peer, f"{peer}-prompt-lookup", f"{peer}-draft"], progress=False, speculative=speculative,
        **({"llama_python": python} if peer == "llama.cpp" else {"genai_python": python}),
    )  # fmt: skip
    rows = {r["path"]: r for r in report["rows"]}
    assert all(r["ok"] for r in rows.values()) and not report["skipped"], (rows, report["skipped"])
    assert rows[f"{peer}-prompt-lookup"]["equal_to_plain"] and rows[f"{peer}-draft"]["equal_to_plain"]
    draft = rows[f"{peer}-draft"]["speculation"]
    assert draft["proposed"] > 0 and draft["acceptance_rate"] == 1.0, draft
