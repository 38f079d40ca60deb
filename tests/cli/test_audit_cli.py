import pytest
import torch

import zoo
from cli.main import main
from helpers import ALL_NAMES, small_overrides
from zoo.audit import run_audit


def _text(v) -> str:
    """A --set value as a user types it: a tuple (longrope's factors) as numbers separated by commas."""
    return ",".join(map(str, v)) if isinstance(v, tuple) else str(v)


@pytest.mark.parametrize("name", ALL_NAMES)
def test_audit_passes_for_every_registered_name(name, capsys):
    sets = [a for k, v in small_overrides(name).items() for a in ("--set", f"{k}={_text(v)}")]
    assert main(["audit", name, "-t", "7", *sets]) == 0
    out = capsys.readouterr().out
    assert "FAIL" not in out and " 0 failed" in out


def test_audit_catches_a_broken_module():
    """The audit can fail: a projection that disagrees with the weights must FAIL."""

    class Broken(zoo.MultiHeadAttention):
        def project(self, x, context=None):
            return tuple(t * 1.5 for t in super().project(x, context))

    bad = {s.title: s.ok for s in run_audit(Broken(zoo.spec("mha-separate-bias")))}
    assert not bad["axis labels: split 'b t (h d) -> b h t d'"]
    assert not bad["W_O and selected output rows"]
    assert main(["audit", "mha-separate-bias"]) == 0  # the registered block itself is fine


def test_audit_report_is_reproducible_from_its_seed(capsys):
    """One seed, one report, every figure included: the block's weights are drawn from it too."""
    args = ["audit", "phi-2", "--set", "d_model=128", "--set", "heads=4", "--set", "kv_heads=2", "--seed", "3"]
    reports = []
    for _ in range(2):
        torch.manual_seed(len(reports))  # whatever the global generator held before
        assert main(args) == 0
        reports.append(capsys.readouterr().out)
    assert reports[0] == reports[1]


def test_cli_list_show(capsys):
    assert main(["list", "mha-*"]) == 0
    out = capsys.readouterr().out
    assert "mha-combined-bias" in out and "bert-base" not in out
    assert main(["show", "transformer-base"]) == 0
    out = capsys.readouterr().out
    assert "1,048,576" in out and "(agree)" in out and "b h t s" in out
    assert main(["show", "transformer-base", "--set", "d_model=1024", "--set", "heads=16"]) == 0
    assert "4,194,304" in capsys.readouterr().out
    # seed 004 exercise 3
    assert main(["show", "transformer-base", "--set", "d_model=4096", "--set", "heads=32", "--seq", "2048"]) == 0
    assert "343,597,383,680" in capsys.readouterr().out


def test_cli_errors_are_one_line(capsys):
    assert main(["show", "gpt2-smal"]) == 2
    err = capsys.readouterr().err
    assert "gpt2-small" in err and "Traceback" not in err
    assert main(["show", "bert-base", "--set", "heads"]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err
    assert main(["list", "zzz*"]) == 2
    assert "no attention block matches 'zzz*'" in capsys.readouterr().err
    assert main(["list", "LLaMA"]) == 0  # a plain word: the names that hold it, in any case
    assert {"llama-3-8b", "llama-3.1-8b"} <= set(capsys.readouterr().out.split())
    assert main(["list", "gqa"]) == 0  # a registered name is a word too
    assert {"gqa", "gqa-combined"} <= set(capsys.readouterr().out.split())
    with pytest.raises(SystemExit):
        main(["show", "bert-base", "--seq", "0"])


def test_audit_leaves_the_callers_module_alone():
    import torch

    m = zoo.create("mha-separate-bias")
    run_audit(m)
    assert m.out_proj.weight.dtype == torch.float32 and m.training


def test_show_with_overrides_does_not_pass_the_presets_words_off_as_the_spec(capsys):
    assert main(["show", "gqa", "--set", "heads=2"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("gqa: d_model=64 h=2 g=2") and "overridden; the preset gqa is:" in first
    assert main(["show", "gqa"]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith("gqa: Grouped-query self-attention: 8 query heads")
