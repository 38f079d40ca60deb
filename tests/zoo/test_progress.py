"""zoo.progress.bar: redrawn in place on a terminal, a line at most every LOGGED_INTERVAL_S into a log."""

from __future__ import annotations

import io

from zoo import progress


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _lines(stream, monkeypatch) -> list[str]:
    monkeypatch.setattr("sys.stderr", stream)
    with progress.bar(500, "work") as bar:
        for i in range(500):
            bar.set_postfix_str(f"item {i}")  # as the commands do, every step
            bar.set_description("work")
            bar.update()
    return [frame for frame in stream.getvalue().replace("\r", "\n").splitlines() if frame.strip()]


def test_a_logged_bar_writes_its_start_and_its_end_only(monkeypatch):
    frames = _lines(io.StringIO(), monkeypatch)  # a file or a pipe: not a terminal
    assert len(frames) == 2 and "0/500" in frames[0] and "500/500" in frames[-1], frames


def test_a_terminal_bar_redraws_at_tqdms_own_rate(monkeypatch):
    monkeypatch.setattr("sys.stderr", _Terminal())
    with progress.bar(5, "work") as bar:
        assert bar.mininterval < 1 < progress.LOGGED_INTERVAL_S
    monkeypatch.setattr("sys.stderr", io.StringIO())
    with progress.bar(5, "work") as bar:
        assert bar.mininterval == progress.LOGGED_INTERVAL_S


def test_a_disabled_bar_writes_nothing(monkeypatch):
    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    with progress.bar(3, "work", disable=True) as bar:
        bar.update(3)
    assert stream.getvalue() == ""
