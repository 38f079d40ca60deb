"""Whole-model generation benchmark: the same greedy tokens from a checkpoint, path by path, each in
its own process.

    attnzoo bench --checkpoint DIR --generate --prompt 128,1024 --new 64 --precision fp32,int4 \
        [--rounds N] [--genai-python PATH] [--llama-python PATH [--gguf fp32=F32.gguf,int4=Q4_0.gguf]] [--json PATH]

Paths (PATHS): attnzoo (export_onnx(model, decode=True, precision=P) and OnnxSession.generate),
transformers' generate with its dynamic cache and with cache_implementation="static" (fp32 only),
onnxruntime-genai (its builder, then og.Generator) from the python given by --genai-python, and
llama.cpp through llama-cpp-python from --llama-python: its GGUF per precision is written from the
checkpoint in that environment (gguf-py, F32; int8 = Q8_0 and int4 = Q4_0 by llama_model_quantize),
or brought with --gguf PREC=FILE. A path whose environment is not given, or that cannot run, is a
row saying why.

Every worker (bench/generate_peers.py) gets the same prompt ids, B = 1, the same threads; it times
its own greedy loop: end-to-end seconds for N new tokens, the prefill (the call for 1 token),
decode ms/token, and its peak RSS. Token agreement: each row's tokens against transformers'
dynamic-cache fp32 tokens at the same prompt (the leading run that matches, and the count equal).
`--checkpoint random` is the issue's random LLaMA (bench/checkpoints.py), made in a temp folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .checkpoints import prompt_ids, random_llama
from .generate_peers import RESULT_MARK
from .jobs import BenchError
from .machine import default_threads, machine_info, versions
from .worker import import_root

PATHS = ("attnzoo", "transformers-dynamic", "transformers-static", "onnxruntime-genai", "llama.cpp")
# --speculative (bench/generate_spec.py): candidates from the text so far, or from a draft (--draft DIR)
SPEC_PATHS = ("attnzoo-prompt-lookup", "attnzoo-draft", "transformers-prompt-lookup", "transformers-assistant")
PEER_SPEC = tuple(f"{p}-{k}" for p in ("llama.cpp", "onnxruntime-genai") for k in ("prompt-lookup", "draft"))
SPEC_PATHS += PEER_SPEC  # the peers' own (bench/peer_spec.py)
PRECISIONS = ("fp32", "int8", "int4")
ONLY_FP32 = ("transformers-dynamic", "transformers-static", "transformers-prompt-lookup", "transformers-assistant")
REFERENCE = "transformers-dynamic"
CPU_ONLY = ("onnxruntime-genai", "llama.cpp", *PEER_SPEC)
DTYPES = ("float32", "float16", "bfloat16")
WORKER = Path(__file__).resolve().parent / "generate_peers.py"
RANDOM = "random"


def benchmark_generate(
    checkpoint: str,
    *,
    prompts: list[int],
    new: int,
    precisions: list[str],
    threads: int | None = None,
    warmup: int = 1,
    repeats: int = 3,
    rounds: int = 1,
    genai_python: str | None = None,
    llama_python: str | None = None,
    gguf: dict[str, str] | None = None,
    paths: list[str] | None = None,
    timeout: float = 1800.0,
    progress: bool = True,
    device: dict[str, Any] | None = None,
    num_beams: int = 1,
    speculative: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Build each path's model once per precision, then time every (prompt, precision, path), `rounds`
    times over (each row keeps its best round: the lowest end-to-end time).
    device: where attnzoo and transformers run (`device_settings`: provider, dtype, cuda_graph, tf32); the
    default is the CPU in float32. On CUDA, attnzoo exports for CUDA in that dtype (packed rows in float16 and
    bfloat16; float32 is left-padded through the decomposed lowering: no fp32 GroupQueryAttention kernel), and
    transformers runs on the GPU in it; onnxruntime-genai and llama.cpp stay CPU paths, skipped there.
    speculative: {"k", "ngram", "draft" (a folder or None), "workload" ("grounded" | "free")}
    (bench/generate_spec.py): the speculating paths join, and the prompts are the workload's."""
    from .generate_spec import build_order, check, default_paths, refusal, shared_model, spec_job, workload_ids

    check(speculative, paths)
    device = device_settings(**(device or {}))
    paths = list(paths or default_paths(PATHS, speculative))
    bad = sorted(set(paths) - set(PATHS + SPEC_PATHS)) + sorted(set(precisions) - set(PRECISIONS))
    if bad:
        raise BenchError(f"unknown path or precision {bad}; paths: {', '.join(PATHS)}; precisions: fp32,int8,int4")
    if new < 1 or not prompts or min(prompts) < 1:
        raise BenchError(f"--new {new} and --prompt {prompts} must be positive")
    if rounds < 1:
        raise BenchError(f"--rounds {rounds} must be 1 or more")
    threads = threads or default_threads()
    pythons = {p: sys.executable for p in PATHS + SPEC_PATHS}
    pythons.update({p: genai_python or "" for p in PATHS + SPEC_PATHS if p.startswith("onnxruntime-genai")})
    pythons.update({p: llama_python or "" for p in PATHS + SPEC_PATHS if p.startswith("llama.cpp")})
    with tempfile.TemporaryDirectory(prefix="attnzoo-bench-generate-") as tmp:
        folder = str(random_llama(Path(tmp) / "random-llama")) if checkpoint == RANDOM else checkpoint
        if not (Path(folder) / "config.json").is_file():
            raise BenchError(f"--checkpoint {checkpoint} has no config.json; name a transformers checkpoint folder")
        max_len = max(prompts) + new
        models: dict[tuple[str, str], str] = {}
        skipped: dict[tuple[str, str], str] = {}
        builds: dict[str, Any] = {}
        extras: dict[tuple[str, str], dict[str, str]] = {}  # a peer's draft model, where its path builds one
        for path in build_order(paths):  # those whose model others share first
            for precision in precisions:
                why = _why_not(path, precision, pythons[path], device["provider"]) or refusal(path, speculative)
                if num_beams > 1 and path in CPU_ONLY:
                    why = f"beam search ({num_beams} beams) is timed on attnzoo and transformers here"
                if why:
                    skipped[(path, precision)] = why
                    continue
                if path in ("llama.cpp", "llama.cpp-prompt-lookup") and precision in (gguf or {}):
                    given = models[(path, precision)] = (gguf or {})[precision]  # the user's own file
                    builds[f"{path} {precision}"] = {"ok": True, "note": f"given: --gguf {precision}={given}"}
                    continue
                if path in ONLY_FP32:
                    continue
                name = (
                    "model.gguf" if path.startswith("llama.cpp") else "model.onnx" if path.startswith("attnzoo") else ""
                )
                own = Path(tmp) / f"{path}-{precision}"
                shared, draft_only = shared_model(path, precision, models, speculative)  # generate_spec.py says whose
                if shared and not draft_only:
                    models[(path, precision)] = shared
                    continue
                target = shared or str(own / name)
                if path in PEER_SPEC and path.endswith("-draft"):
                    extras[(path, precision)] = {"draft_model": str(own / ("draft.gguf" if name else "draft"))}
                job = {
                    "stage": "build",
                    "path": path,
                    "checkpoint": folder,
                    "precision": precision,
                    "model": target.rstrip("/"),
                    "max_len": max_len,
                    "threads": threads,
                    **device,
                    **spec_job(path, speculative),
                    **extras.get((path, precision), {}),
                    **({"draft_only": True} if draft_only else {}),
                }
                started = time.perf_counter()
                result = _spawn(pythons[path], job, timeout)
                builds[f"{path} {precision}"] = {**result, "seconds": time.perf_counter() - started}
                if result.get("ok"):
                    models[(path, precision)] = job["model"]
                else:
                    skipped[(path, precision)] = f"build failed: {result.get('error')}"
                if progress:
                    said = (
                        f"built in {builds[f'{path} {precision}']['seconds']:.1f} s"
                        if result.get("ok")
                        else (f"build failed ({result.get('error')}); its rows are skipped")
                    )
                    print(f"{path} {precision}: {said}", file=sys.stderr)
        floor = memory_floor(folder, prompts, new)
        best: dict[tuple[int, str, str], dict[str, Any]] = {}  # insertion order: the table's
        took: dict[tuple[int, str, str], list[float | None]] = {}  # every round's end-to-end time (None: failed)
        # the prompts' rows: the length, or with --speculative "LENGTH WORKLOAD" for each workload
        ids_of = workload_ids(folder, prompts, speculative, prompt_ids)
        for round_ in range(rounds):
            for prompt, precision, path in ((q, r, p) for q in ids_of for r in precisions for p in paths):
                if (path, precision) in skipped or (path in ONLY_FP32 and precision != "fp32"):
                    continue
                job = {
                    "stage": "time",
                    "path": path,
                    "checkpoint": folder,
                    "precision": precision,
                    "model": models.get((path, precision), ""),
                    "prompt": ids_of[prompt],
                    "new": new,
                    "threads": threads,
                    "warmup": warmup,
                    "repeats": repeats,
                    "max_len": max_len,
                    "num_beams": num_beams,
                    **device,
                    **spec_job(path, speculative),
                    **extras.get((path, precision), {}),
                }
                result = _spawn(pythons[path], job, timeout)
                key = (prompt, precision, path)
                took.setdefault(key, []).append(result.get("end_to_end_s") if result.get("ok") else None)
                row = {"path": path, "precision": precision, "prompt": prompt, **result}
                if key not in best or _better(row, best[key]):
                    best[key] = row
                if progress:
                    where = f" (round {round_ + 1} of {rounds})" if rounds > 1 else ""
                    print(f"prompt {prompt} {path} {precision}{where}: {_brief(result)}", file=sys.stderr)
    rows = [{**row, "rounds_end_to_end_s": took[key]} for key, row in best.items()]
    _agreement(rows)
    if speculative:
        from .generate_spec import rewritten

        rewritten(rows, ids_of)
    return {
        "kind": "generate",
        "checkpoint": checkpoint,
        "config": _config_facts(folder) if checkpoint != RANDOM else {"random_llama": True},
        "prompts": prompts,
        "new": new,
        "precisions": precisions,
        "threads": threads,
        "warmup": warmup,
        "repeats": repeats,
        "rounds": rounds,
        "num_beams": num_beams,
        "device": device,
        **({"speculative": speculative} if speculative else {}),
        "rows": rows,
        "memory_floor": floor,
        "skipped": [{"path": p, "precision": q, "why": why} for (p, q), why in skipped.items()],
        "builds": builds,
        "machine": {**machine_info(), **cpu_facts()},
        "versions": versions(),
    }


def device_settings(
    provider: str = "cpu", dtype: str = "float32", cuda_graph: bool = False, tf32: bool = False
) -> dict[str, Any]:
    """Where attnzoo and transformers run, checked: a CUDA provider that really works here, a half dtype and
    CUDA graphs only there (ONNX Runtime's CPU provider has no half whole models), TF32 only for float32."""
    if provider not in ("cpu", "cuda"):
        raise BenchError(f"--provider {provider!r} is not one of cpu, cuda")
    if dtype not in DTYPES:
        raise BenchError(f"--dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    from runtime.providers import cuda_graph_refusal, dtype_refusal

    why = dtype_refusal(provider, dtype)
    if why:
        raise BenchError(why)
    if cuda_graph:
        why = cuda_graph_refusal(provider, dtype)  # the bench always exports its checkpoint
        if why:
            raise BenchError(why)
    if tf32 and dtype != "float32":
        raise BenchError(f"--tf32 is for float32; --dtype {dtype} has no TF32 products")
    if provider == "cuda":
        from runtime.providers import cuda_status

        ok, why = cuda_status()
        if not ok:
            raise BenchError(f"--provider cuda: {why}")
    return {"provider": provider, "dtype": dtype, "cuda_graph": bool(cuda_graph), "tf32": bool(tf32)}


def _why_not(path: str, precision: str, python: str, provider: str = "cpu") -> str | None:
    if provider == "cuda" and path in CPU_ONLY:
        return f"{path} is measured on the CPU here (its CUDA build is not set up by this bench)"
    if path in ONLY_FP32 and precision != "fp32":
        return None  # transformers rows are fp32 only; nothing to report per precision
    if path == "attnzoo":
        import zoo

        if getattr(zoo, "lm_from_checkpoint", None) is None:
            return "this attnzoo has no whole-model loader (zoo.lm_from_checkpoint)"
    if path.startswith("onnxruntime-genai"):
        if not python:
            return "no --genai-python given (onnxruntime-genai brings its own onnxruntime: give its environment)"
        if precision == "int8":
            return "onnxruntime-genai's builder has no int8 weight precision"
    if path.startswith("llama.cpp") and not python:
        return "no --llama-python given (llama-cpp-python's environment, with numpy, gguf and safetensors)"
    if python and not Path(python).exists():
        return f"{python} does not exist"
    return None


def _spawn(python: str, job: dict, timeout: float) -> dict[str, Any]:
    env = dict(os.environ)
    if python == sys.executable:  # the attnzoo and transformers workers run exactly this code
        root = import_root()
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    try:
        proc = subprocess.run(
            [python, str(WORKER), json.dumps(job)], capture_output=True, text=True, timeout=timeout, env=env
        )
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"timed out after {timeout:.0f} s (raise --timeout)"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_MARK):
            return json.loads(line[len(RESULT_MARK) :])
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1][:300]
    return {"ok": False, "error": f"worker exited {proc.returncode}: {tail}"}


def _agreement(rows: list[dict[str, Any]]) -> None:
    """Each row's tokens against the reference path's fp32 tokens at the same prompt."""
    for row in rows:
        ref = next((r for r in rows if r["path"] == REFERENCE and r["prompt"] == row["prompt"] and r.get("ok")), None)
        if not row.get("ok") or ref is None:
            continue
        a, b = row["tokens"], ref["tokens"]
        lead = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        row["agree_leading"] = lead
        row["agree_count"] = sum(x == y for x, y in zip(a, b))
    from .generate_spec import equal_to_plain

    equal_to_plain(rows)


def _better(row: dict[str, Any], than: dict[str, Any]) -> bool:
    """A round that ran beats one that failed; between two that ran, the lower end-to-end time."""
    if not row.get("ok") or not than.get("ok"):
        return bool(row.get("ok")) and not than.get("ok")
    return row["end_to_end_s"] < than["end_to_end_s"]


def _brief(result: dict[str, Any]) -> str:
    if not result.get("ok"):
        return result.get("error", "?")
    return f"{result['end_to_end_s']:.3f} s, {result['tokens_per_s']:.0f} tok/s"


def _config_facts(folder: str) -> dict[str, Any]:
    config = json.loads((Path(folder) / "config.json").read_text())
    keys = (
        "model_type",
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "intermediate_size",
    )
    return {k: config.get(k) for k in keys}


def cpu_facts() -> dict[str, Any]:
    """AVX-512 or not, the L3 size and the load average: what the figures depend on."""
    facts: dict[str, Any] = {"load_avg": list(os.getloadavg())}
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
        facts["avx512"] = "avx512f" in flags.split()
        facts["avx2"] = "avx2" in flags.split()
    except (OSError, StopIteration):
        pass
    l3 = Path("/sys/devices/system/cpu/cpu0/cache/index3/size")
    if l3.exists():
        facts["l3"] = l3.read_text().strip()
    return facts


def _beams(report: dict[str, Any]) -> str:
    k = report.get("num_beams", 1)
    return "greedy, " if k == 1 else f"beam search with {k} beams (eos off: every hypothesis makes them all), "


def format_generate_table(report: dict[str, Any]) -> str:
    """A markdown table: one row per (prompt, precision, path), then the skipped paths."""
    m = report["machine"]
    dev = report.get("device") or device_settings()
    where = (
        f"CUDA {dev['dtype']}" + (", CUDA graphs" if dev["cuda_graph"] else "") + (", TF32" if dev["tf32"] else "")
        if dev["provider"] == "cuda"
        else "CPU float32"
    )
    lines = [
        f"generate: {report['checkpoint']}, {where}, B 1, {report['new']} new tokens, {_beams(report)}"
        f"{report['threads']} threads, "
        f"best of {report['repeats']} after {report['warmup']} warm-up{_rounds(report)}; {m.get('cpu')} "
        f"({'AVX-512' if m.get('avx512') else 'no AVX-512'}), load {', '.join(f'{x:.1f}' for x in m['load_avg'])}",
        "",
        "| prompt | precision | path | end to end s | tokens/s | prefill s | decode ms/token | peak RSS MB "
        "| model MB | agree (leading / equal) |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in report["rows"]:
        head = f"| {r['prompt']} | {r['precision']} | {r['path']} |"
        if not r.get("ok"):
            lines.append(f"{head} error: {r.get('error', '?')} | | | | | | |")
            continue
        agree = f"{r['agree_leading']} / {r['agree_count']} of {report['new']}" if "agree_count" in r else ""
        decode = "" if r.get("decode_ms_per_token") is None else f"{r['decode_ms_per_token']:.2f}"
        lines.append(
            f"{head} {r['end_to_end_s']:.3f} | {r['tokens_per_s']:.0f} | {r['prefill_s']:.3f} | {decode} "
            f"| {r['peak_rss_mb']:.0f} | {_model_mb(r)} | {agree} |"
        )
    for s in report["skipped"]:
        lines.append(f"| | {s['precision']} | {s['path']} | skipped: {s['why']} | | | | | | |")
    floor = report.get("memory_floor")
    if floor:
        caches = ", ".join(f"{mb:.1f} MB at prompt {p}" for p, mb in floor["cache_mb"].items())
        lines += [
            "",
            f"model MB: the worker's peak RSS less its RSS after the path's imports (the runtime, before the model). "
            f"The floor it is measured against: fp32 weights {floor['weights_mb']:.0f} MB, static cache {caches}.",
        ]
    notes = [(key, b) for key, b in report.get("builds", {}).items() if b.get("ok") and b.get("note")]
    lines += [""] if notes else []
    for key, b in notes:  # how a model was made where the row alone does not say (llama.cpp's GGUFs)
        types = ", ".join(f"{t} {n}" for t, n in b.get("tensor_types", {}).items())
        lines.append(f"- {key}: {b['note']}" + (f" (tensors: {types})" if types else ""))
    return "\n".join(lines)


def _rounds(report: dict[str, Any]) -> str:
    n = report.get("rounds", 1)
    return f", the best of {n} rounds (paths in turn, each a fresh process)" if n > 1 else ""


def _model_mb(row: dict[str, Any]) -> str:
    runtime = row.get("runtime_rss_mb")
    return "" if runtime is None else f"{row['peak_rss_mb'] - runtime:.0f}"


def memory_floor(folder: str, prompts: list[int], new: int) -> dict[str, Any] | None:
    """The fp32 weights (the checkpoint's safetensors bytes) and, per prompt, a static cache of
    prompt + new positions (every layer's K and V, fp32), in MB; None for a config it cannot read."""
    try:
        config = json.loads((Path(folder) / "config.json").read_text())
        heads = config["num_attention_heads"]
        kv = config.get("num_key_value_heads") or heads
        head_dim = config.get("head_dim") or config["hidden_size"] // heads
        per_position = config["num_hidden_layers"] * 2 * kv * head_dim * 4
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
        return None
    weights = sum(f.stat().st_size for f in Path(folder).glob("*.safetensors"))
    return {"weights_mb": weights / 1e6, "cache_mb": {p: per_position * (p + new) / 1e6 for p in prompts}}
