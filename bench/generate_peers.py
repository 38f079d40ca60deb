"""One generation path, built or timed in its own process: `PYTHON generate_peers.py JOB_JSON`.

This file imports nothing of attnzoo's at the top and only the standard library: it runs under
another environment's python too (onnxruntime-genai brings its own onnxruntime, llama-cpp-python
its own build), which is how the benchmark keeps each peer in the environment it needs. The
attnzoo path imports zoo and export inside its functions (the parent sets PYTHONPATH for it); the
llama.cpp build imports numpy, gguf, safetensors and llama_cpp inside its own (it writes the GGUF).

A job (JSON): {"stage": "build"|"time", "path": PATH, "checkpoint": DIR, "precision": "fp32"|"int4"|...,
"model": the built model (ONNX file, genai folder, GGUF file), "prompt": [ids], "new": N,
"threads": T, "warmup": W, "repeats": R, "max_len": L, "provider": "cpu"|"cuda", "dtype": "float32"|"float16"|
"bfloat16", "cuda_graph": bool, "tf32": bool} (the last four absent: the CPU in float32); a speculating path's
"spec": {"k", "ngram", "draft": DIR}, a peer's draft path's "draft_model" (its draft's GGUF or genai folder) and
"draft_only" (the target is its plain path's, built already). The peers' speculation: bench/peer_spec.py.

Timing (stage "time"), the same for every path: `generate(n)` runs the path's own greedy loop from
the prompt (a fresh cache each call) and returns the n new tokens. W warm-up rounds of generate(1)
and generate(N), then R rounds of generate(1) (prefill and the first token) and generate(N); the best of each.
decode ms/token = (best N - best 1) / (N - 1). Peak memory is the worker's peak RSS, model and
runtime included: Linux's VmHWM of its own address space (ru_maxrss survives exec, so it would start at
the RSS of the bench process that started the worker), ru_maxrss elsewhere; the runtime's share is the
RSS after the path's imports (RUNTIMES), before it loads the model.
The one result line on stdout starts with RESULT_MARK.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time

RESULT_MARK = "ATTNZOO-GENERATE-RESULT "


# ---- attnzoo: export_onnx(model, decode=True, precision=P) + OnnxSession.generate ----
def build_attnzoo(job: dict) -> dict:
    import torch

    import zoo
    from export import export_onnx

    model = zoo.lm_from_checkpoint(job["checkpoint"], dtype=torch.float32)
    extra = {} if job["precision"] == "fp32" else {"precision": job["precision"]}
    provider, dtype = job.get("provider", "cpu"), job.get("dtype", "float32")
    spec = job.get("spec") or {}
    if not job.get("draft_only"):  # else the target's export is the prompt-lookup path's, already made
        _export_target(export_onnx, model, job, provider, dtype, bool(spec), extra)
    if spec.get("draft"):  # the draft's own export, at the same precision, beside the target's
        draft = zoo.lm_from_checkpoint(spec["draft"], dtype=torch.float32)
        export_onnx(draft, job["model"] + ".draft.onnx", max_len=job["max_len"], provider=provider, **extra)
    return {}


def _export_target(export_onnx, model, job: dict, provider: str, dtype: str, all_logits: bool, extra: dict) -> None:
    export_onnx(
        model,
        job["model"],
        decode=True,
        cache="static",
        max_len=job["max_len"],
        provider=provider,
        dtype=dtype,
        all_logits=all_logits,  # a speculating path verifies k tokens a call: the logits of each
        **extra,
    )


def load_attnzoo(job: dict):
    import numpy as np

    from export import OnnxSession

    session = OnnxSession(
        job["model"],
        provider=job.get("provider", "cpu"),
        threads=job["threads"],
        cuda_graph=job.get("cuda_graph", False),
        tf32=job.get("tf32", False),
    )
    ids = np.asarray([job["prompt"]], dtype=np.int64)
    k = job.get("num_beams", 1)
    spec, kw, stats = job.get("spec") or {}, {}, {}
    if k > 1:
        kw = {"num_beams": k, "eos_token_id": []}  # beams: eos off, every hypothesis makes n
    elif spec.get("draft"):
        draft = OnnxSession(job["model"] + ".draft.onnx", provider=job.get("provider", "cpu"), threads=job["threads"])
        kw = {"assistant_model": draft, "num_assistant_tokens": spec["k"]}
    elif spec:
        kw = {"prompt_lookup_num_tokens": spec["k"], "max_matching_ngram_size": spec["ngram"]}

    def generate(n: int) -> list[int]:
        timings: dict = {}
        out = session.generate(ids, max_new_tokens=n, timings=timings, **kw)
        stats.update(timings.get("speculation", {}))
        return [int(t) for t in list(out[0])[len(job["prompt"]) :]]

    generate.stats = stats if spec else None
    return generate


# ---- transformers' generate, dynamic cache and static cache ----
def _load_transformers(job: dict, cache_implementation: str | None):
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(job["threads"])
    device = "cuda" if job.get("provider") == "cuda" else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = bool(job.get("tf32"))
    dtype = getattr(torch, job.get("dtype", "float32"))
    model = AutoModelForCausalLM.from_pretrained(job["checkpoint"], dtype=dtype).to(device).eval()
    ids = torch.tensor([job["prompt"]], dtype=torch.long, device=device)
    extra = {} if cache_implementation is None else {"cache_implementation": cache_implementation}
    spec, calls = job.get("spec") or {}, [0]
    if spec.get("draft"):  # transformers' assisted generation, its schedule as attnzoo's (heuristic, from k)
        assistant = AutoModelForCausalLM.from_pretrained(spec["draft"], dtype=dtype).to(device).eval()
        assistant.generation_config.num_assistant_tokens = spec["k"]
        assistant.generation_config.num_assistant_tokens_schedule = "heuristic"
        extra["assistant_model"] = assistant
    elif spec:
        extra.update(prompt_lookup_num_tokens=spec["k"], max_matching_ngram_size=spec["ngram"])
    model.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))  # the target's calls
    pad = model.generation_config.pad_token_id
    pad = model.generation_config.eos_token_id if pad is None else pad
    k = job.get("num_beams", 1)
    if k > 1:  # beams: eos off on the model's own config (a None passed to generate falls back to it)
        model.generation_config.eos_token_id = None
        extra.update(num_beams=k)

    def generate(n: int) -> list[int]:
        calls[0] = 0
        with torch.inference_mode():
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=n,
                do_sample=False,
                pad_token_id=pad,
                **extra,
                **({} if k > 1 else {"min_new_tokens": n}),
            )
        if generate.stats is not None:  # the prefill is one call; the other n - 1 tokens took the rest
            generate.stats.update(target_calls=calls[0] - 1, tokens_per_target_call=(n - 1) / max(calls[0] - 1, 1))
        return out[0, ids.shape[1] :].tolist()

    generate.stats = {} if spec else None
    return generate


def load_transformers_dynamic(job: dict):
    return _load_transformers(job, None)


def load_transformers_static(job: dict):
    return _load_transformers(job, "static")


# speculative paths (bench --generate --speculative): the same loaders, the job's "spec" turning it on
SPECULATIVE = {
    "attnzoo-prompt-lookup": "attnzoo",
    "attnzoo-draft": "attnzoo",
    "transformers-prompt-lookup": "transformers-dynamic",
    "transformers-assistant": "transformers-dynamic",
    "llama.cpp-prompt-lookup": "llama.cpp",  # the peers' own speculation (bench/peer_spec.py)
    "llama.cpp-draft": "llama.cpp",
    "onnxruntime-genai-prompt-lookup": "onnxruntime-genai",
    "onnxruntime-genai-draft": "onnxruntime-genai",
}


# ---- onnxruntime-genai: its builder, then og.Generator's greedy loop ----
GENAI_INT4 = ["int4_block_size=32", "int4_accuracy_level=4"]  # MatMulNBits, block 32, accuracy level 4


def build_genai(job: dict) -> dict:
    out, cache = job["model"], job["model"] + ".cache"
    cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", job["checkpoint"], "-o", out]
    cmd += ["-p", job["precision"], "-e", "cpu", "-c", cache]
    if job["precision"] == "int4":
        cmd += ["--extra_options", *GENAI_INT4]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if proc.returncode != 0:
        tail = (proc.stderr.strip() or proc.stdout.strip() or "no output").splitlines()[-1][:300]
        return {"ok": False, "error": f"onnxruntime-genai's builder exited {proc.returncode}: {tail}"}
    config_file = os.path.join(out, "genai_config.json")
    with open(config_file) as f:
        config = json.load(f)
    options = config["model"]["decoder"].setdefault("session_options", {})
    options["intra_op_num_threads"] = job["threads"]  # the same threads as every other path
    with open(config_file, "w") as f:
        json.dump(config, f, indent=2)
    return {"command": " ".join(["python", *cmd[1:]])}


def load_genai(job: dict):
    """og.Generator's greedy loop; with the job's "spec" its speculative options (bench/peer_spec.py) on."""
    import onnxruntime_genai as og

    peer = _peer_spec() if job.get("spec") else None
    model = og.Model(peer.genai_folder(job) if peer else job["model"])
    prompt, stats = job["prompt"], {}

    def generate(n: int) -> list[int]:
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=len(prompt) + n, min_length=len(prompt) + n, do_sample=False)
        if peer:
            params.set_speculative_options(**peer.genai_options(job))
        generator = og.Generator(model, params)
        generator.append_tokens(prompt)
        out = []
        while not generator.is_done():
            generator.generate_next_token()
            out.append(int(generator.get_next_tokens()[0]))
        if peer:
            stats.update(peer.genai_summary(generator.get_speculative_stats(), n))
        return out

    generate.stats = stats if peer else None
    return generate


# ---- llama.cpp through llama-cpp-python: a GGUF written here, then eval the prompt, argmax, eval one token ----
def build_llama(job: dict) -> dict:
    """The GGUF of job["precision"] (bench/gguf_llama.py, loaded from beside this file: this file runs
    as a script under llama-cpp-python's python, where bench is no package)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gguf_llama.py")
    return _beside("attnzoo_bench_gguf_llama", path).build_llama(job)


def _peer_spec():
    """bench/peer_spec.py (the peers' own speculative decoding), loaded from beside this file."""
    return _beside("attnzoo_bench_peer_spec", os.path.join(os.path.dirname(os.path.abspath(__file__)), "peer_spec.py"))


def _beside(name: str, path: str):
    import importlib.util

    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
    return sys.modules[name]


def load_llama(job: dict):
    import ctypes

    import llama_cpp
    import numpy as np

    prompt = job["prompt"]
    llm = llama_cpp.Llama(
        model_path=job["model"],
        n_ctx=len(prompt) + job["new"],
        n_batch=len(prompt),
        n_threads=job["threads"],
        n_threads_batch=job["threads"],
        verbose=False,
    )
    n_vocab = llm.n_vocab()

    def last_logits():
        pointer = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
        return np.ctypeslib.as_array(ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float)), shape=(n_vocab,))

    def generate(n: int) -> list[int]:
        llm.reset()
        llm.eval(prompt)
        out = []
        for i in range(n):
            out.append(int(np.argmax(last_logits())))
            if i < n - 1:
                llm.eval([out[-1]])
        return out

    return generate


BUILDERS = {"attnzoo": build_attnzoo, "onnxruntime-genai": build_genai, "llama.cpp": build_llama}
LOADERS = {
    "attnzoo": load_attnzoo,
    "transformers-dynamic": load_transformers_dynamic,
    "transformers-static": load_transformers_static,
    "onnxruntime-genai": load_genai,
    "llama.cpp": load_llama,
}
BUILDERS.update({path: BUILDERS[base] for path, base in SPECULATIVE.items() if base in BUILDERS})
LOADERS.update({path: LOADERS[base] for path, base in SPECULATIVE.items()})
BUILDERS["llama.cpp-draft"] = lambda job: _peer_spec().build_llama_draft(job, build_llama)
BUILDERS["onnxruntime-genai-draft"] = lambda job: _peer_spec().build_genai_draft(job, build_genai)
LOADERS["llama.cpp-prompt-lookup"] = LOADERS["llama.cpp-draft"] = lambda job: _peer_spec().load_llama_speculative(job)


# What each path imports before it loads a model: the runtime's share of the worker's memory, measured
# apart from the model's (peak RSS - RSS after these imports = what loading and running the model added).
RUNTIMES = {
    "attnzoo": ("numpy", "onnxruntime", "runtime.session"),
    "transformers-dynamic": ("torch", "transformers"),
    "transformers-static": ("torch", "transformers"),
    "onnxruntime-genai": ("onnxruntime_genai",),
    "llama.cpp": ("numpy", "llama_cpp"),
}
RUNTIMES.update({path: RUNTIMES[base] for path, base in SPECULATIVE.items()})


def time_path(job: dict) -> dict:
    import importlib

    for module in RUNTIMES[job["path"]]:
        importlib.import_module(module)
    runtime_mb = _rss_mb("VmRSS")
    started = time.perf_counter()
    generate = LOADERS[job["path"]](job)
    load_s = time.perf_counter() - started
    n = job["new"]
    for _ in range(job["warmup"]):  # both calls the rounds time, so neither is timed cold
        generate(1)
        tokens = generate(n)
    best_one, best_all = float("inf"), float("inf")
    for _ in range(job["repeats"]):
        t0 = time.perf_counter()
        generate(1)
        best_one = min(best_one, time.perf_counter() - t0)
        t0 = time.perf_counter()
        tokens = generate(n)
        best_all = min(best_all, time.perf_counter() - t0)
    if len(tokens) != n:
        return {"ok": False, "error": f"{job['path']} returned {len(tokens)} new tokens, not {n}"}
    spec = getattr(generate, "stats", None)
    return {
        **({"speculation": dict(spec)} if spec is not None else {}),
        "tokens": tokens,
        "load_s": load_s,
        "end_to_end_s": best_all,
        "prefill_s": best_one,
        "decode_ms_per_token": (best_all - best_one) / (n - 1) * 1e3 if n > 1 else None,
        "tokens_per_s": n / best_all,
        "peak_rss_mb": _rss_mb("VmHWM"),
        "runtime_rss_mb": runtime_mb,
    }


def _rss_mb(field: str) -> float:
    """This process's RSS in MB from /proc/self/status: VmHWM (the peak, this address space only) or
    VmRSS (now); elsewhere ru_maxrss, the peak."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1e3  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3  # KiB on Linux, bytes on macOS


def main(argv: list[str]) -> int:
    job = json.loads(argv[1])
    load_before = os.getloadavg()[0]
    try:
        work = BUILDERS[job["path"]] if job["stage"] == "build" else time_path
        result = {"ok": True, **work(job)}  # a result may say "ok": False itself, with its error
    except Exception as e:  # noqa: BLE001 - any failure becomes the row's note, not a crash
        first = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
        result = {"ok": False, "error": f"{type(e).__name__}: {first}"}
    result["load_avg"] = [load_before, os.getloadavg()[0]]
    result["python"] = sys.executable
    print(RESULT_MARK + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        sys.path.pop(0)  # run as a file: bench/'s own modules must not shadow anything
    sys.exit(main(sys.argv))
