"""The transformers family table (`peers.transformers.family_table()`) against the tests that back it.

Every row marked exact has a parity case in tests/peers/test_hf.py (run there: eager and ONNX Runtime);
every configuration a row refuses, and every class refused as a whole, has a case here showing
that from_hf and to_hf raise HFConversionError naming the class and the field.
"""

from __future__ import annotations

import copy
import re
import subprocess
import sys

import pytest

import peers.transformers
import zoo

transformers = pytest.importorskip("transformers", reason="transformers is in the [hf] and [test] extras")

import hf_cases  # noqa: E402  (after the importorskip: it builds transformers configs)
import hf_cases_copies  # noqa: E402
from test_hf import CASES, capture  # noqa: E402


def test_family_table_rows_are_complete():
    table = peers.transformers.family_table()
    assert len({row["class"] for row in table}) == len(table), "a class appears twice"
    for row in table:
        assert set(row) == {"family", "class", "status", "max_error", "reason", "refuses", "modifiers", "covers"}, row
        assert row["status"] in ("exact", "refused"), row
        assert (row["reason"] is None) == (row["status"] == "exact"), row
    exact = [row["class"] for row in table if row["status"] == "exact"]
    assert list(peers.transformers.supported_classes()) == exact


def test_every_exact_row_has_a_parity_case():
    """As optimum does for its exporters: a class marked exact without a parity case fails."""
    tested = {type(capture(name).module).__name__ for name in CASES}
    exact = {row["class"] for row in peers.transformers.family_table() if row["status"] == "exact"}
    missing = sorted(exact - tested)
    assert not missing, f"marked exact in the family table but with no parity case: {missing}"


def test_the_measured_errors_cover_every_case_and_exact_class():
    """peers/measured.json (scripts/measure_hf.py) holds one measurement per parity case, no stale
    ones; every exact class shows one in the table (test_hf.py's eager test re-measures each)."""
    measured = peers.transformers.measured_errors()
    assert sorted(measured) == sorted(CASES), sorted(set(measured) ^ set(CASES))
    for row in peers.transformers.family_table():
        if row["status"] == "exact":
            assert row["max_error"] is not None and 0 <= row["max_error"] <= 1e-5, row
        else:
            assert row["max_error"] is None, row


def test_every_refusal_has_a_test():
    table = peers.transformers.family_table()
    wanted = {(row["class"], name) for row in table for name in row["refuses"]}
    missing = sorted(wanted - set(hf_cases.REFUSALS))
    assert not missing, f"refusals in the family table without a test: {missing}"
    stale = sorted(set(hf_cases.REFUSALS) - wanted)
    assert not stale, f"refusal tests for checks the table does not hold: {stale}"
    refused = {row["class"] for row in table if row["status"] == "refused"}
    assert refused == set(hf_cases.REFUSED_CLASSES), (refused, set(hf_cases.REFUSED_CLASSES))


@pytest.mark.parametrize("key", sorted(hf_cases.REFUSALS), ids=lambda k: f"{k[0]}-{k[1]}")
def test_refused_config_raises(key):
    cls, check = key
    case, change = hf_cases.REFUSALS[key]
    original = capture(case).module
    block = zoo.from_hf(original)  # the case itself converts ...
    module = copy.deepcopy(original)
    change(module)  # ... the changed copy must not
    assert type(module).__name__ == cls
    with pytest.raises(zoo.HFConversionError, match=rf"^{cls}\b") as e:
        zoo.from_hf(module)
    print(f"{cls} [{check}]: {e.value}")
    with pytest.raises(zoo.HFConversionError, match=rf"^{cls}\b"):
        zoo.to_hf(block, module)


@pytest.mark.parametrize("cls", sorted(hf_cases.REFUSED_CLASSES))
def test_refused_class_raises(cls):
    module = hf_cases.REFUSED_CLASSES[cls]()
    assert type(module).__name__ == cls
    reason = next(row["reason"] for row in peers.transformers.family_table() if row["class"] == cls)
    with pytest.raises(zoo.HFConversionError, match=rf"^{cls}: ") as e:
        zoo.from_hf(module)
    assert str(e.value) == f"{cls}: {reason}"
    with pytest.raises(zoo.HFConversionError, match=rf"^{cls}: "):
        peers.transformers.spec_from_hf(module)


@pytest.mark.parametrize("name", hf_cases_copies.HYBRID_CASES)
def test_a_hybrids_other_layers_are_refused_by_name(name):
    """The attention of a hybrid model converts (its parity case); its state-space / linear layers do not."""
    from peers.copies import STATE_SPACE

    c = capture(name)
    others = [m for m in c.model.modules() if type(m).__name__ in STATE_SPACE]
    assert others, f"{name}: the case's model holds no layer outside the zoo"
    attention = type(c.module).__name__
    for module in others:
        what = type(module).__name__
        pattern = rf"^{what} is {re.escape(STATE_SPACE[what])}, outside the zoo.*{attention}"
        with pytest.raises(zoo.HFTypeError, match=pattern):
            zoo.from_hf(module)


def test_the_family_table_needs_no_transformers():
    code = (
        "import sys; sys.modules['transformers'] = None\n"
        "import peers.transformers as p\n"
        "t = p.family_table(); assert len(t) > 12 and p.supported_classes(); print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
