"""One generation path, built or timed in its own process: `PYTHON generate_peers.py JOB_JSON`.

This file imports nothing of attnzoo's at the top and only the standard library: it runs under
another environment's python too (onnxruntime-genai brings its own onnxruntime, llama-cpp-python
its own build), which is how the benchmark keeps each peer in the environment it needs. The
attnzoo path imports zoo and export inside its functions (the parent sets PYTHONPATH for it); the
llama.cpp build imports numpy, gguf, safetensors and llama_cpp inside its own (it writes the GGUF).

A job (JSON): {"stage": "build"|"time", "path": PATH, "checkpoint": DIR, "precision": "fp32"|"int4"|...,
"model": the built model (ONNX file, genai folder, GGUF file), "prompt": [ids], "new": N,
"threads": T, "warmup": W, "repeats": R, "max_len": L}.

Timing (stage "time"), the same for every path: `generate(n)` runs the path's own greedy loop from
the prompt (a fresh cache each call) and returns the n new tokens. W warm-up rounds of generate(1)
and generate(N), then R rounds of generate(1) (prefill and the first token) and generate(N); the best of each.
decode ms/token = (best N - best 1) / (N - 1). Peak memory is the worker's peak RSS, model and
runtime included: Linux's VmHWM of its own address space (ru_maxrss survives exec, so it would start at
the RSS of the bench process that started the worker), ru_maxrss elsewhere. The one result line on
stdout starts with RESULT_MARK.
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
    export_onnx(model, job["model"], decode=True, cache="static", max_len=job["max_len"], **extra)
    return {}


def load_attnzoo(job: dict):
    import numpy as np

    from export import OnnxSession

    session = OnnxSession(job["model"], provider="cpu", threads=job["threads"])
    ids = np.asarray([job["prompt"]], dtype=np.int64)

    def generate(n: int) -> list[int]:
        out = session.generate(ids, max_new_tokens=n)
        return [int(t) for t in list(out[0])[len(job["prompt"]) :]]

    return generate


# ---- transformers' generate, dynamic cache and static cache ----
def _load_transformers(job: dict, cache_implementation: str | None):
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(job["threads"])
    model = AutoModelForCausalLM.from_pretrained(job["checkpoint"], dtype=torch.float32).eval()
    ids = torch.tensor([job["prompt"]], dtype=torch.long)
    extra = {} if cache_implementation is None else {"cache_implementation": cache_implementation}
    pad = model.generation_config.pad_token_id
    pad = model.generation_config.eos_token_id if pad is None else pad

    def generate(n: int) -> list[int]:
        with torch.inference_mode():
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                pad_token_id=pad,
                **extra,
            )
        return out[0, ids.shape[1] :].tolist()

    return generate


def load_transformers_dynamic(job: dict):
    return _load_transformers(job, None)


def load_transformers_static(job: dict):
    return _load_transformers(job, "static")


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
    import onnxruntime_genai as og

    model = og.Model(job["model"])
    prompt = job["prompt"]

    def generate(n: int) -> list[int]:
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=len(prompt) + n, min_length=len(prompt) + n, do_sample=False)
        generator = og.Generator(model, params)
        generator.append_tokens(prompt)
        out = []
        while not generator.is_done():
            generator.generate_next_token()
            out.append(int(generator.get_next_tokens()[0]))
        return out

    return generate


# ---- llama.cpp through llama-cpp-python: a GGUF written here, then eval the prompt, argmax, eval one token ----
LLAMA_QUANT = {"int8": "Q8_0", "int4": "Q4_0"}  # llama_model_quantize from the F32 file, its default rules


def rope_interleave_order(heads: int, head_dim: int):
    """The row order that turns HF LLaMA's rotate-half rotary into llama.cpp's interleaved-pair one.

    HF rotates row i with row i + head_dim/2 of each head at frequency i; llama.cpp's LLAMA arch
    (rope type NORM) rotates rows 2j and 2j+1 at frequency j. So new row 2j is old row j and new row
    2j+1 is old row j + head_dim/2, head by head: `w[order]` for q_proj (heads) and k_proj (kv heads).
    q.k per head is unchanged by one permutation applied to both, so attention is the same."""
    import numpy as np

    if head_dim % 2:
        raise ValueError(f"head_dim {head_dim} is odd: rotary needs pairs")
    half = head_dim // 2
    within = np.stack([np.arange(half), np.arange(half) + half], axis=1).reshape(-1)  # 0, h, 1, h+1, ...
    return (np.arange(heads)[:, None] * head_dim + within[None, :]).reshape(-1)


def _llama_refusal(config: dict) -> str | None:
    """Why this config is not written as llama.cpp's LLAMA arch exactly, or None."""
    if config.get("model_type") != "llama":
        return f"model_type {config.get('model_type')!r}: only 'llama' is written as a GGUF here"
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    checks = [
        (config.get("hidden_act", "silu") != "silu", f"hidden_act {config.get('hidden_act')!r} is not silu"),
        (kind != "default", f"rope scaling {kind!r} is not written (default rotary only)"),
        (config.get("attention_bias") or config.get("mlp_bias"), "attention or MLP biases are not written"),
        (config.get("partial_rotary_factor", 1.0) != 1.0, "partial rotary is not written"),
    ]
    return next((why for bad, why in checks if bad), None)


def _hf_tensors(folder: str):
    """(name, float32 array) for every tensor of the folder's safetensors, sharded or not."""
    import numpy as np
    from safetensors import safe_open

    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    for name in files:
        path = os.path.join(folder, name)
        with safe_open(path, framework="numpy") as f:
            for key in f.keys():
                if f.get_slice(key).get_dtype() == "BF16":  # numpy has no bfloat16: widen its bits
                    yield key, _bf16_tensor(path, key)
                else:
                    yield key, np.ascontiguousarray(f.get_tensor(key), dtype=np.float32)


def _bf16_tensor(path: str, key: str):
    """A BF16 tensor of a safetensors file as float32: its 16 bits are float32's upper half."""
    import numpy as np

    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")  # the format: u64 header size, JSON header, data
        entry = json.loads(f.read(size))[key]
        start, end = entry["data_offsets"]
        f.seek(8 + size + start)
        bits = np.frombuffer(f.read(end - start), dtype="<u2")
    return (bits.astype(np.uint32) << 16).view(np.float32).reshape(entry["shape"])


def _gguf_name(hf: str) -> str | None:
    """llama.cpp's name for a transformers LLaMA tensor; None for one it has no use for."""
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    top["lm_head.weight"] = "output.weight"
    if hf in top:
        return top[hf]
    parts = hf.split(".")  # model.layers.N.<module>.<proj>.weight
    if len(parts) < 5 or parts[:2] != ["model", "layers"]:
        raise ValueError(f"tensor {hf} has no llama.cpp name here")
    block = {
        "input_layernorm": "attn_norm",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "post_attention_layernorm": "ffn_norm",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }
    module = ".".join(parts[3:-1])
    if module == "self_attn.rotary_emb":
        return None  # old checkpoints' inv_freq buffer: llama.cpp computes its own
    if module not in block or parts[-1] != "weight":
        raise ValueError(f"tensor {hf} has no llama.cpp name here")
    return f"blk.{parts[2]}.{block[module]}.weight"


def write_llama_gguf(folder: str, out: str) -> dict:
    """The checkpoint as an F32 GGUF of arch "llama", with a synthetic vocabulary of vocab_size tokens."""
    import gguf

    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    why = _llama_refusal(config)
    if why:
        raise ValueError(why)
    heads, hidden = config["num_attention_heads"], config["hidden_size"]
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or hidden // heads
    rope = config.get("rope_parameters") or {}
    theta = rope.get("rope_theta", config.get("rope_theta", 10000.0))
    vocab = config["vocab_size"]
    writer = gguf.GGUFWriter(out, "llama")
    writer.add_context_length(config.get("max_position_embeddings", 2048))
    writer.add_embedding_length(hidden)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(float(theta))
    writer.add_layer_norm_rms_eps(float(config.get("rms_norm_eps", 1e-6)))
    writer.add_vocab_size(vocab)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    # The loop feeds ids, never text: tokens <tN>, with the config's specials as control tokens.
    eos = config.get("eos_token_id")
    specials = {config.get("bos_token_id"): "<s>", config.get("pad_token_id"): "<pad>"}
    specials.update({i: "</s>" for i in (eos if isinstance(eos, list) else [eos])})
    specials = {i: text for i, text in specials.items() if isinstance(i, int) and 0 <= i < vocab}
    writer.add_tokenizer_model("llama")
    writer.add_token_list([specials.get(i, f"<t{i}>") for i in range(vocab)])
    writer.add_token_scores([0.0] * vocab)
    normal, control = int(gguf.TokenType.NORMAL), int(gguf.TokenType.CONTROL)
    writer.add_token_types([control if i in specials else normal for i in range(vocab)])
    for key, value in (("bos", config.get("bos_token_id")), ("eos", eos), ("pad", config.get("pad_token_id"))):
        value = value[0] if isinstance(value, list) and value else value
        if isinstance(value, int) and 0 <= value < vocab:
            getattr(writer, f"add_{key}_token_id")(value)
    writer.add_add_bos_token(False)
    orders = {"attn_q": rope_interleave_order(heads, head_dim), "attn_k": rope_interleave_order(kv_heads, head_dim)}
    tied = config.get("tie_word_embeddings", False)
    count = 0
    for hf, array in _hf_tensors(folder):
        name = _gguf_name(hf)
        if name is None or (tied and name == "output.weight"):
            continue
        kind = name.split(".")[-2]
        writer.add_tensor(name, array[orders[kind]] if kind in orders else array)
        count += 1
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {"tensors": count, "gguf": _version("gguf")}


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


def _gguf_tensor_types(path: str) -> dict[str, int]:
    import gguf

    counts: dict[str, int] = {}
    for tensor in gguf.GGUFReader(path).tensors:
        counts[tensor.tensor_type.name] = counts.get(tensor.tensor_type.name, 0) + 1
    return counts


def build_llama(job: dict) -> dict:
    """job["model"]: an F32 GGUF for fp32; for int8/int4 the F32 file, then llama_model_quantize to Q8_0/Q4_0."""
    with open(os.path.join(job["checkpoint"], "config.json")) as f:
        why = _llama_refusal(json.load(f))
    if why:  # refused before llama_cpp is imported
        return {"ok": False, "error": why}
    import ctypes

    import llama_cpp

    os.makedirs(os.path.dirname(os.path.abspath(job["model"])), exist_ok=True)
    quant = LLAMA_QUANT.get(job["precision"])
    f32 = job["model"] + ".f32.gguf" if quant else job["model"]
    info = write_llama_gguf(job["checkpoint"], f32)
    info["note"] = "GGUF F32 written by bench/generate_peers.py (gguf-py)"
    if quant:
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{quant}")
        params.nthread = job["threads"]
        code = llama_cpp.llama_model_quantize(f32.encode(), job["model"].encode(), ctypes.byref(params))
        os.remove(f32)
        if code != 0:
            return {"ok": False, "error": f"llama_model_quantize to {quant} returned {code}"}
        info["note"] = f"{quant} by llama_cpp.llama_model_quantize (its default rules) from that F32 GGUF"
    info["tensor_types"] = _gguf_tensor_types(job["model"])
    info["llama_cpp_python"] = llama_cpp.__version__
    return info


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


def time_path(job: dict) -> dict:
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
    return {
        "tokens": tokens,
        "load_s": load_s,
        "end_to_end_s": best_all,
        "prefill_s": best_one,
        "decode_ms_per_token": (best_all - best_one) / (n - 1) * 1e3 if n > 1 else None,
        "tokens_per_s": n / best_all,
        "peak_rss_mb": _peak_rss_mb(),
    }


def _peak_rss_mb() -> float:
    """This process's peak RSS in MB: /proc/self/status VmHWM (this address space only), else ru_maxrss."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
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
