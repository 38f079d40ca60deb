import math

import pytest

import zoo
from zoo import AttentionSpec, SpecError


def test_defaults_resolve():
    s = AttentionSpec(d_model=512, heads=8)
    assert (s.d_k_, s.d_v_, s.kv_heads_, s.group_size) == (64, 64, 8, 1)
    assert s.scale_ == pytest.approx(1 / math.sqrt(64))


def test_free_widths_need_no_divisibility():
    s = AttentionSpec(d_model=100, heads=7, d_k=9, d_v=13)
    assert (s.d_k_, s.d_v_) == (9, 13)


@pytest.mark.parametrize(
    "fields, words",
    [
        (dict(d_model=512, heads=7), ["d_model=512", "heads=7", "d_k"]),
        (dict(d_model=64, heads=8, kv_heads=3), ["kv_heads=3", "heads=8"]),
        (dict(d_model=64, heads=4, causal=True, d_context=32), ["causal", "d_context=32"]),
        (dict(d_model=0, heads=4), ["d_model=0"]),
        (dict(d_model=64, heads=-1), ["heads=-1"]),
        (dict(d_model=64, heads=4, d_k=0), ["d_k=0"]),
        (dict(d_model=64, heads=4, d_v=2.5), ["d_v=2.5"]),
        (dict(d_model=64, heads=True), ["heads=True"]),
        (dict(d_model=64, heads=4, layout="fused"), ["layout='fused'", "'separate'", "'combined'"]),
        (dict(d_model=64, heads=4, bias="yes"), ["bias='yes'"]),
        (dict(d_model=64, heads=4, scale=0.0), ["scale=0.0"]),
        (dict(d_model=64, heads=4, scale=float("nan")), ["scale=nan"]),
        (dict(d_model=64, heads=4, d_context=-3), ["d_context=-3"]),
    ],
)
def test_invalid_specs_name_fields_and_values(fields, words):
    with pytest.raises(SpecError) as ei:
        AttentionSpec(**fields)
    for w in words:
        assert w in str(ei.value)
    assert isinstance(ei.value, ValueError)


def test_replace_validates_and_rejects_unknown_fields():
    s = zoo.spec("transformer-base")
    assert s.replace(heads=4).d_k_ == 128
    with pytest.raises(SpecError, match="unknown spec field"):
        s.replace(n_heads=4)
    with pytest.raises(SpecError, match="heads=5"):
        s.replace(heads=5)


def test_spec_is_frozen():
    s = AttentionSpec()
    with pytest.raises(AttributeError):
        s.heads = 4  # type: ignore[misc]


def test_overrides_read_numbers_separated_by_commas_as_a_tuple():
    """--set rope_short_factor=1,1.5 is longrope's factor list; other text with commas stays text."""
    got = zoo.parse_overrides(["rope_short_factor=1,1.5, 2", "layout=separate", "name=a,b"])
    assert got == {"rope_short_factor": (1.0, 1.5, 2.0), "layout": "separate", "name": "a,b"}
