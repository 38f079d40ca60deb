"""Whole encoder-decoders in eager torch against transformers, per case of tests/peers/seq2seq_cases.py:
seq2seq_from_checkpoint's logits equal transformers' to 1e-5 of their scale in fp32 with a right-padded
batch; the refusals of a folder the rows cannot read are one line each."""

from __future__ import annotations

import json

import pytest
import seq2seq_cases  # noqa: E402 - tests/peers is on sys.path (tests/conftest.py)
import torch
from safetensors.torch import load_file, save_file

import zoo
from peers.seq2seq import generation_settings, seq2seq_from_checkpoint
from peers.seq2seq_rows import SEQ2SEQ_FAMILIES
from zoo.seq2seq import SinusoidalPositions

REL = 1e-5


@pytest.fixture(scope="session")
def seq2seq_root(tmp_path_factory):
    return tmp_path_factory.mktemp("seq2seq_checkpoints")


def test_every_row_has_a_case():
    kinds = {seq2seq_cases.hf_model(c).config.model_type for c in seq2seq_cases.CASES}
    assert kinds == set(SEQ2SEQ_FAMILIES) - {"mt5"}  # mT5 is T5's row under another model_type


@pytest.mark.parametrize("case", seq2seq_cases.CASES)
def test_logits_equal_transformers(case, seq2seq_root):
    folder, hf = seq2seq_cases.checkpoint(case, seq2seq_root)
    model = seq2seq_from_checkpoint(folder)
    ids, mask = seq2seq_cases.batch()
    top = seq2seq_cases.decoder_vocab(hf)
    dec = torch.randint(3, top, (ids.shape[0], 5), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits
        got = model(ids, dec, mask)
    err = (got - want).abs().max().item() / want.abs().max().item()
    assert err < REL, f"{case}: logits differ by {err:.2e} of their scale"


def test_t5_head_rescaling_follows_the_config(seq2seq_root):
    """v1.0 scales the decoder output by d_model**-0.5 before the tied head; v1.1 (tie_word_embeddings false) not."""
    v10 = seq2seq_from_checkpoint(seq2seq_cases.checkpoint("t5", seq2seq_root)[0])
    v11 = seq2seq_from_checkpoint(seq2seq_cases.checkpoint("t5-gated", seq2seq_root)[0])
    assert v10.spec.head_scale == pytest.approx(32**-0.5) and v11.spec.head_scale == 1.0
    assert (v10.spec.mlp, v10.spec.act, v11.spec.mlp, v11.spec.act) == ("plain", "relu", "gated", "gelu_tanh")


def test_generation_settings_read_generation_config(seq2seq_root):
    bart = generation_settings(seq2seq_cases.checkpoint("bart", seq2seq_root)[0])
    assert (bart["decoder_start_token_id"], bart["eos_token_id"], bart["forced_eos_token_id"]) == (2, 2, 2)
    mbart = generation_settings(seq2seq_cases.checkpoint("mbart", seq2seq_root)[0])
    assert mbart["decoder_start_token_id"] == mbart["bos_token_id"] == 0  # unset: transformers starts at bos


def test_generation_settings_keep_several_eos_ids(seq2seq_root, tmp_path):
    """A list eos_token_id keeps every id (each ends a row); bad_words_ids and suppress_tokens are kept whole."""
    folder = _copy(seq2seq_cases.checkpoint("marian", seq2seq_root)[0], tmp_path / "eos")
    gen = json.loads((folder / "generation_config.json").read_text())
    gen.update(eos_token_id=[1, 5], forced_eos_token_id=[5, 1], bad_words_ids=[[63], [3, 4]], suppress_tokens=[9])
    (folder / "generation_config.json").write_text(json.dumps(gen))
    got = generation_settings(folder)
    assert (got["eos_token_id"], got["forced_eos_token_id"]) == ([1, 5], [5, 1])
    assert (got["suppress_tokens"], got["bad_words_ids"], got["pad_token_id"]) == ([9], [[63], [3, 4]], 63)
    gen["eos_token_id"] = [1, "x"]
    (folder / "generation_config.json").write_text(json.dumps(gen))
    with pytest.raises(zoo.CheckpointError, match=r"eos_token_id=\[1, 'x'\]"):
        generation_settings(folder)


def test_generation_settings_carry_every_key_of_the_file(seq2seq_root, tmp_path):
    """BART-CNN's min_length and no_repeat_ngram_size, a num_beams: every key of generation_config.json reaches the
    export (the run time applies it, or says it does not: runtime/generation_keys.py)."""
    folder = _copy(seq2seq_cases.checkpoint("bart", seq2seq_root)[0], tmp_path / "cnn")
    gen = json.loads((folder / "generation_config.json").read_text())
    gen.update(min_length=56, no_repeat_ngram_size=3, repetition_penalty=1.0, num_beams=4)
    (folder / "generation_config.json").write_text(json.dumps(gen))
    got = generation_settings(folder)
    assert {k: got[k] for k in ("min_length", "no_repeat_ngram_size", "repetition_penalty", "num_beams")} == {
        "min_length": 56, "no_repeat_ngram_size": 3, "repetition_penalty": 1.0, "num_beams": 4
    }  # fmt: skip


def _copy(folder, dst):
    dst.mkdir()
    for f in folder.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def test_an_unread_tensor_is_refused(seq2seq_root, tmp_path):
    folder = _copy(seq2seq_cases.checkpoint("bart", seq2seq_root)[0], tmp_path / "extra")
    tensors = load_file(folder / "model.safetensors")
    tensors["model.encoder.extra.weight"] = torch.zeros(2)
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(zoo.CheckpointError, match="model.encoder.extra.weight.*does not read"):
        seq2seq_from_checkpoint(folder)


def test_a_missing_tensor_is_refused(seq2seq_root, tmp_path):
    folder = _copy(seq2seq_cases.checkpoint("t5", seq2seq_root)[0], tmp_path / "missing")
    tensors = load_file(folder / "model.safetensors")
    del tensors["decoder.final_layer_norm.weight"]
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(zoo.CheckpointError, match="decoder.final_layer_norm.weight.*missing"):
        seq2seq_from_checkpoint(folder)


def test_a_family_without_a_row_is_one_line(seq2seq_root, tmp_path):
    folder = _copy(seq2seq_cases.checkpoint("t5", seq2seq_root)[0], tmp_path / "pegasus")
    data = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**data, "model_type": "pegasus"}))
    with pytest.raises(zoo.HFConversionError, match="model_type='pegasus'.*t5, mt5, bart, mbart"):
        seq2seq_from_checkpoint(folder)


def test_a_bart_config_with_two_ffn_widths_is_one_line(seq2seq_root):
    """One d_ff serves both stacks: a config that gives the decoder another is refused, naming both widths."""
    from peers.seq2seq import seq2seq_spec

    data = seq2seq_cases.hf_model("bart").config.to_dict()
    with pytest.raises(zoo.HFConversionError) as e:
        seq2seq_spec({**data, "decoder_ffn_dim": 96})
    assert str(e.value) == (
        "bart config: encoder_ffn_dim=48 and decoder_ffn_dim=96 differ; the zoo's model has one d_ff"
    )


def test_families_lists_every_seq2seq_row(capsys):
    from cli.main import main

    assert main(["families"]) == 0
    out = capsys.readouterr().out.split("Whole encoder-decoder models", 1)[1]
    assert all(f"| `{kind}` |" in out for kind in SEQ2SEQ_FAMILIES), out


def test_docs_families_table_is_the_commands():
    from cli.cmd_seq2seq import families_markdown
    from helpers import REPO

    assert families_markdown() in (REPO / "docs" / "seq2seq.md").read_text(), "docs/seq2seq.md's table differs"


def test_sinusoidal_positions_are_marians():
    """sin of every frequency in the first half of the channels, cos in the second (transformers' layout)."""
    from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding

    for dim in (32, 7):
        want = MarianSinusoidalPositionalEmbedding(20, dim).create_weight()
        got = SinusoidalPositions(20, dim).weight
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_spec_refuses_a_shared_table_of_two_sizes():
    a = zoo.AttentionSpec(d_model=32, heads=4)
    causal = zoo.AttentionSpec(d_model=32, heads=4, causal=True)
    cross = zoo.AttentionSpec(d_model=32, heads=4, d_context=32)
    kw = dict(vocab=10, d_model=32, encoder=(a,), decoder=(causal,), cross=(cross,), d_ff=8, decoder_vocab=6)
    with pytest.raises(zoo.SpecError, match="decoder_vocab=6 differs from vocab=10.*shared_tokens=False"):
        zoo.Seq2SeqSpec(**kw)
    assert zoo.Seq2SeqLM(zoo.Seq2SeqSpec(**kw, shared_tokens=False)).head.out_features == 6


def test_spec_refuses_a_causal_encoder():
    a = zoo.AttentionSpec(d_model=32, heads=4)
    causal = zoo.AttentionSpec(d_model=32, heads=4, causal=True)
    cross = zoo.AttentionSpec(d_model=32, heads=4, d_context=32)
    with pytest.raises(zoo.SpecError, match=r"encoder\[0\]"):
        zoo.Seq2SeqSpec(vocab=10, d_model=32, encoder=(causal,), decoder=(causal,), cross=(cross,), d_ff=8)
    spec = zoo.Seq2SeqSpec(vocab=10, d_model=32, encoder=(a,), decoder=(causal,), cross=(cross,), d_ff=8)
    assert "encoder=1 decoder=1" in spec.describe()
