"""Fuzz the command line's flags and the public API's arguments with wrong types, NaN, inf,
huge, empty and negative values. The only acceptable outcomes: a result, or one clear line
(at the CLI: exit 2 and one line on stderr; in Python: an AttnzooError, or an OSError for a
path, whose text is one line). Never a traceback, a crash, a hang or a silent wrong answer.

The expensive step after validation (tracing an export, measuring a benchmark, the parity
matrix) is replaced by a sentinel: reaching it means every check let the input through.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import os
import re
import stat
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import analysis.ablate
import analysis.importance
import analysis.scores
import zoo
from bench import plan as bench_mod
from cli.main import build_parser, command_parsers, main
from export import OnnxSession, export_onnx
from export import writer as writer_mod
from parity import matrix as parity_mod
from strategies import config_sizes, fuzz_settings, shard_names

COMMANDS = ("list", "show", "audit", "export", "run", "parity", "bench", "heads", "importance", "ablate", "generate")
PAST_64_BITS = ["99999999999999999999999", "-99999999999999999999999", str(2**64), str(2**63)]
BAD_TEXT = ["", " ", "nan", "NaN", "inf", "-inf", "-1", "0", "-0", "1e20", "1" * 40, "abc", "1.5", "0x10", "None", "2"]
BAD_TEXT += PAST_64_BITS
# Output paths a careful user tries: a device, a symlink (made by the `outputs` fixture), a folder.
OUTPUTS = [os.devnull, "{tmp}/link.json", "{tmp}/link.png", "{tmp}"]
BAD_VALUES = [None, "", "no", "nan", float("nan"), float("inf"), -1, 0, 10**30, 1.5, True, [], {}, b"x", object()]


class Reached(Exception):
    """The input passed every check and reached the expensive step."""


def _reach(*a, **kw):
    raise Reached


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return export_onnx("mha-causal", tmp_path_factory.mktemp("fz") / "m.onnx", lowering="decomposed").path


def _flags(command: str) -> list[argparse.Action]:
    """The options of `command` that take a value, read from the parser (new flags included)."""
    parser = command_parsers(build_parser())[command]
    # argparse lists a parser's options only in `_actions`; there is no public accessor.
    return [a for a in parser._actions if a.option_strings and a.nargs != 0 and a.dest != "help"]


BASE = {
    "list": [],
    "show": ["mha-causal"],
    "audit": ["mha-causal"],
    "export": ["mha-causal", "-o", "{tmp}/x.onnx"],
    "run": ["{model}", "--repeats", "1"],
    "parity": ["mha-causal"],
    "bench": ["mha-causal", "--seq", "2"],
    "heads": ["tiny-induction"],
    "importance": ["tiny-induction", "--batches", "1", "--batch", "2", "-q"],
    "ablate": ["tiny-induction", "--no-latency", "-q"],
    "generate": ["{model}", "--prompt-ids", "1,2", "--max-new-tokens", "2"],  # a block: refused in one line
}


def _run_cli(argv: list[str]) -> tuple[int | str, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            rc: int | str = main(argv)
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 2
        except Reached:
            rc = "reached"
    return rc, err.getvalue()


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> Path:
    """A folder with symlinks to regular files, for the output-path values."""
    tmp = tmp_path_factory.mktemp("outputs")
    for name in ("link.json", "link.png"):
        (tmp / f"real-{name}").write_text("old")
        (tmp / name).symlink_to(tmp / f"real-{name}")
    return tmp


@fuzz_settings(150)
@given(command=st.sampled_from(COMMANDS), data=st.data())
def test_every_cli_flag_gives_a_result_or_one_line(
    command, data, model_path, tmp_path_factory, outputs, monkeypatch_module
):
    flags = _flags(command)
    argv = [a.format(tmp=tmp_path_factory.getbasetemp(), model=model_path) for a in BASE[command]]
    for _ in range(data.draw(st.integers(1, 2))):
        if flags and data.draw(st.booleans()):
            action = data.draw(st.sampled_from(flags))
            values = BAD_TEXT + ["d_model=nan", "heads=0", "=", "d_model=1e40", "x=1"]
            values += [o.format(tmp=outputs) for o in OUTPUTS]
            argv += [action.option_strings[-1], data.draw(st.sampled_from(values))]
        elif argv:  # the positional argument (a name, a pattern, a path)
            argv[0] = data.draw(st.sampled_from(BAD_TEXT + ["*", "mha-*", "/nonexistent.onnx", "a" * 300]))
    rc, err = _run_cli(argv)
    assert "Traceback" not in err, (argv, err)
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode), argv  # written through, never replaced
    assert all((outputs / f"real-{n}").read_text() == "old" for n in ("link.json", "link.png")), argv  # never through
    for name in ("link.json", "link.png"):  # a link an output replaced is made again for the next example
        if not (outputs / name).is_symlink():
            (outputs / name).unlink()
            (outputs / name).symlink_to(outputs / f"real-{name}")
    if rc == 2:
        assert len(err.strip().splitlines()) == 1, (argv, err)
    else:
        assert rc in (0, 1, "reached"), (argv, rc, err)


@pytest.fixture(scope="module")
def monkeypatch_module(model_path):  # the model is exported before the patches, never under them
    mp = pytest.MonkeyPatch()
    try:  # undo also when a setattr fails: a patch left behind would break every later test
        mp.setattr(writer_mod, "lower", _reach)  # export: after every argument check
        mp.setattr(bench_mod, "export_lowerings", _reach)  # bench: after flags, spec, sizes
        mp.setattr(parity_mod, "run_parity", _reach)  # parity: after pattern and providers
        mp.setattr(analysis.scores, "head_scores", _reach)  # heads: after tokens and outputs
        mp.setattr(analysis.importance, "head_importance", _reach)  # importance: after its flags
        mp.setattr(analysis.ablate, "run_ablation", _reach)  # ablate: before any training
        yield mp
    finally:
        mp.undo()


def _one_line_or_result(call):
    """Run call(); return its result, or None when it refused with one clear line."""
    try:
        return call()
    except Reached:
        return None
    except (zoo.AttnzooError, OSError) as e:
        text = str(e)
        assert text and "\n" not in text.strip(), repr(text)
        return None


@fuzz_settings(120)
@given(field=st.sampled_from(list(zoo.AttentionSpec.__dataclass_fields__)), value=st.sampled_from(BAD_VALUES))
def test_spec_overrides(field, value):
    s = _one_line_or_result(lambda: zoo.spec("mha-causal", **{field: value}))
    if s is not None:
        assert getattr(s, field) == value or (isinstance(value, float) and math.isnan(value))
        if zoo.count_parameters(s) < 10**6:  # a small valid spec builds and runs
            y = zoo.create("mha-causal", **{field: value})(torch.randn(1, 3, s.d_model))
            assert y.shape == (1, 3, s.d_model)


@fuzz_settings(120)
@given(arg=st.sampled_from(["x", "context", "mask", "head_mask"]), data=st.data())
def test_forward_arguments(arg, data):
    m = zoo.create("mha-causal").eval()
    good = {"x": torch.randn(2, 3, 64), "context": None, "mask": None, "head_mask": None}
    bad = data.draw(
        st.sampled_from(
            [
                None,
                3,
                "x",
                [1.0, 2.0],
                np.zeros((2, 3, 64), np.float32),
                torch.zeros(2, 3, 64, dtype=torch.int64),
                torch.zeros(2, 3, 64, dtype=torch.float64),
                torch.zeros(0, 3, 64),
                torch.zeros(2, 3),
                torch.zeros(2, 3, 65),
                torch.full((3, 3), float("nan")),
                torch.zeros(5, 3, 3),
                torch.ones(4, dtype=torch.int32),
                torch.ones(7),
            ]
        )
    )
    good[arg] = bad
    y = _one_line_or_result(lambda: m(good["x"], good["context"], good["mask"], head_mask=good["head_mask"]))
    if y is not None:  # accepted: then it must be a real answer of the right shape
        assert y.shape == good["x"].shape and torch.isfinite(y).all(), (arg, bad)


@fuzz_settings(120)
@given(arg=st.sampled_from(["path", "lowering", "dtype", "need_weights", "with_mask", "overwrite", "provider", "set"]))
def test_export_onnx_arguments(arg, tmp_path_factory, monkeypatch_module):
    for value in BAD_VALUES:
        kw = {"lowering": "decomposed", "overwrite": True}
        path = tmp_path_factory.getbasetemp() / "api.onnx"
        if arg == "path":
            path = value
        elif arg == "set":
            kw["d_model"] = value
        else:
            kw[arg] = value
        _one_line_or_result(lambda p=path, k=kw: export_onnx("mha-causal", p, **k))


@fuzz_settings(60)
@given(arg=st.sampled_from(["provider", "threads", "path"]), value=st.sampled_from(BAD_VALUES + [10**9, "gpu"]))
def test_session_arguments(arg, value, model_path):
    kw = {"path": model_path, "provider": "cpu", "threads": None, arg: value}
    sess = _one_line_or_result(lambda: OnnxSession(kw.pop("path"), verbose=False, **kw))
    if sess is not None:
        assert sess.provider == "cpu"


@fuzz_settings(80)
@given(arg=st.sampled_from(["x", "mask"]), data=st.data())
def test_session_run_arguments(arg, data, model_path):
    sess = OnnxSession(model_path, "cpu", verbose=False)
    bad = data.draw(
        st.sampled_from(
            [
                3,
                "x",
                [1.0],
                torch.zeros(0, 3, 64),
                torch.zeros(2, 0, 64),
                torch.zeros(2, 3, 65),
                torch.zeros(2, 3, 64, dtype=torch.float64),
                np.zeros((2, 3, 64), np.int64),
                torch.zeros(2, 3),
                torch.zeros(10**5, 10**5, 64, device="meta"),
                torch.ones(3, 3, dtype=torch.bool),
            ]
        )
    )
    call = (lambda: sess.run(bad)) if arg == "x" else (lambda: sess.run(torch.randn(2, 3, 64), mask=bad))
    y = _one_line_or_result(call)
    if y is not None:
        assert torch.isfinite(torch.as_tensor(np.asarray(y))).all()


@pytest.fixture(scope="module")
def fuzz_checkpoint(tmp_path_factory):
    """A hand-written LLaMA checkpoint (tests/peers/test_checkpoint.py) to break."""
    pytest.importorskip("safetensors")
    from test_checkpoint import CONFIG, _tensors, _write

    folder = tmp_path_factory.mktemp("fuzz-ckpt") / "ckpt"
    _write(folder, _tensors(zoo.MultiHeadAttention(zoo.spec_from_config(CONFIG, layer=1)).eval()))
    return folder, CONFIG


@fuzz_settings(60)
@given(sizes=config_sizes(), command=st.sampled_from(["show", "preset", "export-config", "export-checkpoint"]))
def test_config_size_fields_give_one_line_in_every_command(sizes, command, fuzz_checkpoint, monkeypatch_module):
    import json

    folder, config = fuzz_checkpoint
    (folder / "config.json").write_text(json.dumps(dict(config, **sizes)))
    try:
        out = str(folder.parent / "o.onnx")
        argv = {
            "show": ["show", "--config", str(folder)],
            "preset": ["preset", "--config", str(folder), "--name", "x"],
            "export-config": ["export", "--config", str(folder), "-o", out, "--force"],
            "export-checkpoint": ["export", "--checkpoint", str(folder), "--layer", "1", "-o", out, "--force"],
        }[command]
        rc, err = _run_cli(argv)
    finally:
        (folder / "config.json").write_text(json.dumps(config))
    assert "Traceback" not in err, (sizes, err)
    assert rc in (0, 2, "reached"), (sizes, command, rc, err)
    if rc == 2:  # one line naming a config field (huge sizes too), as the config writes it
        assert len(err.strip().splitlines()) == 1, (sizes, command, err)
        named = re.search(r"\b[a-z_]+=\S", err)  # a config key (num_attention_heads=128) or the spec's (d_k=1)
        # sizes a tensor can hold but this machine cannot: the memory refusal (zoo/limits.py) says how much
        assert named or "of memory; this machine has" in err, (sizes, command, err)
    bad = [k for k, v in sizes.items() if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v <= 0)]
    if bad:  # zero, negative or not an integer: refused, naming a field that is
        assert rc == 2 and any(f"{k}={sizes[k]!r} must be a positive integer" in err for k in bad), (sizes, err)


@fuzz_settings(40)
@given(shard=shard_names())
def test_shard_names_outside_the_folder_give_one_line_before_any_open(shard, fuzz_checkpoint):
    import json

    import safetensors

    folder, _ = fuzz_checkpoint
    weights = ("q_proj", "k_proj", "v_proj", "o_proj")
    index = folder / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {f"model.layers.1.self_attn.{w}.weight": shard for w in weights}}))
    opened: list = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(safetensors, "safe_open", lambda *a, **k: opened.append(a))
        try:
            with pytest.raises(zoo.CheckpointError, match="outside the checkpoint folder") as e:
                zoo.from_checkpoint(folder, layer=1)
        finally:
            index.unlink()
    assert "\n" not in str(e.value) and not opened, (shard, opened)


@pytest.fixture(scope="module")
def static_path(tmp_path_factory):
    """A static-cache decode export of capacity 8 (what sess.static_cache binds)."""
    path = tmp_path_factory.mktemp("fz_static") / "s.onnx"
    return export_onnx("mha-causal", path, decode=True, cache="static", max_len=8, lowering="decomposed").path


def _bad_step_inputs():
    """x values a static cache of batch 2 over d_model 64 must refuse: every wrong kind."""
    return [
        None,
        3,
        "x",
        [[[0.0] * 64]],
        np.zeros((2, 1, 64)),  # float64
        np.zeros((2, 1, 64), np.float16),
        np.zeros((2, 1, 64), np.int64),
        torch.zeros(2, 1, 64, dtype=torch.float64),
        torch.zeros(2, 1, 64, dtype=torch.bool),
        np.zeros(64, np.float32),  # 1-D
        np.zeros((1, 64), np.float32),
        np.zeros((2, 1, 1, 64), np.float32),
        np.zeros((2, 1, 65), np.float32),  # width
        np.zeros((2, 1, 0), np.float32),
        np.zeros((1, 1, 64), np.float32),  # batch
        np.zeros((3, 1, 64), np.float32),
        np.zeros((0, 1, 64), np.float32),
        np.zeros((2, 0, 64), np.float32),  # empty t
        np.zeros((2, 9, 64), np.float32),  # past the capacity of 8
        torch.zeros(2, 10**6, 64, device="meta"),
    ]


# capfd is read afresh in each example
@settings(fuzz_settings(60), suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bad=st.sampled_from(_bad_step_inputs()), written=st.integers(0, 8))
def test_static_cache_step_arguments(bad, written, static_path, capfd):
    sess = OnnxSession(static_path, "cpu", verbose=False)
    cache = sess.static_cache(2)
    if written:
        cache.step(np.zeros((2, written, 64), np.float32))
    key = cache.key.copy()
    capfd.readouterr()
    assert _one_line_or_result(lambda: cache.step(bad)) is None, type(bad)
    assert cache.length == written and np.array_equal(cache.key, key)  # refused before anything is written
    assert capfd.readouterr().err == ""  # refused before ONNX Runtime (which logs its own errors on stderr)


@fuzz_settings(60)
@given(
    arg=st.sampled_from(["batch", "max_len"]),
    value=st.sampled_from(BAD_VALUES + [9, 2**40, 2**64, "8", 8.0]),
)
def test_static_cache_arguments(arg, value, static_path):
    sess = OnnxSession(static_path, "cpu", verbose=False)
    kw = {"batch": 1, "max_len": None, arg: value}
    cache = _one_line_or_result(lambda: sess.static_cache(kw.pop("batch"), **kw))
    if cache is not None:  # accepted: a real cache within the exported capacity
        assert 1 <= cache.capacity <= 8 and cache.key.shape[0] == (value if arg == "batch" else 1)
