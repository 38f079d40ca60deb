"""peers.coverage: the committed table (peers/coverage.json) against the installed transformers, and
docs/transformers.md's copy of it."""

import json
from pathlib import Path

import pytest

from peers.copies import BY_CLASS
from peers.coverage import _PARTS as PARTS
from peers.coverage import COVERAGE_JSON, causal_lm_types, counts, coverage, markdown

pytest.importorskip("transformers")
REPO = Path(__file__).resolve().parents[2]


def _committed() -> list[dict]:
    return json.loads(COVERAGE_JSON.read_text())


def test_every_causal_lm_type_of_the_installed_transformers_is_listed():
    """A model type transformers adds (or drops) fails here until `attnzoo families --coverage --json
    peers/coverage.json` is run again."""
    listed = {r["model_type"] for r in _committed()}
    installed = set(causal_lm_types())
    assert not installed - listed, f"causal-LM types not in peers/coverage.json: {sorted(installed - listed)}"
    gone = sorted(listed - installed)
    assert not gone, f"peers/coverage.json lists types transformers no longer has: {gone}"


def test_an_exact_row_is_the_family_tables_and_a_refused_one_says_why():
    for r in _committed():
        if r["status"] == "exact":
            rows = [c for c in r["attention_classes"] if c in BY_CLASS]
            others = set(r["attention_classes"]) - set(rows)  # parts, cross-attention, other towers
            assert rows and all(c.endswith(PARTS) for c in others), r
        elif r["status"] == "refused":
            assert r["reason"], r
        else:
            assert r["status"] == "not-attention" and not r["attention_classes"], r
    assert counts(_committed())["exact"] >= 120


def test_the_docs_page_shows_the_table():
    assert markdown(_committed()) in (REPO / "docs" / "transformers.md").read_text()


@pytest.mark.slow
def test_the_committed_table_is_the_installed_transformers():
    """Recomputed (every modeling module imported: a minute or two)."""
    assert coverage() == _committed()
