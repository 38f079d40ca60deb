"""Activation patching, direct logit attribution and ablation at named locations, on the shipped models,
and `attnzoo patch`."""

from __future__ import annotations

import json

import pytest
import torch

import analysis
from analysis import patching
from analysis.errors import AnalysisError
from cli.main import main


@pytest.fixture(scope="module")
def lm():
    return analysis.load("tiny-induction")


@pytest.fixture(scope="module")
def dates():
    return analysis.load("tiny-dates")


@pytest.fixture(scope="module")
def induction(lm):
    return patching.induction_experiment(lm, n=8, span=12)


def test_patching_on_tiny_induction_finds_the_induction_head(lm, induction):
    clean, corrupt, metric, _ = induction
    restored = patching.patch_heads(lm, clean, corrupt, metric, "z")
    ind = analysis.head_scores(lm, clean)["induction"]
    best = divmod(int(restored.nan_to_num(-9).argmax()), lm.heads)
    assert best == divmod(int(ind.argmax()), lm.heads)  # the head head_scores calls an induction head
    assert float(ind[best]) > 0.5 and float(restored[best]) > 0.5
    shut = torch.tensor(lm.shut_heads())
    assert shut.any() and (restored[shut] == 0).all()  # a shut head restores nothing
    # pattern and q move the same head's attention; a shut head's output is zero at any location
    for loc in ("pattern", "result"):
        other = patching.patch_heads(lm, clean, corrupt, metric, loc)
        assert divmod(int(other.argmax()), lm.heads) == best and (other[shut] == 0).all()


def test_logit_attribution_adds_up_to_the_logit(lm, induction):
    clean = induction[0]
    b, t = clean.shape
    target = torch.randint(lm.vocab_size, (b, t), generator=torch.Generator().manual_seed(0))
    logits = lm(clean)
    want = logits.gather(-1, target[..., None])[..., 0]
    # at one (b, t): heads + the other components of the stream + beta and the bias = the logit
    where = torch.zeros(b, t, dtype=torch.bool)
    where[1, 7] = True
    per_pos = patching.logit_attribution(lm, clean, target, where)
    with torch.no_grad():
        _, cache = lm.run_with_cache(clean)
        ln = lm.ln_final
        x = cache[f"L{lm.layers - 1}.resid_post"][1, 7]
        sigma = (x.var(unbiased=False) + ln.eps).sqrt()
        w = lm.unembed.weight[target[1, 7]] * ln.weight
        rest = lm.embed(clean)[1, 7] + sum(block.out_proj.bias for block in lm.attn)
        rest_logit = ((rest - rest.mean()) / sigma * w).sum() + ln.bias @ lm.unembed.weight[target[1, 7]]
        rest_logit = rest_logit + lm.unembed.bias[target[1, 7]]
    torch.testing.assert_close(per_pos.nansum() + rest_logit, want[1, 7], rtol=1e-4, atol=1e-4)
    shut = torch.tensor(lm.shut_heads())
    assert (per_pos[shut] == 0).all()


def test_patching_tiny_dates_and_the_day_swap(dates):
    assert patching.day_swap("23 August 1958") == "13 August 1958"
    assert patching.day_swap("August 14, 1907") == "August 24, 1907"
    assert patching.day_swap("15/03/2011") == "25/03/2011"
    with pytest.raises(AnalysisError, match="moves days"):
        patching.day_swap("3 August 1958")
    clean, corrupt, metric, what = patching.dates_experiment(dates, n=8)
    assert "day swapped" in what
    for given, words in ((["23 August 1958"], "1 date given"), (["23 August 1958", "14 May 1907"], "2 dates given")):
        assert patching.dates_experiment(dates, given)[3].startswith(words)
    restored = patching.patch_heads(dates, clean, corrupt, metric, "z")
    assert restored.shape == (dates.layers, dates.heads)
    shut = torch.tensor(dates.shut_heads())
    assert (restored[shut] == 0).all() and float(restored[~shut].max()) > 0.2


def test_ablation_hooks_zero_at_z_is_head_mask_and_mean_keeps_shapes(lm, induction):
    clean = induction[0]
    hm = torch.ones(lm.layers, lm.heads)
    hm[1, 2] = 0
    with torch.no_grad():
        zero = lm.run_with_hooks(clean, hooks=patching.ablation_hooks(lm, [(1, 2)], "z", "zero"))
        torch.testing.assert_close(zero, lm(clean, head_mask=hm))
        for loc in patching.PATCH_LOCATIONS:
            out = lm.run_with_hooks(clean, hooks=patching.ablation_hooks(lm, [(1, 2)], loc, "mean"))
            assert out.shape == zero.shape and torch.isfinite(out).all()
    with pytest.raises(AnalysisError, match="not one of"):
        patching.ablation_hooks(lm, [(1, 2)], "attn")
    with pytest.raises(AnalysisError, match="mode"):
        patching.ablation_hooks(lm, [(1, 2)], "z", "half")


def test_patch_cli_table_json_picture_and_errors(tmp_path, capsys):
    png, js = tmp_path / "patch.png", tmp_path / "patch.json"
    argv = ["patch", "tiny-induction", "--n", "4", "--span", "8", "--plot", str(png), "--json", str(js)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "L1H2" in out and "restored (z)" in out
    data = json.loads(js.read_text())
    assert len(data["restored"]) == 2 and data["location"] == "z"
    assert png.stat().st_size > 5_000
    assert main(["patch", "tiny-induction", "--location", "attn"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "location 'attn' is not one of" in err[0]
    assert main(["patch", "tiny-dates", "--clean", "29 August 1958", "--corrupt", "19 August 1958"]) == 0
    assert "X0H" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        main(["patch", "--help"])
    assert e.value.code == 0 and "--location" in capsys.readouterr().out


def test_location_table_and_ablate_cli(lm, capsys):
    from analysis.ablate import format_locations, location_table
    from analysis.importance import eval_batches
    from analysis.tasks import get_task

    task = get_task("tiny-induction")
    batches = eval_batches(task, 1, 4, seed=0)
    rows = location_table(lm, task, [(1, 2)], batches)
    got = {(r.location, r.mode): r.loss for r in rows}
    assert len(rows) == 1 + 2 * len(patching.PATCH_LOCATIONS)
    # zeroing z, result, pattern or v removes the head's output alike; zeroing q only makes it uniform
    for loc in ("result", "pattern", "v"):
        assert got[(loc, "zero")] == pytest.approx(got[("z", "zero")], abs=1e-4)
    assert got[("q", "zero")] == pytest.approx(got[("scores", "zero")], abs=1e-4)
    assert got[("q", "zero")] != pytest.approx(got[("z", "zero")], abs=1e-3)
    assert "| pattern | mean |" in format_locations(rows, "acc", "loss")
    assert main(["ablate", "tiny-induction", "--heads", "1.2", "--location", "nowhere"]) == 2
    assert "location 'nowhere' is not one of" in capsys.readouterr().err
