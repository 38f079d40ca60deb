"""The logits processors (runtime/processors.py, runtime/warpers.py) against transformers' own: for each
generation key (and combinations), the list `logits_processors` builds and the one transformers' generate builds
(`_get_logits_processor`, tests/peers/hf_generation.py) have the same units in the same order, and each unit
gives transformers' scores to 1e-6 on a left-padded batch over several steps (prompt and new tokens), for a
decoder and for an encoder-decoder's decoder."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hf_generation import hf_processors

from runtime import processors as ours
from runtime.sampling import resolve

V, EOS, NEW = 64, (2,), 6
DECODER_CASES = [
    {"sequence_bias": [[[5], 2.5], [[7, 8, 11], -4.0], [[3, 9], 1.5], [[8, 11], 0.5]]},
    {"encoder_repetition_penalty": 1.4},
    {"repetition_penalty": 1.3},
    {"repetition_penalty": 0.7},
    {"no_repeat_ngram_size": 2},
    {"no_repeat_ngram_size": 1},
    {"no_repeat_ngram_size": 3},
    {"encoder_no_repeat_ngram_size": 2},
    {"bad_words_ids": [[4], [7, 8, 13], [2], [8, 6]]},  # [2] is the eos id: left out, as transformers does
    {"min_length": 12},
    {"min_new_tokens": 3},
    {"min_new_tokens": 2, "min_length": 20},
    {"forced_eos_token_id": 2},
    {"forced_eos_token_id": [5, 3]},
    {"forced_bos_token_id": 7},  # a decoder's prompt is longer than 1: never fires
    {"remove_invalid_values": True},
    {"exponential_decay_length_penalty": (1, 1.5)},
    {"suppress_tokens": [1, 5, 6]},
    {"begin_suppress_tokens": [5, 2]},
    {"renormalize_logits": True},
    {"do_sample": True},  # top_k 50 is transformers' default
    {"do_sample": True, "temperature": 0.7, "top_k": 0},
    {"do_sample": True, "top_k": 5},
    {"do_sample": True, "top_p": 0.8},
    {"do_sample": True, "top_p": 0.0},
    {"do_sample": True, "min_p": 0.1},
    {"do_sample": True, "top_h": 0.6},
    {"do_sample": True, "typical_p": 0.7},
    {"do_sample": True, "epsilon_cutoff": 0.02},
    {"do_sample": True, "eta_cutoff": 0.05},
    {"do_sample": True, "top_k": 10, "top_p": 0.7, "typical_p": 0.8, "min_p": 0.05, "renormalize_logits": True},
    {"do_sample": True, "temperature": 1.3, "top_k": 12, "epsilon_cutoff": 0.01, "eta_cutoff": 0.01, "top_h": 0.9},
    {
        "repetition_penalty": 1.2,
        "no_repeat_ngram_size": 2,
        "bad_words_ids": [[4]],
        "min_new_tokens": 2,
        "suppress_tokens": [6],
        "sequence_bias": [[[9], -1.0]],
        "do_sample": True,
        "temperature": 0.8,
        "top_p": 0.9,
    },
]
SEQ2SEQ_CASES = [
    {"forced_bos_token_id": 7},
    {"forced_bos_token_id": 7, "begin_suppress_tokens": [5, 9]},
    {"begin_suppress_tokens": [5, 9]},
    {"encoder_no_repeat_ngram_size": 2},
    {"encoder_no_repeat_ngram_size": 1},
    {"encoder_repetition_penalty": 0.8},
    {"repetition_penalty": 1.5},
    {"no_repeat_ngram_size": 2},
    {"min_new_tokens": 3, "forced_eos_token_id": 2},
    {"exponential_decay_length_penalty": (2, 1.2)},
]


def _name(keys: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in keys.items())


def _batch(seed: int, b: int = 4, t: int = 9):
    """A left-padded prompt (b t) over a small alphabet (n-grams repeat), its mask, and NEW more columns."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, 12, (b, t + NEW))
    ids[0, t - 2 : t] = (7, 8)  # row 0's prompt ends with a biased / banned sequence's prefix
    mask = np.ones((b, t), np.int64)
    for r, pad in enumerate((0, 3, 1, 5)[:b]):
        mask[r, :pad] = 0
        ids[r, :pad] = 0  # the pad id, as a left-padded batch holds it
    return ids, mask


def _scores(rng, b: int) -> np.ndarray:
    s = (rng.standard_normal((b, V)) * 3).astype(np.float32)
    s[0, 3] = -np.inf  # a token the model rules out
    return s


def _compare(keys, ids, prompt_len, mask, encoder_ids, encoder_decoder):
    settings = resolve(keys)
    mine = ours.logits_processors(
        settings,
        input_len=prompt_len,
        max_length=prompt_len + NEW,
        eos=EOS,
        prompt=None if encoder_decoder else ids[:, :prompt_len],
        mask=mask,
        encoder_ids=encoder_ids,
    )
    theirs = hf_processors(
        keys,
        input_len=prompt_len,
        max_new_tokens=NEW,
        eos=list(EOS),
        mask=None if mask is None else torch.from_numpy(mask),
        encoder_ids=torch.from_numpy(encoder_ids if encoder_decoder else ids[:, :prompt_len]),
        encoder_decoder=encoder_decoder,
    )
    assert [type(p).__name__ for p in mine] == [_ours_for(type(p).__name__) for p in theirs]
    rng = np.random.default_rng(1)
    for step in range(NEW):
        cur = ids[:, : prompt_len + step]
        scores = _scores(rng, len(ids))
        if keys.get("remove_invalid_values"):
            scores[1, 4], scores[2, 5] = np.nan, np.inf
        a, b = scores, torch.from_numpy(scores.copy())
        for mine_p, their_p in zip(mine, theirs):
            a = mine_p(cur, a)
            b = their_p(torch.from_numpy(cur), b)
            want = b.numpy()
            assert a.dtype == np.float32
            assert (np.isneginf(a) == np.isneginf(want)).all(), f"{type(mine_p).__name__} at step {step}"
            np.testing.assert_allclose(a, want, rtol=1e-6, atol=1e-6, err_msg=f"{type(mine_p).__name__} step {step}")


HF_NAMES = {  # transformers' class -> ours
    "SequenceBiasLogitsProcessor": "SequenceBias",
    "NoBadWordsLogitsProcessor": "NoBadWords",
    "EncoderRepetitionPenaltyLogitsProcessor": "EncoderRepetitionPenalty",
    "RepetitionPenaltyLogitsProcessor": "RepetitionPenalty",
    "NoRepeatNGramLogitsProcessor": "NoRepeatNGram",
    "EncoderNoRepeatNGramLogitsProcessor": "EncoderNoRepeatNGram",
    "MinLengthLogitsProcessor": "MinLength",
    "MinNewTokensLengthLogitsProcessor": "MinNewTokens",
    "ForcedBOSTokenLogitsProcessor": "ForcedBOS",
    "ForcedEOSTokenLogitsProcessor": "ForcedEOS",
    "InfNanRemoveLogitsProcessor": "InfNanRemove",
    "ExponentialDecayLengthPenalty": "ExponentialDecayLengthPenalty",
    "SuppressTokensLogitsProcessor": "SuppressTokens",
    "SuppressTokensAtBeginLogitsProcessor": "SuppressTokensAtBegin",
    "LogitNormalization": "LogitNormalization",
    "TemperatureLogitsWarper": "Temperature",
    "TopHLogitsWarper": "TopH",
    "TopKLogitsWarper": "TopK",
    "TopPLogitsWarper": "TopP",
    "MinPLogitsWarper": "MinP",
    "TypicalLogitsWarper": "Typical",
    "EpsilonLogitsWarper": "Epsilon",
    "EtaLogitsWarper": "Eta",
}


def _ours_for(hf_name: str) -> str:
    return HF_NAMES.get(hf_name, f"(no unit for {hf_name})")


@pytest.mark.parametrize("keys", DECODER_CASES, ids=_name)
def test_each_unit_is_transformers_on_a_left_padded_decoder_batch(keys):
    ids, mask = _batch(0)
    _compare(keys, ids, 9, mask, None, encoder_decoder=False)


@pytest.mark.parametrize("keys", SEQ2SEQ_CASES, ids=_name)
def test_each_unit_is_transformers_on_an_encoder_decoders_tokens(keys):
    ids, _ = _batch(2)
    ids[:, 0] = 0  # the decoder start
    dec = ids[:, 8:]  # (b, 1 + NEW): the start token, then the new tokens
    encoder_ids = _batch(3)[0][:, :7]
    _compare(keys, dec, 1, None, encoder_ids, encoder_decoder=True)


def test_the_repetition_penalty_skips_a_decoders_left_padding_as_transformers_generate_does():
    """transformers' generate passes each row's left padding (its attention mask) as prompt_ignore_length: the
    pad id is not penalised in a padded row; the bare processor without it penalises it."""
    ids, mask = _batch(0)
    prompt = ids[:, :9]
    scores = np.zeros((4, V), np.float32) + 1.0
    got = ours.logits_processors(resolve({"repetition_penalty": 2.0}), input_len=9, max_length=None, mask=mask)
    out = got(prompt, scores)
    assert 0 not in prompt[0] and (out[1:, 0] == 1.0).all()  # pad 0 only in padding: not penalised
    theirs = hf_processors({"repetition_penalty": 2.0}, input_len=9, max_new_tokens=1, mask=torch.from_numpy(mask))
    assert (theirs(torch.from_numpy(prompt), torch.from_numpy(scores)).numpy() == out).all()
    bare = ours.RepetitionPenalty(2.0)(prompt, scores)  # no mask: the pad id counts, as the bare processor
    assert (bare[1:, 0] == 0.5).all()
