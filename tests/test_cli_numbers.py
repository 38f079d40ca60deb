"""Numbers and lists on the command line: a value past 64 bits, out of range or empty is one
line and exit 2 (it used to be torch's "Overflow when unpacking long long" traceback)."""

from __future__ import annotations

import pytest

from cli.main import main

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
