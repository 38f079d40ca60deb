"""A whole model's decode step with the int8 KV cache, the fp32 cache and transformers' StaticCache, side by side.

    python scripts/kv8_decode.py --past 4096,16384 [--threads 2] [--layers 1]

A random LLaMA of the bench's GQA block (hidden 2048, 16 heads, 4 kv heads of 128, the block of
`attnzoo bench llama-3-8b --set d_model=2048 --set heads=16 --set kv_heads=4 --decode`), an MLP of 2048 and a
vocabulary of 512, so that the cache dominates a step at long pasts. Each past P: the cache's P positions
hold random values (a step's time does not depend on them), and STEPS single-token steps are timed at
positions P..P+STEPS-1, best of REPEATS:

    ort-fp32-decomposed  export_onnx(model, lowering="decomposed"): the fp32 cache in the folded graph
    ort-fp32-auto        export_onnx(model): the default lowering for a whole model
    ort-kv8              export_onnx(model, kv_precision="int8")
    transformers-static  LlamaForCausalLM with its StaticCache (SDPA), the peer

Every path runs in this one process, in turn, with the same threads: compare only figures of one run.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

STEPS, REPEATS = 16, 3


def hf_model(layers: int):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=2048,
        num_attention_heads=16,
        num_key_value_heads=4,
        head_dim=128,
        intermediate_size=2048,
        num_hidden_layers=layers,
        vocab_size=512,
        max_position_embeddings=32768,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(config).eval()


def time_ort(path: Path, past: int, threads: int) -> float:
    import onnxruntime as ort

    from runtime.kv_buffers import buffer_arrays

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    n = past + STEPS
    rng = np.random.default_rng(0)
    buffers = buffer_arrays(sess.get_inputs(), 1, n, "past_key_values.")
    for name, arr in buffers.items():
        if arr.dtype == np.int8:
            arr[...] = rng.integers(-127, 128, arr.shape, np.int8)
        else:
            arr[...] = rng.random(arr.shape, np.float32) * (0.02 if name.endswith("_scale") else 1)
    binding = sess.io_binding()
    keep = []

    def bound(arr):
        keep.append(arr)
        return ort.OrtValue.ortvalue_from_numpy(arr, "cpu", 0)

    for name, arr in buffers.items():
        value = bound(arr)
        binding.bind_ortvalue_input(name, value)
        binding.bind_ortvalue_output(name.replace("past_key_values.", "present."), value)
    ids, past_len = np.ones((1, 1), np.int64), np.zeros((), np.int64)
    binding.bind_ortvalue_input("input_ids", bound(ids))
    binding.bind_ortvalue_input("attention_mask", bound(np.ones((1, n), np.bool_)))
    binding.bind_ortvalue_input("past_len", bound(past_len))
    binding.bind_ortvalue_output("logits", bound(np.zeros((1, 1, 512), np.float32)))
    binding.bind_ortvalue_output("next_token", bound(np.zeros((1,), np.int64)))
    best = float("inf")
    for _ in range(REPEATS + 1):  # the first pass warms up
        started = time.perf_counter()
        for i in range(STEPS):
            past_len[()] = past + i
            sess.run_with_iobinding(binding)
        best = min(best, (time.perf_counter() - started) / STEPS)
    return best * 1e3


def time_transformers(hf, past: int, threads: int) -> float:
    import torch
    from transformers import StaticCache

    torch.set_num_threads(threads)
    n = past + STEPS
    cache = StaticCache(config=hf.config, max_cache_len=n)
    with torch.no_grad():
        hf(torch.ones(1, 1, dtype=torch.long), past_key_values=cache, cache_position=torch.tensor([0]))
        for layer in cache.layers:
            layer.keys.normal_()
            layer.values.normal_()
        best = float("inf")
        for _ in range(REPEATS + 1):
            started = time.perf_counter()
            for i in range(STEPS):
                pos = torch.tensor([past + i])
                hf(torch.ones(1, 1, dtype=torch.long), past_key_values=cache, cache_position=pos)
            best = min(best, (time.perf_counter() - started) / STEPS)
    return best * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--past", default="4096,16384")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--layers", type=int, default=1)
    args = p.parse_args()
    from export import export_onnx
    from peers.lm import lm_from_hf

    hf = hf_model(args.layers)
    lm = lm_from_hf(hf).eval()
    tmp = Path(tempfile.mkdtemp(prefix="attnzoo-kv8-"))
    paths = {}
    for label, options in (
        ("ort-fp32-decomposed", {"lowering": "decomposed"}),
        ("ort-fp32-auto", {}),
        ("ort-kv8", {"kv_precision": "int8"}),
    ):
        started = time.perf_counter()
        paths[label] = export_onnx(lm, tmp / f"{label}.onnx", **options).path
        print(f"exported {label} in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    print(
        f"random LLaMA, {args.layers} layer(s), hidden 2048, 16 heads, 4 kv heads of 128; B 1; {args.threads} threads"
    )
    print("| past | " + " | ".join([*paths, "transformers-static"]) + " | kv8 vs the peer |")
    print("|---:|" + "---:|" * (len(paths) + 2))
    for past in (int(x) for x in args.past.split(",")):
        times = {label: time_ort(path, past, args.threads) for label, path in paths.items()}
        times["transformers-static"] = time_transformers(hf, past, args.threads)
        ratio = times["transformers-static"] / times["ort-kv8"]
        print(f"| {past} | " + " | ".join(f"{t:.2f}" for t in times.values()) + f" | {ratio:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
