import pytest
import torch

import zoo
from helpers import ALL_NAMES, create, make_inputs
from zoo import InputError

RTOL, ATOL = 1e-5, 1e-5  # fp32 eager vs eager: two orders of summation, nothing more


def close(a, b, rtol=RTOL, atol=ATOL):
    torch.testing.assert_close(a, b, rtol=rtol, atol=atol)


def random_mask(b, t, s, *, empty_row=True):
    m = torch.rand(b, 1, t, s) > 0.4
    m[..., 0] = True
    if empty_row:
        m[0, 0, -1, :] = False  # one query row with no allowed key
    return m


@pytest.mark.parametrize("name", ALL_NAMES)
def test_shapes_and_weights(name):
    m = create(name).eval()
    x, c, s = make_inputs(m.spec)
    y, a = m(x, c, need_weights=True)
    assert y.shape == x.shape
    assert a.shape == (2, m.spec.heads, 5, s)
    if m.spec.sinks:  # the sink takes a share of every row (zoo/modifiers/sinks.py)
        assert bool(((a.sum(-1) > 0) & (a.sum(-1) < 1)).all())
    else:
        close(a.sum(-1), torch.ones(2, m.spec.heads, 5))


@pytest.mark.parametrize("name", ALL_NAMES)
def test_fused_equals_explicit(name):
    m = create(name).eval()
    x, c, s = make_inputs(m.spec)
    for mask in (None, random_mask(2, 5, s), torch.randn(2, 1, 5, s)):
        m.fused = True
        y_fused = m(x, c, mask)
        m.fused = False
        y_explicit = m(x, c, mask)
        close(y_fused, y_explicit)
        assert torch.isfinite(y_fused).all()


@pytest.mark.parametrize("name", ALL_NAMES)
def test_fully_masked_row_gives_zero_attention(name):
    m = create(name).eval()
    x, c, s = make_inputs(m.spec)
    mask = random_mask(2, 5, s)
    b_o = m.out_proj.bias if m.spec.bias else torch.zeros(m.spec.d_model)
    for fused in (True, False):
        m.fused = fused
        y, a = m(x, c, mask, need_weights=True)
        assert torch.isfinite(y).all() and torch.isfinite(a).all()
        assert (a[0, :, -1] == 0).all()
        close(y[0, -1], b_o.detach().expand_as(y[0, -1]))  # Z = 0, so y is W_O's bias
        assert torch.isfinite(m(x, c, mask)).all()
    # a float mask with a whole row of -inf means the same
    fmask = torch.zeros(2, 1, 5, s)
    fmask[1, 0, 2] = float("-inf")
    for fused in (True, False):
        m.fused = fused
        y = m(x, c, fmask)
        close(y[1, 2], b_o.detach().expand_as(y[1, 2]))


@pytest.mark.parametrize("name", ALL_NAMES)
def test_masked_keys_do_not_matter(name):
    m = create(name).eval()
    x, c, s = make_inputs(m.spec)
    mask = torch.ones(s, dtype=torch.bool)
    mask[-2:] = False  # the last two keys are padding
    y = m(x, c, mask)
    if c is None:
        x2 = x.clone()
        x2[:, -2:] += 10 * torch.randn_like(x2[:, -2:])
        y2 = m(x2, None, mask)
        close(y2[:, :-2], y[:, :-2])
    else:
        c2 = c.clone()
        c2[:, -2:] = torch.randn_like(c2[:, -2:])
        close(m(x, c2, mask), y)


def test_causal_ignores_the_future():
    m = zoo.create("mha-causal").eval()
    x = torch.randn(2, 6, 64)
    y = m(x)
    x2 = x.clone()
    x2[:, 4:] = torch.randn(2, 2, 64)
    close(m(x2)[:, :4], y[:, :4])
    _, a = m(x, need_weights=True)
    assert (a.triu(1) == 0).all()


def test_causal_combines_with_user_mask():
    m = zoo.create("gqa").eval()
    x = torch.randn(2, 6, 64)
    pad = torch.ones(2, 1, 1, 6, dtype=torch.bool)
    pad[1, ..., 0] = False  # row 0 of batch 1 sees only key 0 under causal: now nothing
    for fused in (True, False):
        m.fused = fused
        y, a = m(x, mask=pad, need_weights=True)
        assert torch.isfinite(y).all()
        assert (a[1, :, 0] == 0).all() and (a.triu(1) == 0).all()
    m.fused = True
    y_f = m(x, mask=pad)
    m.fused = False
    close(y_f, m(x, mask=pad))


@pytest.mark.parametrize("name", ALL_NAMES)
def test_head_mask_ones_is_identity_and_zeros_leave_bias(name):
    m = create(name).eval()
    x, c, _ = make_inputs(m.spec)
    h = m.spec.heads
    close(m(x, c, head_mask=torch.ones(h)), m(x, c))
    y0 = m(x, c, head_mask=torch.zeros(2, h))
    b_o = m.out_proj.bias.detach() if m.spec.bias else torch.zeros(m.spec.d_model)
    close(y0, b_o.expand_as(y0))


def test_gqa_blocked_mapping():
    """Query head r reads kv head r // (h // g), as torch SDPA's enable_gqa."""
    m = zoo.create("gqa", causal=False).eval()
    s = m.spec
    x = torch.randn(1, 5, s.d_model)
    q, k, v = m.project(x)
    from einops import rearrange

    q = rearrange(q, "b t (h d) -> b h t d", h=s.heads)
    k = rearrange(k, "b s (g d) -> b g s d", g=s.kv_heads_)
    v = rearrange(v, "b s (g d) -> b g s d", g=s.kv_heads_)
    z = torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    y_ref = m.out_proj(rearrange(z, "b h t d -> b t (h d)"))
    close(m(x), y_ref)


@pytest.mark.parametrize(
    "call, exc, words",
    [
        (lambda m: m(torch.randn(2, 5)), InputError, ["(2, 5)", "d_model=64"]),
        (lambda m: m(torch.randn(2, 5, 63)), InputError, ["(2, 5, 63)", "d_model=64"]),
        (lambda m: m(torch.randn(2, 5, 64, dtype=torch.float64)), TypeError, ["float64", "float32"]),
        (lambda m: m([[1.0]]), TypeError, ["torch.Tensor"]),
        (
            lambda m: m(torch.randn(2, 5, 64), mask=torch.ones(3, 1, 5, 5, dtype=torch.bool)),
            InputError,
            ["(3, 1, 5, 5)", "(2, 4, 5, 5)"],
        ),
        (
            # b == h: a (b, t, s) padding mask would silently be read per head
            lambda m: m(torch.randn(4, 5, 64), mask=torch.ones(4, 5, 5, dtype=torch.bool)),
            InputError,
            ["ambiguous", "mask[:, None]"],
        ),
        (lambda m: m(torch.randn(2, 0, 64)), InputError, ["(2, 0, 64)", "at least 1"]),
        (
            lambda m: m(torch.randn(2, 5, 64), mask=torch.ones(1, 1, 1, 2, 5, 5, dtype=torch.bool)),
            InputError,
            ["does not broadcast"],
        ),
        (
            lambda m: m(torch.randn(2, 5, 64), mask=torch.ones(5, 5, dtype=torch.int64)),
            TypeError,
            ["int64", "bool"],
        ),
        (lambda m: m(torch.randn(2, 5, 64), head_mask=torch.ones(3)), InputError, ["(3,)", "h=4"]),
        (lambda m: m(torch.randn(2, 5, 64), head_mask=torch.ones(3, 4)), InputError, ["(3, 4)", "b=2"]),
        (
            lambda m: m(torch.randn(2, 5, 64), torch.randn(2, 5, 64)),
            InputError,
            ["self-attention", "d_context"],
        ),
    ],
)
def test_bad_inputs_raise_clear_errors(call, exc, words):
    m = zoo.create("mha-separate-bias")
    with pytest.raises(exc) as ei:
        call(m)
    for w in words:
        assert w in str(ei.value), (w, str(ei.value))


def test_cross_attention_context_errors():
    m = zoo.create("cross-attention")
    x = torch.randn(2, 5, 64)
    with pytest.raises(InputError, match="pass context"):
        m(x)
    with pytest.raises(InputError, match="d_context=48"):
        m(x, torch.randn(2, 7, 64))
    with pytest.raises(InputError, match="b=2"):
        m(x, torch.randn(3, 7, 48))
    with pytest.raises(TypeError, match="float64"):
        m(x, torch.randn(2, 7, 48, dtype=torch.float64))


def test_module_rejects_non_spec():
    with pytest.raises(TypeError, match="AttentionSpec"):
        zoo.MultiHeadAttention({"d_model": 8})


def test_float64_and_float16_modules_run():
    m = zoo.create("mha-separate-bias").double()
    assert m(torch.randn(1, 3, 64, dtype=torch.float64)).dtype == torch.float64
    h = zoo.create("mha-separate-bias").half()
    y = h(torch.randn(1, 3, 64).half(), mask=random_mask(1, 3, 3))
    assert y.dtype == torch.float16 and torch.isfinite(y).all()


def test_fp16_large_activations_stay_finite_in_both_paths():
    """|q.k| above fp16's 65504 before scaling must not overflow the explicit path."""
    m = zoo.create("mha-separate-nobias", d_model=128, heads=1).half().eval()
    x = (torch.randn(1, 8, 128) * 100).half()
    m.fused = True
    y_fused = m(x)
    m.fused = False
    y_explicit, a = m(x, need_weights=True)
    assert torch.isfinite(y_explicit).all() and torch.isfinite(a).all() and a.dtype == torch.float16
    torch.testing.assert_close(y_explicit.float(), y_fused.float(), rtol=2e-2, atol=2e-2 * y_fused.abs().max().item())


def test_head_mask_with_a_batch_of_one_broadcasts():
    m = zoo.create("mha-separate-bias").eval()
    x = torch.randn(3, 6, 64)
    hm = torch.tensor([[1.0, 0.0, 1.0, 1.0]])
    close(m(x, head_mask=hm), m(x, head_mask=hm[0]))


@pytest.mark.parametrize("name", [n for n in ALL_NAMES if zoo.spec(n).group_size > 1])
def test_sdpa_sharing_kv_heads_equals_repeating_them(name):
    m = create(name).eval()
    x, c, s = make_inputs(m.spec)
    for mask in (None, random_mask(2, 5, s)):
        m.share_kv = True
        shared = m(x, c, mask)
        m.share_kv = False
        repeated = m(x, c, mask)
        close(shared, repeated)


# -- inputs the block refuses: NaN in a float mask, integer x ----------------------------------


@pytest.mark.parametrize("need_weights", [False, True])
def test_nan_float_mask_is_refused_on_every_path(need_weights):
    m = zoo.create("mha-combined-bias").eval()
    mask = torch.zeros(5, 5)
    mask[2] = float("nan")
    with pytest.raises(zoo.InputError, match="NaN"):
        m(torch.randn(2, 5, 64), mask=mask, need_weights=need_weights)
    m.fused = False
    with pytest.raises(zoo.InputError, match="NaN"):
        m(torch.randn(2, 5, 64), mask=mask)


def test_integer_x_is_told_to_convert_x_not_the_module():
    m = zoo.create("mha-combined-bias")
    with pytest.raises(TypeError, match=r"x.to\(torch.float32\)") as ei:
        m(torch.ones(1, 2, 64, dtype=torch.int64))
    assert "module.to" not in str(ei.value)


# -- the three kernels and the two kinds of cache share one score path ---------------------------


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16])
def test_folded_kernel_is_the_explicit_kernel_over_repeated_kv_heads(dtype):
    from zoo.attend import explicit_attention, folded_attention, repeat_kv

    torch.manual_seed(0)
    b, h, g, t, n, d = 2, 6, 2, 3, 7, 8
    q, k, v = torch.randn(b, h, t, d), torch.randn(b, g, n, d), torch.randn(b, g, n, d)
    q, k, v = (a.to(dtype) for a in (q, k, v))
    allowed = torch.rand(b, 1, t, n) > 0.3
    allowed[0, 0, -1] = False  # a query with no allowed key: Z = 0
    bias = torch.randn(1, h, t, n, dtype=dtype)

    def cap(scores):
        return 5 * torch.tanh(scores / 5)

    z_fold = folded_attention(q, k, v, 0.3, allowed, bias, score_map=cap)
    z_exp, _ = explicit_attention(q, repeat_kv(k, h // g), repeat_kv(v, h // g), 0.3, allowed, bias, score_map=cap)
    tol = 1e-12 if dtype == torch.float64 else 1e-3  # matmul and einsum sum in their own orders
    torch.testing.assert_close(z_fold, z_exp, rtol=tol, atol=tol)
    assert (z_fold[0, :, -1] == 0).all()


def test_both_kinds_of_cache_place_a_left_padded_prompt_at_the_same_positions():
    from zoo.cache import GrowingCache, StaticBuffers

    key_mask = torch.tensor([[False, False, True, True, True], [True, True, True, True, True]])
    grow = GrowingCache(key_mask=key_mask).place(5, torch.device("cpu"))
    buffers = torch.zeros(2, 1, 8, 4)
    full = torch.cat((key_mask, torch.zeros(2, 3, dtype=torch.bool)), 1)
    static = StaticBuffers(buffers, buffers, torch.tensor(0), full).place(5, torch.device("cpu"))
    assert torch.equal(grow.q_pos, static.q_pos) and torch.equal(grow.q_pos[0], torch.tensor([-1, -1, 0, 1, 2]))
    assert torch.equal(static.index, torch.arange(5)) and static.k_at.shape == (1, 8)
