"""One decode step of attnzoo's whole model and of onnxruntime-genai's, under ONNX Runtime's profiler, side by side.

    python scripts/profile_step.py --genai-python /work/peers/genai/bin/python \\
        [--checkpoint random] [--prompt 128] [--new 64] [--threads 2] [--repeats 5] \\
        [--out docs/bench/profile-decode-step]

Builds each path's fp32 model the way `attnzoo bench --generate` does (bench/generate_peers.py's build stage:
attnzoo's `export_onnx(model, decode=True, cache="static", max_len=prompt + new)`, genai's
`python -m onnxruntime_genai.models.builder -i DIR -o OUT -p fp32 -e cpu`), then runs each in its own process
(bench/step_profile.py, genai's under its own python): the unprofiled step (the bench's timing) and a profiled
generate(N) whose decode runs give, per step, each op type's node time and count, the sum of node time, the
session's run time, the wall time (one run's start to the next's) and the host time between runs. Writes
OUT.md (tables) and OUT.json (everything), each atomically. The floor: the bytes a decode step reads (every
weight but the embedding table, one row of it, and the cache at the mean past) over the read bandwidth
measured here with the same threads (bench/decode_measure.py's read_bandwidth), from memory and at the step's
own working set (what stays in the last-level cache between steps is read from there).
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WORKER = ROOT / "bench" / "step_profile.py"
PATHS = ("attnzoo", "onnxruntime-genai")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--checkpoint", default="random", help="a transformers LLaMA folder, or random (the bench's)")
    p.add_argument("--prompt", type=int, default=128, help="prompt tokens (default 128)")
    p.add_argument("--new", type=int, default=64, help="new tokens a generate makes (default 64)")
    p.add_argument("--threads", type=int, default=2, help="intra-op threads, both paths (default 2)")
    p.add_argument("--repeats", type=int, default=5, help="unprofiled rounds, the best kept (default 5)")
    p.add_argument("--genai-python", default="", help="the python of onnxruntime-genai's environment")
    p.add_argument("--paths", default=",".join(PATHS), help=f"which of {','.join(PATHS)} (default both)")
    p.add_argument("--out", default="docs/bench/profile-decode-step", help="OUT.md and OUT.json are written")
    p.add_argument("--work", default="", help="keep the models and traces in this folder (default: a temp one)")
    p.add_argument("--timeout", type=float, default=1200.0, help="seconds a worker may take")
    args = p.parse_args(argv)
    paths = [s for s in args.paths.split(",") if s]
    bad = sorted(set(paths) - set(PATHS))
    if bad or not paths:
        p.error(f"--paths {args.paths}: choose from {','.join(PATHS)}")
    if "onnxruntime-genai" in paths and not (args.genai_python and Path(args.genai_python).is_file()):
        p.error("onnxruntime-genai's row needs --genai-python PATH (its environment's python), or --paths attnzoo")
    if args.new < 3 or args.prompt < 1 or args.threads < 1 or args.repeats < 1:
        p.error("--new must be 3 or more, --prompt, --threads and --repeats 1 or more")
    args.paths = paths
    return args


def spawn(python: str, worker: Path, job: dict, mark: str, timeout: float) -> dict:
    """`python worker JOB` with this checkout first on PYTHONPATH; the result line's dict."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    try:
        proc = subprocess.run(
            [python, str(worker), json.dumps(job)], capture_output=True, text=True, timeout=timeout, env=env
        )
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"timed out after {timeout:.0f} s (raise --timeout)"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(mark):
            return json.loads(line[len(mark) :])
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1][:300]
    return {"ok": False, "error": f"worker exited {proc.returncode}: {tail}"}


def step_bytes(folder: Path, past: float) -> dict:
    """What one decode step reads (bytes): every weight in the checkpoint's safetensors but the embedding
    table (one row of it: the token's; a tied table is the head, read whole), and every layer's K and V at
    `past` positions, fp32."""
    config = json.loads((folder / "config.json").read_text())
    tied = config.get("tie_word_embeddings", False)
    weights = 0
    for f in sorted(folder.glob("*.safetensors")):
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        for name, t in header.items():
            if name == "__metadata__":
                continue
            size = t["data_offsets"][1] - t["data_offsets"][0]
            if name.endswith("embed_tokens.weight") and not tied:
                size //= t["shape"][0]  # one row
            weights += size
    heads = config["num_attention_heads"]
    kv = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    cache = config["num_hidden_layers"] * 2 * kv * head_dim * 4 * past
    return {"weights": weights, "cache": int(cache), "total": weights + int(cache), "layers": config}


def bandwidths(nbytes: int, threads: int) -> dict:
    import torch

    from bench.decode_measure import BANDWIDTH_BYTES, read_bandwidth

    cpu = torch.device("cpu")
    return {
        "memory_gbs": read_bandwidth(torch, cpu, BANDWIDTH_BYTES, threads),
        "working_set_gbs": read_bandwidth(torch, cpu, nbytes, threads),
    }


def run(args) -> dict:
    from bench.checkpoints import prompt_ids, random_llama
    from bench.generate import cpu_facts
    from bench.generate_peers import RESULT_MARK as BUILD_MARK
    from bench.machine import machine_info, versions
    from bench.step_profile import RESULT_MARK

    pythons = {"attnzoo": sys.executable, "onnxruntime-genai": args.genai_python}
    with tempfile.TemporaryDirectory(prefix="attnzoo-profile-step-") as tmp:
        work = Path(args.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        folder = random_llama(work / "random-llama") if args.checkpoint == "random" else Path(args.checkpoint)
        if not (folder / "config.json").is_file():
            raise SystemExit(f"--checkpoint {args.checkpoint} has no config.json; name a transformers checkpoint")
        config = json.loads((folder / "config.json").read_text())
        ids = prompt_ids(folder, args.prompt)
        rows, builds = {}, {}
        for path in args.paths:
            model = work / path / ("model.onnx" if path == "attnzoo" else "")
            job = {"stage": "build", "path": path, "checkpoint": str(folder), "precision": "fp32"}
            job.update(model=str(model).rstrip("/"), max_len=args.prompt + args.new, threads=args.threads)
            started = time.perf_counter()
            builds[path] = spawn(pythons[path], ROOT / "bench" / "generate_peers.py", job, BUILD_MARK, args.timeout)
            builds[path]["seconds"] = time.perf_counter() - started
            if not builds[path].get("ok"):
                rows[path] = {"ok": False, "error": f"build failed: {builds[path].get('error')}"}
                continue
            traces = work / f"{path}-traces"
            traces.mkdir(exist_ok=True)
            job = {"path": path, "model": job["model"], "prompt": ids, "new": args.new, "threads": args.threads}
            job.update(repeats=args.repeats, vocab=config["vocab_size"], layers=config["num_hidden_layers"])
            job["trace_dir"] = str(traces)
            rows[path] = spawn(pythons[path], WORKER, job, RESULT_MARK, args.timeout)
            print(f"{path}: {_brief(rows[path])}", file=sys.stderr)
        need = step_bytes(folder, args.prompt + args.new / 2)
        bw = bandwidths(need["total"], args.threads)
    floor = {k.replace("_gbs", "_ms"): need["total"] / (v * 1e9) * 1e3 for k, v in bw.items()}
    return {
        "kind": "profile-decode-step",
        "command": "python scripts/profile_step.py " + " ".join(sys.argv[1:]),
        "checkpoint": args.checkpoint,
        "prompt": args.prompt,
        "new": args.new,
        "threads": args.threads,
        "repeats": args.repeats,
        "rows": rows,
        "builds": {k: {kk: vv for kk, vv in v.items() if kk != "python"} for k, v in builds.items()},
        "step_bytes": {k: v for k, v in need.items() if k != "layers"},
        "bandwidth": bw,
        "floor": floor,
        "machine": {**machine_info(), **cpu_facts()},
        "versions": versions(),
    }


def _brief(row: dict) -> str:
    if not row.get("ok"):
        return row.get("error", "failed")
    p = row["profile"]
    return f"step {row['step_ms']:.2f} ms unprofiled; profiled wall {p['wall_us']:.0f} us, nodes {p['nodes_us']:.0f} us"


def format_report(report: dict) -> str:
    from bench.step_profile_report import markdown

    return markdown(report)


def main(argv=None) -> int:
    args = parse_args(argv)
    report = run(args)
    from zoo.files import write_atomic

    out = Path(args.out)
    text = format_report(report)
    write_atomic(out.with_suffix(".json"), lambda tmp: tmp.write_text(json.dumps(report, indent=1) + "\n"))
    write_atomic(out.with_suffix(".md"), lambda tmp: tmp.write_text(text))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
