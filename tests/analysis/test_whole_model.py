"""A whole model's heads (analysis.WholeModel over zoo.DecoderLM): scores, patching and direct logit
attribution on the shipped checkpoint, and `attnzoo heads|patch --checkpoint`."""

import json

import pytest
import torch

import analysis
import zoo
from analysis import patching
from cli.main import main
from helpers import REPO, one_line_error

FOLDER = REPO / "models" / "tiny-stdlib-llama"
TEXT = "import os\nimport sys\n\nimport os\nimport sys\n"


@pytest.fixture(scope="module")
def whole():
    from cli.checkpoint_heads import load_whole

    model, tok = load_whole(str(FOLDER))
    return model, tok, torch.tensor([tok.encode(TEXT).ids])


def test_patterns_are_causal_distributions_per_layer(whole):
    model, _, ids = whole
    maps = model.attention_maps(ids)
    t = ids.shape[1]
    assert maps.shape == (model.layers, 1, model.heads, t, t) == (4, 1, 4, t, t)
    torch.testing.assert_close(maps.sum(-1), torch.ones(4, 1, 4, t))
    assert maps.triu(1).abs().max() == 0  # no query reads a later key
    scores = analysis.head_scores(model, ids)
    assert scores["previous_token"].shape == (4, 4) and scores["previous_token"].isfinite().all()


def test_direct_logit_attribution_adds_up_to_the_logit_through_rmsnorm(whole):
    """Each head's attribution plus the rest of the stream, through the RMSNorm linearised at the actual
    stream, is the model's own logit: no centring (RMSNorm has none), the root mean square, gamma."""
    model, _, ids = whole
    for pos in (3, ids.shape[1] - 2):
        target, per_head, logit, x, heads = _attribution_at(model, ids, pos)
        norm = model.final_norm
        w = model.unembed.weight[target] * norm.weight
        rest = ((x - heads) / (x.pow(2).mean() + norm.eps).sqrt() * w).sum()
        torch.testing.assert_close(per_head.sum() + rest, logit, atol=1e-4, rtol=1e-4)


def _attribution_at(model, ids, pos: int):
    """For the next token at `pos`: (that token, each head's direct logit attribution, the model's logit for
    it, the last layer's residual stream there, the heads' summed results there); the norm is the test's."""
    last = f"L{model.layers - 1}.resid_post"
    where = torch.zeros_like(ids, dtype=torch.bool)
    where[0, pos] = True
    target = int(ids[0, pos + 1])
    per_head = patching.logit_attribution(model, ids, target, where)
    logits, cache = model.run_with_cache(ids, names=[f"L{i}.result" for i in range(model.layers)] + [last])
    heads = sum(cache[f"L{i}.result"][0, pos].sum(0) for i in range(model.layers))
    return target, per_head, logits[0, pos, target], cache[last][0, pos], heads


@torch.no_grad()
def test_patching_a_head_is_its_z_from_the_clean_run(whole):
    """restored[l, h] is the gap share that the clean run's z of that head alone, put in the corrupt
    run at L{l}.z, restores; a head's slice of z is its own (b h t dv: axis 1)."""
    model, _, _ = whole
    clean, corrupt, metric, _ = patching.induction_experiment(model, n=4, span=8, seed=3)
    restored = patching.patch_heads(model, clean, corrupt, metric, location="z")
    assert restored.shape == (4, 4) and restored.isfinite().all()
    _, cache = model.run_with_cache(clean, names=["L2.z"])

    def put(t, name):
        t = t.clone()
        t[:, 1] = cache[name][:, 1]
        return t

    m_clean, m_corrupt = float(metric(model(clean))), float(metric(model(corrupt)))
    m = float(metric(model.run_with_hooks(corrupt, hooks={"L2.z": put})))
    assert float(restored[2, 1]) == pytest.approx((m - m_corrupt) / (m_clean - m_corrupt), abs=1e-5)
    assert len(set(restored.flatten().tolist())) > 1  # heads differ: not one number everywhere


def test_whole_model_refusals():
    with pytest.raises(analysis.AnalysisError, match="DecoderLM"):
        analysis.WholeModel(zoo.create("mha-causal"))


def test_heads_cli_on_a_checkpoint(tmp_path, capsys):
    out = tmp_path / "h.json"
    assert main(["heads", "--checkpoint", str(FOLDER), "--text", TEXT, "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "tiny-stdlib-llama: head scores on your input" in printed and "L3H3" in printed
    data = json.loads(out.read_text())
    assert len(data["scores"]["induction"]) == 4 and data["shut"] == [[False] * 4] * 4


def test_patch_cli_on_a_checkpoint(capsys):
    assert main(["patch", "--checkpoint", str(FOLDER), "--n", "2", "--span", "6"]) == 0
    printed = capsys.readouterr().out
    assert "activation patching at 'z'" in printed and "L0H0" in printed and "direct logit" in printed


@pytest.mark.parametrize(
    "argv, words",
    [
        (["heads", "tiny-induction", "--checkpoint", str(FOLDER)], "one of NAME"),
        (["heads"], "one of NAME"),
        (["heads", str(FOLDER), "--text", "abc"], f"give it as --checkpoint {FOLDER}"),  # a folder as NAME
        (["patch", str(FOLDER)], f"give it as --checkpoint {FOLDER}"),
        (["heads", "--checkpoint", str(FOLDER)], "give --text"),
        (["heads", "--checkpoint", str(FOLDER), "--tokens", "1 2 999"], "outside the vocabulary"),
        (["heads", "--checkpoint", str(FOLDER), "--tokens", "1 99999999999999999999999"], "outside the vocabulary"),
        (["heads", "--checkpoint", str(REPO / "models")], "no config.json"),
        (["patch", "--checkpoint", str(FOLDER), "--clean", "abc", "--corrupt", "abcd"], "same length"),
        (["patch", "--checkpoint", str(FOLDER), "--corrupt", "abc"], "--corrupt needs --clean"),
    ],
)
def test_checkpoint_heads_errors_are_one_line(argv, words, capsys):
    assert words in one_line_error(capsys, argv)


def test_text_needs_the_tokenizer(tmp_path, capsys):
    import shutil

    folder = tmp_path / "no-tokenizer"
    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(FOLDER / name, folder / name)
    assert "tokenizer.json" in one_line_error(capsys, ["heads", "--checkpoint", str(folder), "--text", "abc"])
    assert main(["heads", "--checkpoint", str(folder), "--tokens", "100 101 100 101"]) == 0


def test_direct_logit_attribution_adds_up_through_a_weightless_layernorm():
    """OLMo's final norm is a LayerNorm without weight or bias ("layer_plain"): the attribution centres each
    head's result, as the stream is centred, and reads no weight."""
    import lm_cases  # noqa: E402 - tests/peers is on sys.path (tests/conftest.py)

    from peers.lm import lm_from_hf

    model = analysis.WholeModel(lm_from_hf(lm_cases.hf_model("olmo")).eval())
    assert model.final_norm.kind == "layer_plain" and model.final_norm.weight is None
    ids = lm_cases.prompt(batch=1, t=8)
    target, per_head, logit, x, heads = _attribution_at(model, ids, pos=5)
    sigma = (x.var(unbiased=False) + model.final_norm.eps).sqrt()
    rest = x - heads
    rest = ((rest - rest.mean()) / sigma * model.unembed.weight[target]).sum()
    torch.testing.assert_close(per_head.sum() + rest, logit, atol=1e-4, rtol=1e-4)
