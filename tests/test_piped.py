"""The suite's own child-process reader (helpers.Piped), which the server tests stand on: no line lost between
the lines read before the readiness line and the rest, and a child that writes much to stderr before it is ready
never blocks on a full pipe. The reader it replaced (a loop over proc.stdout, then communicate() on the raw pipe)
failed both: its read-ahead buffer kept lines communicate() never saw, and stderr was not read until the end."""

from __future__ import annotations

import os
import sys

from helpers import Piped

CHILD = """
import sys
sys.stderr.write("e" * 300_000 + "\\n")  # past a pipe's 64 KiB: blocks unless stderr is read meanwhile
sys.stderr.flush()
print("starting")
print("ready: serving")
for i in range(5000):
    print(f"line {i}")
print("stopped")
"""


def test_piped_keeps_every_line_and_never_blocks_the_child():
    proc = Piped([sys.executable, "-c", CHILD], dict(os.environ))
    assert proc.wait_for("ready:", timeout=300) == ["starting\n", "ready: serving\n"]
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0
    lines = out.splitlines()
    assert lines[:2] == ["starting", "ready: serving"] and lines[-1] == "stopped" and len(lines) == 5003
    assert err == "e" * 300_000 + "\n"


def test_piped_names_what_the_child_printed_when_it_ends_before_the_line():
    proc = Piped([sys.executable, "-c", "import sys; print('no'); sys.exit('broken')"], dict(os.environ))
    try:
        proc.wait_for("ready:", timeout=300)
    except AssertionError as e:
        assert "no" in str(e) and "broken" in str(e)
    else:
        raise AssertionError("wait_for returned without the line")
    proc.communicate(timeout=300)
