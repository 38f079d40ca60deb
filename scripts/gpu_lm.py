"""Whole-model generation on one device: attnzoo's ONNX export under ONNX Runtime against transformers'
generate, same random LLaMA, same prompt ids, B 1, greedy (scripts/gpu_check.sh's generation steps).
Run from the project root with PYTHONPATH set.

Env: PROVIDER (cuda|cpu), SHAPE (small|mid: the mid one is the 156M-parameter LLaMA of the first H200 run),
OUT (folder for lm-PROVIDER.json), PROMPTS (e.g. 128,1024), NEW (new tokens), EXPORTS (dtype:precision pairs,
e.g. float16:fp32,float32:fp32,bfloat16:fp32,float16:int4), CACHES (transformers' caches: dynamic,static),
GUARD (seconds for the transformers rows), GRAPHS (off,on: attnzoo without and with the decode step captured
as a CUDA graph, OnnxSession(cuda_graph=True); "on" needs a packed-rows export: --target cuda's fp16/bf16
GroupQueryAttention, or PADDING=packed), PADDING (export --padding: auto|left|packed)."""

import json
import os
import subprocess
import sys
import time
import traceback

import numpy as np
import torch

# scripts/bench.py would shadow the bench package: import from the repository root, not this folder
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

PROVIDER = os.environ.get("PROVIDER", "cuda")
OUT = os.environ.get("OUT", "/tmp")
PROMPTS = [int(p) for p in os.environ.get("PROMPTS", "128,1024").split(",")]
NEW = int(os.environ.get("NEW", "64"))
SHAPES = {
    "small": dict(
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=256,
        vocab_size=1000,
        max_position_embeddings=2048,
    ),
    "mid": dict(
        hidden_size=1024,
        num_hidden_layers=8,
        num_attention_heads=16,
        num_key_value_heads=4,
        intermediate_size=2816,
        vocab_size=32000,
        max_position_embeddings=4096,
    ),
}
shape = SHAPES[os.environ.get("SHAPE", "mid")]
res = {"provider": PROVIDER, "shape": shape, "new": NEW, "rows": [], "errors": []}


def save():
    with open(os.path.join(OUT, f"lm-{PROVIDER}.json"), "w") as f:
        json.dump(res, f, indent=1)


def sync():
    if PROVIDER == "cuda":
        torch.cuda.synchronize()


from bench.checkpoints import prompt_ids, random_llama  # noqa: E402

ck = "/tmp/ck-lmgpu"
t = time.perf_counter()
random_llama(ck, **shape)
res["make_s"] = time.perf_counter() - t
print(f"checkpoint made in {res['make_s']:.1f} s", flush=True)
save()
maxlen = max(PROMPTS) + NEW + 64
exports = {}
EXPORTS = [e.split(":") for e in os.environ.get("EXPORTS", "float16:fp32,float32:fp32").split(",")]
for dtype, precision in EXPORTS:
    if PROVIDER == "cpu" and dtype != "float32":
        continue
    path = f"/tmp/lmgpu-{dtype}-{precision}.onnx"
    cmd = [
        sys.executable,
        "-m",
        "cli",
        "export",
        "--checkpoint",
        ck,
        "--whole",
        "--target",
        PROVIDER,
        "--dtype",
        dtype,
        "--precision",
        precision,
        "--max-len",
        str(maxlen),
        "--padding",
        os.environ.get("PADDING", "auto"),
        "-o",
        path,
        "--force",
    ]
    t = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
        rc, tail = p.returncode, (p.stdout + p.stderr)[-1500:]
    except subprocess.TimeoutExpired:
        rc, tail = 124, "timed out after 240 s"
    el = time.perf_counter() - t
    print(f"export {dtype} {precision}: rc {rc} in {el:.1f} s", flush=True)
    print("\n".join(tail.strip().splitlines()[-6:]), flush=True)
    res[f"export_{dtype}_{precision}"] = {"rc": rc, "s": el, "tail": tail}
    if rc == 0:
        exports[(dtype, precision)] = path
    save()

ref_tokens = {}
az_tokens = {}
CACHES = os.environ.get("CACHES", "dynamic,static").split(",")
# attnzoo under ONNX Runtime
from runtime.core import onnx_metadata  # noqa: E402
from runtime.generation import generate  # noqa: E402
from runtime.session import OnnxSession  # noqa: E402

GRAPHS = [g == "on" for g in os.environ.get("GRAPHS", "off").split(",")]
for (dtype, precision), path in exports.items():
    padding = onnx_metadata(path).get("attnzoo.padding")
    for graph in GRAPHS:
        if graph and padding != "packed":
            # a CUDA graph replays packed rows only (OnnxSession refuses the rest); fp32 for CUDA is left-padded
            why = f"attnzoo {dtype} {precision} graph=True: not run, a CUDA graph needs packed rows (this: {padding})"
            res.setdefault("skipped", []).append(why)
            print(why, flush=True)
            continue
        try:
            t = time.perf_counter()
            sess = OnnxSession(path, provider=PROVIDER, verbose=False, cuda_graph=graph)
            load = time.perf_counter() - t
            for P in PROMPTS:
                ids = np.array([prompt_ids(ck, P)], np.int64)
                generate(sess, ids, 4)
                best, tim = 1e9, {}
                for _ in range(3):
                    tm = {}
                    t = time.perf_counter()
                    out = generate(sess, ids, NEW, timings=tm)
                    el = time.perf_counter() - t
                    if el < best:
                        best, tim = el, tm
                toks = out[0, P:].tolist()
                az_tokens[(dtype, precision, P, graph)] = toks
                agree = None
                row = dict(
                    path="attnzoo-graph" if graph else "attnzoo",
                    padding=sess.metadata.get("attnzoo.padding"),
                    dtype=dtype,
                    precision=precision,
                    prompt=P,
                    s=best,
                    tok_s=NEW / best,
                    provider=sess.provider,
                    load_s=load,
                    prefill_s=tim.get("prefill_s"),
                    decode_s=tim.get("decode_s"),
                    agree=agree,
                    tokens=toks,
                )
                res["rows"].append(row)
                print({k: v for k, v in row.items() if k != "tokens"}, flush=True)
                save()
            del sess
        except Exception:  # noqa: BLE001
            res["errors"].append(f"attnzoo {dtype} {precision} graph={graph}: " + traceback.format_exc()[-1200:])
            print(res["errors"][-1], flush=True)
            save()

# transformers on the device: the dynamic cache first, then the static cache (compiled by generate on CUDA),
# under a time guard
T0 = time.perf_counter()
GUARD = float(os.environ.get("GUARD", "110"))
try:
    from transformers import AutoModelForCausalLM

    dev = "cuda" if PROVIDER == "cuda" else "cpu"
    dtypes = ("float16", "float32") if dev == "cuda" else ("float32",)
    configs = [(d, "dynamic", P) for d in dtypes for P in PROMPTS]
    configs += [(dtypes[0], "static", P) for P in PROMPTS if "static" in CACHES]
    models = {}
    for dtype, cache, P in configs:
        if time.perf_counter() - T0 > GUARD:
            res["errors"].append(f"transformers {dtype} {cache} {P}: skipped, past the {GUARD:.0f} s guard")
            continue
        if dtype not in models:
            models[dtype] = AutoModelForCausalLM.from_pretrained(ck, dtype=getattr(torch, dtype)).to(dev).eval()
        model = models[dtype]
        ids = torch.tensor([prompt_ids(ck, P)], device=dev)
        kw = dict(max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, pad_token_id=258)
        if cache == "static":
            kw["cache_implementation"] = "static"
        try:
            with torch.no_grad():
                t = time.perf_counter()
                out = model.generate(ids, **kw)  # warm-up (and the compile, for the static cache on CUDA)
                warm = time.perf_counter() - t
                best = 1e9
                for _ in range(3):
                    sync()
                    t = time.perf_counter()
                    out = model.generate(ids, **kw)
                    sync()
                    best = min(best, time.perf_counter() - t)
            toks = out[0, P:].tolist()
            ref_tokens[(dtype, P, cache)] = toks
            row = dict(
                path=f"transformers-{cache}",
                dtype=dtype,
                prompt=P,
                s=best,
                tok_s=NEW / best,
                warmup_s=warm,
                tokens=toks,
            )
            res["rows"].append(row)
            print({k: v for k, v in row.items() if k != "tokens"}, flush=True)
        except Exception as e:  # noqa: BLE001
            res["errors"].append(f"transformers {dtype} {cache} {P}: {type(e).__name__}: {e}"[:500])
            print(res["errors"][-1], flush=True)
        save()
except Exception:  # noqa: BLE001
    res["errors"].append("transformers: " + traceback.format_exc()[-800:])
    save()

for r in res["rows"]:
    if r["path"].startswith("attnzoo"):
        # fp32 rows against transformers' fp32; fp16, bf16 and int4 rows against its fp16 (the agreement stated)
        ref_dtype = "float32" if r["dtype"] == "float32" and r["precision"] == "fp32" else "float16"
        ref = ref_tokens.get((ref_dtype, r["prompt"], "dynamic")) or ref_tokens.get(("float32", r["prompt"], "dynamic"))
        graph = r["path"] == "attnzoo-graph"
        toks = az_tokens.get((r["dtype"], r["precision"], r["prompt"], graph))
        plain = az_tokens.get((r["dtype"], r["precision"], r["prompt"], False))
        if graph and plain is not None:
            r["same_as_uncaptured"] = toks == plain  # a replayed graph must give the uncaptured run's tokens
        if ref is not None and toks is not None:
            lead = 0
            while lead < min(len(ref), len(toks)) and ref[lead] == toks[lead]:
                lead += 1
            r["agree"] = dict(leading=lead, equal=sum(a == b for a, b in zip(ref, toks)), of=len(ref))
save()
print("== generation table")
for r in res["rows"]:
    print(
        f"{r['path']:22s} {r['dtype']:8s} {r.get('precision', ''):5s} prompt {r['prompt']:5d}"
        f"  {r['s'] * 1000:8.1f} ms  {r['tok_s']:8.1f} tok/s"
        f"  {r.get('agree') or ''}"
    )
for e in res.get("skipped", []):
    print("SKIPPED", e)
for e in res["errors"]:
    print("ERROR", e[:300])
save()
# the step's status: 1 where an attnzoo row or an export failed (transformers rows past their guard are not failures)
failed = [e for e in res["errors"] if e.startswith("attnzoo")]
failed += [k for k, v in res.items() if k.startswith("export_") and v["rc"] != 0]
sys.exit(1 if failed else 0)
