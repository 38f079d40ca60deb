"""Whole encoders against transformers (last hidden state, padded batches) and sentence-transformers folders
against SentenceTransformer.encode, eager; every family of peers/encoder_rows.py has a case."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("sentence_transformers", reason="sentence-transformers is in the test extras")

import encoder_cases as cases  # noqa: E402

import zoo  # noqa: E402
from peers.encoder_rows import ENCODER_FAMILIES  # noqa: E402
from peers.sentence import sentence_encoder, tokenizer_facts  # noqa: E402
from runtime.embedding import TextTokenizer  # noqa: E402

ATOL = 1e-5  # of the reference's scale, fp32

# (family, pooling mode(s), Normalize): every family, every modelled pooling mode
SENTENCE_CASES = [
    ("bert", "mean", True),
    ("roberta", "cls", False),
    ("xlm-roberta", "mean_sqrt_len_tokens", True),
    ("distilbert", "max", True),
    ("modernbert", ("mean", "cls"), False),
]


def test_every_family_has_a_case():
    assert set(cases.FAMILIES) == set(ENCODER_FAMILIES)
    assert {f for f, _, _ in SENTENCE_CASES} == set(ENCODER_FAMILIES)


@pytest.fixture(scope="module")
def batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, len(cases.VOCAB), (3, 9), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    mask[2, 3:] = 0
    return ids.masked_fill(mask == 0, 0), mask


@pytest.mark.parametrize("family", cases.FAMILIES)
def test_last_hidden_state_equals_transformers(family, tmp_path, batch):
    hf = cases.checkpoint(tmp_path / family, family)
    enc = zoo.encoder_from_checkpoint(tmp_path / family)
    ids, mask = batch
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask).last_hidden_state
        got = enc(ids, mask)
    scale = ref.abs().max()
    real = mask.bool()[..., None]
    # ModernBERT's local layers: a padded position whose window holds no real token gets zero attention in
    # the zoo (the house rule) and an average of padding in transformers; no pooling reads it
    where = real if family == "modernbert" else torch.ones_like(real)
    err = ((got - ref).abs() * where).max() / scale
    assert err <= ATOL, f"{family}: max error {err:.2e} of the scale {scale:.3f}"
    assert torch.equal(enc(ids[:1, :6], mask[:1, :6]), enc(ids[:1, :6])), "a mask of ones is no mask"


@pytest.fixture(scope="module")
def sentence_folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("st")
    return {
        f: cases.sentence_folder(root / f, f, mode, normalize=norm, prompts={"query": "query "})
        for f, mode, norm in SENTENCE_CASES
    }


def _encode(folder, texts, prompt=""):
    model = sentence_encoder(folder)
    path, pad, lower = tokenizer_facts(folder)
    feeds = TextTokenizer(path, model.max_seq_length, pad, lower=lower)([prompt + t for t in texts])
    with torch.no_grad():
        out = model(*(torch.from_numpy(feeds[n]) for n in ("input_ids", "attention_mask", "token_type_ids")))
    return out.numpy(), feeds


@pytest.mark.parametrize("family", [f for f, _, _ in SENTENCE_CASES])
def test_sentence_encoder_equals_encode(family, sentence_folders):
    folder = sentence_folders[family]
    ref = cases.reference(folder, batch_size=3)
    got, feeds = _encode(folder, cases.TEXTS)
    assert feeds["input_ids"].shape[1] == 12, "the long text is truncated to max_seq_length"
    err = np.abs(got - ref).max() / np.abs(ref).max()
    assert err <= ATOL, f"{family}: max error {err:.2e}"
    q_ref = cases.reference(folder, prompt_name="query")
    q_got, _ = _encode(folder, cases.TEXTS, sentence_encoder(folder).prompt("query"))
    assert np.abs(q_got - q_ref).max() <= ATOL * np.abs(q_ref).max(), "the query prompt is put before each text"


def test_legacy_sentence_folder_reads_as_sentence_transformers_does(sentence_folders, tmp_path):
    """The older files: pooling_mode_*_token(s) booleans and sentence_bert_config.json's max_seq_length."""
    import shutil

    folder = tmp_path / "legacy"
    shutil.copytree(sentence_folders["bert"], folder)
    (folder / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": 32, "pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False})
    )
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 6, "do_lower_case": False}))
    model = sentence_encoder(folder)
    assert (model.pooling.modes, model.max_seq_length, model.pooling.normalize) == (("cls",), 6, True)
    got, feeds = _encode(folder, cases.TEXTS)
    assert feeds["input_ids"].shape[1] == 6
    ref = cases.reference(folder)
    assert np.abs(got - ref).max() <= ATOL * np.abs(ref).max()


def _edit(src, dst, path, change):
    import shutil

    shutil.copytree(src, dst)
    data = json.loads((dst / path).read_text())
    (dst / path).write_text(json.dumps(change(data)))
    return dst


@pytest.mark.parametrize(
    ("path", "change", "words"),
    [
        ("modules.json", lambda m: m + [{"idx": 3, "name": "3", "path": "3_Dense", "type": "x.Dense"}], "Dense"),
        ("1_Pooling/config.json", lambda c: dict(c, pooling_mode="weightedmean"), "weightedmean"),
        ("1_Pooling/config.json", lambda c: dict(c, include_prompt=False), "include_prompt"),
        ("config.json", lambda c: dict(c, position_embedding_type="relative_key"), "relative_key"),
        ("config.json", lambda c: dict(c, model_type="gpt2"), "gpt2"),
    ],
)
def test_sentence_folder_refusals_name_the_part(sentence_folders, tmp_path, path, change, words):
    folder = _edit(sentence_folders["bert"], tmp_path / "edited", path, change)
    with pytest.raises(zoo.HFConversionError, match=words):
        sentence_encoder(folder)


def test_an_unread_tensor_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    cases.checkpoint(tmp_path / "m", "bert")
    tensors = load_file(tmp_path / "m" / "model.safetensors")
    tensors["encoder.layer.0.attention.self.extra.weight"] = torch.zeros(2)
    save_file(tensors, tmp_path / "m" / "model.safetensors")
    with pytest.raises(zoo.CheckpointError, match="extra"):
        zoo.encoder_from_checkpoint(tmp_path / "m")
