"""The static KV cache (zoo/cache.py, runtime/static_decoding.py): buffers of a fixed capacity
written in place, eagerly (block.decode(x, cache=...)) and under ONNX Runtime (cache="static").

Eagerly every causal preset decodes in any split, batch 3 left-padded, to what the growing cache
gives; under ONNX Runtime the decode parity check (parity.matrix.check_decode: a prompt, 25 single
steps, chunks, batch 1 and 3 left-padded) passes for presets covering every modifier, the rest under -m slow.
"""

import numpy as np
import pytest
import torch

import zoo
from export import OnnxSession, export_onnx
from export.choice import why_not
from export.lowerings import LOWERING_LIST
from export.names import LOWERINGS
from helpers import ALL_NAMES, create, small_overrides
from parity.matrix import check_decode
from runtime.decoding import DecodeInputError

CAUSAL = [n for n in ALL_NAMES if zoo.spec(n).causal and not zoo.spec(n).is_cross]
PADS = (0, 3, 1)


def _static_runs(m, x, key_mask, capacity):
    """y from a static cache in three splits: prompt + single steps, chunks, all at once."""
    n = x.shape[1]
    for cuts in ([7, *range(8, n + 1)], [3, 11, n], [n]):
        cache = zoo.StaticCache.empty(m.spec, batch=x.shape[0], max_len=capacity)
        ys, start = [], 0
        for end in cuts:
            ys.append(m.decode(x[:, start:end], cache=cache, key_mask=key_mask[:, :end]))
            start = end
        yield torch.cat(ys, 1), cache


@pytest.mark.parametrize("name", CAUSAL)
def test_eager_static_cache_is_the_growing_cache(name):
    torch.manual_seed(0)
    m = create(name).eval()
    x = torch.randn(len(PADS), 16, m.spec.d_model)
    key_mask = torch.ones(len(PADS), 16, dtype=torch.bool)
    for r, pad in enumerate(PADS):
        key_mask[r, :pad] = False
    with torch.no_grad():
        want, pk, pv = m.decode(x, key_mask=key_mask)
        for got, cache in _static_runs(m, x, key_mask, capacity=21):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
            assert cache.length == 16
            torch.testing.assert_close(cache.valid()[0], pk, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(cache.valid()[1], pv, rtol=1e-5, atol=1e-5)


def test_eager_static_cache_writes_in_place_and_refuses_past_capacity():
    m = create("llama-3-8b").eval()
    cache = zoo.StaticCache.empty(m.spec, batch=2, max_len=8)
    key_buffer = cache.key.data_ptr()
    with torch.no_grad():
        m.decode(torch.randn(2, 6, m.spec.d_model), cache=cache)
        before = cache.key.clone()
        with pytest.raises(zoo.CacheFullError, match=r"max_len=8 positions cannot take 6 written \+ 3 new = 9"):
            m.decode(torch.randn(2, 3, m.spec.d_model), cache=cache)
    assert cache.length == 6 and torch.equal(cache.key, before)  # nothing written
    assert cache.key.data_ptr() == key_buffer
    with pytest.raises(zoo.InputError, match="either cache="):
        m.decode(torch.randn(2, 1, m.spec.d_model), cache.key, cache.value, cache=cache)
    with pytest.raises(zoo.InputError, match=r"cache.key has shape"):
        m.decode(torch.randn(3, 1, m.spec.d_model), cache=cache)
    with pytest.raises(zoo.InputError, match="max_len=0 must be at least 1"):
        zoo.StaticCache.empty(m.spec, batch=1, max_len=0)
    with pytest.raises(zoo.CacheFullError, match=r"max_len=2 positions cannot take 0 written \+ 6 new"):
        zoo.StaticCache.from_past(cache.key[:, :, :6], cache.value[:, :, :6], max_len=2)
    with pytest.raises(zoo.InputError, match="decode\\(\\) needs a causal self-attention block"):
        c = create("mha-separate-bias")
        c.decode(torch.randn(1, 1, c.spec.d_model), cache=zoo.StaticCache.empty(c.spec, batch=1, max_len=4))


# Presets that cover every modifier (rotary full/partial, GQA, window, softcap, QK-norm, ALiBi,
# MHA with biases) in the default run; every other causal preset under -m slow.
QUICK = {"gemma-2-9b", "bloom-560m"}  # + llama-3-8b and mistral-7b below; the rest under -m slow


STATIC = [lw.name for lw in LOWERING_LIST if lw.static_cache is None]


@pytest.mark.parametrize(
    "name, lowering",
    [
        pytest.param(n, lw, marks=() if n in QUICK else (pytest.mark.slow,))
        for n in CAUSAL
        for lw in STATIC
        if why_not(lw, zoo.spec(n, **small_overrides(n)), decode=True, cache="static") is None
    ],
)
def test_static_cache_decode_parity(name, lowering, tmp_path):
    row = check_decode(name, lowering, cache="static", workdir=tmp_path, **small_overrides(name))
    assert row.case == "decode-static"
    assert row.status == "PASS", f"{name} {lowering}: {row.reason} (max abs {row.max_abs:.2e})"
    assert row.shapes == 2 * (26 + 4)


def test_static_lowerings():
    assert STATIC == ["decomposed", "ort-gqa"]


@pytest.mark.parametrize("lowering", [lw for lw in LOWERINGS if lw not in STATIC])
def test_lowerings_without_a_static_cache_say_why(lowering):
    reason = why_not(lowering, zoo.spec("llama-3-8b"), decode=True, cache="static")
    assert reason and "static cache" in reason and "decomposed" in reason
    row = check_decode("llama-3-8b", lowering, cache="static", **small_overrides("llama-3-8b"))
    assert row.status == "SKIP" and row.reason == reason


def test_ort_gqa_static_cache_shares_the_buffers(tmp_path):
    """GroupQueryAttention's presents are the graph's outputs (no Identity copy between them), and
    a step writes into the bound buffer itself; a batched chunk after a past runs row by row."""
    path = tmp_path / "gqa.onnx"
    r = export_onnx(
        "llama-3-8b",
        path,
        decode=True,
        cache="static",
        lowering="ort-gqa",
        max_len=16,
        with_mask=True,
        **small_overrides("llama-3-8b"),
    )
    assert r.op_counts.get("com.microsoft::GroupQueryAttention") == 1 and not r.op_counts.get("Identity")
    sess = OnnxSession(path, "cpu", verbose=False)
    m = r.module
    x = torch.randn(2, 12, m.spec.d_model)
    with torch.no_grad():
        want, pk, _ = m.decode(x)
    cache = sess.static_cache(2, max_len=16)
    key = cache.key
    got = [cache.step(x[:, :5].numpy()), cache.step(x[:, 5:9].numpy())]  # the second: b 2, t 4, a past
    got += [cache.step(x[:, i : i + 1].numpy()) for i in range(9, 12)]
    assert cache.key is key and cache.length == 12
    np.testing.assert_allclose(key[:, :, :12], pk.numpy(), rtol=1e-4, atol=1e-5)  # written in place
    assert not key[:, :, 12:].any()
    np.testing.assert_allclose(np.concatenate(got, 1), want.numpy(), rtol=1e-4, atol=1e-5)


@pytest.fixture(scope="module")
def static_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("static") / "llama.onnx"
    r = export_onnx("llama-3-8b", path, decode=True, cache="static", max_len=24, **small_overrides("llama-3-8b"))
    return path, r


def test_static_export_records_its_cache_and_interface(static_model):
    path, r = static_model
    assert r.lowering == "decomposed"  # auto: the lowering that keeps a static cache
    assert [n for n, _, _ in r.inputs] == ["x", "past_key", "past_value", "past_len"]
    assert r.inputs[3][1] == "int64" and r.inputs[1][2][2] == "n"
    assert r.op_counts.get("ScatterElements") == 2  # the in-place write, one per buffer
    sess = OnnxSession(path, "cpu", verbose=False)
    assert sess.cache == "static" and sess.metadata["attnzoo.max_len"] == "24"


def test_session_static_cache_matches_eager_and_keeps_the_caller_arrays(static_model):
    path, r = static_model
    sess = OnnxSession(path, "cpu", verbose=False)
    m = r.module
    x = torch.randn(2, 20, m.spec.d_model)
    with torch.no_grad():
        want, pk, pv = m.decode(x)
    y0, k0, v0 = sess.decode(x[:, :5].numpy())
    k0_copy = k0.copy()
    ys, k1, v1 = sess.generate_steps(x[:, 5:].numpy(), k0, v0)
    assert np.array_equal(k0, k0_copy)  # the caller's past is copied into the buffers, never written
    np.testing.assert_allclose(np.concatenate([y0, ys], 1), want.numpy(), rtol=1e-4, atol=1e-5)
    assert k1.shape == (2, m.spec.kv_heads_, 20, m.spec.d_k_)
    np.testing.assert_allclose(k1, pk.numpy(), rtol=1e-4, atol=1e-5)
    with pytest.raises(
        zoo.CacheFullError,
        match=r"max_len=24 positions cannot take 20 written \+ 5 new = 25: re-export with a larger --max-len",
    ):
        sess.generate_steps(x[:, :5].numpy(), k1, v1)
    assert k1.shape[2] == 20


def test_session_static_cache_object_steps_rewinds_and_refuses(static_model):
    path, r = static_model
    sess = OnnxSession(path, "cpu", verbose=False)
    m = r.module
    x = torch.randn(1, 12, m.spec.d_model)
    with torch.no_grad():
        want, _, _ = m.decode(x)
    cache = sess.static_cache(1, max_len=12)
    assert cache.capacity == 12 and cache.length == 0
    got = [cache.step(x[:, :4].numpy())] + [cache.step(x[:, i : i + 1].numpy()) for i in range(4, 12)]
    np.testing.assert_allclose(np.concatenate(got, 1), want.numpy(), rtol=1e-4, atol=1e-5)
    key_before = cache.key.copy()
    with pytest.raises(zoo.CacheFullError, match=r"12 written \+ 1 new"):
        cache.step(x[:, :1].numpy())
    assert np.array_equal(cache.key, key_before) and cache.length == 12  # nothing written
    cache.rewind(4)  # decode positions 4.. again from the same prompt: same rows
    again = [cache.step(x[:, i : i + 1].numpy()) for i in range(4, 12)]
    np.testing.assert_allclose(np.concatenate(again, 1), np.concatenate(got[1:], 1), rtol=1e-6, atol=1e-6)
    with pytest.raises(zoo.ArgumentError, match="length=13 must be an int in 0..12"):
        cache.rewind(13)
    grow = path.with_name("grow.onnx")
    export_onnx("llama-3-8b", grow, decode=True, cache="grow", **small_overrides("llama-3-8b"))
    with pytest.raises(zoo.ArgumentError, match="keeps a grow cache"):
        OnnxSession(grow, "cpu", verbose=False).static_cache(1)


def test_static_cache_export_refusals(tmp_path):
    out = tmp_path / "m.onnx"
    with pytest.raises(ValueError, match="cache='static' is for decode models"):
        export_onnx("llama-3-8b", out, cache="static")
    with pytest.raises(ValueError, match="max_len is the capacity of a static cache"):
        export_onnx("llama-3-8b", out, decode=True, cache="grow", max_len=64)
    with pytest.raises(ValueError, match="cache='ring' is not one of auto, grow, static"):
        export_onnx("llama-3-8b", out, decode=True, cache="ring")
    with pytest.raises(ValueError, match="max_len=0 must be at least 1"):
        export_onnx("llama-3-8b", out, decode=True, cache="static", max_len=0)
    with pytest.raises(TypeError, match="max_len='8' must be an int"):
        export_onnx("llama-3-8b", out, decode=True, cache="static", max_len="8")
    with pytest.raises(ValueError, match="onnx-attention cannot keep a static cache"):
        export_onnx("llama-3-8b", out, decode=True, cache="static", lowering="onnx-attention")
    assert not out.exists()


def test_cli_static_cache(tmp_path, capsys):
    from cli.main import main

    path = tmp_path / "m.onnx"
    sets = ["--set", "d_model=64", "--set", "heads=4", "--set", "kv_heads=2", "--set", "d_k=16"]
    assert (
        main(["export", "mistral-7b", *sets, "--decode", "--cache", "static", "--max-len", "40", "-o", str(path)]) == 0
    )
    assert "past_len int64[]" in capsys.readouterr().out
    assert main(["run", str(path), "-b", "2", "-t", "5", "--steps", "6", "--provider", "cpu"]) == 0
    assert "static cache of capacity 40" in capsys.readouterr().out
    assert main(["run", str(path), "-t", "38", "--steps", "6", "--provider", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "max_len=40 positions" in err and "--max-len" in err and "rewind" not in err  # `run` holds no cache
    assert main(["parity", "mistral-7b", "--decode", "--cache", "static", "--lowering", "decomposed", "-q", *sets]) == 0
    out = capsys.readouterr().out
    assert "decode-static" in out and "1 passed, 0 failed" in out
    assert main(["parity", "mistral-7b", "--cache", "static", *sets]) == 2
    assert "add --decode" in capsys.readouterr().err


STEP_BAD = [
    (np.zeros((1, 1, 64)), zoo.InputTypeError, "x has dtype float64; this model takes float32"),
    (np.zeros((1, 1, 65), np.float32), DecodeInputError, r"x has shape \(1, 1, 65\); expected"),
    (np.zeros((2, 1, 64), np.float32), DecodeInputError, "this cache was made for batch=1"),
    (np.zeros(64, np.float32), DecodeInputError, r"x has shape \(64,\); expected \(b >= 1, t >= 1, c=64\)"),
    (np.zeros((1, 0, 64), np.float32), DecodeInputError, r"x has shape \(1, 0, 64\)"),
    ([[[0.0] * 64]], zoo.InputTypeError, "must be a torch.Tensor or numpy array, got list"),
]


@pytest.mark.parametrize("x, error, words", STEP_BAD, ids=["float64", "width", "batch", "1-D", "empty-t", "list"])
def test_static_cache_step_checks_x_as_decode_does(static_model, capfd, x, error, words):
    """OrtStaticCache.step shares sess.decode's check of x (dtype, rank, width, batch, empty): a typed
    one-line error before ONNX Runtime runs (which raised its own RuntimeError and logged on stderr)."""
    path, r = static_model
    sess = OnnxSession(path, "cpu", verbose=False)
    cache = sess.static_cache(1)
    cache.step(np.zeros((1, 2, 64), np.float32))
    key = cache.key.copy()
    capfd.readouterr()
    with pytest.raises(error, match=words):
        cache.step(x)
    assert capfd.readouterr().err == ""
    assert cache.length == 2 and np.array_equal(cache.key, key)  # nothing written
    if "batch" not in words:  # the same refusal as sess.decode's (which has no cache of a batch yet)
        with pytest.raises(error, match=words):
            sess.decode(x)
    y = cache.step(torch.zeros(1, 1, 64))  # torch in -> torch out, as sess.decode
    assert isinstance(y, torch.Tensor) and y.shape == (1, 1, 64) and cache.length == 3


def test_static_cache_max_len_past_the_exported_capacity_is_refused(static_model):
    path, _ = static_model
    sess = OnnxSession(path, "cpu", verbose=False)
    with pytest.raises(zoo.ArgumentError, match=r"max_len=100 is past this model's capacity of 24 positions"):
        sess.static_cache(1, max_len=100)
    with pytest.raises(zoo.ArgumentError, match="max_len=25 is past"):
        sess.static_cache(1, max_len=25)
    assert sess.static_cache(1, max_len=24).capacity == 24 and sess.static_cache(1).capacity == 24


def test_static_capacity_past_the_machine_is_refused_before_allocating(static_model, tmp_path, capsys):
    """export, the session and the eager cache refuse buffers past the machine's memory with a
    ResourceError naming the size (not a capacity past int64 recorded, numpy's MemoryError, torch's
    allocator error)."""
    import onnx

    from cli.main import main

    out = tmp_path / "big.onnx"
    for n in (10**23, 2**40):
        with pytest.raises(zoo.ResourceError, match=rf"a static cache \(batch=1, max_len={n}\) needs about"):
            export_onnx("llama-3-8b", out, decode=True, cache="static", max_len=n, **small_overrides("llama-3-8b"))
    assert not out.exists()
    argv = ["export", "mha-causal", "--decode", "--cache", "static", "--max-len", "99999999999999999999999"]
    assert main([*argv, "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--max-len 99999999999999999999999) needs about" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()

    path, _ = static_model  # a file that records a capacity past the machine (as an older export could)
    model = onnx.load(str(path))
    for prop in model.metadata_props:
        if prop.key == "attnzoo.max_len":
            prop.value = str(2**40)
    onnx.save(model, str(out))
    sess = OnnxSession(out, "cpu", verbose=False)
    with pytest.raises(zoo.ResourceError, match=r"max_len=1099511627776\) needs about .* this machine has"):
        sess.static_cache(1)
    with pytest.raises(zoo.ResourceError, match="batch=1099511627776"):
        sess.static_cache(2**40, max_len=1)
    y, pk, _ = sess.decode(np.zeros((1, 3, 64), np.float32))  # a call sizes its buffers to itself
    assert pk.shape[2] == 3

    spec = zoo.spec("llama-3-8b")
    with pytest.raises(zoo.ResourceError, match=r"a static cache \(batch=1, max_len=1099511627776\) needs"):
        zoo.StaticCache.empty(spec, batch=1, max_len=2**40)
    with pytest.raises(zoo.ResourceError, match="needs about"):
        zoo.StaticCache.from_past(torch.zeros(1, 8, 1, 128), torch.zeros(1, 8, 1, 128), max_len=2**40)
    assert zoo.StaticCache.empty(spec, batch=1, max_len=2**40, device="meta").capacity == 2**40  # nothing allocated


def test_static_cache_from_a_cuda_past_is_judged_against_the_device(monkeypatch):
    """from_past shares empty()'s check: a CUDA past is judged against its device's memory (it was
    judged against the host's), before anything is allocated, and a meta past allocates nothing."""

    class CudaPast:  # what from_past reads of a (b g p d) CUDA tensor before it allocates
        device = torch.device("cuda", 0)

        def __init__(self, d):
            self.shape = (1, 2, 3, d)

        def element_size(self):
            return 4

    class Props:
        total_memory = 2**20  # a 1 MiB device: far less than this machine's memory

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: Props)
    with pytest.raises(zoo.ResourceError, match=r"a static cache \(batch=1, max_len=8192\) on cuda:0 needs about"):
        zoo.StaticCache.from_past(CudaPast(16), CudaPast(16), max_len=8192)  # 2 MiB of buffers
    meta = torch.zeros(1, 2, 3, 16, device="meta")
    assert zoo.StaticCache.from_past(meta, meta, max_len=2**40).capacity == 2**40


@pytest.mark.parametrize("lowering", STATIC)
def test_static_graph_refuses_past_len_outside_its_buffer(lowering, tmp_path):
    """The graph run directly (another runtime, no session): past_len = -1 wrapped around and wrote
    at position n - 1. Outside 0..n-t the decomposed graph now writes nothing, with every index
    inside the buffer (no runtime bounds check needed); GroupQueryAttention refuses the call. The
    valid range is in the metadata."""
    import onnx
    import onnxruntime as ort

    path = tmp_path / "m.onnx"
    r = export_onnx(
        "llama-3-8b", path, decode=True, cache="static", lowering=lowering, max_len=16, **small_overrides("llama-3-8b")
    )
    meta = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
    assert meta["attnzoo.past_len"] == "0 <= past_len <= max_len - t" and meta["attnzoo.max_len"] == "16"
    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    s = r.spec
    rng = np.random.default_rng(0)
    for past_len, t in ((-1, 1), (-16, 1), (-1, 2), (16, 1), (15, 2), (100, 1), (0, 17), (-5, 20)):
        key = rng.standard_normal((1, s.kv_heads_, 16, s.d_k_)).astype(np.float32)
        feeds = {"x": rng.standard_normal((1, t, s.d_model)).astype(np.float32), "past_key": key}
        feeds |= {"past_value": key.copy(), "past_len": np.array(past_len, np.int64)}
        if lowering == "decomposed":  # a no-op write: the buffers come back as they went in
            _, pk, pv = sess.run(None, feeds)
            assert pk.shape == pv.shape == key.shape and np.array_equal(pk, key) and np.array_equal(pv, key)
        else:
            with pytest.raises(Exception, match="GroupQueryAttention"):
                sess.run(None, feeds)
    for past_len, t in ((0, 1), (15, 1), (14, 2)):  # the valid range still writes where it should
        key = np.zeros((1, s.kv_heads_, 16, s.d_k_), np.float32)
        feeds = {"x": rng.standard_normal((1, t, s.d_model)).astype(np.float32), "past_key": key}
        feeds |= {"past_value": key.copy(), "past_len": np.array(past_len, np.int64)}
        _, pk, _ = sess.run(None, feeds)
        written = np.nonzero(np.abs(pk).sum((0, 1, 3)))[0]
        assert pk.shape[2] == 16 and list(written) == list(range(past_len, past_len + t))
