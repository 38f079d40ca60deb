"""Numbers and lists on the command line: a value past 64 bits, out of range or empty is one
line and exit 2 (it used to be torch's "Overflow when unpacking long long" traceback)."""

from __future__ import annotations

import argparse
import re

import pytest

from cli.main import main
from helpers import one_line_error

HUGE = "99999999999999999999999"


def one_line(capsys, argv: list[str]) -> str:
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse's own usage errors exit from inside parse_args
        rc = e.code
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, (argv, rc, err)
    return err


@pytest.mark.parametrize("command", ["heads", "importance", "ablate", "audit"])
def test_seed_past_64_bits_is_one_line_with_the_range(capsys, command):
    name = "mha-causal" if command == "audit" else "tiny-induction"
    line = one_line(capsys, [command, name, "--seed", HUGE])
    assert "9223372036854775808" in line and "e+" not in line


@pytest.mark.parametrize(
    "argv",
    [
        ["heads", "tiny-induction", "--batch", HUGE],
        ["importance", "tiny-induction", "--batches", HUGE],
        ["ablate", "tiny-induction", "--finetune-steps", HUGE],
        ["ablate", "tiny-induction", "--scratch-steps", "0"],
    ],
)
def test_counts_out_of_range_are_one_line(capsys, argv):
    assert "must be in" in one_line(capsys, argv)


def test_token_id_past_64_bits_is_named(capsys):
    line = one_line(capsys, ["heads", "tiny-induction", "--tokens", f"{HUGE} 2"])
    assert HUGE in line and "0..127" in line


def test_empty_heads_is_refused_not_the_default(capsys):
    assert "--heads is empty" in one_line(capsys, ["ablate", "tiny-induction", "--heads", ""])


def test_one_token_says_why_there_is_nothing_to_score(capsys):
    assert "2 or more" in one_line(capsys, ["heads", "tiny-induction", "--tokens", "5"])


# -- bounded numbers and seeds -----------------------------------------------------------------


def test_seed_out_of_range_is_one_line(capsys):
    assert "--seed" in one_line_error(capsys, ["audit", "mha-causal", "--seed", "1e20"])
    assert "--seed" in one_line_error(capsys, ["audit", "mha-causal", "--seed", str(2**70)])


@pytest.mark.parametrize(
    "kind, low, kw, text, words",
    [
        (int, 0, {"low_open": True}, "0", "0 must be positive"),
        (int, 0, {"low_open": True}, "2.5", "'2.5' is not an integer"),
        (float, 0, {}, "nan", "'nan' is not a finite number"),
        (float, 0, {}, "-inf", "'-inf' is not a finite number"),
        (float, 0, {"below": 1}, "1", "1.0 must be in [0, 1)"),
        (int, 0, {}, "-1", "-1 must be >= 0"),
    ],
)
def test_bounded_cli_numbers_refuse_with_the_range(kind, low, kw, text, words):
    from cli.common import number_in

    with pytest.raises(argparse.ArgumentTypeError, match=re.escape(words)):
        number_in(kind, low, **kw)(text)
    assert number_in(kind, low, **kw)("0.5" if kind is float else "1") in (0.5, 1)
