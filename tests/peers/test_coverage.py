"""peers.coverage: the committed table (peers/coverage.json) against the installed transformers, and
docs/transformers.md's copy of it."""

from pathlib import Path

import pytest

from peers.copies import BY_CLASS
from peers.coverage import _PARTS as PARTS
from peers.coverage import COVERAGE_JSON, causal_lm_types, counts, coverage, installed_version, load, markdown

pytest.importorskip("transformers")
REPO = Path(__file__).resolve().parents[2]


def _committed() -> list[dict]:
    return load(COVERAGE_JSON)[1]


def stale(listed: set[str], installed: set[str]) -> str | None:
    """What a table listing `listed` misses against `installed` model types, in one line; None when it has both."""
    parts = []
    if installed - listed:
        parts.append(f"not assessed: {sorted(installed - listed)}")
    if listed - installed:
        parts.append(f"listed but gone from transformers: {sorted(listed - installed)}")
    return "; ".join(parts) or None


def test_every_causal_lm_type_of_the_installed_transformers_is_listed():
    """Under the transformers version the table was made from, a type it adds or drops fails here until
    `attnzoo families --coverage --json peers/coverage.json` is run again. Under any other version the table
    cannot speak for it: the test skips, naming the types the table has not assessed."""
    version, rows = load(COVERAGE_JSON)
    missing = stale({r["model_type"] for r in rows}, set(causal_lm_types()))
    if installed_version() != version:
        pytest.skip(
            f"peers/coverage.json was made from transformers {version}, {installed_version()} is installed: "
            f"{missing or 'the same model types'}"
        )
    assert missing is None, f"peers/coverage.json (transformers {version}) is stale: {missing}"


def test_a_stale_table_is_named_type_by_type():
    assert stale({"a", "b"}, {"a", "b"}) is None
    assert stale({"a"}, {"a", "new"}) == "not assessed: ['new']"
    assert stale({"a", "old"}, {"a"}) == "listed but gone from transformers: ['old']"


def test_the_table_records_the_transformers_version_it_was_made_from():
    version, rows = load(COVERAGE_JSON)
    assert version.count(".") >= 2 and rows, version


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
