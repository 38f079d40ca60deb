"""Where a generation step's time goes, attnzoo's ONNX path against transformers, each in its own process.

    python scripts/profile_generate.py --prompt 128 --new 64 [--precision fp32,int4] [--threads 2]

The model is issue 27's random LLaMA (hidden 512, 8 layers, 8 heads, 2 kv heads, intermediate 1408, vocab
8000, seed 0). Each path runs in a fresh process: a warm-up, then the best of --repeats end-to-end runs
(prefill + new tokens, B = 1). For attnzoo's path a last run under ONNX Runtime's profiler splits a decode
step into the session call's overhead (wall time outside the nodes), the projections and MLP (MatMul /
MatMulNBits on weights), the attention products (MatMul between activations), the head (the MatMul to the
vocabulary) and the rest. Prints one JSON line per path; figures depend on the machine's load: run the paths
side by side and compare them, not against figures from another machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

CONFIG = dict(
    vocab_size=8000,
    hidden_size=512,
    intermediate_size=1408,
    num_hidden_layers=8,
    num_attention_heads=8,
    num_key_value_heads=2,
    max_position_embeddings=4096,
    tie_word_embeddings=False,
)


def hf_model():
    import torch
    import transformers

    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG)).eval()


def exported(precision: str, folder: Path) -> Path:
    from export import export_onnx
    from peers.lm import lm_from_hf

    path = folder / f"llama-random-{precision}.onnx"
    if not path.is_file():
        export_onnx(lm_from_hf(hf_model()), path, precision=precision)
    return path


def best_of(run, repeats: int) -> float:
    run()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return min(times)


def attnzoo_path(args) -> dict:
    import numpy as np

    from export import OnnxSession
    from runtime.generation import generate

    path = exported(args.precision, Path(args.folder))
    sess = OnnxSession(path, provider="cpu", threads=args.threads, verbose=False)
    ids = np.random.default_rng(0).integers(3, CONFIG["vocab_size"], (1, args.prompt))
    timings: dict = {}
    total = best_of(lambda: generate(sess, ids, args.new, timings=timings), args.repeats)
    out = {
        "path": f"attnzoo-onnx-{args.precision}",
        "seconds": total,
        "tokens_per_s": args.new / total,
        "prefill_s": timings["prefill_s"],
        "step_ms": 1e3 * timings["decode_s"] / max(timings["steps"], 1),
    }
    out["split_ms_per_step"] = profile_steps(path, ids, args)
    return out


def profile_steps(path: Path, ids, args) -> dict:
    """ONNX Runtime's profiler over one generate call: the mean decode step, by kind of node."""
    from export import OnnxSession
    from runtime.generation import generate

    sess = OnnxSession(path, provider="cpu", threads=args.threads, verbose=False, profile=True)
    timings: dict = {}
    generate(sess, ids, args.new, timings=timings)
    trace = json.loads(Path(sess.end_profiling()).read_text())
    runs = [e for e in trace if e.get("cat") == "Session" and e.get("name") == "model_run"]
    nodes = [e for e in trace if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    steps = runs[1:]  # the first run is the prefill
    vocab = CONFIG["vocab_size"]
    split: dict = defaultdict(float)
    for e in nodes:
        if not any(r["ts"] <= e["ts"] <= r["ts"] + r["dur"] for r in steps):
            continue
        op = e["args"].get("op_name", "")
        # torch's exporter names a Linear's node node_linear_N (the quantizer keeps the name in its MatMulNBits)
        if "linear" in e["name"]:
            shapes = json.dumps(e["args"].get("output_type_shape", ""))
            split["head" if f"{vocab}]" in shapes else "projections_mlp"] += e["dur"]
        elif op in ("MatMul", "FusedMatMul", "Einsum"):
            split["attention_products"] += e["dur"]
        else:
            split["other_nodes"] += e["dur"]
    wall = sum(r["dur"] for r in steps)
    split["session_overhead"] = wall - sum(split.values())
    return {k: round(v / 1e3 / max(len(steps), 1), 3) for k, v in sorted(split.items())}


def transformers_path(args, cache: str) -> dict:
    import torch

    torch.set_num_threads(args.threads or torch.get_num_threads())
    model = hf_model()
    ids = torch.randint(3, CONFIG["vocab_size"], (1, args.prompt), generator=torch.Generator().manual_seed(0))
    extra = {"cache_implementation": "static"} if cache == "static" else {}

    def run():
        with torch.no_grad():
            model.generate(ids, max_new_tokens=args.new, min_new_tokens=args.new, do_sample=False, **extra)

    total = best_of(run, args.repeats)
    return {"path": f"transformers-{cache}", "seconds": total, "tokens_per_s": args.new / total}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--new", type=int, default=64)
    p.add_argument("--precision", default="fp32", help="comma-separated: fp32,int8,int4")
    p.add_argument("--paths", default="attnzoo,transformers-static,transformers-dynamic")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--folder", default=str(Path(tempfile.gettempdir()) / "attnzoo-profile"))
    p.add_argument("--one", help=argparse.SUPPRESS)  # a child process: run this one path
    args = p.parse_args()
    Path(args.folder).mkdir(parents=True, exist_ok=True)
    if args.one:
        if args.one == "attnzoo":
            out = attnzoo_path(args)
        else:
            out = transformers_path(args, args.one.split("-", 1)[1])
        out.update(prompt=args.prompt, new=args.new, threads=args.threads, load=os.getloadavg()[0])
        print(json.dumps(out), flush=True)
        return
    base = [
        sys.executable,
        __file__,
        "--prompt",
        str(args.prompt),
        "--new",
        str(args.new),
        "--folder",
        args.folder,
        "--repeats",
        str(args.repeats),
    ] + (["--threads", str(args.threads)] if args.threads else [])
    for path in args.paths.split(","):
        precisions = args.precision.split(",") if path == "attnzoo" else ["fp32"]
        for precision in precisions:
            subprocess.run([*base, "--one", path, "--precision", precision], check=False)


if __name__ == "__main__":
    main()
