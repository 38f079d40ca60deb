"""Encoder-decoders generate as decoders do (runtime/seq2seq_generation.py): every generation_config key's greedy
tokens equal transformers' generate on a right-padded batch (T5 and BART); sampled first tokens follow
transformers' processed distribution; seeds reproduce, one stream per row; stop strings, streaming and logprobs;
and the CLI's --temperature, --seed, --stop, --stream and --chat act (or are refused in one line)."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import seq2seq_cases
import torch
from hf_generation import hf_processors

import zoo
from cli.main import main as cli
from runtime.seq2seq_session import Seq2SeqSession

NEW = 10


def _hf(hf, ids, mask, new=NEW, **kw) -> torch.Tensor:
    if not seq2seq_cases.cached_generate_ok(hf):
        kw.setdefault("use_cache", False)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, num_beams=1, **kw)


def _cases(free: np.ndarray) -> list[dict]:
    new = free[:, 1:]
    first, second = int(new[0, 0]), int(new[0, 1])
    common = int(np.bincount(new.ravel()).argmax())
    return [
        {"no_repeat_ngram_size": 2},
        {"repetition_penalty": 2.5},
        {"encoder_no_repeat_ngram_size": 1},
        {"encoder_repetition_penalty": 0.2},
        {"bad_words_ids": [[first, second], [common]]},
        {"sequence_bias": [[[first], -30.0], [[first, 7], 3.0]]},
        {"suppress_tokens": [first], "begin_suppress_tokens": [int(new[1, 0])]},
        {"eos_token_id": common, "min_new_tokens": 6},
    ]


@pytest.mark.parametrize("case", ["bart", pytest.param("t5-gated", marks=pytest.mark.slow)])
def test_each_key_gives_transformers_greedy_tokens(case, seq2seq_pairs):
    _, hf, path = seq2seq_pairs(case)
    sess = Seq2SeqSession(path)
    ids, mask = seq2seq_cases.batch()
    free = sess.generate(ids, NEW, mask)
    assert free.tolist() == _hf(hf, ids, mask, do_sample=False).tolist()
    for keys in _cases(free.numpy()):
        want = _hf(hf, ids, mask, do_sample=False, **keys)
        got = sess.generate(ids, NEW, mask, **keys)
        assert got.tolist() == want.tolist(), keys
        if not any(k.startswith("encoder_") for k in keys):  # random models rarely make an input token
            assert got.tolist() != free.tolist(), f"{keys} changed nothing: a weak case"


def test_sampled_first_tokens_follow_transformers(seq2seq_pairs):
    """num_return_sequences=3000 copies of one input, each its own stream: their first tokens against transformers'
    processed distribution of that step (its model's logits through its own processors)."""
    _, hf, path = seq2seq_pairs("bart")
    sess = Seq2SeqSession(path)
    ids, mask = seq2seq_cases.batch()
    ids, mask = ids[:1], mask[:1]
    start = sess.generation["decoder_start_token_id"]
    plain = {"decoder_start_token_id": start, "eos_token_id": 2, "pad_token_id": 1}  # no forced eos: step 1 free
    keys = {"do_sample": True, "temperature": 1.4, "top_k": 25, "top_p": 0.95}
    with torch.no_grad():
        logits = hf(input_ids=ids, attention_mask=mask, decoder_input_ids=torch.tensor([[start]])).logits[:, -1]
    procs = hf_processors(keys, input_len=1, max_new_tokens=2, eos=[2], encoder_ids=ids, encoder_decoder=True)
    want = procs(torch.tensor([[start]]), logits).softmax(-1)[0].numpy()
    n = 3000
    got = sess.generate(ids, 2, mask, generation_config=plain, num_return_sequences=n, seed=2, **keys)
    counts = np.bincount(got[:, 1], minlength=len(want))
    assert counts[want == 0].sum() == 0
    tv = 0.5 * np.abs(counts / n - want).sum()
    assert tv < 0.08, tv
    assert (counts > 0).sum() > 8


def test_seeds_reproduce_and_each_row_draws_its_own_stream(seq2seq_pairs):
    _, _, path = seq2seq_pairs("bart")
    sess = Seq2SeqSession(path)
    ids, mask = seq2seq_cases.batch()
    kw = {"temperature": 1.5, "top_k": 0}
    a = sess.generate(ids, NEW, mask, seed=5, **kw)
    assert (a == sess.generate(ids, NEW, mask, seed=5, **kw)).all()
    assert (a != sess.generate(ids, NEW, mask, seed=6, **kw)).any()
    assert (a != sess.generate(ids, NEW, mask)).any()  # sampled, not greedy
    alone = sess.generate(ids[2:3], NEW, mask[2:3], seed=9, **kw)
    both = sess.generate(ids, NEW, mask, seed=[1, 2, 9, 4], **kw)
    assert both[2, : alone.shape[1]].tolist() == alone[0].tolist()


def test_stop_strings_streaming_and_logprobs(seq2seq_pairs):
    folder, hf, path = seq2seq_pairs("bart")
    sess = Seq2SeqSession(path)
    tok = str(folder / "tokenizer.json")
    prompt = "w5 w9 w33 w7 w12"
    text = "".join(sess.stream(prompt, NEW, tokenizer=tok, eos_token_id=[], forced_eos_token_id=None))
    words = text.split()
    assert len(words) >= 4
    stop = words[3]
    cut = "".join(sess.stream(prompt, NEW, tokenizer=tok, stop=stop, eos_token_id=[], forced_eos_token_id=None))
    assert cut == text[: text.index(stop)]
    ids = torch.tensor([[5, 9, 33, 7, 12]])
    from runtime.seq2seq_generation import Seq2SeqGeneration

    run = Seq2SeqGeneration(sess, ids, 4, logprobs=True)
    tokens = run.run()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = hf.generate(
            input_ids=ids, max_new_tokens=4, do_sample=False, output_logits=True, return_dict_in_generate=True
        )
    want = [torch.log_softmax(step[0], -1)[t].item() for step, t in zip(out.logits, out.sequences[0, 1:])]
    assert tokens[0].tolist() == out.sequences[0].tolist()
    assert np.allclose(run.logprobs[0], want, atol=1e-4)


def test_cli_sampling_seed_stop_stream_and_chat_act_on_an_encoder_decoder(seq2seq_pairs, tmp_path, capsys):
    _, _, path = seq2seq_pairs("bart")
    base = ["generate", str(path), "--prompt", "w5 w9 w33 w7", "--max-new-tokens", "8"]

    def run(*flags) -> dict:
        out = tmp_path / "out.json"
        assert cli([*base, *flags, "--json", str(out)]) == 0
        return json.loads(out.read_text())

    greedy = run()
    sampled = run("--temperature", "1.5", "--top-k", "0", "--seed", "3")
    assert (
        sampled["seed"] == 3
        and sampled["tokens"] == run("--temperature", "1.5", "--top-k", "0", "--seed", "3")["tokens"]
    )
    assert sampled["tokens"] != greedy["tokens"] and greedy["seed"] is None
    assert len(greedy["logprobs"][0]) == len(greedy["tokens"][0]) - 1
    word = greedy["text"][0].split()[1]
    stopped = run("--stop", word)
    assert (
        stopped["finish_reason"] == ["stop"]
        and stopped["text"][0] == greedy["text"][0][: greedy["text"][0].index(word)]
    )
    capsys.readouterr()
    assert cli([*base, "--stream"]) == 0
    assert f"'w5 w9 w33 w7' -> {greedy['text'][0]}" in capsys.readouterr().out
    assert cli([*base, "--chat"]) == 2  # no chat template in the folder: one line
    err = capsys.readouterr().err
    assert "no chat template" in err and len(err.strip().splitlines()) == 1
    assert cli([*base, "--kv-precision", "int8"]) == 2
    assert "--kv-precision int8 is for decoder-only" in capsys.readouterr().err


def test_a_key_not_applied_is_refused_and_a_checkpoints_is_said(seq2seq_pairs):
    _, _, path = seq2seq_pairs("bart")
    sess = Seq2SeqSession(path)
    ids, mask = seq2seq_cases.batch()
    with pytest.raises(zoo.ArgumentError, match="num_beam_groups"):
        sess.generate(ids, 2, mask, num_beam_groups=2)
    with pytest.warns(UserWarning, match="num_beam_groups=2"):
        sess.generate(ids, 2, mask, generation_config={**sess.generation, "num_beam_groups": 2})
