"""A whole-model export's stages as a progress bar (cli/progress.py over export/progress.py): drawn on a terminal,
stage by stage (trace, optimize, quantize, save), nothing when stderr is piped or with --quiet."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest

from cli.main import main
from cli.progress import export_bar
from export.progress import STAGES, reporting, stage

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "peers"))
import lm_cases  # noqa: E402 - small random transformers models, one per family


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _stages_seen(text: str) -> list[str]:
    """The stage names the bar showed, in order, once each."""
    seen = []
    for part in text.split("export: ")[1:]:
        name = part.split(":", 1)[0]
        if name in STAGES and (not seen or seen[-1] != name):
            seen.append(name)
    return seen


def test_a_whole_export_shows_its_stages_on_a_terminal(tmp_path, monkeypatch, capsys):
    folder = lm_cases.saved("llama", tmp_path)
    capsys.readouterr()  # transformers' own output while saving
    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    assert main(["export", "--checkpoint", str(folder), "--whole", "-o", str(tmp_path / "m.onnx")]) == 0
    assert _stages_seen(terminal.getvalue()) == list(STAGES)
    assert "wrote " in capsys.readouterr().out  # the summary stays on stdout


@pytest.mark.parametrize("quiet, stream", [(False, io.StringIO()), (True, Terminal())], ids=["piped", "quiet"])
def test_no_bar_when_piped_or_quiet(quiet, stream):
    with export_bar(quiet, stream=stream):
        for name in STAGES:
            stage(name)
    assert stream.getvalue() == ""


def test_the_listener_hears_each_stage_in_its_own_block():
    heard, outer = [], []
    with reporting(outer.append):
        stage("trace")
        with reporting(heard.append):
            for name in STAGES:
                stage(name)
        stage("save")
    stage("trace")  # nobody listening: nothing told, nothing raised
    assert heard == list(STAGES) and outer == ["trace", "save"]
