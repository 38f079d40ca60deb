"""The scaled rotary kinds (zoo/modifiers/rope_scaling.py): their checks, their frequencies against the
formulas written out, longrope's switch by a call's largest position (eager, decode and the traced
graph), yarn's attention factor, and what the hand-built GroupQueryAttention graph takes of them."""

import json

import pytest
import torch

import zoo
import zoo.heads  # zoo loads its modules on first use; this file reads zoo.heads directly
from zoo.modifiers import rope_scaling
from zoo.spec_fields import rope_switch_at

D = dict(d_model=64, heads=4, causal=True, rope_theta=10000.0)
LLAMA3 = dict(rope_scaling="llama3", rope_factor=8.0, rope_original_max=64)
YARN = dict(rope_scaling="yarn", rope_factor=4.0, rope_original_max=64)
LONG = dict(
    rope_scaling="longrope",
    rope_original_max=16,
    rope_short_factor=tuple(1.0 + 0.1 * i for i in range(8)),
    rope_long_factor=tuple(2.0 + i for i in range(8)),
)
KINDS = {"llama3": LLAMA3, "yarn": YARN, "yarn-no-truncate": dict(YARN, rope_truncate=False), "longrope": LONG}


@pytest.mark.parametrize(
    "fields, match",
    [
        (dict(rope_scaling="dynamic", rope_original_max=64), "'dynamic' NTK keeps state across calls"),
        (dict(rope_scaling="llama3", rope_original_max=64), "rope_factor=None"),
        (dict(rope_scaling="llama3", rope_factor=8.0), "rope_original_max=None"),
        (dict(LLAMA3, rope_scale=2.0), "give one of them"),
        (dict(LLAMA3, rope_beta_fast=2.0), "rope_beta_fast set with rope_scaling='llama3'"),
        (dict(LLAMA3, rope_low_freq=4.0, rope_high_freq=1.0), "below rope_high_freq"),
        (dict(YARN, rope_truncate="yes"), "rope_truncate"),
        (dict(YARN, rope_attention=-1.0), "rope_attention"),
        (dict(LONG, rope_short_factor=(1.0, 2.0)), "rope_short_factor must hold rope_dim / 2 = 8"),
        (dict(LONG, rope_long_factor=None), "rope_long_factor must hold"),
    ],
)
def test_invalid_scalings_are_spec_errors(fields, match):
    with pytest.raises(zoo.SpecError, match=match):
        zoo.AttentionSpec(**{**D, **fields})


def test_scaling_fields_need_rotary_and_a_kind():
    with pytest.raises(zoo.SpecError, match="set rope_theta"):
        zoo.AttentionSpec(d_model=64, heads=4, **LLAMA3)
    with pytest.raises(zoo.SpecError, match="rope_factor set without rope_scaling"):
        zoo.AttentionSpec(**D, rope_factor=2.0)


@pytest.mark.parametrize("kind", list(KINDS))
def test_frequencies_are_the_formulas_and_the_audit_passes(kind):
    from zoo.audit import run_audit

    m = zoo.create("mha-causal", **{**D, **KINDS[kind]})
    mod = m.mods["rope"]
    for have, longest in [(mod.inv_freq, 1)] + ([(mod.long_freq, 17)] if mod.long_freq is not None else []):
        want = torch.tensor(rope_scaling.reference_frequencies(m.spec, 16, longest)[0], dtype=torch.float64)
        assert ((have.double() - want).abs() / want).max() < 1e-6
    plain = rope_scaling.base_frequencies(1e4, 16)
    assert not torch.equal(mod.inv_freq, plain)  # the scaling changes some band
    steps = run_audit(m, seq=7)
    assert all(s.ok for s in steps), [(s.title, s.detail) for s in steps if not s.ok]
    assert any(s.title.startswith(f"rope: {m.spec.rope_scaling} frequencies") for s in steps)
    assert m.spec.rope_scaling in m.spec.describe()


def test_yarn_multiplies_cos_and_sin_by_its_attention_factor():
    m = zoo.create("mha-causal", **D, **YARN).double()
    assert m.mods["rope"].attention == pytest.approx(0.1 * torch.log(torch.tensor(4.0)).item() + 1)
    same = zoo.heads.build(m.spec.replace(rope_attention=1.0), zoo.get_projections(m)).double()
    x = torch.randn(1, 5, 64, dtype=torch.float64)
    q1, k1, _ = m.heads(x, torch.arange(5)[None])
    q2, k2, _ = same.heads(x, torch.arange(5)[None])
    torch.testing.assert_close(q1, q2 * m.mods["rope"].attention)  # every dim rotates: all of Q scales
    torch.testing.assert_close(k1, k2 * m.mods["rope"].attention)


def test_longrope_switches_by_the_calls_largest_position():
    m = zoo.create("mha-causal", **D, **LONG).double()
    short = zoo.heads.build(m.spec.replace(rope_long_factor=LONG["rope_short_factor"]), zoo.get_projections(m))
    long = zoo.heads.build(m.spec.replace(rope_short_factor=LONG["rope_long_factor"]), zoo.get_projections(m))
    x = torch.randn(2, 20, 64, dtype=torch.float64)
    torch.testing.assert_close(m(x[:, :16]), short.double()(x[:, :16]))  # positions 0..15: short
    torch.testing.assert_close(m(x), long.double()(x))  # 0..19 passes 16: long for every position
    assert (m(x)[:, :16] - m(x[:, :16])).abs().max() > 1e-3  # so the first 16 rows change
    # where callers that run a call in pieces or share it must not cross (runtime.generation, serve): the same 16
    assert rope_switch_at(m.spec.rope_scaling, m.spec.rope_original_max) == 16
    assert [rope_switch_at(kind, 16) for kind in (None, "llama3", "yarn")] == [None] * 3


def test_longrope_decode_keeps_each_keys_rotation_across_the_switch():
    """Decoding 14 positions then one at a time past 16: each step's new key and query take the
    frequencies of that step's largest position, cached keys keep theirs (transformers does the same);
    both kinds of cache agree, and the steps before the switch are the full forward's rows."""
    m = zoo.create("mha-causal", **D, **LONG).double()
    x = torch.randn(1, 20, 64, dtype=torch.float64)
    y, pk, pv = m.decode(x[:, :14])
    ys = [y]
    for i in range(14, 20):
        y, pk, pv = m.decode(x[:, i : i + 1], pk, pv)
        ys.append(y)
    stepped = torch.cat(ys, dim=1)
    torch.testing.assert_close(stepped[:, :16], m(x[:, :16]))  # before the switch: the full forward's rows
    # after it: a step's query and key rotate long, the 16 keys cached before it short
    long = zoo.heads.build(m.spec.replace(rope_short_factor=LONG["rope_long_factor"]), zoo.get_projections(m)).double()
    k_new = long.heads(x[:, 19:20], torch.tensor([[19]]))[1]
    k_old = pk[:, :, :16]
    torch.testing.assert_close(pk[:, :, 19:20], k_new)
    assert (k_old - long.heads(x[:, :16], torch.arange(16)[None])[1]).abs().max() > 1e-3
    cache = zoo.StaticCache.empty(m.spec, batch=1, max_len=20, dtype=torch.float64)
    out = [m.decode(x[:, :14], cache=cache)] + [m.decode(x[:, i : i + 1], cache=cache) for i in range(14, 20)]
    torch.testing.assert_close(torch.cat(out, dim=1), stepped)


def test_longrope_switch_is_in_the_traced_graph(tmp_path):
    """Exported once, the traced graph picks short or long by the length it is run at."""
    from export import OnnxSession, export_onnx

    m = zoo.create("mha-causal", **D, **LONG)
    path = tmp_path / "longrope.onnx"
    export_onnx(m, path, lowering="decomposed")
    sess = OnnxSession(str(path), "cpu")
    for t in (12, 16, 17, 24):
        x = torch.randn(2, t, 64)
        with torch.no_grad():
            want = m(x)
        err = (torch.as_tensor(sess.run(x)) - want).abs().max().item()
        assert err < 1e-5, (t, err)


def test_the_gqa_graph_takes_llama3_and_yarn_and_refuses_longrope():
    from export.choice import why_not

    assert why_not("ort-gqa", zoo.AttentionSpec(**D, **LLAMA3)) is None
    assert why_not("ort-gqa", zoo.AttentionSpec(**D, **YARN)) is None
    assert "longrope" in why_not("ort-gqa", zoo.AttentionSpec(**D, **LONG))


def test_a_json_or_toml_list_becomes_the_specs_tuple():
    spec = zoo.AttentionSpec(**D, **LONG)
    back = zoo.AttentionSpec(**json.loads(json.dumps(spec.to_dict())))
    assert back == spec and isinstance(back.rope_long_factor, tuple)
