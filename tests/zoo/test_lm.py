"""zoo.lm: LMSpec's checks, and DecoderLM's own consistency without transformers: `step` in any split of
the prompt equals `forward`, a left-padded row computes what it would alone, generation's cache rules."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import zoo
from zoo.errors import CacheFullError, InputError, InputTypeError, SpecError
from zoo.lm import RESIDUALS, DecoderLM, LMSpec

VOCAB, C = 50, 32


def attn(**kw) -> zoo.AttentionSpec:
    base = dict(d_model=C, heads=4, kv_heads=2, bias=False, causal=True, rope_theta=10000.0)
    return zoo.AttentionSpec(**{**base, **kw})


def spec(**kw) -> LMSpec:
    base = dict(vocab=VOCAB, d_model=C, d_ff=48, attention=(attn(), attn(window=3)))
    return LMSpec(**{**base, **kw})


# one spec per arrangement and part kind, so each branch of a layer runs
VARIANTS = {
    "llama": spec(),
    "gpt2-like": spec(
        norm="layer",
        norm_bias=True,
        mlp="plain",
        act="gelu_tanh",
        mlp_bias=True,
        max_positions=40,
        position_offset=2,
        attention=(attn(rope_theta=None, bias=True),) * 2,
    ),
    **{
        f"residual-{r}": spec(
            residual=r,
            norm="rms_plus1",
            embed_scale=C**0.5,
            embed_scale_in_dtype=True,
            logit_softcap=5.0,
            tied=False,
            head_bias=True,
            residual_multiplier=1.0,
        )
        for r in RESIDUALS
    },
    "mixture": spec(experts=3, experts_per_token=2),
    "mixture-shared": spec(experts=3, experts_per_token=1, expert_renorm=False, shared_expert_d_ff=24),
    "granite-like": spec(residual_multiplier=0.5, embed_scale=3.0, logit_scale=0.25, embed_norm=True),
    "olmo-like": spec(norm="layer_plain", norm_eps=1e-5),
}


def model(s: LMSpec, seed: int = 0) -> DecoderLM:
    torch.manual_seed(seed)
    lm = DecoderLM(s).eval()
    with torch.no_grad():
        for p in lm.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return lm


def ids(b: int = 2, t: int = 9, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (b, t), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_step_in_any_split_equals_forward(name):
    lm, x = model(VARIANTS[name]), ids()
    with torch.no_grad():
        full = lm(x)
        cache = lm.new_cache(2, 12)
        parts = []
        for start, stop in ((0, 4), (4, 5), (5, 9)):
            logits, keys, values = lm.step(
                x[:, start:stop], cache.keys, cache.values, torch.tensor(start), in_place=True, all_logits=True
            )
            assert all(k is c for k, c in zip(keys, cache.keys))  # in place: the same buffers
            parts.append(logits)
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=1e-5, atol=1e-5)
    # the functional step (what the export traces) gives the same logits and leaves the buffers alone
    fresh = lm.new_cache(2, 12)
    with torch.no_grad():
        logits, keys, values = lm.step(x, fresh.keys, fresh.values, torch.tensor(0), in_place=False)
    torch.testing.assert_close(logits, full[:, -1:], rtol=1e-5, atol=1e-5)
    assert not fresh.keys[0].any() and keys[0].any()


@pytest.mark.parametrize("name", ["llama", "gpt2-like"])
def test_left_padded_row_generates_as_alone(name):
    lm, x = model(VARIANTS[name]), ids(1, 6)
    alone = lm.generate(x, 5)
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), x], dim=1)
    batch = torch.cat([padded, ids(1, 9, seed=2)])
    mask = torch.ones_like(batch)
    mask[0, :3] = 0
    out = lm.generate(batch, 5, attention_mask=mask)
    assert out.shape == (2, 14)
    assert torch.equal(out[0, 3:], alone[0])
    torch.testing.assert_close(lm(batch, mask)[0, 3:], lm(x)[0], rtol=1e-5, atol=1e-5)


def test_eos_pads_an_ended_row_and_stops_when_all_end():
    lm, x = model(VARIANTS["llama"]), ids()
    free = lm.generate(x, 6)
    eos = int(free[0, 9 + 1])  # row 0's second new token
    out = lm.generate(x, 6, eos_token_id=eos, pad_token_id=7)
    row0 = out[0, 9:].tolist()
    end = row0.index(eos)
    assert all(tok == 7 for tok in row0[end + 1 :])
    if eos not in free[1, 9:].tolist():  # row 1 goes on to the end
        assert out.shape[1] == 15 and torch.equal(out[1], free[1])
    one = lm.generate(x[:1], 6, eos_token_id=eos)
    assert one.shape[1] == 9 + end + 1  # a batch whose rows all ended stops


def test_generate_refuses_bad_input():
    lm = model(VARIANTS["llama"])
    with pytest.raises(InputError, match="max_new_tokens"):
        lm.generate(ids(), 0)
    with pytest.raises(InputError, match="outside the vocabulary"):
        lm.generate(torch.full((1, 3), VOCAB), 2)
    with pytest.raises(InputTypeError, match="int64"):
        lm(ids().int())
    with pytest.raises(InputError, match="0/1"):
        lm(ids(), torch.full((2, 9), 2))
    cache = lm.new_cache(2, 8)
    with pytest.raises(CacheFullError, match="max_len=8"):
        lm.step(ids(), cache.keys, cache.values, torch.tensor(0), in_place=True)


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(vocab=0), "vocab"),
        (dict(attention=()), "non-empty tuple"),
        (dict(attention=[attn()]), "tuple"),
        (dict(attention=(attn(causal=False),)), "causal self-attention"),
        (dict(attention=(attn(d_model=64, heads=4),)), "d_model=32"),
        (dict(norm="batch"), "norm='batch'"),
        (dict(mlp="moe"), "mlp='moe'"),
        (dict(act="tanh"), "act='tanh'"),
        (dict(residual="deepnorm"), "residual"),
        (dict(tied=1), "tied"),
        (dict(norm_eps=0.0), "norm_eps"),
        (dict(logit_softcap=float("inf")), "logit_softcap"),
        (dict(position_offset=2), "without max_positions"),
        (dict(max_positions=-1), "max_positions"),
        (dict(experts=-1), "experts=-1"),
        (dict(experts=4, experts_per_token=5), "experts_per_token in 1..4"),
        (dict(experts=4, experts_per_token=2, mlp="plain"), "mlp='gated'"),
        (dict(shared_expert_d_ff=8), "without experts"),
        (dict(norm="layer_plain", norm_bias=True), "norm_bias=True needs norm='layer'"),
    ],
)
def test_lmspec_refuses(change, match):
    with pytest.raises(SpecError, match=match):
        spec(**change)


def test_lmspec_is_frozen_data_and_describes_itself():
    s = VARIANTS["granite-like"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.vocab = 3
    assert "residual_multiplier=0.5" in s.describe() and s.layers == 2
    assert isinstance(model(s).layers[0].attn, zoo.MultiHeadAttention)
    with pytest.raises(InputTypeError):
        DecoderLM(s.attention[0])
