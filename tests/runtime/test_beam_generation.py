"""Beam search from a whole decoder export (runtime/beam_generation.py, OnnxSession.generate(num_beams=k)):
tokens and sequences_scores equal transformers' generate(num_beams=k, do_sample=False, output_scores=True,
return_dict_in_generate=True) on a left-padded batch, for the three early_stopping values, length penalties
other than 1, num_return_sequences > 1 and an eos that ends hypotheses early; left-padded and packed-rows
exports, the packed one also through the device path (the Gather graph, on the CPU provider); the
checkpoint's num_beams by default; transformers' own processors applied where its beam search applies them;
the refusals. One left-padded and one packed export of lm_cases' tiny LLaMA (a few seconds); other families
under -m slow."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import zoo
from export import OnnxSession, export_onnx
from peers.lm import lm_from_hf
from runtime import beam_cache
from runtime.beam_generation import BeamGeneration
from runtime.beam_search import Beams

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "peers"))
import lm_cases  # noqa: E402 - small random transformers models, one per family

MAX_LEN = 64
NEW = 10
PADS = (0, 4, 2)  # row r left-padded by PADS[r]
SCORE_ATOL = 1e-4  # ORT's fp32 logits against torch's (measured: under 1e-5 over 10 steps)
# (num_beams, early_stopping, length_penalty, num_return_sequences): every early_stopping value, penalties
# above, below and at 1, more than one sequence returned
SETTINGS = [(4, False, 1.0, 1), (3, True, 2.0, 2), (4, "never", -0.5, 3), (2, "never", 1.5, 2)]


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """kind -> (hf model, {"left": path, "packed": path}), exported on first use."""
    made: dict = {}
    folder = tmp_path_factory.mktemp("beam")

    def get(kind: str = "llama"):
        if kind not in made:
            hf = lm_cases.hf_model(kind)
            lm = lm_from_hf(hf).eval()
            paths = {
                p: export_onnx(lm, folder / f"{kind}-{p}.onnx", max_len=MAX_LEN, padding=p).path
                for p in (("left", "packed") if kind == "llama" else ("left",))
            }
            made[kind] = hf, paths
        return made[kind]

    return get


def padded_prompt():
    ids = lm_cases.prompt(batch=3, t=9)
    mask = torch.ones_like(ids)
    for r, pad in enumerate(PADS):
        mask[r, :pad] = 0
        ids[r, :pad] = 0
    return ids, mask


def hf_beams(hf, ids, mask, **kw):
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return hf.generate(
            ids, attention_mask=mask, do_sample=False, output_scores=True, return_dict_in_generate=True, **kw
        )


def an_eos_the_beams_make(hf, ids, mask) -> int:
    """A token the free beams make early in a row, as the eos: hypotheses then end before max_length."""
    free = hf_beams(hf, ids, mask, num_beams=4, max_new_tokens=NEW, eos_token_id=None, pad_token_id=0).sequences
    return int(free[1, ids.shape[1] + 2])


def assert_same(got, want, what: str) -> None:
    assert got.sequences.shape == tuple(want.sequences.shape), f"{what}: {got.sequences.shape} {want.sequences.shape}"
    assert np.array_equal(got.sequences, want.sequences.numpy()), f"{what}:\n{got.sequences}\n{want.sequences}"
    np.testing.assert_allclose(got.sequences_scores, want.sequences_scores.numpy(), atol=SCORE_ATOL, err_msg=what)


def matrix():
    """Every setting on the left-padded export, one on the packed one (the rest of it under -m slow)."""
    out = [pytest.param("left", s, id=f"left-{name(s)}") for s in SETTINGS]
    return out + [
        pytest.param("packed", s, id=f"packed-{name(s)}", marks=() if s == SETTINGS[2] else pytest.mark.slow)
        for s in SETTINGS
    ]


def name(s) -> str:
    return f"k{s[0]}-es{s[1]}-lp{s[2]}-n{s[3]}"


@pytest.mark.parametrize("padding, setting", matrix())
def test_beams_equal_transformers_tokens_and_scores_on_a_padded_batch(padding, setting, exports):
    hf, paths = exports()
    k, early, lp, n = setting
    ids, mask = padded_prompt()
    eos = an_eos_the_beams_make(hf, ids, mask)
    kw = dict(num_beams=k, early_stopping=early, length_penalty=lp, num_return_sequences=n, max_new_tokens=NEW)
    want = hf_beams(hf, ids, mask, eos_token_id=eos, pad_token_id=0, **kw)
    sess = OnnxSession(paths[padding], provider="cpu")
    got = sess.generate(
        ids.numpy(), attention_mask=mask.numpy(), eos_token_id=eos, pad_token_id=0, return_dict_in_generate=True, **kw
    )
    assert_same(got, want, f"{padding} {setting} eos {eos}")
    assert got.sequences.shape[0] == ids.shape[0] * n
    # torch in, torch out; the plain call returns the sequences alone
    tokens = sess.generate(ids, attention_mask=mask, eos_token_id=eos, pad_token_id=0, **kw)
    assert torch.equal(tokens, want.sequences)


def test_an_eos_ends_hypotheses_early_and_they_are_filled_as_transformers_fills_them(exports):
    hf, paths = exports()
    ids, mask = padded_prompt()
    eos = an_eos_the_beams_make(hf, ids, mask)
    kw = dict(num_beams=4, num_return_sequences=4, max_new_tokens=NEW, eos_token_id=eos, pad_token_id=0)
    want = hf_beams(hf, ids, mask, **kw)
    got = OnnxSession(paths["left"], provider="cpu").generate(
        ids, attention_mask=mask, return_dict_in_generate=True, **kw
    )
    assert_same(got, want, f"eos {eos}")
    new = got.sequences[:, ids.shape[1] :]
    ends = [int(np.flatnonzero(row == eos)[0]) for row in new if (row == eos).any()]
    assert any(e < new.shape[1] - 1 for e in ends), f"no hypothesis ended early: eos {eos} proves nothing\n{new}"
    for row in new:  # after its eos a hypothesis is filled with transformers' `pad_token_id or eos[0]`: pad 0 -> eos
        if (row == eos).any():
            assert (row[np.flatnonzero(row == eos)[0] :] == eos).all()


@pytest.mark.parametrize("padding", ["left", "packed"])
def test_the_cache_is_reordered_in_place_and_without_it_the_beams_differ(padding, exports, monkeypatch):
    """The reorder is what makes beams right: with it skipped the tokens are not transformers'."""
    hf, paths = exports()
    ids, mask = padded_prompt()
    sess = OnnxSession(paths[padding], provider="cpu")
    run = BeamGeneration(sess, ids, NEW, mask, eos_token_id=[], pad_token_id=0, beams=Beams(4))
    got = run.run()
    want = hf_beams(hf, ids, mask, num_beams=4, max_new_tokens=NEW, eos_token_id=None, pad_token_id=0).sequences
    assert torch.equal(got, want)
    assert run.reorders > 0 and run.timings["beam_reorders"] == run.reorders
    monkeypatch.setattr(beam_cache.HostReorder, "__call__", lambda self, idx, length: None)
    skipped = BeamGeneration(sess, ids, NEW, mask, eos_token_id=[], pad_token_id=0, beams=Beams(4)).run()
    assert not torch.equal(skipped, want)


def test_the_device_path_reorders_with_a_gather_graph_on_the_sessions_provider(exports):
    """A packed export's device-resident cache (OrtValues) reordered by the Gather + Identity graphs, run here on
    the CPU provider: the same tokens and scores as transformers."""
    hf, paths = exports()
    ids, mask = padded_prompt()
    sess = OnnxSession(paths["packed"], provider="cpu")
    run = BeamGeneration(
        sess, ids.numpy(), NEW, mask.numpy(), eos_token_id=[], pad_token_id=0, beams=Beams(3, 1.5, "never", 2),
        reorder="graph",
    )  # fmt: skip
    run.run()
    want = hf_beams(
        hf, ids, mask, num_beams=3, length_penalty=1.5, early_stopping="never", num_return_sequences=2,
        max_new_tokens=NEW, eos_token_id=None, pad_token_id=0,
    )  # fmt: skip
    assert_same(run.output, want, "graph reorder")
    assert run.reorders > 0


def test_the_checkpoints_num_beams_gives_beams_by_default(exports):
    """transformers' generate reads num_beams (and the other beam keys) from the generation_config."""
    hf, paths = exports()
    ids, mask = padded_prompt()
    config = {"num_beams": 3, "length_penalty": 0.5, "early_stopping": True, "eos_token_id": 2, "pad_token_id": 0}
    with_config = type(hf.generation_config)(**config)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = hf.generate(ids, attention_mask=mask, generation_config=with_config, max_new_tokens=NEW)
        greedy = hf.generate(ids, attention_mask=mask, generation_config=with_config, max_new_tokens=NEW, num_beams=1)
    sess = OnnxSession(paths["left"], provider="cpu")
    assert torch.equal(sess.generate(ids, NEW, mask, generation_config=config), want)
    assert torch.equal(sess.generate(ids, NEW, mask, generation_config=config, num_beams=1), greedy)  # the call wins
    assert not torch.equal(want, greedy)


def test_processors_apply_to_the_log_softmax_where_transformers_beam_search_applies_them(exports):
    """transformers' own NoRepeatNGramLogitsProcessor through a numpy adapter (the interface of
    runtime/processors.py: (ids (n, t), scores (n, v)) -> scores): the beams of generate(no_repeat_ngram_size=2)."""
    from transformers.generation.logits_process import NoRepeatNGramLogitsProcessor

    hf, paths = exports()
    ids, mask = padded_prompt()
    peer = NoRepeatNGramLogitsProcessor(2)
    calls = []

    def processors(input_ids, scores):
        assert input_ids.dtype == np.int64 and scores.dtype == np.float32 and scores.shape[0] == input_ids.shape[0]
        calls.append(input_ids.shape)
        return peer(torch.from_numpy(input_ids), torch.from_numpy(scores.copy())).numpy()

    kw = dict(num_beams=3, max_new_tokens=NEW, eos_token_id=None, pad_token_id=0)
    want = hf_beams(hf, ids, mask, no_repeat_ngram_size=2, **kw)
    got = OnnxSession(paths["left"], provider="cpu").generate(
        ids, attention_mask=mask, processors=processors, return_dict_in_generate=True, **kw
    )
    assert_same(got, want, "no_repeat_ngram_size 2")
    assert calls[0] == (9, 9) and calls[-1] == (9, 9 + NEW - 1)  # b x k rows, the padded prompt then the new tokens
    free = hf_beams(hf, ids, mask, **kw)
    assert not torch.equal(free.sequences, want.sequences)  # the processor changed the beams: it was applied


def test_the_repetition_penalty_applies_to_beams_as_transformers(exports):
    hf, paths = exports()
    ids = lm_cases.prompt(batch=2, t=6)  # unpadded: transformers' penalty also counts left padding
    kw = dict(num_beams=3, max_new_tokens=NEW, eos_token_id=None, pad_token_id=0, repetition_penalty=1.8)
    want = hf_beams(hf, ids, torch.ones_like(ids), **kw)
    got = OnnxSession(paths["left"], provider="cpu").generate(ids.numpy(), return_dict_in_generate=True, **kw)
    assert_same(got, want, "repetition_penalty 1.8")


def test_max_length_counts_the_prompt_as_transformers(exports):
    hf, paths = exports()
    ids, mask = padded_prompt()
    want = hf_beams(hf, ids, mask, num_beams=2, max_length=14, eos_token_id=None, pad_token_id=0).sequences
    got = OnnxSession(paths["left"], provider="cpu").generate(
        ids, attention_mask=mask, num_beams=2, max_length=14, eos_token_id=[], pad_token_id=0
    )
    assert torch.equal(got, want) and got.shape[1] == 14


@pytest.mark.parametrize(
    "options, match",
    [
        (dict(num_beams=2, do_sample=True), "beam sampling is not done here"),
        (dict(num_beams=2, temperature=0.7), "beam sampling is not done here"),
        (dict(num_beams=2, num_return_sequences=3), r"num_return_sequences=3 must be <= num_beams=2"),
        (dict(num_beams=2, early_stopping="sometimes"), "early_stopping='sometimes'"),
        (dict(num_beams=0), "num_beams=0 must be an int >= 1"),
        (dict(num_beams=2, length_penalty="long"), "length_penalty='long'"),
        (dict(num_return_sequences=2), "needs num_beams >= 2"),
        (dict(processors=lambda i, s: s), r"processors= is taken with beam search"),
        (dict(num_beams=2, stop="\n"), "stop strings are not done in beam search"),
    ],
)
def test_unsupported_beam_options_are_refused_by_name(options, match, exports):
    _, paths = exports()
    sess = OnnxSession(paths["left"], provider="cpu")
    with pytest.raises(zoo.ArgumentError, match=match):
        sess.generate(lm_cases.prompt(batch=1).numpy(), 4, **options)


def test_beams_do_not_stream(exports):
    _, paths = exports()
    sess = OnnxSession(paths["left"], provider="cpu")
    with pytest.raises(zoo.ArgumentError, match="beam search does not stream"):
        next(sess.stream(lm_cases.prompt(batch=1).numpy(), 4, num_beams=2))
    with pytest.raises(zoo.ArgumentError, match="the call's or the checkpoint's"):
        next(sess.stream(lm_cases.prompt(batch=1).numpy(), 4, generation_config={"num_beams": 2}))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["gpt2", "qwen2", "mistral", "gemma2"])
@pytest.mark.parametrize("setting", SETTINGS, ids=name)
def test_beams_equal_transformers_for_other_families(kind, setting, exports):
    if kind not in lm_cases.CASES:
        pytest.skip(f"no lm_cases case {kind}")
    hf, paths = exports(kind)
    k, early, lp, n = setting
    ids, mask = padded_prompt()
    eos = an_eos_the_beams_make(hf, ids, mask)
    kw = dict(num_beams=k, early_stopping=early, length_penalty=lp, num_return_sequences=n, max_new_tokens=NEW)
    want = hf_beams(hf, ids, mask, eos_token_id=eos, pad_token_id=0, **kw)
    got = OnnxSession(paths["left"], provider="cpu").generate(
        ids, attention_mask=mask, eos_token_id=eos, pad_token_id=0, return_dict_in_generate=True, **kw
    )
    assert_same(got, want, f"{kind} {setting}")
