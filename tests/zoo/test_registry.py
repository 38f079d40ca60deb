from pathlib import Path

import pytest

import zoo
from helpers import REPO
from zoo.registry import read_preset

REQUIRED = [
    "transformer-base",
    "bert-base",
    "gpt2-small",
    "vit-b16",
    "gqa-decoder-4096",
    "single-head-dv128",
    "mha-causal",
    "gqa",
    "mqa",
    "cross-attention",
]


def test_names_sorted_and_wildcards():
    names = zoo.names()
    assert names == sorted(names)
    assert set(REQUIRED) <= set(names)
    mha = zoo.names("mha-*")
    assert mha and all(n.startswith("mha-") for n in mha)
    assert zoo.names("no-such-*") == []


def test_all_eight_layout_bias_width_combinations():
    seen = set()
    for n in zoo.names():
        s = zoo.spec(n)
        if s.is_cross or s.causal or s.kv_heads_ != s.heads:
            continue
        seen.add((s.layout, s.bias, s.d_v_ == s.d_k_))
    assert seen == {(lay, b, eq) for lay in ("separate", "combined") for b in (True, False) for eq in (True, False)}


def test_variant_kinds_present():
    specs = [zoo.spec(n) for n in zoo.names()]
    assert any(s.causal for s in specs)
    assert any(1 < s.kv_heads_ < s.heads for s in specs)  # GQA
    assert any(s.kv_heads_ == 1 < s.heads for s in specs)  # MQA
    assert any(s.is_cross for s in specs)


@pytest.mark.parametrize(
    "name, fields",
    [
        ("transformer-base", dict(d_model=512, heads=8, layout="combined", bias=False)),
        ("bert-base", dict(d_model=768, heads=12, layout="separate", bias=True)),
        ("gpt2-small", dict(d_model=768, heads=12, layout="combined", bias=True, causal=True)),
        ("vit-b16", dict(d_model=768, heads=12, layout="combined", bias=True, causal=False)),
        ("gqa-decoder-4096", dict(d_model=4096, heads=32, kv_heads=8, bias=False, causal=True)),
        ("single-head-dv128", dict(heads=1, d_v=128)),
    ],
)
def test_presets_have_the_published_shapes(name, fields):
    s = zoo.spec(name)
    for k, v in fields.items():
        assert getattr(s, k) == v, (name, k)


def test_spec_overrides_and_create():
    s = zoo.spec("mha-combined-bias", d_model=256, heads=4)
    m = zoo.create("mha-combined-bias", d_model=256, heads=4)
    assert m.spec == s and s.d_model == 256


def test_unknown_name_lists_closest():
    with pytest.raises(zoo.UnknownNameError) as ei:
        zoo.spec("gpt2-smal")
    assert "gpt2-small" in str(ei.value)
    assert isinstance(ei.value, ValueError)


def test_register_duplicate_and_unregister():
    zoo.register("test-tiny", d_model=8, heads=2, description="t")
    try:
        assert "test-tiny" in zoo.names("test-*")
        with pytest.raises(zoo.DuplicateNameError, match="test-tiny"):
            zoo.register("test-tiny", d_model=8, heads=2)
        with pytest.raises(zoo.DuplicateNameError, match="transformer-base"):
            zoo.register("transformer-base", zoo.spec("transformer-base"))
    finally:
        zoo.unregister("test-tiny")
    assert "test-tiny" not in zoo.names()


@pytest.mark.parametrize("bad", ["", "a b", "mha-*", None])
def test_register_rejects_bad_names(bad):
    with pytest.raises((ValueError, TypeError)):
        zoo.register(bad, d_model=8, heads=2)


@pytest.mark.parametrize(
    "text, words",
    [
        ("[spec]\nd_model = 64\nheads = 5\n", ["d_model=64", "heads=5"]),
        ("[spec]\nd_model = 64\nhead = 4\n", ["head"]),
        ("description = 3\n[spec]\nd_model = 64\n", ["description"]),
        ("descr = 'x'\n[spec]\nd_model = 64\n", ["descr"]),
        ("description = 'no spec'\n", ["[spec]"]),
        ("[spec\nd_model = 64\n", ["not valid TOML"]),
        ("[spec]\nd_model = '64'\n", ["d_model='64'"]),
        ("[spec]\nlayout = 'packed'\n", ["layout='packed'"]),
    ],
)
def test_malformed_preset_names_file_and_field(tmp_path: Path, text, words):
    f = tmp_path / "broken.toml"
    f.write_text(text)
    with pytest.raises(zoo.PresetFileError) as ei:
        read_preset(f)
    msg = str(ei.value)
    assert str(f) in msg
    for w in words:
        assert w in msg


def test_load_presets_from_a_user_folder(tmp_path: Path):
    (tmp_path / "my-block.toml").write_text("description = 'mine'\n[spec]\nd_model = 32\nheads = 2\n")
    try:
        assert zoo.load_presets(tmp_path) == ["my-block"]
        assert zoo.entry("my-block").description == "mine"
    finally:
        zoo.unregister("my-block")


def test_every_models_file_is_registered():
    models = REPO / "models"
    stems = {p.stem for p in models.glob("*.toml")}
    assert stems and stems <= set(zoo.names())


# -- preset files ------------------------------------------------------------------------------


def test_preset_that_is_not_utf8_names_the_file(tmp_path):
    bad = tmp_path / "latin1.toml"
    bad.write_bytes('description = "caf\xe9"\n[spec]\nd_model = 64\n'.encode("latin-1"))
    with pytest.raises(zoo.PresetFileError, match=r"latin1\.toml: not UTF-8"):
        zoo.read_preset(bad)
