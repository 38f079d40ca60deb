"""What ONNX Runtime's GroupQueryAttention kernel accepts, asked of the kernel itself: one small node per case,
run on the provider given, each case's answer (ran, or the kernel's own message) printed as a table row.

    python scripts/gqa_probe.py --provider cuda     # on the GPU machine (scripts/gpu_check.sh step 2)
    python scripts/gqa_probe.py --provider cpu      # the CPU kernel's answers, for comparison

The open question it answers (issue "CUDA for real"): the CPU kernel accepts a bias whose last axis is
`total_sequence_length = past + S` with a static buffer of capacity N, and the H200 run refused the same
graph ("attention_bias dimension 3 must be equal to total_sequence_length, got 9"). The cases cross what
decides it: the scalar fed as total (past + S, or N), the bias's last axis, whether past and present are one
buffer (bound to the same device OrtValue, as a CUDA-graph step must be) or not, and the dtypes; then the
feature combinations the CUDA source refuses with a bias (head_sink, smooth_softmax); then the packed rows a
whole model's graph feeds (docs/generation.md, "The padding rule"): two rows of different lengths, no bias, a
right-padded first prompt (total = its width) and a decode step at each row's own length (total = N), each
row's y against the row run alone. Needs onnxruntime and numpy only.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

H, KV, D = 4, 2, 64  # query heads, kv heads, head size (a multiple of 16: the rotary rule)


def node_model(dtype: str, *, bias: bool, sink: bool = False, smooth: bool = False) -> bytes:
    """One GroupQueryAttention node, past and present of capacity N, every input a graph input."""
    t = {"float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16, "float32": TensorProto.FLOAT}[dtype]
    ins = [
        helper.make_tensor_value_info("query", t, ["b", "s", H * D]),
        helper.make_tensor_value_info("key", t, ["b", "s", KV * D]),
        helper.make_tensor_value_info("value", t, ["b", "s", KV * D]),
        helper.make_tensor_value_info("past_key", t, ["b", KV, "n", D]),
        helper.make_tensor_value_info("past_value", t, ["b", KV, "n", D]),
        helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["b"]),
        helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, []),
    ]
    names = [i.name for i in ins] + ["", "", ""]  # cos_cache, sin_cache, position_ids
    if bias:
        ins.append(helper.make_tensor_value_info("attention_bias", t, ["b", 1, "s", "m"]))
        names.append("attention_bias")
    if sink:
        ins.append(helper.make_tensor_value_info("head_sink", t, [H]))
        names += [""] * (11 - len(names)) + ["head_sink"]  # input 11; 10 is attention_bias
    attrs = dict(num_heads=H, kv_num_heads=KV)
    if smooth:
        attrs["smooth_softmax"] = 1
    node = helper.make_node(
        "GroupQueryAttention", names, ["y", "present_key", "present_value"], domain="com.microsoft", **attrs
    )
    outs = [
        helper.make_tensor_value_info("y", t, ["b", "s", H * D]),
        helper.make_tensor_value_info("present_key", t, ["b", KV, "m2", D]),
        helper.make_tensor_value_info("present_value", t, ["b", KV, "m2", D]),
    ]
    graph = helper.make_graph([node], "gqa_probe", ins, outs)
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )
    model.ir_version = 10  # what onnxruntime 1.20 and later read (onnx 1.23 writes 14 by default)
    return model.SerializeToString()


def _words(e: Exception) -> str:
    """ONNX Runtime's message without its source path: what the kernel said."""
    text = " ".join(str(e).split())
    if "Status Message: " in text:
        return text.split("Status Message: ", 1)[1][:220]
    return text.split(") ", 1)[-1][:220] if "onnxruntime_src" in text else text[:220]


def run_case(
    provider: str,
    dtype: str,
    *,
    n: int,
    past: int,
    s: int,
    total: int,
    bias_last: int | None,
    shared: bool,
    sink: bool = False,
    smooth: bool = False,
    lengths: tuple[int, ...] | None = None,
) -> str:
    """One case's answer. lengths: packed rows, each row's total length after the call (past = length - s
    for a decode step, 0 for a first prompt), checked against each row alone."""
    np_t = {"float16": np.float16, "float32": np.float32, "bfloat16": np.float16}[dtype]
    if dtype == "bfloat16":
        return "skipped: numpy has no bfloat16 (the CUDA run answers it through the whole-model export)"
    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    providers = [("CUDAExecutionProvider", {"use_tf32": "0"})] if provider == "cuda" else ["CPUExecutionProvider"]
    try:
        sess = ort.InferenceSession(
            node_model(dtype, bias=bias_last is not None, sink=sink, smooth=smooth), opts, providers=providers
        )
    except Exception as e:  # noqa: BLE001 - the kernel's (or the session's) own words are the answer
        return "session: " + _words(e)
    if provider == "cuda" and "CUDAExecutionProvider" not in sess.get_providers():
        return "no CUDA provider here (fell back to the CPU): nothing to learn"
    rng = np.random.default_rng(0)
    b = 1 if lengths is None else len(lengths)
    feeds = {
        "query": rng.standard_normal((b, s, H * D)).astype(np_t),
        "key": rng.standard_normal((b, s, KV * D)).astype(np_t),
        "value": rng.standard_normal((b, s, KV * D)).astype(np_t),
        "seqlens_k": np.full((b,), past + s - 1, np.int32) if lengths is None else np.array(lengths, np.int32) - 1,
        "total_sequence_length": np.array(total, np.int32),
    }
    if bias_last is not None:
        feeds["attention_bias"] = np.zeros((b, 1, s, bias_last), np_t)
    if sink:
        feeds["head_sink"] = np.zeros((H,), np_t)
    cache = [rng.standard_normal((b, KV, n, D)).astype(np_t) for _ in range(2)]  # a past in every slot
    device = "cuda" if provider == "cuda" else "cpu"
    try:
        if lengths is not None:
            return _packed_rows(sess, device, feeds, cache, lengths, s, total == s)
        binding = sess.io_binding()
        for name, arr in feeds.items():
            binding.bind_cpu_input(name, arr)
        binding.bind_output("y", device)
        for name, arr in zip(("key", "value"), cache):
            ov = ort.OrtValue.ortvalue_from_numpy(arr, device, 0)
            binding.bind_ortvalue_input(f"past_{name}", ov)
            if shared:
                binding.bind_ortvalue_output(f"present_{name}", ov)
            else:
                binding.bind_output(f"present_{name}", device)
        sess.run_with_iobinding(binding)
        present = binding.get_outputs()[1].shape()
        return f"ran; present {tuple(present)}"
    except Exception as e:  # noqa: BLE001
        return "refused: " + _words(e)


def _packed_rows(sess, device: str, feeds: dict, cache: list, lengths, s: int, first: bool) -> str:
    """Each row of a packed batch against the row alone (its own length, its real tokens only)."""

    def run(feeds, cache):
        binding = sess.io_binding()
        for name, arr in feeds.items():
            binding.bind_cpu_input(name, np.ascontiguousarray(arr))
        binding.bind_output("y", device)
        for name, arr in zip(("key", "value"), cache):
            ov = ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(arr), device, 0)
            binding.bind_ortvalue_input(f"past_{name}", ov)
            binding.bind_ortvalue_output(f"present_{name}", ov)
        sess.run_with_iobinding(binding)
        return binding.get_outputs()[0].numpy().astype(np.float32)

    y = run(feeds, cache)
    worst = 0.0
    for r, length in enumerate(lengths):
        t = length if first else s  # a first prompt's row holds `length` real tokens of the padded s
        alone = {k: v[r : r + 1, :t] for k, v in feeds.items() if k in ("query", "key", "value")}
        alone.update(
            seqlens_k=feeds["seqlens_k"][r : r + 1],
            total_sequence_length=np.array(t if first else feeds["total_sequence_length"], np.int32),
        )
        worst = max(worst, float(np.abs(run(alone, [c[r : r + 1] for c in cache]) - y[r : r + 1, :t]).max()))
    return f"ran; each row against itself alone: max |dy| {worst:.2e}"


def cases(n: int = 16) -> list[tuple[str, dict]]:
    out = []
    for dtype in ("float16", "float32"):
        for shared in (True, False):
            for past, s in ((0, 9), (8, 1)):
                for total_name, total in (("past+S", past + s), ("N", n)):
                    for bias_name, last in (("none", None), ("total", total), ("past+S", past + s), ("N", n)):
                        if bias_name != "none" and bias_name == total_name and last == total:
                            continue  # the same case twice
                        label = (
                            f"{dtype:8s} {'shared' if shared else 'apart ':6s} past {past:2d} S {s:2d} "
                            f"total={total_name:6s} bias last={bias_name}"
                        )
                        out.append(
                            (label, dict(dtype=dtype, n=n, past=past, s=s, total=total, bias_last=last, shared=shared))
                        )
    for feature in ("sink", "smooth"):
        out.append(
            (
                f"float16  shared past  8 S  1 total=N bias last=N + {feature}",
                dict(dtype="float16", n=n, past=8, s=1, total=n, bias_last=n, shared=True, **{feature: True}),
            )
        )
        out.append(
            (
                f"float16  shared past  8 S  1 total=N no bias + {feature}",
                dict(dtype="float16", n=n, past=8, s=1, total=n, bias_last=None, shared=True, **{feature: True}),
            )
        )
    for dtype in ("float16", "float32"):  # packed rows, no bias: a right-padded first prompt, then a decode step
        first = dict(dtype=dtype, n=n, past=0, s=9, total=9, bias_last=None, shared=True, lengths=(9, 5))
        out.append((f"{dtype:8s} shared packed rows 9, 5: first prompt S 9 total=S no bias", first))
        step = dict(dtype=dtype, n=n, past=0, s=1, total=n, bias_last=None, shared=True, lengths=(10, 6))
        out.append((f"{dtype:8s} shared packed rows 10, 6: decode S 1 total=N no bias", step))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--provider", choices=("cuda", "cpu"), default="cuda")
    args = p.parse_args(argv)
    ort.set_default_logger_severity(4)  # each refusal is printed once, in its row
    print(
        f"onnxruntime {ort.__version__}, onnx {onnx.__version__}, provider {args.provider}, N=16, heads {H}/{KV}, D {D}"
    )
    for label, case in cases():
        answer = run_case(args.provider, **case)
        if answer.startswith("no CUDA provider"):
            print(f"{answer} (onnxruntime's CUDA provider could not start here)")
            return 2
        print(f"{label}: {answer}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
