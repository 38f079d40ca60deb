import pytest
import torch
from torch import nn

import zoo


def close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("kdim", [None, 24])
def test_from_torch_mha_matches_outputs_and_weights(bias, batch_first, kdim):
    peer = nn.MultiheadAttention(32, 4, bias=bias, kdim=kdim, vdim=kdim, batch_first=batch_first).eval()
    with torch.no_grad():  # torch zero-initialises the biases; make them count
        for p in peer.parameters():
            p.add_(0.1 * torch.randn_like(p))
    if batch_first:
        m = zoo.from_torch_mha(peer).eval()
    else:  # the layout change is said out loud, naming the peer's (t, b, c)
        with pytest.warns(UserWarning, match=r"batch_first=False.*\(t, b, c\)"):
            m = zoo.from_torch_mha(peer).eval()
    assert m.spec.layout == ("combined" if kdim is None else "separate")
    assert m.spec.bias == bias and zoo.count_parameters(m) == zoo.count_parameters(peer)
    x = torch.randn(2, 5, 32)
    ctx = torch.randn(2, 7, kdim) if kdim else x
    kpm = torch.zeros(2, ctx.shape[1], dtype=torch.bool)
    kpm[1, -2:] = True  # torch: True = ignore; ours: True = may attend

    def peer_call(q, kv, **kw):
        if batch_first:
            return peer(q, kv, kv, **kw)
        y, a = peer(q.transpose(0, 1), kv.transpose(0, 1), kv.transpose(0, 1), **kw)
        return y.transpose(0, 1), a

    y_ref, a_ref = peer_call(x, ctx, key_padding_mask=kpm, need_weights=True, average_attn_weights=False)
    mask = (~kpm)[:, None, None, :]
    y, a = m(x, ctx if kdim else None, mask, need_weights=True)
    close(y, y_ref)
    close(a, a_ref)


def test_cross_attention_flag_for_equal_widths():
    peer = nn.MultiheadAttention(16, 2, batch_first=True).eval()
    m = zoo.from_torch_mha(peer, cross_attention=True).eval()
    assert m.spec.is_cross and m.spec.d_context == 16 and m.spec.layout == "combined"
    x, c = torch.randn(1, 3, 16), torch.randn(1, 6, 16)
    close(m(x, c), peer(x, c, c, need_weights=False)[0])


@pytest.mark.parametrize("name", ["mha-separate-bias", "mha-combined-nobias", "cross-attention", "transformer-base"])
def test_to_torch_mha_round_trip(name):
    m = zoo.create(name).eval()
    peer = zoo.to_torch_mha(m)
    s = m.spec
    x = torch.randn(2, 5, s.d_model)
    c = torch.randn(2, 6, s.d_context) if s.is_cross else x
    close(peer(x, c, c, need_weights=False)[0], m(x, c if s.is_cross else None))
    back = zoo.from_torch_mha(peer)
    close(back(x, c if s.is_cross else None), m(x, c if s.is_cross else None))


@pytest.mark.parametrize(
    "name, word",
    [("gqa", "kv_heads"), ("mha-separate-bias-dv", "d_k"), ("mha-causal", "causal"), ("mha-scaled", "scale")],
)
def test_to_torch_mha_refuses_what_it_cannot_express(name, word):
    with pytest.raises(ValueError, match=word):
        zoo.to_torch_mha(zoo.create(name))


def test_from_torch_mha_refuses_extras():
    with pytest.raises(ValueError, match="add_bias_kv"):
        zoo.from_torch_mha(nn.MultiheadAttention(8, 2, add_bias_kv=True))
    with pytest.raises(ValueError, match="add_zero_attn"):
        zoo.from_torch_mha(nn.MultiheadAttention(8, 2, add_zero_attn=True))
    with pytest.raises(ValueError, match="kdim=4"):
        zoo.from_torch_mha(nn.MultiheadAttention(8, 2, kdim=4, vdim=6))
    with pytest.raises(TypeError):
        zoo.from_torch_mha(nn.Linear(2, 2))


def test_float64_peer_stays_exact():
    peer = nn.MultiheadAttention(16, 2, batch_first=True).double().eval()
    with torch.no_grad():
        for p in peer.parameters():
            p.normal_()
    m = zoo.from_torch_mha(peer)
    assert m.out_proj.weight.dtype == torch.float64
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    torch.testing.assert_close(m(x), peer(x, x, x, need_weights=False)[0], rtol=1e-12, atol=1e-12)


def test_training_mode_dropout_warns():
    with pytest.warns(UserWarning, match="dropout=0.1"):
        zoo.from_torch_mha(nn.MultiheadAttention(8, 2, dropout=0.1, batch_first=True))


# -- the torch peer's constructor options: exact, refused, or said out loud --------------------


def test_sequence_first_peer_converts_with_a_warning_naming_the_layout():
    peer = nn.MultiheadAttention(64, 4).eval()  # batch_first=False is torch's default
    with pytest.warns(UserWarning, match=r"batch_first=False.*\(t, b, c\)"):
        m = zoo.from_torch_mha(peer).eval()
    x_tbc = torch.randn(7, 2, 64)
    with torch.no_grad():
        y_ref, _ = peer(x_tbc, x_tbc, x_tbc)
        y = m(x_tbc.transpose(0, 1)).transpose(0, 1)  # what the warning tells the user to do
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)


def test_batch_first_peer_converts_silently():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        zoo.from_torch_mha(nn.MultiheadAttention(64, 4, batch_first=True).eval())


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"add_bias_kv": True}, "add_bias_kv"),
        ({"add_zero_attn": True}, "add_zero_attn"),
        ({"kdim": 16, "vdim": 24}, "kdim=16 != vdim=24"),
    ],
)
def test_peer_options_the_zoo_cannot_express_are_refused(kwargs, match):
    with pytest.raises(zoo.ArgumentError, match=match):
        zoo.from_torch_mha(nn.MultiheadAttention(64, 4, batch_first=True, **kwargs))
