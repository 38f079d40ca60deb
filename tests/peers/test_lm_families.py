"""Whole models against transformers, per row of peers.lm_rows.LM_FAMILIES (a small random model each,
tests/peers/lm_cases.py): lm_from_checkpoint and lm_from_hf logits equal transformers' to 1e-5 of their
scale in fp32; greedy generate gives transformers' tokens (a divergence is allowed only at a near-tie of
transformers' own logits, top-2 gap < 1e-3, and is reported); a left-padded batch gives each row its own
tokens; eos pads an ended row as transformers' generate does. A model_type without a row is one line.

The default run checks a few families (one of each kind of layer); the whole table runs under -m slow."""

from __future__ import annotations

import functools
import json
import warnings

import lm_cases  # noqa: E402 - tests/peers is on sys.path (tests/conftest.py)
import pytest
import torch

import zoo
from peers.lm import lm_from_checkpoint, lm_from_hf
from peers.lm_rows import LM_FAMILIES

NEW, TIE_GAP = 12, 1e-3
# the families the default run checks: rotary gated pre-norm, learned positions and Conv1D, sandwich + softcaps
FAST = ("llama", "gpt2", "gemma2")


def kinds(fast: tuple[str, ...]) -> list:
    """Every row, those outside `fast` under -m slow."""
    return [pytest.param(k, marks=() if k in fast else pytest.mark.slow) for k in LM_FAMILIES]


def test_every_row_has_a_case():
    assert sorted(LM_FAMILIES) == sorted(lm_cases.CASES)


@pytest.fixture(scope="session")
def lm_folder(tmp_path_factory):
    return tmp_path_factory.mktemp("lm_checkpoints")


@functools.cache
def _hf(kind: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return lm_cases.hf_model(kind)


def hf_generate(model, ids, mask=None, **kw) -> torch.Tensor:
    model.generation_config.eos_token_id = None
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model.generate(ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, pad_token_id=0, **kw)


def same_tokens(model, got: torch.Tensor, want: torch.Tensor, kind: str) -> None:
    """got == want, except from a step where transformers' own top two logits lie within TIE_GAP (reported)."""
    if torch.equal(got, want):
        return
    assert got.shape[0] == want.shape[0]
    for r in range(want.shape[0]):
        n = min(got.shape[1], want.shape[1])
        diff = (got[r, :n] != want[r, :n]).nonzero()
        if not len(diff):
            continue
        at = int(diff[0])
        with torch.no_grad():
            logits = model(want[r : r + 1, :at]).logits[0, -1]
        top = logits.topk(2).values
        gap = float(top[0] - top[1])
        assert gap < TIE_GAP, f"{kind} row {r}: token {at} differs ({got[r, at]} vs {want[r, at]}), top-2 gap {gap:.2e}"
        print(f"\n{kind} row {r}: divergence at a near-tie (top-2 gap {gap:.2e}) at token {at}")  # the report


@pytest.mark.parametrize("kind", kinds(FAST))
def test_logits_and_greedy_tokens_equal_transformers(kind, lm_folder):
    model = _hf(kind)
    folder = lm_cases.saved(kind, lm_folder)
    ids = lm_cases.prompt()
    with torch.no_grad():
        want = model(ids).logits
    scale = float(want.abs().max())
    for lm in (lm_from_checkpoint(folder), lm_from_hf(model)):
        assert all(isinstance(layer.attn, zoo.MultiHeadAttention) for layer in lm.layers)
        with torch.no_grad():
            got = lm(ids)
        err = float((got - want).abs().max())
        assert err <= 1e-5 * scale, f"{kind}: max error {err:.2e} against a scale of {scale:.2e}"
    same_tokens(model, lm.generate(ids, NEW), hf_generate(model, ids), kind)


@pytest.mark.parametrize("kind", kinds(("gpt2",)))  # learned positions: the padding rule's hardest case
def test_left_padded_batch_gives_each_row_its_own_tokens(kind, lm_folder):
    model, lm = _hf(kind), lm_from_checkpoint(lm_cases.saved(kind, lm_folder))
    short, long = lm_cases.prompt(1, 4, seed=3), lm_cases.prompt(1, 9, seed=4)
    batch = torch.cat([torch.cat([torch.zeros(1, 5, dtype=torch.long), short], dim=1), long])
    mask = torch.ones_like(batch)
    mask[0, :5] = 0
    out = lm.generate(batch, NEW, attention_mask=mask)
    same_tokens(model, out[:1, 5:], hf_generate(model, short), kind)
    same_tokens(model, out[1:], hf_generate(model, long), kind)


@pytest.mark.parametrize("kind", kinds(("llama",)))
def test_eos_pads_an_ended_row_as_transformers_does(kind, lm_folder):
    model, lm = _hf(kind), lm_from_checkpoint(lm_cases.saved(kind, lm_folder))
    ids = lm_cases.prompt()
    eos = int(hf_generate(model, ids)[0, ids.shape[1] + 2])  # row 0's third new token ends it
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = model.generate(ids, max_new_tokens=NEW, do_sample=False, eos_token_id=eos, pad_token_id=5)
    got = lm.generate(ids, NEW, eos_token_id=eos, pad_token_id=5)
    same_tokens(model, got, want, kind)
    assert (got[0, ids.shape[1] + 3 :] == 5).all()


def test_a_model_type_without_a_row_is_refused_in_one_line(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mpt", "d_model": 64, "n_heads": 4, "n_layers": 2}))
    with pytest.raises(zoo.HFConversionError) as e:
        lm_from_checkpoint(tmp_path)
    assert "model_type='mpt'" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("kind", "key", "value", "said"),
    [
        ("opt", "do_layer_norm_before", False, "do_layer_norm_before=false"),
        ("gpt2", "add_cross_attention", True, "add_cross_attention=true"),
        ("gpt_bigcode", "add_cross_attention", True, "add_cross_attention=true"),
        ("olmoe", "clip_qkv", 0.0, "clip_qkv=0.0"),  # transformers clamps at 0.0 too: set, not unset
    ],
)
def test_a_configuration_a_row_refuses_is_one_line(lm_folder, tmp_path, kind, key, value, said):
    """Refused in one line, whether the row refuses it from config.json or the attention's row once the
    layers are built (OLMoE's clip_qkv): so each case has its checkpoint's weights."""
    src = lm_cases.saved(kind, lm_folder)
    config = json.loads((src / "config.json").read_text())
    config[key] = value
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").symlink_to(src / "model.safetensors")
    with pytest.raises(zoo.HFConversionError, match=said) as e:
        lm_from_checkpoint(tmp_path)
    assert "\n" not in str(e.value)


def test_smollm3_without_no_rope_layers_reads_its_config_class_default():
    """SmolLM3Config fills a left-out no_rope_layers with a NoPE layer every no_rope_layer_interval (4), and
    left-out layer_types from it: with use_sliding_window, the NoPE layers slide."""
    import transformers

    for windowed in (False, True):
        config = dict(model_type="smollm3", num_hidden_layers=8, hidden_size=64, num_attention_heads=4)
        config.update(use_sliding_window=windowed, sliding_window=16)
        hf = transformers.SmolLM3Config(**{k: v for k, v in config.items() if k != "model_type"})
        specs = [zoo.spec_from_config(config, i) for i in range(8)]
        assert [s.rope_theta is not None for s in specs] == [bool(x) for x in hf.no_rope_layers]
        want = [16 if kind == "sliding_attention" else None for kind in hf.layer_types]
        assert [s.window for s in specs] == want
        assert not all(hf.no_rope_layers) and (any(want) == windowed)  # there are NoPE (and sliding) layers


def test_a_tensor_the_model_does_not_read_is_refused(lm_folder, tmp_path):
    from safetensors.torch import load_file, save_file

    src = lm_cases.saved("llama", lm_folder)
    tensors = load_file(str(src / "model.safetensors"))
    tensors["model.layers.0.mlp.extra_proj.weight"] = torch.zeros(2, 2)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text((src / "config.json").read_text())
    with pytest.raises(zoo.CheckpointError, match="extra_proj.weight.*does not read"):
        lm_from_checkpoint(tmp_path)
    del tensors["model.layers.0.mlp.extra_proj.weight"], tensors["model.norm.weight"]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(zoo.CheckpointError, match="model.norm.weight' is missing"):
        lm_from_checkpoint(tmp_path)


def test_a_tied_config_with_another_head_in_the_file_reads_the_files_head(lm_folder, tmp_path):
    """config.json ties the head (tie_word_embeddings) but the file's lm_head differs from the embedding:
    transformers unties them and uses the file's head (it warns), and so does the zoo, whichever way it reads
    the model; a file head equal to the embedding stays tied."""
    from safetensors.torch import load_file, save_file

    src = lm_cases.saved("llama", lm_folder)  # untied: its lm_head differs from the embedding
    config = json.loads((src / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(dict(config, tie_word_embeddings=True)))
    tensors = load_file(str(src / "model.safetensors"))
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = lm_cases.transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    head, embed = model.lm_head.weight, model.model.embed_tokens.weight
    assert model.config.tie_word_embeddings and not torch.equal(head, embed)  # transformers reads the file's head
    ids = lm_cases.prompt()
    with torch.no_grad():
        want = model(ids).logits
        for lm in (lm_from_checkpoint(tmp_path), lm_from_hf(model)):
            assert not lm.spec.tied
            torch.testing.assert_close(lm(ids), want, rtol=1e-5, atol=1e-5)
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
    save_file(tensors, str(tmp_path / "model.safetensors"))
    assert lm_from_checkpoint(tmp_path).spec.tied


def test_phi3_longrope_generate_past_the_switch_equals_transformers():
    """transformers' Phi-3 generate runs the whole sequence again at the first step past original_max (every
    key with the long factors); the zoo's generate does the same, alone and in a left-padded batch."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = lm_cases.longrope_phi3(original_max=32)
    lm = lm_from_hf(model)
    assert lm.spec.longrope_recompute and lm.spec.recompute_at == 32
    ids = lm_cases.prompt(batch=2, t=15)
    mask = torch.ones_like(ids)
    mask[1, :4], ids[1, :4] = 0, 0
    for rows, m in ((ids[:1], None), (ids, mask)):
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            want = model.generate(
                rows, attention_mask=m, max_new_tokens=30, do_sample=False, pad_token_id=0, eos_token_id=None
            )
        assert torch.equal(lm.generate(rows, 30, attention_mask=m), want)


def test_zoo_hands_on_the_whole_model_readers():
    assert zoo.lm_from_checkpoint is lm_from_checkpoint and zoo.lm_from_hf is lm_from_hf


def test_the_docs_table_is_the_commands():
    from cli.cmd_zoo import lm_families_markdown
    from helpers import REPO

    assert lm_families_markdown() in (REPO / "docs" / "models.md").read_text(), "docs/models.md's table differs"


def test_a_sharded_checkpoint_reads_as_one_and_dtype_converts(tmp_path):
    model = _hf("llama")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(tmp_path, max_shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    ids = lm_cases.prompt()
    with torch.no_grad():
        want = model(ids).logits
        torch.testing.assert_close(lm_from_checkpoint(tmp_path)(ids), want, rtol=1e-5, atol=1e-5)
        half = lm_from_checkpoint(tmp_path, dtype="bfloat16")
    assert half.dtype == torch.bfloat16 and all(p.dtype == torch.bfloat16 for p in half.parameters())
    assert half.generate(ids, 3).shape == (2, ids.shape[1] + 3)


@pytest.mark.parametrize("kind", kinds(("llama", "gemma2")))
def test_named_patterns_equal_transformers_output_attentions(kind):
    """L{i}.pattern of a whole model is transformers' output_attentions=True map, layer by layer; the
    residual stream after a layer is its hidden state (output_hidden_states), and replacing one is read."""
    model = _hf(kind)
    ids = lm_cases.prompt()
    with torch.no_grad():
        out = model(ids, output_attentions=True, output_hidden_states=True)
        lm = lm_from_hf(model)
        logits, cache = lm.run_with_cache(ids)
    torch.testing.assert_close(logits, out.logits, rtol=0, atol=1e-5 * float(out.logits.abs().max()))
    for i, want in enumerate(out.attentions):
        torch.testing.assert_close(cache[f"L{i}.pattern"], want, rtol=0, atol=1e-5)
    for i in range(len(lm.layers) - 1):  # the last hidden state transformers returns is after the final norm
        torch.testing.assert_close(cache[f"L{i}.resid_post"], out.hidden_states[i + 1], rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        zeroed = lm.run_with_hooks(ids, hooks={"L0.resid_post": lambda h, name: torch.zeros_like(h)})
        alone = lm.run_with_hooks(ids, hooks={"L0.z": lambda z, name: z})  # a hook that returns it unchanged
    assert not torch.allclose(zeroed, logits) and torch.equal(alone, lm(ids))


DEFAULTABLE = ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "tie_word_embeddings")


@pytest.mark.parametrize("kind", sorted(LM_FAMILIES))
def test_a_key_left_out_of_config_json_reads_as_the_config_class_default(kind):
    """A config.json without a norm's eps or tie_word_embeddings builds what transformers builds from it:
    the config class's own default (Helium's eps is 1e-8, SmolLM3 ties its head), not LLaMA's."""
    from peers.config import normalized
    from peers.model_types import FAMILIES, ConfigView

    config = lm_cases.hf_config(kind)
    data = config.to_dict()
    default = type(config)()
    for key in DEFAULTABLE:
        if key not in data:
            continue
        left_out = {k: v for k, v in data.items() if k != key}
        filled = {**data, key: getattr(default, key)}
        row = LM_FAMILIES[kind]
        read = [row.fields(ConfigView(normalized(kind, d), FAMILIES[kind].aliases)) for d in (left_out, filled)]
        assert read[0] == read[1], key
