"""Encoder-decoders exported whole (export/seq2seq_export.py) and generated from under ONNX Runtime
(export/seq2seq_session.py): greedy tokens equal transformers' generate(num_beams=1, do_sample=False) on a
right-padded batch, with the checkpoint's decoder start and forced eos, an eos that ends rows early, and a
forced bos; the pair's names; the CLI's export --whole and generate on a folder made here.

T5 v1.1 (gated, buckets), BART and Marian (sinusoidal positions, its pad id banned) export in the default run
(one session-scoped export each); T5 v1.0, mBART and Marian with a decoder vocabulary of its own under -m slow."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
import seq2seq_cases  # noqa: E402 - tests/peers is on sys.path (tests/conftest.py)
import torch

from cli.main import main as cli
from export.seq2seq_export import seq2seq_paths
from export.seq2seq_session import Seq2SeqSession

NEW = 12
FAST = ("t5-gated", "bart", "marian")


@pytest.fixture(scope="session")
def pairs(seq2seq_pairs):
    """case -> (checkpoint folder, transformers model, the export's PATH): tests/conftest.py's, shared."""
    return seq2seq_pairs


def cases() -> list:
    return [pytest.param(c, marks=() if c in FAST else pytest.mark.slow) for c in seq2seq_cases.CASES]


def hf_generate(hf, ids, mask, **kw) -> torch.Tensor:
    if not seq2seq_cases.cached_generate_ok(hf):  # transformers' cache is wrong for it: its uncached loop
        kw.setdefault("use_cache", False)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW, num_beams=1, do_sample=False, **kw)


@pytest.mark.parametrize("case", cases())
def test_greedy_tokens_equal_transformers(case, pairs):
    _, hf, path = pairs(case)
    sess = Seq2SeqSession(path)
    ids, mask = seq2seq_cases.batch()
    want = hf_generate(hf, ids, mask)
    got = sess.generate(ids, NEW, mask)
    assert torch.equal(got, want), f"{case}:\n{got}\n{want}"
    # an eos that one row makes early: that row is padded after it, as transformers pads it
    eos = int(want[0, 4])
    want = hf_generate(hf, ids, mask, eos_token_id=eos, forced_eos_token_id=None, forced_bos_token_id=7)
    got = sess.generate(ids, NEW, mask, eos_token_id=eos, forced_eos_token_id=None, forced_bos_token_id=7)
    assert torch.equal(got, want), f"{case} (eos {eos}, forced bos 7):\n{got}\n{want}"
    assert (got[:, 1] == 7).all()


def test_every_listed_eos_id_ends_a_row(pairs):
    """eos_token_id may be a list (generation_config.json): each id ends a row, as in transformers' generate."""
    _, hf, path = pairs("marian")
    ids, mask = seq2seq_cases.batch()
    free = hf_generate(hf, ids, mask, forced_eos_token_id=None)
    first = int(free[0, 2])
    other = next(int(t) for t in free[1:, 1:].flatten() if t != first)
    kw = dict(eos_token_id=[first, other], forced_eos_token_id=None)
    want = hf_generate(hf, ids, mask, **kw)
    got = Seq2SeqSession(path).generate(ids, NEW, mask, **kw)
    assert torch.equal(got, want), f"eos {[first, other]}:\n{got}\n{want}"
    stops = {int(t) for row in got for t in row[1:] if t in (first, other)}
    assert stops == {first, other}, f"rows ended at {stops}: each listed id should end one here"
    assert (got[:, 2:] == hf.config.pad_token_id).any()  # an ended row is padded while others go on


def test_suppressed_tokens_are_never_made(pairs):
    """Marian's generation_config bans its pad id (bad_words_ids [[pad]]); a banned id is never generated and the
    next best token is taken, as transformers' generate does."""
    _, hf, path = pairs("marian")
    sess = Seq2SeqSession(path)
    assert sess.generation["suppress_tokens"] == [hf.config.pad_token_id]
    ids, mask = seq2seq_cases.batch()
    free = sess.generate(ids, NEW, mask, suppress_tokens=None)
    banned = int(free[1, 2])
    want = hf_generate(hf, ids, mask, bad_words_ids=[[banned]])
    got = sess.generate(ids, NEW, mask, suppress_tokens=[banned])
    assert torch.equal(got, want) and not (got[:, 1:] == banned).any(), f"banned {banned}:\n{got}\n{want}"


def test_bart_forces_eos_at_the_budget(pairs):
    """BART's generation_config.json holds forced_eos_token_id=2: the last token a budget allows is eos."""
    _, _, path = pairs("bart")
    ids, mask = seq2seq_cases.batch(seed=3)
    got = Seq2SeqSession(path).generate(ids.numpy(), 6, mask.numpy())
    assert isinstance(got, np.ndarray) and got.shape[1] <= 7 and (got[:, 0] == 2).all()
    assert ((got == 2).sum(axis=1) >= 2).all()  # the start token, then an eos in every row


def test_the_pair_takes_the_ecosystems_names(pairs):
    _, hf, path = pairs("t5-gated")
    enc, dec = seq2seq_paths(path)
    assert (enc.name, dec.name) == ("t5-gated.encoder.onnx", "t5-gated.decoder.onnx")
    e = onnx.load(enc, load_external_data=False).graph
    d = onnx.load(dec, load_external_data=False).graph
    assert [x.name for x in e.input] == ["input_ids", "attention_mask"]
    assert [x.name for x in e.output][:3] == [
        "encoder_hidden_states",
        "present.0.encoder.key",
        "present.0.encoder.value",
    ]
    names = [x.name for x in d.input]
    assert names[:4] == ["input_ids", "encoder_attention_mask", "past_len", "past_key_values.0.decoder.key"]
    layers = hf.config.num_decoder_layers
    assert names[3 + 2 * layers] == "past_key_values.0.encoder.key" and len(names) == 3 + 4 * layers
    assert [x.name for x in d.output][:3] == ["logits", "next_token", "present.0.decoder.key"]


def test_cli_generate_on_the_export_reads_its_tokenizer(pairs, capsys):
    folder, _, path = pairs("bart")
    tok = path.with_name("bart.tokenizer.json")
    assert tok.read_bytes() == (folder / "tokenizer.json").read_bytes()  # export --whole copied it
    assert cli(["generate", str(path), "--prompt", "w5 w9 w33 w7", "--max-new-tokens", "4"]) == 0
    out = capsys.readouterr().out
    ids, _ = seq2seq_cases.batch()
    tokens = [int(t) for t in out.split("tokens", 1)[1].splitlines()[0].split()]
    want = hf_generate(pairs("bart")[1], torch.tensor([[5, 9, 33, 7]]), None)[0, : len(tokens)].tolist()
    assert tokens[:-1] == want[: len(tokens) - 1] and "text   'w5 w9 w33 w7' ->" in out


@pytest.mark.slow
def test_cli_generate_on_a_folder(pairs, tmp_path, monkeypatch, capsys):
    folder, _, _ = pairs("t5-gated")
    monkeypatch.setenv("ATTNZOO_CACHE", str(tmp_path))
    assert cli(["generate", str(folder), "--prompt", "w5 w9", "--max-new-tokens", "3"]) == 0
    assert "exporting" in capsys.readouterr().out
    assert cli(["generate", str(folder), "--prompt", "w5 w9", "--max-new-tokens", "3"]) == 0
    assert "exporting" not in capsys.readouterr().out  # the second run finds the cached pair
