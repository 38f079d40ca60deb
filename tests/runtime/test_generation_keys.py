"""Every key of the installed transformers' GenerationConfig has a fate here (runtime/generation_keys.py):
applied, refused by name, or irrelevant to the tokens; a key transformers adds fails this test until it gets
one. The table in docs/generation.md is the module's own."""

from __future__ import annotations

import dataclasses

from transformers import GenerationConfig

from helpers import REPO
from runtime import generation_keys as keys
from runtime.sampling import Sampling


def test_every_key_of_transformers_generation_config_is_applied_refused_or_irrelevant():
    theirs = set(vars(GenerationConfig()))
    assert theirs, "GenerationConfig() has no attributes: the test would pass on nothing"
    missing = sorted(k for k in theirs if keys.fate(k) == "unknown")
    assert not missing, f"keys with no fate (add each to APPLIED, REFUSED or IRRELEVANT): {missing}"
    stale = sorted((set(keys.APPLIED) | set(keys.REFUSED) | set(keys.IRRELEVANT)) - theirs)
    assert not stale, f"keys transformers no longer has: {stale}"


def test_no_key_has_two_fates_and_each_processor_key_is_a_setting():
    groups = [set(keys.APPLIED), set(keys.REFUSED), set(keys.IRRELEVANT)]
    assert all(not (a & b) for i, a in enumerate(groups) for b in groups[i + 1 :])
    fields = {f.name for f in dataclasses.fields(Sampling)}
    assert set(keys.DEFAULTS) <= fields and set(keys.DEFAULTS) <= set(keys.APPLIED)


def test_the_defaults_are_transformers():
    theirs = GenerationConfig._get_default_generation_params()
    shared = [k for k in keys.DEFAULTS if k in theirs]
    assert {k: theirs[k] for k in shared} == {k: keys.DEFAULTS[k] for k in shared}
    unset = {k: v for k, v in keys.DEFAULTS.items() if k not in theirs}  # None in transformers: off
    assert all(v in (None, False) for v in unset.values()), unset


def test_docs_generation_md_holds_the_table():
    assert keys.table_markdown() in (REPO / "docs" / "generation.md").read_text()
