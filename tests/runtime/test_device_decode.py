"""Packed rows and the device-resident decode driver (export padding="packed", runtime/device_decode.py): the
graph takes row lengths and no attention bias; its tokens are transformers' greedy tokens for a left-padded
batch and for each row alone, its prompt logits transformers' to fp32 rounding; the CUDA-graph driver's runs
and bound buffers, run with the CPU provider (capture off there); the CUDA options a cuda_graph session asks
for. One packed and one left-padded export of lm_cases' tiny LLaMA, shared."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import zoo
from export import OnnxSession, export_onnx
from export.errors import ExportError
from peers.lm import lm_from_hf
from runtime import core, providers
from runtime.device_decode import GRAPH_ID, NOT_CAPTURED, pack
from runtime.providers import CPU, CUDA, SessionError, cuda_options, providers_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "peers"))
import lm_cases  # noqa: E402 - small random transformers models, one per family

NEW = 12
MAX_LEN = 64
PADS = (0, 4, 2)  # row r left-padded by PADS[r]
LOGITS_ATOL = 1e-4  # fp32 under ONNX Runtime against transformers' eager fp32 (measured ~2e-7)


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """(hf model, {"packed": path, "left": path}) of lm_cases' LLaMA."""
    hf = lm_cases.hf_model("llama")
    lm = lm_from_hf(hf).eval()
    folder = tmp_path_factory.mktemp("device-decode")
    paths = {p: export_onnx(lm, folder / f"{p}.onnx", max_len=MAX_LEN, padding=p).path for p in ("packed", "left")}
    return hf, paths


def padded_prompt():
    ids = lm_cases.prompt(batch=3, t=9)
    mask = torch.ones_like(ids)
    for r, pad in enumerate(PADS):
        mask[r, :pad] = 0
        ids[r, :pad] = 0
    return ids, mask


def test_a_packed_graph_takes_row_lengths_and_gives_its_attention_no_bias(exports):
    _, paths = exports
    model = onnx.load(paths["packed"], load_external_data=False)
    names = ["input_ids", "position_ids", "seqlens_k", "total_sequence_length"]
    assert [i.name for i in model.graph.input[:4]] == names
    gqa = [n for n in model.graph.node if n.op_type == "GroupQueryAttention"]
    assert len(gqa) == 2 and all(len(n.input) <= 10 or n.input[10] == "" for n in gqa)  # 10: attention_bias
    assert {p.key: p.value for p in model.metadata_props}["attnzoo.padding"] == "packed"
    left = onnx.load(paths["left"], load_external_data=False)
    assert {p.key: p.value for p in left.metadata_props}["attnzoo.padding"] == "left"


@pytest.mark.parametrize("cuda_graph", [False, True])
def test_packed_rows_generate_transformers_tokens_padded_and_alone(exports, cuda_graph):
    hf, paths = exports
    ids, mask = padded_prompt()
    kw = dict(max_new_tokens=NEW, do_sample=False, pad_token_id=0, eos_token_id=None)
    want = hf.generate(ids, attention_mask=mask, **kw)
    sess = OnnxSession(paths["packed"], provider="cpu", cuda_graph=cuda_graph)
    assert torch.equal(sess.generate(ids, NEW, attention_mask=mask), want)
    for r, pad in enumerate(PADS):
        alone = sess.generate(ids[r : r + 1, pad:], NEW)
        assert torch.equal(alone[0], want[r, pad:]), (r, alone[0].tolist(), want[r, pad:].tolist())


def test_a_packed_prompts_logits_are_each_rows_alone(exports):
    """The right-padded first call: each row's last real token's logits, as transformers gives the row alone."""
    hf, paths = exports
    ids, mask = padded_prompt()
    packed, lengths = pack(ids.numpy(), mask.numpy().astype(bool))
    sess = ort.InferenceSession(str(paths["packed"]), providers=[CPU])
    feeds = {"input_ids": packed, "position_ids": np.tile(np.arange(packed.shape[1]), (3, 1))}
    feeds.update(seqlens_k=(lengths - 1).astype(np.int32), total_sequence_length=np.array(packed.shape[1], np.int32))
    for x in sess.get_inputs()[4:]:
        feeds[x.name] = np.zeros([3 if d == "b" else 16 if d == "n" else d for d in x.shape], np.float32)
    logits = sess.run(["logits"], feeds)[0]
    with torch.no_grad():
        for r, pad in enumerate(PADS):
            want = hf(ids[r : r + 1, pad:]).logits[0, -1].numpy()
            err = float(np.abs(logits[r, 0] - want).max())
            assert err < LOGITS_ATOL, (r, err)


def test_sampling_on_packed_rows_draws_the_left_padded_graphs_tokens(exports):
    _, paths = exports
    ids, mask = padded_prompt()
    knobs = dict(attention_mask=mask, do_sample=True, temperature=0.9, seed=[3, 4, 5])
    got = OnnxSession(paths["packed"], provider="cpu").generate(ids, NEW, **knobs)
    assert torch.equal(got, OnnxSession(paths["left"], provider="cpu").generate(ids, NEW, **knobs))


def test_pack_moves_each_rows_real_tokens_to_slot_0():
    ids = np.array([[5, 6, 7], [0, 8, 9], [0, 0, 4]])
    packed, lengths = pack(ids, np.array([[1, 1, 1], [0, 1, 1], [0, 0, 1]], bool))
    assert packed.tolist() == [[5, 6, 7], [8, 9, 0], [4, 0, 0]] and lengths.tolist() == [3, 2, 1]


def test_the_cuda_graph_driver_binds_once_and_replays_one_graph_per_shape(exports, monkeypatch):
    """What a CUDA session would capture, run on the CPU (the run option is ignored there): the prompt in its
    own binding, never captured (-1); every decode step the one binding, graph id 1, at the same addresses,
    lengths and positions written in place, total_sequence_length the capacity; the next call of that shape
    reuses it all."""
    _, paths = exports
    sess = OnnxSession(paths["packed"], provider="cpu", cuda_graph=True)
    runs = []
    real = sess.run_with_iobinding

    def record(binding, run_options=None):
        real(binding, run_options)
        buf = next(iter(sess._graphs.values()))
        runs.append(
            dict(
                binding=binding,
                graph=run_options.get_run_config_entry(GRAPH_ID),
                outputs={o.data_ptr() for o in binding.get_outputs()},
                seqlens=buf.seqlens.numpy().tolist() if binding is buf.binding else None,
                positions=buf.pos.numpy()[:, 0].tolist() if binding is buf.binding else None,
            )
        )

    monkeypatch.setattr(sess, "run_with_iobinding", record)
    ids, mask = padded_prompt()
    sess.generate(ids, NEW, attention_mask=mask)
    assert list(sess._graphs) == [(3, MAX_LEN)]  # a cuda_graph call binds the export's whole capacity
    buf = sess._graphs[3, MAX_LEN]
    prompt, steps = runs[0], runs[1:]
    assert prompt["graph"] == NOT_CAPTURED and prompt["binding"] is not buf.binding
    assert len(steps) == NEW - 1 and {s["graph"] for s in steps} == {buf.graph_id} == {"1"}
    assert all(s["binding"] is buf.binding for s in steps)
    fixed = {buf.logits.data_ptr(), buf.next_token.data_ptr()} | {c.data_ptr() for c in buf.caches.values()}
    assert all(s["outputs"] == fixed for s in steps)
    assert {c.data_ptr() for c in buf.caches.values()} <= prompt["outputs"]  # the prompt writes the same caches
    lengths = np.array([9 - p for p in PADS])
    assert [s["seqlens"] for s in steps] == [(lengths + i).tolist() for i in range(NEW - 1)]
    assert [s["positions"] for s in steps] == [s["seqlens"] for s in steps]  # each row's new slot
    assert int(buf.total.numpy()) == MAX_LEN
    runs.clear()
    sess.generate(ids, 3, attention_mask=mask)
    assert [r["graph"] for r in runs] == [NOT_CAPTURED, "1", "1"] and runs[1]["outputs"] == fixed
    sess.generate(ids[:1], 2)
    assert list(sess._graphs) == [(3, MAX_LEN), (1, MAX_LEN)] and sess._graphs[1, MAX_LEN].graph_id == "2"


def test_a_cuda_graph_session_asks_for_graph_capture_with_exact_fp32():
    assert cuda_options(cuda_graph=True) == {"use_tf32": "0", "enable_cuda_graph": "1"}
    assert providers_for(True, cuda_graph=True) == [(CUDA, {"use_tf32": "0", "enable_cuda_graph": "1"}), CPU]
    assert providers_for(False, cuda_graph=True) == [CPU]


def test_a_cuda_session_hands_onnx_runtime_the_graph_option(exports, monkeypatch):
    _, paths = exports
    seen = []

    class FakeOrt:
        SessionOptions = providers.ort().SessionOptions

        @staticmethod
        def InferenceSession(path, opts, providers):  # noqa: N802 - onnxruntime's name
            seen.append(providers)
            raise RuntimeError("caught before a CUDA session is made")

    monkeypatch.setattr(core, "choose", lambda provider: (True, ""))
    monkeypatch.setattr(core, "ort", lambda: FakeOrt)
    with pytest.raises(SessionError, match="caught before"):
        OnnxSession(paths["packed"], provider="cuda", cuda_graph=True, verbose=False)
    assert seen == [[(CUDA, {"use_tf32": "0", "enable_cuda_graph": "1"}), CPU]]


def test_the_refusals_of_packed_rows_and_cuda_graphs_are_one_line(exports):
    _, paths = exports
    with pytest.raises(zoo.ArgumentError, match="needs a packed-rows export") as e:
        OnnxSession(paths["left"], provider="cpu", cuda_graph=True)
    assert "\n" not in str(e.value)
    lm = lm_from_hf(lm_cases.hf_model("llama")).eval()
    with pytest.raises(ExportError, match="padding='packed' takes a lowering built by hand"):
        export_onnx(lm, "x.onnx", lowering="decomposed", padding="packed")
    with pytest.raises(ExportError, match="padding='sideways' is not one of auto, left, packed"):
        export_onnx(lm, "x.onnx", padding="sideways")


@pytest.mark.parametrize("padding", ["left", "packed"])
def test_a_greedy_step_of_rows_that_go_on_calls_none_of_the_loops_rare_numpy(padding, exports, monkeypatch):
    """A step's host work runs after ~100 MB of weights went through the caches, so each numpy call is slow
    there (docs/benchmarks.md, "One decode step"): with one eos id and no row ending, the loop calls neither
    np.isin, np.where nor np.flatnonzero (each ran once a step before); the tokens stay transformers'."""
    hf, paths = exports
    ids, mask = padded_prompt()
    sess = OnnxSession(paths[padding], provider="cpu")
    free = sess.generate(ids, NEW, attention_mask=mask, eos_token_id=[])
    eos = next(i for i in range(lm_cases.VOCAB) if i not in set(free[:, ids.shape[1] :].flatten().tolist()))
    calls = []

    def counted(name, real):
        def call(*a, **k):
            caller = sys._getframe(1).f_code
            if caller.co_name == "__iter__" and caller.co_filename.endswith("generation.py"):
                calls.append(name)  # made by the loop itself (the call's setup may use them)
            return real(*a, **k)

        return call

    for name in ("isin", "where", "flatnonzero"):
        monkeypatch.setattr(np, name, counted(name, getattr(np, name)))
    got = sess.generate(ids, NEW, attention_mask=mask, eos_token_id=eos, pad_token_id=0)
    monkeypatch.undo()
    assert calls == []
    kw = dict(max_new_tokens=NEW, do_sample=False, pad_token_id=0, eos_token_id=eos)
    assert torch.equal(got, hf.generate(ids, attention_mask=mask, **kw))
