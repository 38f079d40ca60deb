"""attnzoo heads / importance / ablate, in-process through cli.main.main."""

from __future__ import annotations

import json

import pytest

from cli.main import main


def test_heads_scores_picture_and_json(tmp_path, capsys):
    png, js = tmp_path / "heads.png", tmp_path / "heads.json"
    assert main(["heads", "tiny-induction", "--batch", "4", "--plot", str(png), "--json", str(js)]) == 0
    out = capsys.readouterr().out
    assert "L1H0" in out and "induction" in out
    assert png.stat().st_size > 10_000
    data = json.loads(js.read_text())
    assert len(data["scores"]["induction"]) == 2 and len(data["scores"]["induction"][0]) == 4


def test_heads_on_text_and_tokens(capsys):
    assert main(["heads", "tiny-induction", "--text", "the cat sat on the mat. the cat sat on the mat."]) == 0
    assert main(["heads", "tiny-induction", "--tokens", "5 9 2 7 5 9 2 7"]) == 0
    assert "previous_token" in capsys.readouterr().out


def test_heads_on_dates(tmp_path, capsys):
    png = tmp_path / "dates.png"
    assert main(["heads", "tiny-dates", "--text", "29 August 1958; 03/04/2011", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "1958-08-29" in out and "year" in out
    assert png.exists()


@pytest.mark.parametrize(
    "argv, words",
    [
        (["heads", "tiny-induction", "--tokens", "5 9 200"], "outside the vocabulary"),
        (["heads", "tiny-induction", "--tokens", "5 x"], "must be integers"),
        (["heads", "tiny-induction", "--text", ""], "empty"),
        (["heads", "tiny-induction", "--text", "caf\u00e9"], "outside the vocabulary"),
        (["heads", "tiny-dates", "--text", "the 5th of May"], "not a date"),
        (["heads", "tiny-nope"], "unknown model 'tiny-nope'"),
        (["ablate", "tiny-induction", "--heads", "0.7", "--no-latency"], "layer 0 has heads 0..3"),
        (["ablate", "tiny-induction", "--heads", "1.0,1.1,1.2,1.3", "--no-latency"], "leave layer 1 with no head"),
        (["ablate", "tiny-induction", "--heads", "5.0", "--no-latency"], "layer 5 does not exist"),
        (["ablate", "tiny-induction", "--heads", "one", "--no-latency"], "LAYER.HEAD"),
        (["importance", "tiny-nope"], "unknown model"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, words, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and "\n" not in err and "Traceback" not in err


@pytest.fixture
def svg_text(monkeypatch):
    """Pictures keep their words as SVG text (not glyph paths): the test reads what a picture says."""
    import matplotlib

    monkeypatch.setitem(matplotlib.rcParams, "svg.fonttype", "none")

    def read(path) -> str:
        import html
        import re

        return html.unescape(" ".join(re.findall(r"<text[^>]*>(.*?)</text>", path.read_text(), flags=re.S)))

    return read


def test_importance_plot_names_each_points_heads_and_the_half_point(tmp_path, capsys, svg_text):
    svg, js = tmp_path / "sweep.svg", tmp_path / "sweep.json"
    argv = ["importance", "tiny-induction", "--batches", "1", "--batch", "16", "--plot", str(svg), "--json", str(js)]
    assert main([*argv, "-q"]) == 0
    out = capsys.readouterr().out
    assert "pruning sweep" in out and "0.9 x start" in out
    data = json.loads(js.read_text())
    words = svg_text(svg)
    pruned = data["sweep"]["pruned"]
    for before, after in zip(pruned, pruned[1:]):  # each point after the first names the heads it zeroed
        added = after[len(before) :]
        assert "+" + ",".join(f"L{a}H{b}" for a, b in added) in words, (added, words)
    half = data["half"]
    assert f"half the heads zeroed ({len(half['heads'])}): {half['metric']:.3f}" in words, words


def test_ablate_table(tmp_path, capsys):
    js = tmp_path / "ablate.json"
    argv = ["ablate", "tiny-induction", "--heads", "0.1,0.2", "--batches", "1", "--batch", "8", "--no-latency"]
    argv += ["--finetune-steps", "2", "--scratch-steps", "2", "--json", str(js), "-q"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    for row in ("(a) zero", "(b) prune", "(c) prune + fine-tune", "(d) fewer heads from scratch"):
        assert row in out
    data = json.loads(js.read_text())
    assert data["max_diff_zero_vs_prune"] <= 1e-5
    rows = {r["experiment"][:3]: r for r in data["rows"]}
    assert rows["(b)"]["parameters"] < rows["(a)"]["parameters"]
    assert rows["(b)"]["loss"] == pytest.approx(rows["(a)"]["loss"], abs=1e-5)
    assert rows["(d)"]["note"].endswith("heads per layer [2, 4]")
    assert "Model tiny-induction" in data["caption"] and "metric" in data["caption"]


def test_onnx_latency_of_blocks_with_and_without_head_mask():
    import torch

    import zoo
    from bench.latency import OnnxLatency

    block = zoo.create("mha-causal", d_model=32, heads=4)
    meter = OnnxLatency(repeats=3, rounds=2)
    try:
        blocks = [(block, 16, None)]
        plain, masked, again = meter(
            [(blocks, [None]), (blocks, [torch.tensor([1.0, 0.0, 1.0, 1.0])]), (blocks, [None])]
        )
        made = len(meter._sessions)
    finally:
        meter.close()
    assert plain > 0 and masked > 0 and again > 0
    assert made == 2  # one export per head-mask input, shared by the requests with the same one
    assert len(meter._sessions) == 0


def test_dates_picture_marks_the_day_head_and_the_year_head(tmp_path, capsys, svg_text):
    svg, js = tmp_path / "roles.svg", tmp_path / "roles.json"
    assert main(["heads", "tiny-dates", "--n", "30", "--plot", str(svg), "--json", str(js)]) == 0
    out = capsys.readouterr().out
    assert "field scores" in out and "day head" in out and "punctuation" in out
    data = json.loads(js.read_text())
    assert len(data["translations"]) == 3  # one held-out date in each of the three formats
    assert set(data["field_scores"]["all"]) == {"day", "month", "year"}
    assert data["day_head"] != data["year_head"]
    words = svg_text(svg)
    for what in ("day", "year"):
        layer, h = data[f"{what}_head"]
        assert f"{what} head: X{layer}H{h}" in out  # the text names it; the picture marks the same head
        assert f"X{layer}H{h} (the {what} head): " in words, words
        assert words.count(f"the {what} head") == 1, words


def test_a_head_that_is_the_day_head_and_the_year_head_says_both(tmp_path, capsys, svg_text, monkeypatch):
    import dataclasses

    from analysis import roles

    real = roles.dates_heads

    def one_head_both(*a, **k):  # the year head is the best other head; a one-head model has none other
        r = real(*a, **k)
        return dataclasses.replace(r, year_head=r.day_head)

    monkeypatch.setattr(roles, "dates_heads", one_head_both)
    svg = tmp_path / "both.svg"
    assert main(["heads", "tiny-dates", "--n", "30", "--plot", str(svg), "--json", str(tmp_path / "b.json")]) == 0
    data = json.loads((tmp_path / "b.json").read_text())
    layer, h = data["day_head"]
    assert data["year_head"] == data["day_head"]
    words = svg_text(svg)
    assert f"X{layer}H{h} (the day head and the year head): " in words, words
    assert words.count("the year head") == 1 and words.count("the day head") == 1, words


def test_importance_reports_removing_half_the_heads(capsys):
    assert main(["importance", "tiny-dates", "--batches", "1", "--batch", "32", "-q"]) == 0
    assert "half the heads zeroed (4, least important first)" in capsys.readouterr().out
