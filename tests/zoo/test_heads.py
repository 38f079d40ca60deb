import pytest
import torch

import zoo
from helpers import ALL_NAMES, create, make_inputs
from zoo.audit import valid_permutation


def close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ALL_NAMES)
def test_separate_combined_round_trip_is_exact(name):
    m = create(name).eval()
    x, c, s = make_inputs(m.spec)
    if m.spec.kv_lora_rank is not None:  # latent attention has no [Q|K|V] projection: refused, named
        with pytest.raises(zoo.SpecError, match="layout='combined'"):
            zoo.to_combined(m)
        return
    comb, sep = zoo.to_combined(m), zoo.to_separate(m)
    assert comb.spec.layout == "combined" and sep.spec.layout == "separate"
    close(comb(x, c), m(x, c))
    close(sep(x, c), m(x, c))
    back = zoo.to_separate(comb) if m.spec.layout == "separate" else zoo.to_combined(sep)
    for (k1, v1), (k2, v2) in zip(m.state_dict().items(), back.state_dict().items()):
        assert k1 == k2 and torch.equal(v1, v2)


@pytest.mark.parametrize("name", ALL_NAMES)
def test_permutation_preserves_function(name):
    import random

    m = create(name).eval()
    x, c, s = make_inputs(m.spec)
    perm = valid_permutation(m, random.Random(1))
    p = zoo.permute_heads(m, perm)
    y, a = m(x, c, need_weights=True)
    yp, ap = p(x, c, need_weights=True)
    close(yp, y)
    close(ap, a[:, perm])  # new head r is old head perm[r]
    if m.spec.heads > 1:
        assert not torch.equal(p.out_proj.weight, m.out_proj.weight)


def test_permutation_alone_on_q_breaks_function():
    """Permuting W_Q without the matching W_O permutation must change the output (the check can fail)."""
    m = zoo.create("mha-separate-nobias").eval()
    x = torch.randn(1, 5, 64)
    p = zoo.permute_heads(m, [1, 0, 2, 3])
    with torch.no_grad():
        p.out_proj.weight.copy_(m.out_proj.weight)
    assert (p(x) - m(x)).abs().max() > 1e-3


def test_gqa_permutation_must_respect_groups():
    m = zoo.create("gqa")
    with pytest.raises(ValueError, match="splits a GQA group"):
        zoo.permute_heads(m, [0, 1, 2, 4, 3, 5, 6, 7])
    with pytest.raises(ValueError, match="not a permutation"):
        zoo.permute_heads(m, [0, 0, 1, 2, 3, 4, 5, 6])
    with pytest.raises(TypeError):
        zoo.permute_heads(m, "abc")


@pytest.mark.parametrize("name", ALL_NAMES)
def test_head_ablation_location(name):
    """Zeroing head j via head_mask == removing Z^(j)'s rows of W_O (math convention)."""
    m = create(name).eval()
    s = m.spec
    x, c, _ = make_inputs(m.spec)
    j = s.heads - 1
    hm = torch.ones(s.heads)
    hm[j] = 0
    cut = zoo.to_separate(m)
    with torch.no_grad():
        cut.out_proj.weight[:, j * s.d_v_ : (j + 1) * s.d_v_] = 0
    close(m(x, c, head_mask=hm), cut(x, c))


@pytest.mark.parametrize("name", ALL_NAMES)
def test_pruning_equals_zeroing(name):
    m = create(name).eval()
    s = m.spec
    if s.heads == 1:
        pytest.skip("h=1: pruning the only head is refused (tested below)")
    x, c, _ = make_inputs(m.spec)
    gs = s.group_size
    drop = list(range(s.heads - gs, s.heads)) if 1 < gs < s.heads else [s.heads - 1]
    if s.qk_norm == "full":  # one RMS over all heads: removing a head is a different function
        with pytest.raises(ValueError, match="qk_norm='full'"):
            zoo.prune_heads(m, drop)
        return
    pruned = zoo.prune_heads(m, drop)
    hm = torch.ones(s.heads)
    hm[drop] = 0
    close(pruned(x, c), m(x, c, head_mask=hm))
    assert pruned.spec.heads == s.heads - len(drop)
    assert zoo.count_parameters(pruned) == zoo.count_parameters(pruned.spec)


def test_prune_errors():
    with pytest.raises(ValueError, match="unequal sizes"):
        zoo.prune_heads(zoo.create("gqa"), [0])
    with pytest.raises(ValueError, match="at least one"):
        zoo.prune_heads(zoo.create("single-head-dv128"), [0])
    with pytest.raises(ValueError, match="outside range"):
        zoo.prune_heads(zoo.create("mqa"), [9])
    # MQA: every query head reads kv head 0, so any query head can go
    assert zoo.prune_heads(zoo.create("mqa"), [1]).spec.heads == 3


def test_head_ops_reject_other_modules():
    with pytest.raises(TypeError, match="MultiHeadAttention"):
        zoo.to_combined(torch.nn.Linear(2, 2))


def test_prune_the_same_count_from_every_gqa_group():
    m = zoo.create("gqa").eval()
    pruned = zoo.prune_heads(m, [3, 7])  # one head from each of the 2 groups of 4
    assert (pruned.spec.heads, pruned.spec.kv_heads_, pruned.spec.group_size) == (6, 2, 3)
    x = torch.randn(2, 5, 64)
    hm = torch.ones(8)
    hm[[3, 7]] = 0
    close(pruned(x), m(x, head_mask=hm))
