"""Speculative decoding (runtime/speculative.py, runtime/candidates.py) on the small random models of
tests/peers/lm_cases.py, exported with all_logits=True: greedy tokens equal plain greedy's and transformers'
greedy tokens token for token, on a left-padded batch whose rows accept their own counts, with prompt lookup, with
the model as its own draft (every candidate kept) and with another family's random model of the same vocabulary as
the draft (some kept, some not); eos ids, stop strings and streaming on top; sampling reproducible with a seed;
the refusals. The default run checks three families (one of each kind of layer), the whole table under -m slow;
the accept/reject rule's distribution is tests/runtime/test_speculative_sampling.py."""

from __future__ import annotations

import json

import lm_cases  # noqa: E402 - tests/peers is on sys.path (tests/conftest.py)
import numpy as np
import pytest
import torch

import zoo
from export import OnnxSession, export_onnx
from peers.lm import lm_from_hf
from peers.lm_rows import LM_FAMILIES

NEW = 20
FAST = ("llama", "gpt2", "gemma2")  # rotary gated pre-norm, learned positions and Conv1D, sandwich + softcaps
FAMILIES = [pytest.param(k, marks=() if k in FAST else pytest.mark.slow) for k in LM_FAMILIES if k in lm_cases.CASES]
PADS = (0, 4, 2)


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """(kind, precision, kv) -> (hf model, session of an all_logits export), made on first use."""
    made: dict = {}
    folder = tmp_path_factory.mktemp("spec")

    def get(kind: str, precision: str = "fp32", kv: str = "fp32"):
        if (kind, precision, kv) not in made:
            hf = lm_cases.hf_model(kind)
            path = folder / f"{kind}-{precision}-{kv}.onnx"
            export_onnx(lm_from_hf(hf).eval(), path, precision=precision, kv_precision=kv, max_len=64, all_logits=True)
            made[kind, precision, kv] = hf, OnnxSession(path, provider="cpu")
        return made[kind, precision, kv]

    return get


def padded_prompt() -> tuple[torch.Tensor, torch.Tensor]:
    """3 rows left-padded by PADS, each repeating a span of itself (so prompt lookup has something to propose)."""
    base = lm_cases.prompt(batch=3, t=6, seed=5)
    ids = torch.cat([base, base[:, :4], base[:, :2]], dim=1)  # (3, 12)
    mask = torch.ones_like(ids)
    for r, pad in enumerate(PADS):
        mask[r, :pad] = 0
        ids[r, :pad] = 0
    return ids, mask


def transformers_greedy(hf, ids, mask, new=NEW) -> torch.Tensor:
    with torch.no_grad():
        return hf.generate(
            ids, attention_mask=mask, max_new_tokens=new, do_sample=False, pad_token_id=0, eos_token_id=None
        )


def speculated(sess, ids, mask, **kw) -> tuple[torch.Tensor, dict]:
    timings: dict = {}
    out = sess.generate(ids, NEW, attention_mask=mask, eos_token_id=[], timings=timings, **kw)
    return out, timings["speculation"]


@pytest.mark.parametrize("kind", FAMILIES)
def test_greedy_speculation_gives_plain_and_transformers_tokens_on_a_padded_batch(kind, exports):
    hf, sess = exports(kind)
    ids, mask = padded_prompt()
    plain = sess.generate(ids, NEW, attention_mask=mask, eos_token_id=[])
    assert torch.equal(plain, transformers_greedy(hf, ids, mask))
    draft = exports("gpt2" if kind != "gpt2" else "llama")[1]  # another random model of the same vocabulary
    for kw in (
        dict(prompt_lookup_num_tokens=4),
        dict(prompt_lookup_num_tokens=8, max_matching_ngram_size=1),
        dict(assistant_model=sess, num_assistant_tokens=3),
        dict(assistant_model=draft, num_assistant_tokens=4),
    ):
        got, stats = speculated(sess, ids, mask, **kw)
        assert torch.equal(got, plain), (kind, kw, got.tolist(), plain.tolist())
        assert stats["emitted"] == 3 * (NEW - 1) and stats["proposed"] > 0
    assert speculated(sess, ids, mask, assistant_model=sess, num_assistant_tokens=3)[1]["acceptance_rate"] == 1.0


def test_rows_accept_their_own_counts_and_each_row_is_its_generation_alone(exports):
    _, sess = exports("llama")
    ids, mask = padded_prompt()
    got, stats = speculated(sess, ids, mask, prompt_lookup_num_tokens=4)
    assert stats["target_calls"] < 3 * (NEW - 1)  # some rounds kept candidates
    for r, pad in enumerate(PADS):
        alone, _ = speculated(sess, ids[r : r + 1, pad:], None, prompt_lookup_num_tokens=4)
        assert torch.equal(alone[0], got[r, pad:])


@pytest.mark.parametrize("wrong_at", [None, 1, 0])
def test_kept_candidates_advance_many_tokens_per_call_and_rejected_ones_are_rolled_back(exports, monkeypatch, wrong_at):
    """An oracle in prompt lookup's place proposes plain greedy's own next tokens (one of each round's made wrong
    at `wrong_at`): the tokens stay plain greedy's, and a round keeps exactly the candidates before the wrong one."""
    import runtime.speculative

    _, sess = exports("llama")
    ids = lm_cases.prompt(batch=1, t=8, seed=2)
    plain = sess.generate(ids, 40, eos_token_id=[])
    future = plain[0, 8:].numpy()

    def oracle(seq, k, max_ngram, eos):
        out = future[len(seq) - 8 : len(seq) - 8 + k].copy()
        if wrong_at is not None and len(out) > wrong_at:
            out[wrong_at] = (out[wrong_at] + 1) % lm_cases.VOCAB
        return out

    monkeypatch.setattr(runtime.speculative, "lookup", oracle)
    timings: dict = {}
    got = sess.generate(ids, 40, eos_token_id=[], prompt_lookup_num_tokens=6, timings=timings)
    assert torch.equal(got, plain)
    stats = timings["speculation"]
    if wrong_at is None:
        assert stats["acceptance_rate"] == 1.0 and stats["tokens_per_target_call"] > 3, stats
    elif wrong_at == 1:
        # one kept a round (a last round may have had room for none), the wrong one rolled back
        assert stats["target_calls"] - 1 <= stats["accepted"] < stats["proposed"], stats
    else:
        assert stats["accepted"] == 0 and stats["tokens_per_target_call"] == 1.0, stats


def test_eos_stop_strings_and_streaming_work_on_top(exports):
    _, sess = exports("llama")
    ids, mask = padded_prompt()
    plain = sess.generate(ids, NEW, attention_mask=mask, eos_token_id=[])
    eos = int(plain[0, ids.shape[1] + 3])  # row 0's fourth new token ends it
    want = sess.generate(ids, NEW, attention_mask=mask, eos_token_id=[eos, 1], pad_token_id=7)
    kw = dict(attention_mask=mask, eos_token_id=[eos, 1], pad_token_id=7)
    got = sess.generate(ids, NEW, prompt_lookup_num_tokens=4, **kw)
    assert torch.equal(got, want) and (got[0, ids.shape[1] + 4 :] == 7).all()
    steps = list(sess.stream(ids, NEW, attention_mask=mask, eos_token_id=[], prompt_lookup_num_tokens=4))
    assert np.array_equal(np.stack(steps, 1), plain[:, ids.shape[1] :].numpy())


def test_sampling_is_reproducible_with_a_seed_and_keeps_the_knobs(exports):
    _, sess = exports("llama")
    ids, mask = padded_prompt()
    knobs = dict(do_sample=True, temperature=0.8, top_k=20, repetition_penalty=1.1)
    for spec in (dict(prompt_lookup_num_tokens=4), dict(assistant_model=exports("gpt2")[1])):
        a = sess.generate(ids, NEW, attention_mask=mask, seed=3, **knobs, **spec)
        assert torch.equal(a, sess.generate(ids, NEW, attention_mask=mask, seed=3, **knobs, **spec))
        assert not torch.equal(a, sess.generate(ids, NEW, attention_mask=mask, seed=4, **knobs, **spec))


@pytest.mark.slow
@pytest.mark.parametrize(("precision", "kv"), [("int4", "fp32"), ("int8", "fp32"), ("fp32", "int8")])
def test_quantized_weights_and_the_int8_cache_speculate_their_own_greedy_tokens(precision, kv, exports):
    _, sess = exports("llama", precision, kv)
    ids, mask = padded_prompt()
    plain = sess.generate(ids, NEW, attention_mask=mask, eos_token_id=[])
    for kw in (dict(prompt_lookup_num_tokens=4), dict(assistant_model=exports("gpt2")[1])):
        assert torch.equal(speculated(sess, ids, mask, **kw)[0], plain)


def test_refusals_are_one_line(exports, tmp_path):
    hf, sess = exports("llama")
    ids = lm_cases.prompt(batch=1, t=5)
    last_only = export_onnx(lm_from_hf(hf).eval(), tmp_path / "last.onnx", max_len=64).path
    with pytest.raises(zoo.ArgumentError, match="all_logits=True"):
        OnnxSession(last_only, provider="cpu").generate(ids, 4, prompt_lookup_num_tokens=3)
    with pytest.raises(zoo.ArgumentError, match="not both"):
        sess.generate(ids, 4, prompt_lookup_num_tokens=3, assistant_model=sess)
    with pytest.raises(zoo.ArgumentError, match="prompt_lookup_num_tokens=0 must be an int >= 1"):
        sess.generate(ids, 4, prompt_lookup_num_tokens=0)
    with pytest.raises(zoo.ArgumentError, match="needs assistant_model"):
        sess.generate(ids, 4, num_assistant_tokens=3)
    with pytest.raises(zoo.InputTypeError, match="assistant_model must be an OnnxSession"):
        sess.generate(ids, 4, assistant_model="draft.onnx")


def _cli(argv, capsys) -> tuple[int, str, str]:
    from cli.main import main

    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_generate_speculates_and_reports_it(exports, tmp_path, capsys):
    _, sess = exports("llama")
    draft = exports("gpt2")[1]
    ids = ",".join(map(str, padded_prompt()[0][0].tolist()))
    argv = ["generate", str(sess.path), "--prompt-ids", ids, "--max-new-tokens", "12", "--eos-token-id", "1"]
    rc, out, err = _cli([*argv, "--json", str(tmp_path / "plain.json")], capsys)
    assert rc == 0, err
    plain = json.loads((tmp_path / "plain.json").read_text())
    for extra in (["--prompt-lookup", "4", "--ngram", "1"], ["--draft", str(draft.path), "--draft-tokens", "3"]):
        rc, out, err = _cli([*argv, *extra, "--json", str(tmp_path / "spec.json")], capsys)
        assert rc == 0, err
        doc = json.loads((tmp_path / "spec.json").read_text())
        spec = doc["timings"]["speculation"]
        assert doc["tokens"] == plain["tokens"] and spec["proposed"] > 0, (extra, doc)
        assert f"{spec['accepted']} of {spec['proposed']} candidates kept" in out
    rc, _, err = _cli([*argv, "--draft-tokens", "3"], capsys)
    assert rc == 2 and "--draft FOLDER" in err and len(err.strip().splitlines()) == 1
    last_only = tmp_path / "last.onnx"
    export_onnx(lm_from_hf(exports("llama")[0]).eval(), last_only, max_len=64)
    rc, _, err = _cli(["generate", str(last_only), "--prompt-ids", ids, "--prompt-lookup", "3"], capsys)
    assert rc == 2 and "all_logits=True" in err and len(err.strip().splitlines()) == 1, err


def test_a_prompt_in_chunks_of_several_widths_prefills_an_all_logits_export(exports, monkeypatch):
    """One row's prompt runs in chunks (generation.prefill_chunk); an all_logits export's logits are (1, chunk, v),
    and a last, shorter chunk once ran into the first one's output (ONNX Runtime refused its shape)."""
    import runtime.generation

    _, sess = exports("llama")
    ids = lm_cases.prompt(batch=1, t=12, seed=9)
    whole = sess.generate(ids, 6, eos_token_id=[])
    monkeypatch.setattr(runtime.generation, "PREFILL_CHUNK", 5)  # chunks of 5, 5 and 2
    assert torch.equal(sess.generate(ids, 6, eos_token_id=[]), whole)
    assert torch.equal(sess.generate(ids, 6, eos_token_id=[], prompt_lookup_num_tokens=3), whole)


def test_a_row_call_binds_held_buffers_up_to_held_tokens_and_allocates_past_them(exports):
    """RowCalls.run: a chunk of at most HELD tokens (a verify call) binds views of one ids and one logits buffer
    made once; a longer one (a server's prefill) allocates its own, so what a row holds stays (1, HELD, v) whatever
    the lengths it ran. Causal: each call's logits are the leading rows of a longer call's after the same past."""
    from runtime.candidates import HELD, RowCalls
    from runtime.device_decode import LeftRows

    _, sess = exports("llama")
    ids = lm_cases.prompt(batch=1, t=12 + HELD + 3, seed=4).numpy()
    rows = LeftRows(sess, 1, 12, 64, None, False, lambda x: x.argmax(-1))
    rows.prefill(np.ascontiguousarray(ids[:, :12]), 64)
    calls = RowCalls(sess, rows, 0)
    runs = {}
    for t in (HELD + 3, 2, HELD, 5):  # allocated, held, held, held again after a longer held call
        calls.length = 12
        runs[t] = calls.run(ids[0, 12 : 12 + t]).copy()
        assert calls.length == 12 + t
    for t in (2, 5, HELD):
        np.testing.assert_allclose(runs[t], runs[HELD + 3][:t], rtol=1e-5, atol=1e-5)
    assert sorted(calls.chunks) == [2, 5, HELD]  # only the held lengths, views of the buffers below
    assert calls.chunk_ids.shape == (1, HELD) and calls.chunk_logits.shape[:2] == (1, HELD)
