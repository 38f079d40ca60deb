"""Every generation_config key that changes tokens, end to end on a decoder (runtime/generation.py over the
processors): greedy tokens equal transformers' `generate` on the same random LLaMA, a left-padded batch, key by
key; a checkpoint's generation_config applies by default (recorded in the export, and read from a folder by
`attnzoo generate` without being passed); sampled first tokens with num_return_sequences follow transformers'
processed distribution; a key that is not applied is refused by name (call) or said (checkpoint)."""

from __future__ import annotations

import json
import warnings

import lm_cases
import numpy as np
import pytest
import torch
from hf_generation import hf_processors

import zoo
from cli.main import main as cli
from export import OnnxSession, export_onnx
from runtime import generation

NEW = 10
PADS = (0, 3, 5)
BASE = {"eos_token_id": 2, "pad_token_id": 0}


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    """(transformers model, session of its export, ids, mask, its free greedy tokens)."""
    hf = lm_cases.hf_model("llama")
    ids = lm_cases.prompt(batch=3, t=8)
    mask = torch.ones_like(ids)
    for r, pad in enumerate(PADS):
        mask[r, :pad], ids[r, :pad] = 0, 0
    path = export_onnx(zoo.lm_from_hf(hf), tmp_path_factory.mktemp("genconf") / "lm.onnx", max_len=64).path
    free = _hf(hf, ids, mask, eos_token_id=None)
    return hf, OnnxSession(path, provider="cpu"), ids, mask, free


def _hf(hf, ids, mask, **keys):
    kw = {**BASE, **keys}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, **kw).numpy()


def _cases(free: np.ndarray) -> list[dict]:
    """Keys chosen from the model's own free run, so each one changes the tokens."""
    new = free[:, 8:]
    first, second, third = (int(x) for x in new[0, :3])
    common = int(np.bincount(new.ravel()).argmax())
    return [
        {"suppress_tokens": [first, common]},
        {"begin_suppress_tokens": [first, int(new[1, 0])]},
        {"bad_words_ids": [[first], [second, third], [int(new[2, 0]), int(new[2, 1])]]},
        {"eos_token_id": common, "min_new_tokens": 5},
        {"eos_token_id": common, "min_length": 14},
        {"eos_token_id": [common, 77], "forced_eos_token_id": 77},
        {"eos_token_id": common, "exponential_decay_length_penalty": [2, 3.0]},
        {"no_repeat_ngram_size": 2},
        {"no_repeat_ngram_size": 1},
        {"encoder_no_repeat_ngram_size": 1},
        {"repetition_penalty": 2.0},
        {"encoder_repetition_penalty": 0.3},
        {"sequence_bias": [[[second], 4.0], [[first, 55], 9.0]]},
        {"renormalize_logits": True, "remove_invalid_values": True, "suppress_tokens": [common]},
        {"forced_bos_token_id": 5},  # a decoder's prompt is longer than one token: transformers never forces it
    ]


def test_each_key_gives_transformers_greedy_tokens_on_a_left_padded_batch(lm):
    hf, sess, ids, mask, free = lm
    plain = _hf(hf, ids, mask).tolist()
    for keys in _cases(free):
        want = _hf(hf, ids, mask, **keys)
        got = sess.generate(ids.numpy(), NEW, mask.numpy(), generation_config={**BASE, **keys})
        assert got.tolist() == want.tolist(), keys
        if "forced_bos_token_id" not in keys:
            assert got.tolist() != plain, f"{keys} changed nothing: a weak case"


def test_the_keys_given_to_the_call_act_as_the_checkpoints(lm):
    hf, sess, ids, mask, free = lm
    keys = {"no_repeat_ngram_size": 2, "min_new_tokens": 4}
    want = _hf(hf, ids, mask, **keys)
    assert sess.generate(ids.numpy(), NEW, mask.numpy(), generation_config=BASE, **keys).tolist() == want.tolist()


def test_a_recorded_generation_config_applies_without_being_passed(lm, tmp_path, monkeypatch):
    """The export records the checkpoint's generation_config; generate reads it by default (51.15). With that
    path switched off (an empty config), the tokens are the unconstrained ones."""
    hf, _, ids, mask, free = lm
    keys = {**BASE, "suppress_tokens": [int(free[0, 8])], "no_repeat_ngram_size": 2}
    path = export_onnx(zoo.lm_from_hf(hf), tmp_path / "rec.onnx", max_len=64, generation_config=keys).path
    sess = OnnxSession(path, provider="cpu")
    want = _hf(hf, ids, mask, **keys)
    assert sess.generate(ids.numpy(), NEW, mask.numpy()).tolist() == want.tolist()
    monkeypatch.setattr(generation, "generation_defaults", lambda sess: {})
    assert sess.generate(ids.numpy(), NEW, mask.numpy()).tolist() != want.tolist()


def test_attnzoo_generate_applies_a_folders_generation_config(lm, tmp_path, monkeypatch):
    """A checkpoint folder's generation_config.json, read by `attnzoo generate FOLDER` without a flag: its tokens
    are transformers' generate of the folder's model (which reads the same file)."""
    hf, _, _, _, free = lm
    folder = lm_cases.saved("llama", tmp_path)
    keys = {"eos_token_id": 2, "suppress_tokens": [int(x) for x in free[0, 8:10]], "min_new_tokens": 6}
    (folder / "generation_config.json").write_text(json.dumps(keys))
    monkeypatch.setenv("ATTNZOO_CACHE", str(tmp_path / "cache"))
    prompt = [int(x) for x in lm_cases.prompt(batch=1, t=8)[0]]
    out = tmp_path / "out.json"
    assert cli(["generate", str(folder), "--prompt-ids", ",".join(map(str, prompt)), "--max-new-tokens", str(NEW),
                "--provider", "cpu", "--json", str(out)]) == 0  # fmt: skip
    got = json.loads(out.read_text())["tokens"]
    want = _hf(hf, torch.tensor([prompt]), None, **keys)
    assert got == want.tolist()


def test_sampled_first_tokens_of_num_return_sequences_follow_transformers(lm):
    """One prompt, num_return_sequences=3000, one new token each (every copy its own stream): the draws against
    transformers' processed distribution of that step (its model's logits through its own processors)."""
    hf, sess, ids, _, _ = lm
    keys = {"do_sample": True, "temperature": 1.5, "top_k": 20, "repetition_penalty": 1.3}
    prompt = ids[:1]
    with torch.no_grad():
        logits = hf(prompt).logits[:, -1]
    want = hf_processors(keys, input_len=8, max_new_tokens=1, eos=[2])(prompt, logits).softmax(-1)[0].numpy()
    n = 3000
    got = sess.generate(prompt.numpy(), 1, generation_config=BASE, num_return_sequences=n, seed=4, **keys)
    assert got.shape == (n, 9) and (got[:, :8] == prompt.numpy()).all()
    counts = np.bincount(got[:, 8], minlength=len(want))
    assert counts[want == 0].sum() == 0
    kept = want > 0
    tv = 0.5 * np.abs(counts / n - want).sum()  # total variation: ~0.04 expected for 20 tokens at n = 3000
    assert tv < 0.08, tv
    assert (counts[kept] > 0).sum() > 10  # the draws spread over the kept tokens


def test_a_key_not_applied_is_refused_in_a_call_and_said_from_a_checkpoint(lm):
    _, sess, ids, mask, _ = lm
    for keys in ({"num_beam_groups": 2}, {"guidance_scale": 2.0}, {"penalty_alpha": 0.6}, {"watermarking_config": {}}):
        with pytest.raises(zoo.ArgumentError, match=next(iter(keys))):
            sess.generate(ids.numpy(), 2, mask.numpy(), **keys)
    with pytest.warns(UserWarning, match="num_beam_groups=2"):
        run = generation.Generation(
            sess, ids.numpy(), 2, mask.numpy(), generation_config={**BASE, "num_beam_groups": 2}
        )
    assert "num_beam_groups=2" in run.note and "group beam search" in run.note
    # a checkpoint's beams run in generate(); a path of greedy or sampled tokens says it does not run them
    with pytest.warns(UserWarning, match="num_beams=4"):
        run = generation.Generation(sess, ids.numpy(), 2, mask.numpy(), generation_config={**BASE, "num_beams": 4})
    assert "beam search runs in generate()" in run.note
    with pytest.raises(zoo.ArgumentError, match="num_return_sequences"):
        sess.generate(ids.numpy(), 2, mask.numpy(), num_return_sequences=2)  # greedy copies: refused as there
