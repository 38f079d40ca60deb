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
        tokens = [1, 2, 3] if job["path"] != "transformers-prompt-lookup" else [1, 2, 4]
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
    assert "| 80 grounded | fp32 | attnzoo-prompt-lookup | 0.500 | 6 | 2.00x | 0.50 | 2.00 | yes |" in table


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
