"""Named locations on every block (zoo/hooks.py): shapes, the identities between them, and what
an edit at each location does, on every registered variant (so on every modifier kind)."""

from __future__ import annotations

import pytest
import torch
from einops import rearrange

import zoo
from tests.helpers import ALL_NAMES, create, make_inputs
from zoo.hooks import LOCATIONS, HookRun, hooked
from zoo.modifiers import MODIFIERS

B, T, S = 2, 5, 7


def _block(name: str) -> zoo.MultiHeadAttention:
    torch.manual_seed(0)
    return create(name).double().eval()


def _inputs(block):
    torch.manual_seed(1)
    x, ctx, s = make_inputs(block.spec, B, T, S, dtype=torch.float64)
    return x, ctx, s


# Modifiers no preset uses, each tested below on a spec of its own: "NAME+MODIFIER" is NAME with these fields.
OWN_SPECS = {
    "mha-causal+clip_qkv": dict(clip_qkv=0.5),  # no preset clips
    "gqa+gate": dict(output_gate=True),  # Qwen3-Next's full-attention layers (tests/hf_cases_gated.py)
    "mha-causal+temperature": dict(temperature_floor=4, temperature_scale=0.1),  # Llama 4's NoPE layers
}
OWN = {name.split("+")[1] for name in OWN_SPECS}


def test_every_modifier_kind_is_in_the_registry():
    """The identities below run on every registered name; each modifier must be active in one, or have a
    spec of its own here (OWN_SPECS)."""
    for mod in MODIFIERS:
        if mod.name in OWN:
            assert any(mod.active(_case(n).spec) for n in OWN_SPECS), mod.name
            continue
        assert any(mod.active(zoo.spec(n)) for n in ALL_NAMES), f"no registered name uses the {mod.name} modifier"


def _kinds(spec: zoo.AttentionSpec) -> set[str]:
    """What makes a variant a different case for the hooks: its modifiers, its head sharing, its layout."""
    kinds = {mod.name for mod in MODIFIERS if mod.active(spec)}
    kinds.add("mqa" if spec.kv_heads_ == 1 < spec.heads else "gqa" if spec.group_size > 1 else "mha")
    kinds.update({spec.layout, "cross" if spec.is_cross else "causal" if spec.causal else "bidirectional"})
    kinds.update({"dv" if spec.d_v_ != spec.d_k_ else "", "bias" if spec.bias else "no-bias"})
    return kinds - {""}


def _representatives() -> list[str]:
    """The fewest registered names (first in order) that cover every kind some name has."""
    chosen, covered = [], set()
    for name in ALL_NAMES:
        if _kinds(zoo.spec(name)) - covered:
            chosen.append(name)
            covered |= _kinds(zoo.spec(name))
    return chosen


# Every registered name; the default run takes one name per kind (every modifier among them), the
# rest run with -m slow.
FAST = set(_representatives()) | set(OWN_SPECS)
CASES = [n if n in FAST else pytest.param(n, marks=pytest.mark.slow) for n in [*ALL_NAMES, *OWN_SPECS]]


def _softmax(block: zoo.MultiHeadAttention, scores: torch.Tensor) -> torch.Tensor:
    """pattern from scores: the softmax over keys, with a sink (zoo/modifiers/sinks.py) as one more column."""
    sink = zoo.attend.score_sink(block.mods.values())
    if sink is None:
        return torch.softmax(scores, -1)
    column = sink.to(scores.dtype).expand(*scores.shape[:-1], 1)
    return torch.softmax(torch.cat([scores, column], -1), -1)[..., :-1]


def _case(case: str) -> zoo.MultiHeadAttention:
    if case in OWN_SPECS:
        torch.manual_seed(0)
        return create(case.split("+")[0], **OWN_SPECS[case]).double().eval()
    return _block(case)


def test_the_default_run_covers_every_modifier():
    covered = set().union(*(_kinds(zoo.spec(n)) for n in FAST if "+" not in n))
    assert {mod.name for mod in MODIFIERS} - OWN <= covered


@pytest.mark.parametrize("name", CASES)
def test_locations_shapes_and_identities(name):
    block = _case(name)
    x, ctx, s = _inputs(block)
    sp = block.spec
    h, g, dk, dv, c = sp.heads, sp.kv_heads_, sp.d_k_, sp.d_v_, sp.d_model
    with torch.no_grad():
        y0 = block(x, ctx)
        y, cache = block.run_with_cache(x, ctx)
    assert block.hook is None
    assert set(cache) == set(LOCATIONS)
    want = {
        "q": (B, h, T, dk),
        "k": (B, g, s, dk),
        "v": (B, g, s, dv),
        "scores": (B, h, T, s),
        "pattern": (B, h, T, s),
        "z": (B, h, T, dv),
        "result": (B, T, h, c),
        "out": (B, T, c),
    }
    assert {k: tuple(v.shape) for k, v in cache.items()} == want
    torch.testing.assert_close(y, y0)
    torch.testing.assert_close(cache["out"], y)
    torch.testing.assert_close(_softmax(block, cache["scores"]), cache["pattern"])
    bias = block.out_proj.bias if block.out_proj.bias is not None else 0
    torch.testing.assert_close(cache["result"].sum(2) + bias, y)
    # cache only what is asked: the fused path stays when neither scores nor pattern is read
    _, only = block.run_with_cache(x, ctx, names=["z"])
    assert set(only) == {"z"}
    torch.testing.assert_close(only["z"], cache["z"])


@pytest.mark.parametrize("name", CASES)
def test_zeroing_a_heads_z_is_head_mask(name):
    block = _case(name)
    x, ctx, _ = _inputs(block)
    r = block.spec.heads - 1
    hm = torch.ones(block.spec.heads, dtype=torch.float64)
    hm[r] = 0

    def zero(z, where):
        assert where == "z"
        z = z.clone()
        z[:, r] = 0
        return z

    with torch.no_grad():
        torch.testing.assert_close(block.run_with_hooks(x, ctx, hooks={"z": zero}), block(x, ctx, head_mask=hm))


@pytest.mark.parametrize("name", CASES)
def test_minus_inf_on_a_score_is_a_mask_without_that_key(name):
    block = _case(name)
    x, ctx, s = _inputs(block)
    key = 1

    def drop(scores, _):
        scores = scores.clone()
        scores[..., key] = float("-inf")
        return scores

    mask = torch.ones(B, 1, T, s, dtype=torch.bool)
    mask[..., key] = False
    with torch.no_grad():
        torch.testing.assert_close(block.run_with_hooks(x, ctx, hooks={"scores": drop}), block(x, ctx, mask))


@pytest.mark.parametrize("name", CASES)
def test_replacing_the_pattern_changes_only_what_follows(name):
    block = _case(name)
    x, ctx, s = _inputs(block)
    torch.manual_seed(2)
    new = torch.softmax(torch.randn(B, block.spec.heads, T, s, dtype=torch.float64), -1)
    with torch.no_grad():
        _, before = block.run_with_cache(x, ctx)
        y, after = block.run_with_cache(x, ctx, hooks={"pattern": lambda a, _: new})
    for loc in ("q", "k", "v", "scores"):
        torch.testing.assert_close(after[loc], before[loc])
    torch.testing.assert_close(after["pattern"], new)
    v = before["v"].repeat_interleave(block.spec.group_size, dim=1)
    z = torch.einsum("b h t s, b h s d -> b h t d", new, v)
    for mod in block.mods.values():  # what acts on Z after the attention (the output gate)
        z = mod.z_heads(z, x)
    torch.testing.assert_close(after["z"], z)
    torch.testing.assert_close(y, block.out_proj(rearrange(z, "b h t d -> b t (h d)")))


def _name(case) -> str:
    return case if isinstance(case, str) else case.values[0]


DECODE = [c for c in CASES if zoo.spec(_name(c).split("+")[0]).causal]


@pytest.mark.parametrize("name", DECODE)
@pytest.mark.parametrize("kind", ["grow", "static"])
def test_decode_offers_the_locations_for_the_new_positions(name, kind):
    block = _case(name)
    sp = block.spec
    torch.manual_seed(3)
    x = torch.randn(B, 6, sp.d_model, dtype=torch.float64)
    p, t, n = 4, 2, 9
    with torch.no_grad():
        _, pk, pv = block.decode(x[:, :p])
        if "latent" in block.mods:  # its cache holds the latent, not per-head k and v: refused in one line
            cache = None if kind == "grow" else zoo.StaticCache.from_past(pk, pv, max_len=n)
            past = (pk, pv) if kind == "grow" else ()
            with pytest.raises(zoo.InputError, match="latent"):
                block.run_with_cache(x[:, p:], *past, cache=cache, decode=True)
            return
        if kind == "grow":
            (y, k_all, _), cache = block.run_with_cache(x[:, p:], pk, pv, decode=True)
            y0, _, _ = block.decode(x[:, p:], pk, pv)
            keys = p + t
        else:
            c1 = zoo.StaticCache.from_past(pk, pv, max_len=n)
            y, cache = block.run_with_cache(x[:, p:], cache=c1, decode=True)
            y0 = block.decode(x[:, p:], cache=zoo.StaticCache.from_past(pk, pv, max_len=n))
            keys = n  # a static cache's k and v: the whole buffer (the tail past its length is masked)
            assert c1.length == p + t
        full = block(x)
    torch.testing.assert_close(y, y0)
    torch.testing.assert_close(y, full[:, p:])
    assert tuple(cache["q"].shape) == (B, sp.heads, t, sp.d_k_)
    assert tuple(cache["k"].shape) == (B, sp.kv_heads_, keys, sp.d_k_)
    assert tuple(cache["pattern"].shape) == (B, sp.heads, t, keys)
    torch.testing.assert_close(_softmax(block, cache["scores"]), cache["pattern"])
    bias = block.out_proj.bias if block.out_proj.bias is not None else 0
    torch.testing.assert_close(cache["result"].sum(2) + bias, y)


@pytest.mark.parametrize("loc", ["q", "scores", "pattern", "z", "out"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.long, torch.bool])  # the block runs in float64
def test_a_hook_returning_another_dtype_is_one_line(loc, dtype):
    block = _block("mha-causal")
    x, _, _ = _inputs(block)
    with pytest.raises(zoo.InputError, match=f"returned a {dtype} tensor on cpu; return one of the dtype") as e:
        block.run_with_hooks(x, hooks={loc: lambda t, _: t.to(dtype)})
    assert "\n" not in str(e.value) and block.hook is None


def test_hooks_are_removed_after_a_failing_run_and_bad_requests_are_one_line():
    block = _block("mha-causal")
    x, _, _ = _inputs(block)

    def boom(t, _):
        raise RuntimeError("inside the hook")

    with pytest.raises(RuntimeError, match="inside the hook"):
        block.run_with_hooks(x, hooks={"q": boom})
    assert block.hook is None
    with pytest.raises(zoo.ArgumentError, match="'attn' is not one of"):
        block.run_with_hooks(x, hooks={"attn": lambda t, _: None})
    with pytest.raises(zoo.InputError, match="return a tensor of shape"):
        block.run_with_hooks(x, hooks={"z": lambda t, _: t[:, :1]})
    with pytest.raises(zoo.InputTypeError, match="not a function"):
        block.run_with_hooks(x, hooks={"z": 3})
    with hooked(block, HookRun({"z": lambda t, _: None})), pytest.raises(zoo.ArgumentError, match="do not nest"):
        block.run_with_hooks(x, hooks={"z": lambda t, _: None})
    assert block.hook is None


def test_a_hook_that_returns_none_changes_nothing_and_the_fused_path_stays():
    block = _block("gqa")
    x, _, _ = _inputs(block)
    seen = []
    with torch.no_grad():
        y = block.run_with_hooks(x, hooks={"z": lambda t, name: seen.append(name)})
        torch.testing.assert_close(y, block(x))
    assert seen == ["z"]
    assert not HookRun({"z": print}).explicit and HookRun({"pattern": print}).explicit
