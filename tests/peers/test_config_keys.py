"""peers.config_keys against the installed transformers: every config key an accepted model_type's modeling file
reads is classified (honoured, irrelevant, refused), each refused key is refused when it would change the math,
and a config.json that leaves a key out reads as transformers' config class fills it in."""

from __future__ import annotations

import copy
import re
import warnings
from pathlib import Path

import pytest

from peers.config import prepare, spec_from_config
from peers.config_keys import DEFAULTS, GENERIC, IRRELEVANT, KEYS, KV_HEADS_UNREAD, REFUSED
from peers.encoder_rows import ENCODER_FAMILIES
from peers.lm_rows import LM_FAMILIES
from peers.model_types import FAMILIES
from peers.seq2seq_rows import SEQ2SEQ_FAMILIES
from zoo.errors import HFConversionError

transformers = pytest.importorskip("transformers")

ACCEPTED = sorted({*FAMILIES, *ENCODER_FAMILIES, *SEQ2SEQ_FAMILIES})

# config.x, self.config.x, text_config.x; getattr(config, "x"[, default]); config.get("x"); MPT's attn_config.x
_READS = (
    re.compile(r"\bconfig\.(?!get\b)([A-Za-z_]\w*)"),
    re.compile(r"""getattr\(\s*(?:self\.)?(?:text_)?config\s*,\s*["'](\w+)["']"""),
    re.compile(r"""\bconfig\.get\(\s*["'](\w+)["']"""),
)
_NESTED = re.compile(r"\battn_config\.([A-Za-z_]\w*)")


def modeling_source(kind: str) -> str:
    from transformers.models.auto.configuration_auto import model_type_to_module_name

    folder = model_type_to_module_name(kind)
    return (Path(transformers.__file__).parent / "models" / folder / f"modeling_{folder}.py").read_text()


def keys_read(source: str) -> set[str]:
    keys = {m.group(1) for pattern in _READS for m in pattern.finditer(source)}
    return keys | {f"attn_config.{m.group(1)}" for m in _NESTED.finditer(source)}


def test_the_grep_finds_each_way_of_reading_a_key():
    source = "a = config.x\nb = self.config.y\nc = getattr(config, \"z\", None)\nd = getattr(self.config, 'w')\n"
    source += 'e = config.get("v", 1)\nf = config.attn_config.u\n'
    assert keys_read(source) == {"x", "y", "z", "w", "v", "attn_config", "attn_config.u"}


@pytest.mark.parametrize("kind", ACCEPTED)
def test_every_config_key_the_modeling_file_reads_is_classified(kind):
    """A transformers upgrade whose modeling code reads a new key fails here, naming it: classify it in
    peers/config_keys.py (honoured where, irrelevant why, or REFUSED with its no-op values)."""
    assert kind in KEYS, f"{kind}: no entry in peers.config_keys.KEYS"
    unclassified = keys_read(modeling_source(kind)) - set(IRRELEVANT) - set(GENERIC) - set(KEYS[kind])
    assert not unclassified, f"{kind}: modeling_{kind}.py reads {sorted(unclassified)}, not classified in KEYS"


def _tiny(kind: str) -> dict:
    return dict(
        model_type=kind,
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
        intermediate_size=128,
        vocab_size=100,
        max_position_embeddings=512,
    )


REFUSALS = [(kind, key) for kind, keys in sorted(REFUSED.items()) for key in keys]


@pytest.mark.parametrize(("kind", "key"), REFUSALS)
def test_a_refused_key_is_refused_where_it_changes_the_math(kind, key):
    r = REFUSED[kind][key]
    with pytest.raises(HFConversionError, match=rf"{kind} config: {key}={r.example!r} is not applied"):
        spec_from_config(dict(_tiny(kind), **{key: r.example}))
    for value in r.noops:  # the values that change nothing still read
        assert spec_from_config(dict(_tiny(kind), **{key: value})) == spec_from_config(_tiny(kind))


def _class_value(kind: str, key: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = transformers.AutoConfig.for_model(kind)
    return getattr(config, key)


@pytest.mark.parametrize("kind", sorted(DEFAULTS))
def test_defaults_are_the_config_class_values(kind):
    for key, value in DEFAULTS[kind].items():
        assert _class_value(kind, key) == value, f"{kind}.{key}"


# the sizes of the families that name them otherwise (a config of llama's keys is not one of theirs)
_GPT = dict(n_embd=64, n_head=4, n_layer=2, vocab_size=100, n_positions=512)
_BASES = {
    **dict.fromkeys(("gpt2", "gpt_bigcode"), _GPT),
    **dict.fromkeys(("gptj", "codegen"), dict(_GPT, n_embd=512)),  # heads of 128: the default rotary_dim is 64
    "gpt_neo": dict(hidden_size=64, num_heads=4, num_layers=2, attention_types=[[["global", "local"], 1]]),
    "bloom": dict(hidden_size=64, n_head=4, n_layer=2, vocab_size=100),
    "mpt": dict(d_model=64, n_heads=4, n_layers=2, vocab_size=100),
    "qwen3_next": dict(_tiny("qwen3_next"), num_hidden_layers=4),
    "persimmon": {k: v for k, v in _tiny("persimmon").items() if k != "num_key_value_heads"},  # no GQA
}


@pytest.mark.parametrize("kind", sorted(FAMILIES))
def test_a_config_json_reads_as_its_config_class_fills_it_in(kind):
    """A config.json holding only the sizes, against the config object transformers makes of it (every default
    filled in): each layer's spec (and the whole model's fields) must be the same, or the short one refused."""
    base = dict(_BASES.get(kind, _tiny(kind)), model_type=kind)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        full = transformers.AutoConfig.for_model(**copy.deepcopy(base))
    for layer in range(int(getattr(full, "num_hidden_layers", None) or 2)):
        try:
            want = spec_from_config(full, layer)
        except HFConversionError:  # a layer outside the zoo (Qwen3-Next's linear attention)
            continue
        try:
            got = spec_from_config(dict(base), layer)
        except HFConversionError:  # a size the short config lacks: loud, not silent
            continue
        assert got == want, {k: (v, getattr(want, k)) for k, v in vars(got).items() if v != getattr(want, k)}
    if kind in LM_FAMILIES:
        try:
            got = LM_FAMILIES[kind].fields(prepare(dict(base), 0).cfg)
        except (HFConversionError, AttributeError, KeyError):
            return
        assert got == LM_FAMILIES[kind].fields(prepare(full, 0).cfg)


def test_a_stray_num_key_value_heads_is_dropped_where_transformers_reads_none():
    """The types whose modeling file reads no num_key_value_heads are KV_HEADS_UNREAD, and there a config.json
    that sets one reads as without it (Persimmon's split its fused projection by it: a raw einops error)."""
    unread = {kind for kind in FAMILIES if "num_key_value_heads" not in modeling_source(kind)}
    assert unread == KV_HEADS_UNREAD
    cfg = transformers.PersimmonConfig(
        hidden_size=64, num_attention_heads=4, num_hidden_layers=1, intermediate_size=128
    )
    stray = dict(cfg.to_dict(), num_key_value_heads=2)
    assert spec_from_config(stray) == spec_from_config(cfg.to_dict())


_SEQ2SEQ_SIZES = {
    "t5": dict(d_model=64, d_ff=128, num_heads=4, d_kv=16, num_layers=2, num_decoder_layers=2, vocab_size=100),
    "bart": dict(
        d_model=64,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_layers=2,
        decoder_layers=2,
        vocab_size=100,
        max_position_embeddings=128,
    ),  # fmt: skip
}


@pytest.mark.parametrize("kind", sorted(SEQ2SEQ_FAMILIES))
def test_an_encoder_decoder_config_json_reads_as_its_config_class_fills_it_in(kind):
    """The encoder-decoder readers fill in DEFAULTS too: an mT5 config.json of sizes alone read as T5 v1.0
    (relu, plain) where mT5's class says gated-gelu."""
    from peers.seq2seq import seq2seq_spec

    sizes = _SEQ2SEQ_SIZES["t5" if "t5" in kind else "bart"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        full = transformers.AutoConfig.for_model(kind, **sizes).to_dict()
    assert seq2seq_spec(dict(sizes, model_type=kind)) == seq2seq_spec(full)
