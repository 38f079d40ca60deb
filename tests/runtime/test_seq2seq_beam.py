"""Beam search for encoder-decoders (runtime/seq2seq_beam.py through Seq2SeqSession.generate(num_beams=k)):
tokens and sequences_scores equal transformers' generate(num_beams=k, do_sample=False, output_scores=True,
return_dict_in_generate=True) on a batch of prompts of different lengths (right-padded), for the three
early_stopping values, length penalties other than 1 and num_return_sequences > 1, with each checkpoint's
own processors (BART's forced eos, Marian's banned pad id) and an eos that ends hypotheses early; the
checkpoint's num_beams by default; the self-attention cache reordered (skipping it changes the beams).

T5 v1.1, BART and Marian in the default run (the session-scoped exports of tests/conftest.py, shared with
tests/export/test_seq2seq_export.py); T5 v1.0, mBART and Marian with its own decoder vocabulary under -m slow."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import seq2seq_cases  # noqa: E402 - tests/peers is on sys.path (tests/conftest.py)
import torch

import zoo
from peers.seq2seq import generation_settings
from runtime import beam_cache
from runtime.seq2seq_session import Seq2SeqSession

NEW = 12
FAST = ("t5-gated", "bart", "marian")
SCORE_ATOL = 1e-4  # ORT's fp32 logits against torch's (measured: up to 1e-4 with length_penalty -0.5)
SCORE_RTOL = 1e-5  # a score sums ~12 fp32 log-probs: seq2seq_cases.vary's wider weights reach |score| 60
# (num_beams, early_stopping, length_penalty, num_return_sequences)
SETTINGS = [(4, False, 1.0, 1), (3, True, 2.0, 2), (4, "never", -0.5, 3)]


def cases() -> list:
    skip = ("t5-deep-decoder",)  # transformers' cached generate fails on it (seq2seq_cases.cached_generate_ok)
    return [pytest.param(c, marks=() if c in FAST else pytest.mark.slow) for c in seq2seq_cases.CASES if c not in skip]


def hf_beams(hf, ids, mask, **kw):
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return hf.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=NEW,
            do_sample=False,
            output_scores=True,
            return_dict_in_generate=True,
            **kw,
        )


def assert_same(got, want, what: str) -> None:
    assert got.sequences.shape == tuple(want.sequences.shape), f"{what}: {got.sequences.shape} {want.sequences.shape}"
    assert np.array_equal(np.asarray(got.sequences), want.sequences.numpy()), (
        f"{what}:\n{got.sequences}\n{want.sequences}"
    )
    np.testing.assert_allclose(
        got.sequences_scores, want.sequences_scores.numpy(), rtol=SCORE_RTOL, atol=SCORE_ATOL, err_msg=what
    )


@pytest.mark.parametrize("case", cases())
@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: f"k{s[0]}-es{s[1]}-lp{s[2]}-n{s[3]}")
def test_beams_equal_transformers_tokens_and_scores(case, setting, seq2seq_pairs):
    _, hf, path = seq2seq_pairs(case)
    k, early, lp, n = setting
    ids, mask = seq2seq_cases.batch()
    kw = dict(num_beams=k, early_stopping=early, length_penalty=lp, num_return_sequences=n)
    want = hf_beams(hf, ids, mask, **kw)
    sess = Seq2SeqSession(path)
    timings: dict = {}
    got = sess.generate(ids.numpy(), NEW, mask.numpy(), return_dict_in_generate=True, timings=timings, **kw)
    assert_same(got, want, f"{case} {setting}")
    assert got.sequences.shape[0] == ids.shape[0] * n and timings["beam_reorders"] > 0
    assert torch.equal(sess.generate(ids, NEW, mask, **kw), want.sequences)  # torch in, torch out; sequences alone


@pytest.mark.parametrize("case", ["bart", pytest.param("t5", marks=pytest.mark.slow)])
def test_an_eos_ends_hypotheses_early_as_in_transformers(case, seq2seq_pairs):
    _, hf, path = seq2seq_pairs(case)
    ids, mask = seq2seq_cases.batch()
    free = hf_beams(hf, ids, mask, num_beams=4, forced_eos_token_id=None).sequences
    eos = int(free[0, 3])
    kw = dict(num_beams=4, num_return_sequences=4, eos_token_id=eos, forced_eos_token_id=None)
    want = hf_beams(hf, ids, mask, **kw)
    got = Seq2SeqSession(path).generate(ids, NEW, mask, return_dict_in_generate=True, **kw)
    assert_same(got, want, f"{case} eos {eos}")
    first = [int(np.flatnonzero(row[1:] == eos)[0]) for row in got.sequences.numpy() if (row[1:] == eos).any()]
    assert any(f < got.sequences.shape[1] - 2 for f in first), f"no hypothesis ended early at eos {eos}"


def test_skipping_the_cache_reorder_changes_the_beams(seq2seq_pairs, monkeypatch):
    """On BART (the random T5 and Marian are peaked enough that their beams rarely change rows)."""
    _, hf, path = seq2seq_pairs("bart")
    ids, mask = seq2seq_cases.batch()
    want = hf_beams(hf, ids, mask, num_beams=4).sequences
    sess = Seq2SeqSession(path)
    assert torch.equal(sess.generate(ids, NEW, mask, num_beams=4), want)
    monkeypatch.setattr(beam_cache.HostReorder, "__call__", lambda self, idx, length: None)
    assert not torch.equal(sess.generate(ids, NEW, mask, num_beams=4), want)


def test_max_length_counts_the_start_token_as_transformers(seq2seq_pairs):
    _, hf, path = seq2seq_pairs("bart")
    ids, mask = seq2seq_cases.batch()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = hf.generate(input_ids=ids, attention_mask=mask, max_length=7, num_beams=3)
    got = Seq2SeqSession(path).generate(ids, attention_mask=mask, max_length=7, num_beams=3)
    assert torch.equal(got, want) and got.shape[1] <= 7


def test_the_checkpoints_beam_settings_are_the_default(seq2seq_pairs):
    """A generation_config asking num_beams (and length_penalty, early_stopping) gets beams, as transformers'
    generate does; the call's num_beams=1 is greedy."""
    _, hf, path = seq2seq_pairs("bart")
    sess = Seq2SeqSession(path)
    ids, mask = seq2seq_cases.batch()
    asked = dict(num_beams=3, length_penalty=0.6, early_stopping=True)
    sess.generation.update(asked)  # as an export of such a checkpoint records it (generation_settings below)
    config = type(hf.generation_config).from_dict({**hf.generation_config.to_dict(), **asked})
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = hf.generate(input_ids=ids, attention_mask=mask, generation_config=config, max_new_tokens=NEW)
        greedy = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW, num_beams=1)
    assert torch.equal(sess.generate(ids, NEW, mask), want)
    assert torch.equal(sess.generate(ids, NEW, mask, num_beams=1), greedy)
    assert not torch.equal(want, greedy)


def test_a_stream_refuses_the_checkpoints_beams_by_name(seq2seq_pairs):
    """A stream makes greedy or sampled tokens: a checkpoint asking beams is refused there, not streamed greedily."""
    _, _, path = seq2seq_pairs("bart")
    sess = Seq2SeqSession(path)
    ids, mask = seq2seq_cases.batch()
    sess.generation.update(num_beams=3)
    with pytest.raises(zoo.ArgumentError, match="num_beams=3 .*does not stream"):
        list(sess.stream(ids, 4, mask))
    assert len(list(sess.stream(ids, 4, mask, num_beams=1))) >= 1
    assert sess.note is None or "num_beams" not in sess.note  # generate runs them: nothing to say


def test_generation_settings_read_the_beam_keys(tmp_path):
    import json

    folder, _ = seq2seq_cases.checkpoint("bart", tmp_path)
    gen = json.loads((folder / "generation_config.json").read_text())
    gen.update(num_beams=4, length_penalty=2.0, early_stopping="never", num_return_sequences=2)
    (folder / "generation_config.json").write_text(json.dumps(gen))
    got = generation_settings(folder)
    assert {k: got[k] for k in ("num_beams", "length_penalty", "early_stopping", "num_return_sequences")} == {
        "num_beams": 4,
        "length_penalty": 2.0,
        "early_stopping": "never",
        "num_return_sequences": 2,
    }
    gen["early_stopping"] = "sometimes"
    (folder / "generation_config.json").write_text(json.dumps(gen))
    with pytest.raises(zoo.CheckpointError, match="early_stopping='sometimes'"):
        generation_settings(folder)


@pytest.mark.parametrize(
    "options, match",
    [
        (dict(num_beams=2, num_return_sequences=3), "num_return_sequences=3 must be <= num_beams=2"),
        (dict(num_beams=2, early_stopping=1.5), "early_stopping=1.5"),
        (dict(num_return_sequences=2), "needs sampling or num_beams"),
        (dict(return_dict_in_generate=True), "taken with num_beams > 1"),
        (dict(num_beam=2), r"unknown generation keys \['num_beam'\]"),
    ],
)
def test_bad_beam_options_are_refused_by_name(options, match, seq2seq_pairs):
    _, _, path = seq2seq_pairs("t5-gated")
    ids, mask = seq2seq_cases.batch()
    with pytest.raises(zoo.ArgumentError, match=match):
        Seq2SeqSession(path).generate(ids, 4, mask, **options)


def test_cli_generate_num_beams_on_an_encoder_decoder(seq2seq_pairs, tmp_path, capsys):
    import json

    from cli.main import main

    _, hf, path = seq2seq_pairs("bart")
    ids = seq2seq_cases.batch()[0][:1]
    out = tmp_path / "beams.json"
    argv = ["generate", str(path), "--prompt-ids", ",".join(map(str, ids[0].tolist())), "--max-new-tokens", str(NEW)]
    assert main([*argv, "--num-beams", "3", "--num-return-sequences", "2", "--json", str(out)]) == 0
    want = hf_beams(hf, ids, torch.ones_like(ids), num_beams=3, num_return_sequences=2)
    doc = json.loads(out.read_text())
    assert doc["tokens"] == want.sequences.tolist() and doc["num_beams"] == 3
    np.testing.assert_allclose(doc["sequences_scores"], want.sequences_scores.numpy(), rtol=SCORE_RTOL, atol=SCORE_ATOL)
    assert "beam 2 score" in capsys.readouterr().out
    assert main([*argv, "--num-beams", "2", "--do-sample"]) != 0
    err = capsys.readouterr().err.strip()
    assert "with beam search" in err and len(err.splitlines()) == 1, err
