"""The block locations on the shipped models: L{layer}. for decoder self-attention, E{layer}. and
X{layer}. for tiny-dates' encoder and cross-attention, and the residual stream around each layer."""

from __future__ import annotations

import pytest
import torch

import analysis
import zoo
from zoo.hooks import LOCATIONS


@pytest.fixture(scope="module")
def lm():
    return analysis.load("tiny-induction")


@pytest.fixture(scope="module")
def dates():
    return analysis.load("tiny-dates")


def test_lm_names_and_the_residual_stream(lm):
    tokens = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits, cache = lm.run_with_cache(tokens)
        torch.testing.assert_close(logits, lm(tokens))
    assert set(cache) == set(lm.hook_names())
    assert {f"L{i}.{loc}" for i in range(lm.layers) for loc in LOCATIONS} <= set(cache)
    maps = lm.attention_maps(tokens)
    for i in range(lm.layers):
        torch.testing.assert_close(cache[f"L{i}.pattern"], maps[i])
        # attention only: the layer adds its heads' results and W_O's bias to the stream
        bias = lm.attn[i].out_proj.bias
        torch.testing.assert_close(
            cache[f"L{i}.resid_post"], cache[f"L{i}.resid_pre"] + cache[f"L{i}.result"].sum(2) + bias
        )
    torch.testing.assert_close(cache["L0.resid_post"], cache["L1.resid_pre"])
    assert all(block.hook is None for block in lm.attn) and lm.resid_hook is None


def test_lm_hooks_edit_what_the_math_says(lm):
    tokens = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(1))
    hm = torch.ones(lm.layers, lm.heads)
    hm[1, 2] = 0

    def zero(z, name):
        assert name == "L1.z"
        z = z.clone()
        z[:, 2] = 0
        return z

    with torch.no_grad():
        torch.testing.assert_close(lm.run_with_hooks(tokens, hooks={"L1.z": zero}), lm(tokens, head_mask=hm))
        # the residual stream: what a hook returns is what the next layer reads
        same = lm.run_with_hooks(tokens, hooks={"L1.resid_pre": lambda x, _: x * 1.0})
        torch.testing.assert_close(same, lm(tokens))
        moved = lm.run_with_hooks(tokens, hooks={"L1.resid_pre": lambda x, _: torch.zeros_like(x)})
        assert not torch.allclose(moved, lm(tokens))
    with pytest.raises(zoo.ArgumentError, match="not a location of this model"):
        lm.run_with_hooks(tokens, hooks={"L2.z": lambda t, _: None})
    with pytest.raises(zoo.ArgumentError, match="not a location of this model"):
        lm.run_with_cache(tokens, names=["L0.attn"])


def test_dates_prefixes_and_cross_attention(dates):
    src = dates.encode_sources(["29 August 1958", "August 13, 1907"])
    tgt = dates.encode_targets(["1958-08-29", "1907-08-13"])
    tgt_in = dates.shift(tgt)
    with torch.no_grad():
        logits, cache = dates.run_with_cache(src, tgt_in)
        torch.testing.assert_close(logits, dates(src, tgt_in))
    assert set(cache) == set(dates.hook_names())
    last = f"E{dates.config.encoder_layers - 1}"  # the shipped model has one encoder layer
    assert {"E0.pattern", f"{last}.pattern", "L0.pattern", "X0.pattern", f"{last}.resid_post", "L0.resid_pre"} <= set(
        cache
    )
    s = src.shape[1]
    assert tuple(cache["X0.pattern"].shape) == (2, dates.heads, tgt_in.shape[1], s)
    assert tuple(cache["E0.pattern"].shape) == (2, dates.config.heads, s, s)
    maps = dates.cross_attention_maps(["29 August 1958", "August 13, 1907"], ["1958-08-29", "1907-08-13"])
    torch.testing.assert_close(cache["X0.pattern"], maps[0])
    enc, _ = dates.encoder_attention_maps(["29 August 1958", "August 13, 1907"])
    torch.testing.assert_close(cache[f"{last}.pattern"], enc[-1])
    hm = torch.ones(dates.layers, dates.heads)
    hm[0, 5] = 0

    def zero(z, _):
        z = z.clone()
        z[:, 5] = 0
        return z

    with torch.no_grad():
        torch.testing.assert_close(dates.run_with_hooks(src, tgt_in, hooks={"X0.z": zero}), dates(src, tgt_in, hm))
