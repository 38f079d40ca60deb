"""Serving: request decoding and padded batches (plain numpy), then the same through Ray Serve.

The Ray half shares one Ray instance per module (2 CPUs) and one deployment on 127.0.0.1 at a
free port; both are shut down by the fixture's finalizer, also when a test fails.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import os
import re
import socket
import threading
import zipfile

import numpy as np
import pytest

from export import export_onnx
from helpers import REPO, free_port, local_ray
from runtime.session import OnnxSession
from serve import (
    JSON,
    NPY,
    NPZ,
    Client,
    ClientError,
    Item,
    ModelInfo,
    RequestError,
    ServeError,
    check_arrays,
    decode_request,
    encode_response,
    length_groups,
    run_batch,
    start,
)

# Ray Serve's own pydantic models warn on import; not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
RTOL = 1e-5  # max abs error relative to the output scale (fp32, CPU), as the issue asks


def _npy(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=False)
    return buf.getvalue()


def _close(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape, (got.shape, want.shape)
    err = float(np.abs(got - want).max())
    scale = float(np.abs(want).max())
    assert scale > 0 and err <= RTOL * scale, f"max abs err {err:.3g} vs output scale {scale:.3g}"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Small exports: self-attention with a mask input, cross-attention with a mask and weights."""
    d = tmp_path_factory.mktemp("serve_models")
    out = {}
    export_onnx("mha-combined-bias", d / "masked.onnx", with_mask=True)
    out["masked"] = d / "masked.onnx"
    export_onnx("cross-attention", d / "cross.onnx", with_mask=True, lowering="decomposed", need_weights=True)
    out["cross"] = d / "cross.onnx"
    return out


@pytest.fixture(scope="module")
def sessions(models):
    return {k: OnnxSession(p, provider="cpu", verbose=False) for k, p in models.items()}


def _info(sess, **kw) -> ModelInfo:
    return ModelInfo.of(sess, **kw)


def _no_mask(sess) -> ModelInfo:
    """What a model exported without --mask looks like to the server (saves an export: the
    session fills an all-True mask itself when none is fed)."""
    return dataclasses.replace(ModelInfo.of(sess), has_mask=False)


# -- decoding ----------------------------------------------------------------------------------


def test_json_npy_npz_and_base64_decode_to_the_same_item(sessions):
    info = _info(sessions["masked"])
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 64)).astype(np.float32)
    mask = rng.random((5, 5)) > 0.3
    b64 = base64.b64encode(_npy(x)).decode()
    forms = [
        (json.dumps({"x": x.tolist(), "mask": mask.tolist()}).encode(), JSON),
        (json.dumps({"x": {"npy_b64": b64}, "mask": mask.astype(int).tolist()}).encode(), JSON),
    ]
    buf = io.BytesIO()
    np.savez(buf, x=x, mask=mask)
    forms.append((buf.getvalue(), NPZ))
    for body, kind in forms:
        item = decode_request(body, kind, info)
        assert item.squeeze and item.x.shape == (1, 5, 64) and item.x.dtype == np.float32
        np.testing.assert_array_equal(item.x[0], x)
        np.testing.assert_array_equal(item.mask[0], mask)
        assert item.binary == (kind != JSON)
    item = decode_request(_npy(x[None]), NPY, info)
    assert not item.squeeze and item.binary and item.mask is None
    # The Accept header picks the answer's format whatever the request's was.
    assert decode_request(_npy(x), NPY, info, accept=JSON).binary is False
    assert decode_request(forms[0][0], JSON, info, accept=NPY).binary is True


BAD = [
    (b"{not json", JSON, 400, "not JSON"),
    (b"[1, 2]", JSON, 400, "send an object"),
    (json.dumps({"x": [[1.0] * 64], "y": 1}).encode(), JSON, 400, "unknown field"),
    (json.dumps({"x": [[1.0] * 64, [1.0] * 63]}).encode(), JSON, 400, "ragged"),
    (json.dumps({"x": [["a"] * 64]}).encode(), JSON, 400, "numbers"),
    (json.dumps({"x": [[1.0] * 63]}).encode(), JSON, 400, "width 63"),
    (json.dumps({"x": [1.0] * 64}).encode(), JSON, 400, "shape (64,)"),
    (json.dumps({"context": [[1.0] * 64]}).encode(), JSON, 400, "x is required"),
    (json.dumps({"x": [[1.0] * 64], "mask": [[2]]}).encode(), JSON, 400, "true/false"),
    (json.dumps({"x": [[1.0] * 64] * 3, "mask": [[True] * 4]}).encode(), JSON, 400, "does not broadcast"),
    (json.dumps({"x": [[1.0] * 64], "context": [[1.0] * 64]}).encode(), JSON, 400, "self-attention"),
    (json.dumps({"x": {"npy_b64": "***"}}).encode(), JSON, 400, "base64"),
    (b"garbage", NPY, 400, "not a .npy"),
    (_npy(np.zeros((2, 64), np.float64)), NPY, 400, "dtype float64"),
    (_npy(np.zeros((2, 64), np.int32)), NPY, 400, "dtype int32"),
    (_npy(np.zeros((0, 3, 64), np.float32)), NPY, 400, "empty"),
    (_npy(np.full((2, 64), np.nan, np.float32)), NPY, 400, "NaN"),
    (_npy(np.zeros((1, 2, 3, 64), np.float32)), NPY, 400, "shape (1, 2, 3, 64)"),
    (_npy(np.zeros((1, 300, 64), np.float32)), NPY, 413, "at most 256"),
    (b"x", "text/plain", 415, "content type"),
]


@pytest.mark.parametrize("body,kind,status,words", BAD, ids=[f"{b[3]}" for b in BAD])
def test_bad_requests_get_one_line_and_a_4xx(sessions, body, kind, status, words):
    info = _info(sessions["masked"], max_tokens=256)
    with pytest.raises(RequestError) as e:
        decode_request(body, kind, info)
    assert e.value.status == status
    assert words in str(e.value) and "\n" not in str(e.value)


def test_too_large_is_refused_from_the_npy_header_alone(sessions):
    info = _info(sessions["masked"], max_tokens=256)
    head = io.BytesIO()
    np.lib.format.write_array_header_1_0(head, {"descr": "<f4", "fortran_order": False, "shape": (4, 1000, 64)})
    with pytest.raises(RequestError) as e:
        decode_request(head.getvalue(), NPY, info)  # no data at all: the header is enough
    assert e.value.status == 413


def _zip(members: dict[str, bytes]) -> bytes:
    """An .npz body from raw member bytes (what np.savez writes, or not)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return buf.getvalue()


def test_an_npz_bomb_is_refused_from_its_member_headers_before_inflating(sessions, monkeypatch):
    """A small archive whose x.npy inflates to far more than the limits: refused (413) from the
    member's .npy header, streamed, without unpacking any array."""
    info = _info(sessions["masked"], max_tokens=256, max_body=2**20)

    def no_unpacking(*args, **kwargs):
        raise AssertionError("an array was unpacked before the archive was checked")

    monkeypatch.setattr(np.lib.format, "read_array", no_unpacking)
    bomb = _zip({"x.npy": _npy(np.zeros((20_000, 64), np.float32))})  # 5 MB of zeros, 5 KB zipped
    assert len(bomb) < 20_000
    with pytest.raises(RequestError) as e:
        decode_request(bomb, NPZ, info)
    assert e.value.status == 413 and "x in the .npz declares shape (20000, 64)" in str(e.value)
    # Members that are each within --max-tokens but together unpack past the body limit.
    many = _zip({"x.npy": _npy(np.zeros((2, 64), np.float32)), "mask.npy": _npy(np.ones((1, 2, 2**21), bool))})
    with pytest.raises(RequestError) as e:
        decode_request(many, NPZ, info)
    assert e.value.status == 413 and "at most 1048576" in str(e.value) and "\n" not in str(e.value)


def test_arrays_longer_than_their_npy_header_are_refused(sessions):
    """A header declaring (2, 64) in front of 5000 x 64 floats: 400, never the first 2 rows."""
    info = _info(sessions["masked"])
    x = np.ones((2, 64), np.float32)
    long = _npy(x) + np.zeros((5000, 64), np.float32).tobytes()
    short = _npy(x)[:-8]
    bodies = [
        (long, NPY),
        (short, NPY),
        (json.dumps({"x": {"npy_b64": base64.b64encode(long).decode()}}).encode(), JSON),
        (_zip({"x.npy": long}), NPZ),
        (_zip({"x.npy": short}), NPZ),
    ]
    for body, kind in bodies:
        with pytest.raises(RequestError) as e:
            decode_request(body, kind, info)
        assert e.value.status == 400 and "(2, 64) float32 (512 bytes of data)" in str(e.value), (kind, e.value)
    assert decode_request(_zip({"x.npy": _npy(x)}), NPZ, info).x.shape == (1, 2, 64)  # exact: fine


def test_deeply_nested_json_is_a_400_not_a_recursion_error(sessions):
    info = _info(sessions["masked"])
    for depth in (100_000, 900):
        body = b'{"x": ' + b"[" * depth + b"]" * depth + b"}"
        with pytest.raises(RequestError) as e:
            decode_request(body, JSON, info)
        assert e.value.status == 400 and "\n" not in str(e.value)


def test_an_output_that_is_not_finite_is_a_422_not_invalid_json(sessions):
    """{"x": [[1e30] * 64]} is finite float32 but its y overflows to NaN: JSON has no NaN."""
    sess = sessions["masked"]
    info = _info(sess)
    item = decode_request(json.dumps({"x": [[1e30] * 64]}).encode(), JSON, info)
    ((y,),) = run_batch(sess, [item], info)
    assert not np.isfinite(y).all()
    for binary in (False, True):
        item.binary = binary
        with pytest.raises(RequestError) as e:
            encode_response(item, (y,), info.outputs)
        assert e.value.status == 422 and "the output is not finite" in str(e.value)


def test_model_specific_inputs_are_checked(sessions):
    with pytest.raises(RequestError, match="takes no mask"):
        check_arrays(
            {"x": np.zeros((1, 3, 64), np.float32), "mask": np.ones((3, 3), bool)}, _no_mask(sessions["masked"])
        )
    with pytest.raises(RequestError, match="cross-attention model: send context"):
        check_arrays({"x": np.zeros((1, 3, 64), np.float32)}, _info(sessions["cross"]))
    with pytest.raises(RequestError, match="context has shape"):
        check_arrays(
            {"x": np.zeros((2, 3, 64), np.float32), "context": np.zeros((1, 4, 48), np.float32)},
            _info(sessions["cross"]),
        )


# -- batching ----------------------------------------------------------------------------------


def _alone(sess, it: Item):
    out = sess.run(it.x, it.context, it.mask)
    return out if isinstance(out, tuple) else (out,)


def test_padded_batch_equals_each_request_alone(sessions):
    sess = sessions["masked"]
    info = _info(sess)
    rng = np.random.default_rng(1)
    items = []
    for b, t in ((1, 3), (2, 9), (1, 1), (3, 6)):
        x = rng.standard_normal((b, t, 64)).astype(np.float32)
        mask = rng.random((b, t, t)) > 0.4
        mask[..., 0] = True
        items.append(check_arrays({"x": x, "mask": mask if t > 1 else None}, info))
    results = run_batch(sess, items, info)
    for it, res in zip(items, results):
        _close(res[0], _alone(sess, it)[0])


@pytest.mark.parametrize("precision", ["int8", "int4"])
def test_quantized_padded_mixed_scale_batch_equals_each_request_alone(precision, tmp_path):
    """A quantized export through the server's batching: requests whose inputs differ 200x in scale,
    padded into one run, each get the answer they get alone (dynamic int8 took one activation scale
    for the whole batch, and 0 of 40 such requests were bit-equal to running alone)."""
    export_onnx("mha-combined-bias", tmp_path / "q.onnx", with_mask=True, precision=precision)
    sess = OnnxSession(tmp_path / "q.onnx", provider="cpu", verbose=False)
    info = _info(sess)
    rng = np.random.default_rng(3)
    items = [
        check_arrays({"x": (scale * rng.standard_normal((b, t, 64))).astype(np.float32)}, info)
        for b, t, scale in ((1, 5, 1.0), (2, 8, 20.0), (1, 6, 0.1), (1, 8, 4.0))
    ]
    assert len(length_groups(items, has_mask=True)) == 1  # one padded run
    for it, res in zip(items, run_batch(sess, items, info)):
        assert np.array_equal(res[0], _alone(sess, it)[0]), (precision, it.b, it.t)  # bit-equal


def test_longrope_requests_share_a_padded_run_only_on_one_side_of_the_switch(tmp_path):
    """A longrope block takes its long frequency set when a run's sequence passes rope_original_max, so a
    request of 6 padded beside one of 10 (original max 8) would change: they run apart, and each gets
    exactly its answer alone; requests on one side still share a run."""
    overrides = dict(d_model=64, heads=4, rope_original_max=8, rope_short_factor=(1.0,) * 8)
    overrides["rope_long_factor"] = tuple(2.0 + i for i in range(8))
    export_onnx("phi-3.5-mini", tmp_path / "lr.onnx", with_mask=True, **overrides)
    sess = OnnxSession(tmp_path / "lr.onnx", provider="cpu", verbose=False)
    info = _info(sess)
    assert info.switch_at == 8
    rng = np.random.default_rng(4)
    items = [check_arrays({"x": rng.standard_normal((1, t, 64)).astype(np.float32)}, info) for t in (6, 10, 7, 11)]
    assert len(length_groups(items, has_mask=True)) == 1  # lengths alone would share one run
    for it, res in zip(items, run_batch(sess, items, info)):
        np.testing.assert_allclose(res[0], _alone(sess, it)[0], rtol=1e-5, atol=1e-6, err_msg=str(it.t))


def test_lengths_share_a_run_only_within_twice_each_other(sessions):
    info = _info(sessions["masked"])
    items = [check_arrays({"x": np.zeros((1, t, 64), np.float32)}, info) for t in (16, 20, 31, 33, 64, 65, 128, 3)]
    groups = length_groups(items, has_mask=True)
    assert [[items[i].t for i in g] for g in groups] == [[3], [16, 20, 31], [33, 64, 65], [128]]
    assert sorted(i for g in groups for i in g) == list(range(len(items)))
    twice = items[:3] * 2  # without a mask only equal lengths share a run
    assert [[twice[i].t for i in g] for g in length_groups(twice, has_mask=False)] == [[16, 16], [20, 20], [31, 31]]


def test_cross_attention_pads_queries_and_keys_and_cuts_the_weights(sessions):
    sess = sessions["cross"]
    info = _info(sess)
    rng = np.random.default_rng(2)
    items = [
        check_arrays(
            {
                "x": rng.standard_normal((1, t, 64)).astype(np.float32),
                "context": rng.standard_normal((1, s, 48)).astype(np.float32),
            },
            info,
        )
        for t, s in ((2, 7), (5, 3), (4, 11))
    ]
    for it, (y, attn) in zip(items, run_batch(sess, items, info)):
        want_y, want_attn = _alone(sess, it)
        _close(y, want_y)
        _close(attn, want_attn)
        np.testing.assert_allclose(attn.sum(-1), 1.0, rtol=1e-5)  # padded keys got no weight


def test_a_model_without_a_mask_batches_equal_lengths_only(sessions):
    sess = sessions["masked"]
    info = _no_mask(sess)
    rng = np.random.default_rng(3)
    items = [check_arrays({"x": rng.standard_normal((1, t, 64)).astype(np.float32)}, info) for t in (4, 7, 4, 7, 2)]
    for it, res in zip(items, run_batch(sess, items, info)):
        _close(res[0], _alone(sess, it)[0])


def test_answers_keep_the_request_shape_and_format(sessions):
    info = _info(sessions["masked"])
    item = check_arrays({"x": np.ones((3, 64), np.float32)}, info)
    y = np.arange(3 * 64, dtype=np.float32).reshape(1, 3, 64)
    body, kind = encode_response(item, (y,), ("y",))
    assert kind == JSON and np.asarray(json.loads(body)["y"]).shape == (3, 64)
    item.binary = True
    body, kind = encode_response(item, (y,), ("y",))
    assert kind == NPY and np.load(io.BytesIO(body)).shape == (3, 64)


@pytest.fixture(scope="module")
def decoder(tmp_path_factory):
    """A token-by-token export (x, past_key, past_value, past_len, key_mask -> y, present_key, present_value):
    the default static cache; requests still send and receive a past of p positions."""
    path = tmp_path_factory.mktemp("serve_decode") / "decode.onnx"
    export_onnx("mha-causal", path, decode=True, with_mask=True)
    return OnnxSession(path, provider="cpu", verbose=False)


def test_a_decode_model_takes_its_cache_in_and_out(decoder):
    info = _info(decoder)
    assert info.decode and info.has_key_mask and (info.kv_heads, info.d_k, info.d_v) == (4, 16, 16)
    rng = np.random.default_rng(6)
    prompt = rng.standard_normal((5, 64)).astype(np.float32)
    item = decode_request(json.dumps({"x": prompt.tolist()}).encode(), JSON, info)  # no past: a prompt
    ((y, pk, pv),) = run_batch(decoder, [item], info)
    want = decoder.decode(prompt[None])
    for got, w in zip((y, pk, pv), want):
        _close(got, w)
    body, kind = encode_response(item, (y, pk, pv), info.outputs)
    assert kind == JSON and np.asarray(json.loads(body)["present_key"]).shape == (4, 5, 16)

    # The next step sends the presents back as its past, as .npz; two such steps and two prompts
    # (one with a key mask) share a batch, each answered as if alone.
    step = rng.standard_normal((1, 64)).astype(np.float32)
    buf = io.BytesIO()
    np.savez(buf, x=step, past_key=pk[0], past_value=pv[0])
    items = [decode_request(buf.getvalue(), NPZ, info) for _ in range(2)]
    key_mask = np.array([[False, True, True, True, True]])
    items += [check_arrays({"x": prompt[None]}, info), check_arrays({"x": prompt[None], "key_mask": key_mask}, info)]
    results = run_batch(decoder, items, info)
    alone = [
        decoder.decode(step[None], pk, pv),
        decoder.decode(step[None], pk, pv),
        decoder.decode(prompt[None]),
        decoder.decode(prompt[None], key_mask=key_mask),
    ]
    for res, want in zip(results, alone):
        for got, w in zip(res, want):
            _close(got, w)
    assert results[0][1].shape == (1, 4, 6, 16)  # the cache grew by the step


@pytest.fixture(scope="module")
def gqa_decoder(tmp_path_factory):
    """A GroupQueryAttention decode export (ort-gqa: what `auto` picks for a growing cache of shared kv heads)."""
    path = tmp_path_factory.mktemp("serve_gqa") / "gqa.onnx"
    dims = {"d_model": 64, "heads": 4, "kv_heads": 2, "d_k": 16}
    r = export_onnx("llama-3-8b", path, decode=True, cache="grow", with_mask=True, **dims)
    assert r.lowering == "ort-gqa"
    return OnnxSession(path, provider="cpu", verbose=False)


def test_ort_gqa_decode_requests_with_chunks_after_a_past_share_a_run(gqa_decoder):
    """Equal (t, p) with t > 1 and p > 0 from several requests: the case GroupQueryAttention
    refuses at b > 1; each answer equals its request run alone, left padding included."""
    info = _info(gqa_decoder)
    rng = np.random.default_rng(3)
    items, alone = [], []
    for r in range(3):
        prompt = rng.standard_normal((1, 5, 64)).astype(np.float32)
        key_mask = np.ones((1, 9), bool)
        key_mask[0, :r] = False  # rows 1 and 2 left-padded
        _, pk, pv = gqa_decoder.decode(prompt, key_mask=key_mask[:, :5])
        chunk = rng.standard_normal((1, 4, 64)).astype(np.float32)
        items.append(check_arrays({"x": chunk, "past_key": pk, "past_value": pv, "key_mask": key_mask}, info))
        alone.append(gqa_decoder.decode(chunk, pk, pv, key_mask))
    for res, want in zip(run_batch(gqa_decoder, items, info), alone):
        assert not isinstance(res, Exception), res
        for got, w in zip(res, want):
            _close(got, w)


def test_a_failing_group_fails_only_its_own_requests(decoder):
    """Groups of one server batch run separately: one whose run raises answers its own requests
    with that error, and the others are answered as if alone."""
    info = _info(decoder)
    rng = np.random.default_rng(4)
    prompt = rng.standard_normal((1, 5, 64)).astype(np.float32)
    _, pk, pv = decoder.decode(prompt)

    class Flaky:  # the real session, except that a chunk of 3 after a past fails
        def decode(self, x, past_key, past_value, key_mask=None):
            if x.shape[1] == 3 and past_key.shape[2] > 0:
                raise RuntimeError("the runtime refused this chunk")
            return decoder.decode(x, past_key, past_value, key_mask)

    step = rng.standard_normal((1, 1, 64)).astype(np.float32)
    chunk = rng.standard_normal((1, 3, 64)).astype(np.float32)
    items = [
        check_arrays({"x": step, "past_key": pk, "past_value": pv}, info),
        check_arrays({"x": chunk, "past_key": pk, "past_value": pv}, info),
        check_arrays({"x": prompt}, info),
        check_arrays({"x": chunk, "past_key": pk, "past_value": pv}, info),
    ]
    results = run_batch(Flaky(), items, info)
    assert isinstance(results[1], RuntimeError) and results[3] is results[1]
    for res, want in ((results[0], decoder.decode(step, pk, pv)), (results[2], decoder.decode(prompt))):
        for got, w in zip(res, want):
            _close(got, w)


DECODE_BAD = [
    ({"x": np.zeros((1, 64), np.float32), "past_key": np.zeros((3, 2, 16), np.float32)}, "together"),
    (
        {
            "x": np.zeros((1, 64), np.float32),
            "past_key": np.zeros((3, 2, 16), np.float32),
            "past_value": np.zeros((3, 2, 16), np.float32),
        },
        "past_key has shape (3, 2, 16); send (4, p, 16)",
    ),
    (
        {
            "x": np.zeros((1, 64), np.float32),
            "past_key": np.zeros((4, 2, 16), np.float32),
            "past_value": np.zeros((4, 3, 16), np.float32),
        },
        "past_key holds 2 positions but past_value 3",
    ),
    ({"x": np.zeros((2, 64), np.float32), "key_mask": np.ones(3, bool)}, "send (b, p+t) = (1, 2)"),
    ({"x": np.zeros((2, 64), np.float32), "key_mask": np.ones(2, np.int8)}, "key_mask has dtype int8"),
    ({"x": np.zeros((2, 64), np.float32), "mask": np.ones((2, 2), bool)}, "a decode model takes"),
    ({"x": np.zeros((1, 900, 64), np.float32)}, "at most 512"),
]


@pytest.mark.parametrize("arrays,words", DECODE_BAD, ids=[w for _, w in DECODE_BAD])
def test_decode_requests_are_checked(decoder, arrays, words):
    with pytest.raises(RequestError) as e:
        check_arrays(arrays, _info(decoder, max_tokens=512))
    assert words in str(e.value) and 400 <= e.value.status < 500


def test_a_static_capacity_that_is_not_ascii_digits_is_a_serve_error(decoder, monkeypatch):
    """The server reads attnzoo.max_len with the session's reader (export's capacity()): '²'.isdigit()
    is True, and int('²') raised a raw ValueError out of ModelInfo.of; every bad value is a ServeError."""
    for raw in ("²", "٣", "0", "-3", " 7", "1_0", "x", ""):
        monkeypatch.setitem(decoder.metadata, "attnzoo.max_len", raw)
        with pytest.raises(ServeError, match=re.escape(f"attnzoo.max_len={raw!r}")):
            _info(decoder)
    monkeypatch.delitem(decoder.metadata, "attnzoo.max_len")
    with pytest.raises(ServeError, match="has no attnzoo.max_len metadata"):
        _info(decoder)
    monkeypatch.setitem(decoder.metadata, "attnzoo.max_len", "4096")
    assert _info(decoder).max_len == 4096


def test_a_static_request_past_the_capacity_is_a_4xx_naming_max_len(decoder):
    """p + t past a static cache's capacity can never succeed: a 413 naming max_len (never a 503 a
    client retries, no rewind() advice, which HTTP has not), the capacity in /metadata's ModelInfo."""
    import zoo
    from serve.blocks.protocol import failure_answer

    info = _info(decoder)
    assert info.max_len == int(decoder.metadata["attnzoo.max_len"]) == 4096
    small = dataclasses.replace(info, max_len=64)  # what a 64-position export looks like to the server
    past = np.zeros((1, 4, 60, 16), np.float32)
    fits = check_arrays({"x": np.zeros((1, 4, 64), np.float32), "past_key": past, "past_value": past}, small)
    assert fits.p + fits.t == 64
    with pytest.raises(RequestError) as e:
        check_arrays({"x": np.zeros((1, 5, 64), np.float32), "past_key": past, "past_value": past}, small)
    assert e.value.status == 413 and "max_len=64" in str(e.value) and "p+t = 60+5 = 65" in str(e.value)
    assert "rewind" not in str(e.value)
    # A run that still meets the capacity (the session's own refusal) is the client's too.
    full = np.zeros((1, 4, 4092, 16), np.float32)
    with pytest.raises(zoo.CacheFullError) as run:
        decoder.decode(np.zeros((1, 5, 64), np.float32), full, full)
    line, status = failure_answer(run.value)
    assert status == 413 and "max_len" in line and "rewind" not in line
    assert failure_answer(zoo.ResourceError("the padded batch needs 9 GB"))[1] == 503  # try later
    assert failure_answer(RuntimeError("boom"))[1] == 500


def test_a_cache_sent_to_a_full_sequence_model_is_refused(sessions):
    arrays = {"x": np.zeros((1, 2, 64), np.float32), "past_key": np.zeros((1, 4, 1, 16), np.float32)}
    with pytest.raises(RequestError, match="full-sequence model"):
        check_arrays(arrays, _info(sessions["masked"]))


def test_start_refuses_bad_options_before_starting_ray(models, tmp_path):
    with pytest.raises(ServeError, match="replicas=0"):
        start(models["masked"], replicas=0)
    with pytest.raises(ServeError, match="provider='gpu'"):
        start(models["masked"], provider="gpu")
    with pytest.raises(FileNotFoundError, match="attnzoo export"):
        start(tmp_path / "missing.onnx")
    import ray

    if not ray.is_initialized():  # the port is checked when start() is to start Ray itself
        with socket.socket() as busy:
            busy.bind(("127.0.0.1", 0))
            busy.listen()
            with pytest.raises(ServeError, match="pick another --port"):
                start(models["masked"], port=busy.getsockname()[1])
    with pytest.raises(ServeError, match="route_prefix='decode'"):
        start(models["masked"], route_prefix="decode")
    from runtime.session import cuda_status

    if not cuda_status()[0]:  # embedded with no working CUDA: refused now, not a replica waiting for a GPU
        with pytest.raises(ServeError, match="provider='cuda'"):
            start(models["masked"], provider="cuda")


def test_the_port_check_names_what_to_change():
    from serve import check_port_free

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with pytest.raises(ServeError, match="Address already in use.*pick another --port"):
            check_port_free("127.0.0.1", busy.getsockname()[1])
    for host in ("192.0.2.1", "no-such-host.invalid"):  # a documentation address, a name that never resolves
        with pytest.raises(ServeError, match="pick another --host"):
            check_port_free(host, 8000)
    with socket.socket() as probe:  # a free port, on each loopback this machine has
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    check_port_free("127.0.0.1", free)
    if socket.has_ipv6 and _binds(socket.AF_INET6, "::1"):
        check_port_free("::1", free)  # an IPv6 host binds an IPv6 socket


def _binds(family: int, host: str) -> bool:
    try:
        with socket.socket(family) as s:
            s.bind((host, 0))
        return True
    except OSError:
        return False


def test_cli_serve_refuses_an_unknown_model_in_one_line(capsys):
    from cli.main import main

    assert main(["serve", "no-such-block"]) == 2
    err = capsys.readouterr().err.strip()
    assert "neither an .onnx file nor a zoo name" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("port", ["99999", "0", "-1", "http"])
def test_cli_serve_refuses_a_port_that_is_not_one_in_one_line(capsys, models, port):
    from cli.main import main

    try:
        rc = main(["serve", str(models["masked"]), "--port", port])
    except SystemExit as e:  # argparse's usage errors exit from inside parse_args
        rc = e.code
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "--port" in err and len(err.splitlines()) == 1 and "Traceback" not in err, err


def test_client_and_start_refuse_bad_urls_and_ports_as_attnzoo_errors(models):
    from zoo import AttnzooError

    for url, words in (
        ("not-a-url", "give an http URL"),
        ("ftp://x/", "give an http URL"),
        ("http://127.0.0.1:99999/", "Port out of range"),
        ("http://127.0.0.1:port/", "url="),
    ):
        with pytest.raises(AttnzooError, match=re.escape(words)) as e:
            Client(url)
        assert isinstance(e.value, ValueError) and "\n" not in str(e.value)
    with pytest.raises(AttnzooError, match="timeout"):
        Client("http://127.0.0.1:1/", timeout=0)
    with pytest.raises(ServeError, match="1..65535"):
        start(models["masked"], port=99999)
    assert issubclass(ClientError, AttnzooError) and issubclass(ClientError, RuntimeError)


# -- through Ray Serve -------------------------------------------------------------------------


def test_a_local_serve_keeps_ray_on_loopback(models):
    """`attnzoo serve` without --address starts a Ray of its own: every socket that Ray's processes
    (GCS, raylet, agents, metrics, the Serve controller, proxy and replica) listen on is loopback."""
    import os
    import signal
    import subprocess
    import sys

    from helpers import Piped, descendants, is_loopback, listening_sockets

    pytest.importorskip("ray")
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "cli", "serve", str(models["masked"]), "--port", str(port)]
    proc = Piped([*cmd, "--duration", "300"], env)  # both pipes drained from the start: Ray's chatter never blocks it
    try:
        proc.wait_for("ready:")  # once /healthz answers through the proxy
        rows = listening_sockets(descendants(proc.pid) | {proc.pid})
        assert any(p == port for _, p, _ in rows), rows  # the HTTP proxy is among them
        assert len(rows) > 5, rows  # GCS, raylet, workers...: Ray's own, not only the proxy
        open_ = [r for r in rows if not is_loopback(r[0])]
        assert not open_, f"listening beyond loopback: {open_}"
    finally:
        proc.send_signal(signal.SIGTERM)  # the CLI shuts Serve and its Ray down, as on Ctrl-C
        try:
            out, err = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
    assert (proc.returncode, out.rstrip().endswith("stopped")) in ((0, True), (130, False)), (out, err[-2000:])
    assert "SIGTERM received" not in err and (proc.returncode == 0 or err.strip() == "attnzoo serve: interrupted")


@pytest.fixture(scope="module")
def server(models, request):
    local_ray(request)
    dep = start(models["masked"], port=free_port(), max_batch=8, batch_wait_ms=100, max_tokens=4096, app="test-serve")
    assert dep.url.startswith("http://127.0.0.1:")
    return dep


def _health_and_metadata(server) -> None:
    with Client(server.url) as c:
        assert c.health()
        meta = c.metadata()
    assert meta["name"] == "mha-combined-bias" and meta["spec"]["d_model"] == 64
    assert meta["provider"] == "cpu" and meta["lowering"] and meta["inputs"] == ["x", "mask"]
    assert meta["max_batch"] == 8 and meta["max_tokens"] == 4096


def _concurrent_requests_of_different_lengths_are_batched_and_exact(server, sessions) -> None:
    sess = sessions["masked"]
    rng = np.random.default_rng(4)
    cases = []
    for i, t in enumerate((3, 17, 1, 8, 12, 5, 30, 2)):
        x = rng.standard_normal((t, 64)).astype(np.float32)
        mask = rng.random((t, t)) > 0.3
        mask[:, 0] = True
        cases.append((x, mask if i % 2 else None, i % 3 != 0))
    results: list = [None] * len(cases)
    barrier = threading.Barrier(len(cases))

    def one(i):
        x, mask, binary = cases[i]
        with Client(server.url, binary=binary) as c:
            barrier.wait()
            reply = c.predict_reply(x, mask=mask)
            results[i] = reply

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(cases))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    from serve import decode_reply

    for (x, mask, binary), reply in zip(cases, results):
        assert reply is not None and reply.status == 200, reply
        assert reply.headers["content-type"].startswith(NPY if binary else JSON)
        want = sess.run(x[None], mask=None if mask is None else mask[None])[0]
        _close(decode_reply(reply), want)
        assert reply.timing("model-ms") > 0 and reply.timing("queue-ms") >= 0
    # Sent together, at least some were answered from one padded batch.
    assert max(int(r.headers["x-attnzoo-batch"]) for r in results) > 1


def _bad_requests_through_http_are_4xx_and_the_replica_lives_on(server, sessions) -> None:
    with Client(server.url) as c:
        for body, kind, status, words in BAD:
            if status == 413:
                continue  # the server's max_tokens differs; checked below
            reply = c.request("POST", "/predict", body, {"Content-Type": kind})
            assert reply.status == status, (words, reply.status, reply.body)
            assert words.encode() in reply.body
        reply = c.request("POST", "/predict", _npy(np.zeros((1, 4097, 64), np.float32)), {"Content-Type": NPY})
        assert reply.status == 413
        assert c.request("GET", "/nowhere").status == 404
        assert c.request("PUT", "/predict", b"").status == 405
        assert c.request("POST", "/elsewhere", b"{}").status == 404
        with pytest.raises(ClientError, match="HTTP 400: x has width 5"):
            c.predict(np.zeros((2, 5), np.float32))
        deep = b'{"x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
        reply = c.request("POST", "/predict", deep, {"Content-Type": JSON})
        assert reply.status == 400 and b"nests too deeply" in reply.body, reply
        reply = c.request("POST", "/predict", json.dumps({"x": [[1e30] * 64]}).encode(), {"Content-Type": JSON})
        assert reply.status == 422 and b"the output is not finite" in reply.body, reply
        x = np.random.default_rng(5).standard_normal((4, 64)).astype(np.float32)
        _close(c.predict(x), sessions["masked"].run(x[None])[0])
        assert c.retried == 0  # 4xx answers are final, never retried


def _a_decode_model_beside_it_passes_the_cache_in_and_out(server, decoder) -> None:
    port = int(server.url.rsplit(":", 1)[1].split("/")[0])
    dep = start(decoder.path, port=port, max_batch=4, batch_wait_ms=20, app="test-decode", route_prefix="/decode")
    assert dep.url == f"http://127.0.0.1:{port}/decode/"
    rng = np.random.default_rng(7)
    prompt, step = rng.standard_normal((6, 64)).astype(np.float32), rng.standard_normal((1, 64)).astype(np.float32)
    for binary in (True, False):
        with Client(dep.url, binary=binary) as c:
            # The default decode export keeps a static cache; past_len is the session's to bind, not a client's.
            meta = c.metadata()
            assert meta["inputs"] == ["x", "past_key", "past_value", "key_mask"] and meta["cache"] == "static"
            assert meta["max_len"] == 4096  # the capacity, so that a client can check p + t first
            full = np.zeros((4, 4092, 16), np.float32)
            with pytest.raises(ClientError, match=r"HTTP 413: p\+t = 4092\+5 = 4097 .* max_len=4096") as e:
                c.decode(np.zeros((5, 64), np.float32), full, full)
            assert "rewind" not in str(e.value) and c.retried == 0  # the client's mistake: final, not retried
            y, pk, pv = c.decode(prompt)
            y2, pk2, pv2 = c.decode(step, pk, pv)  # the answer's cache goes back in as the past
        want = decoder.decode(prompt[None])
        want2 = decoder.decode(step[None], want[1], want[2])
        for got, w in zip((y, pk, pv, y2, pk2, pv2), (*want, *want2)):
            _close(got, w[0])
        assert pk2.shape == (4, 7, 16)


def _concurrent_gqa_decode_chunks_are_batched_and_exact(server, gqa_decoder) -> None:
    """Equal-(t, p) chunks after a past from concurrent requests share a Ray batch with single
    tokens: every request gets a 200 and its own answer (GroupQueryAttention refuses the chunk
    batched; the session runs it row by row)."""
    port = int(server.url.rsplit(":", 1)[1].split("/")[0])
    dep = start(
        gqa_decoder.path,
        port=port,
        max_batch=8,
        batch_wait_ms=300,
        app="test-gqa",
        route_prefix="/gqa",
        cpus_per_replica=0,  # the module's Ray has 2 CPUs, both taken by the other replicas
    )
    try:
        rng = np.random.default_rng(8)
        cases = []
        for t in (3, 3, 3, 3, 1, 1):
            prompt = rng.standard_normal((1, 5, 64)).astype(np.float32)
            _, pk, pv = gqa_decoder.decode(prompt)
            cases.append((rng.standard_normal((1, t, 64)).astype(np.float32), pk, pv))
        replies: list = [None] * len(cases)
        barrier = threading.Barrier(len(cases))

        def one(i):
            x, pk, pv = cases[i]
            with Client(dep.url, retries=0) as c:
                barrier.wait()
                body, kind = c.encode(x, past_key=pk, past_value=pv)
                replies[i] = c.request("POST", "/predict", body, {"Content-Type": kind})

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(cases))]
        for th in threads:
            th.start()
        for th in threads:
            th.join(120)
        from serve import decode_reply

        for (x, pk, pv), reply in zip(cases, replies):
            assert reply is not None and reply.status == 200, reply
            for got, want in zip(decode_reply(reply), gqa_decoder.decode(x, pk, pv)):
                _close(got, want)
        assert max(int(r.headers["x-attnzoo-batch"]) for r in replies) > 1  # they did share batches
    finally:
        dep.shutdown()


def test_through_ray_serve(server, sessions, decoder, gqa_decoder):
    """One test, so that pytest-xdist cannot split the Ray part over workers (each would start
    its own Ray); each step names what it checks."""
    _health_and_metadata(server)
    _concurrent_requests_of_different_lengths_are_batched_and_exact(server, sessions)
    _bad_requests_through_http_are_4xx_and_the_replica_lives_on(server, sessions)
    _concurrent_requests_of_different_lengths_are_batched_and_exact(server, sessions)  # still whole
    _a_decode_model_beside_it_passes_the_cache_in_and_out(server, decoder)
    _concurrent_gqa_decode_chunks_are_batched_and_exact(server, gqa_decoder)


def test_the_client_retries_once_then_says_what_failed():
    c = Client(f"http://127.0.0.1:{free_port()}/", retries=1, timeout=2)
    with pytest.raises(ConnectionError, match="failed"):
        c.predict(np.zeros((2, 64), np.float32))
    assert c.retried == 1
    assert not Client(f"http://127.0.0.1:{free_port()}/", retries=0).health()
    with pytest.raises(ValueError, match="http URL"):
        Client("ftp://example/")
    with pytest.raises(ValueError, match="retries=-1"):
        Client("http://127.0.0.1:1/", retries=-1)


def test_a_ray_of_our_own_gives_its_http_proxy_a_minute_to_start(monkeypatch):
    """Serve's controller kills an HTTP proxy that is not ready in 5 s; on 2 busy cores serve.start then failed
    with a raw ActorDiedError ("killed by ray.kill"). Ray's daemons read the timeouts from the environment they
    inherit when ray.init starts them; a value the user set stays."""
    import ray

    import serve.app

    seen = {}
    monkeypatch.setattr(
        ray, "init", lambda **kw: seen.update({k: os.environ.get(k) for k in serve.app.SLOW_HOST_TIMEOUTS})
    )
    for name in serve.app.SLOW_HOST_TIMEOUTS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S", "7")
    serve.app.init_local_ray(num_cpus=1)
    assert seen == {"RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "60", "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S": "7"}
    assert float(seen["RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S"]) >= 30


def test_a_proxy_that_does_not_start_is_one_line(models, monkeypatch):
    import ray
    from ray import serve as ray_serve

    def killed(**_):
        raise ray.exceptions.RayError(
            "The actor died unexpectedly\nThe actor is dead because it was killed by `ray.kill`."
        )

    monkeypatch.setattr(ray, "is_initialized", lambda: True)  # a Ray already running: nothing to start or stop
    monkeypatch.setattr(ray_serve, "start", killed)
    with pytest.raises(ServeError, match=r"HTTP proxy did not start: .*killed by `ray.kill`.*READY_CHECK_TIMEOUT"):
        start(models["masked"], port=free_port())
