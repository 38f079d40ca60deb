"""In a worker: one decode row (path, b, p) of `attnzoo bench NAME --decode`, and the machine's
read bandwidth measured in the same process just before it (the row's floor divides by it).

Paths (bench/jobs.py DECODE_PATHS):
  eager-sdpa             zoo block.decode with a growing cache (torch.cat each step)
  eager-static           zoo block.decode(x, cache=StaticCache): buffers written in place
  transformers-static    transformers' own attention module (weights copied with zoo.to_hf), its
                         StaticCache and SDPA: the peer a user would pick (LLaMA-shaped blocks)
  ort-<lowering>         OnnxSession.generate_steps on a growing-cache export
  ort-<lowering>-static  a static-cache export: OrtStaticCache bound once, rewound to p per call

Every call feeds STEPS single tokens after a past of p positions. The static paths hold a
capacity of p + STEPS and rewind to p before each call (an int: nothing is copied), so every
call does the same work as the growing paths, which start again from the same past.
"""

from __future__ import annotations

import time
from typing import Any

import zoo

from .jobs import BASELINE, STEPS, BenchError, Job
from .timing import PeakMemory, time_calls, torch_setup

BANDWIDTH_BYTES = 512 << 20  # larger than any last-level cache of a CPU this runs on


def read_bandwidth(torch, device, nbytes: int = BANDWIDTH_BYTES, threads: int | None = None) -> float:
    """GB/s: the best of 5 reductions over a buffer of nbytes (a read of every byte once, as a decode
    step reads its weights and cache), with `threads` torch threads: the threads the path uses. The
    buffer is read once untimed first, so a buffer that fits the last-level cache is read from it, as
    a step's weights and cache are when they fit: the bandwidth of a step's own working set."""
    if threads is not None:
        torch.set_num_threads(threads)
    count = max(nbytes // 4, 1024)
    buf = torch.ones(count, dtype=torch.float32, device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    buf.sum()
    best = float("inf")
    for _ in range(5):
        sync()
        started = time.perf_counter()
        buf.sum()
        sync()
        best = min(best, time.perf_counter() - started)
    del buf
    return count * 4 / best / 1e9


def last_level_cache_bytes() -> int | None:
    """The CPU's L3 (or last-level) cache in bytes, from sysfs; None where it does not say."""
    from pathlib import Path

    for index in ("index3", "index2"):
        f = Path(f"/sys/devices/system/cpu/cpu0/cache/{index}/size")
        try:
            text = f.read_text().strip().upper()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        return int(text.rstrip("KMG")) * scale
    return None


def floor_bandwidths(torch, device, job: Job) -> dict[str, Any]:
    """The floor's bandwidths, all with the path's threads: from memory (BANDWIDTH_BYTES), of the step's
    own working set (job.floor_bytes, read again right after a read, so whatever part of it stays in the
    last-level cache between steps is read from there), and of the cache itself (a quarter of its size).
    l3_part: the share of the working set those figures say stays in the last-level cache between steps."""
    out: dict[str, Any] = {"bandwidth_threads": job.threads}
    out["bandwidth_gbs"] = read_bandwidth(torch, device, BANDWIDTH_BYTES, job.threads)
    if device.type != "cpu" or job.floor_bytes <= 0:
        return out
    out["working_set_gbs"] = read_bandwidth(torch, device, job.floor_bytes, job.threads)
    llc = last_level_cache_bytes()
    if llc:
        out["llc_mb"] = llc / 1e6
        out["llc_gbs"] = read_bandwidth(torch, device, llc // 4, job.threads)
        t_mem, t_set, t_llc = (
            job.floor_bytes / (out[k] * 1e9) for k in ("bandwidth_gbs", "working_set_gbs", "llc_gbs")
        )
        out["l3_part"] = min(1.0, max(0.0, (t_mem - t_set) / (t_mem - t_llc))) if t_mem > t_llc else None
    return out


def measure_decode(job: Job) -> dict[str, Any]:
    """ms per token for one (path, b, p), with the bandwidth read just before."""
    torch, device, dtype, sync = torch_setup(job)
    bandwidths = floor_bandwidths(torch, device, job)
    spec = zoo.spec(job.name, **job.overrides)
    b, p = job.batch, job.seq
    past_key = torch.randn(b, spec.kv_heads_, p, spec.d_k_, device=device, dtype=dtype)
    past_value = torch.randn(b, spec.kv_heads_, p, spec.d_v_, device=device, dtype=dtype)
    x = torch.randn(b, STEPS, spec.d_model, device=device, dtype=dtype)
    if job.runtime == "torch":
        call, where = _torch_call(job, spec, x, past_key, past_value, torch, device, dtype)
    else:
        call, where = _ort_call(job, x, past_key, past_value)
    call()  # warm: kernels, arenas and thread pools exist before the baseline
    sync()
    peak = PeakMemory(job.provider, job.runtime)
    peak.start()
    out = time_calls(call, sync, job.budget, after_each=peak.sample)
    out.update(peak.stop())
    out["ms_per_token"] = out["median_ms"] / STEPS
    out["ran_on"] = where
    out.update(bandwidths)
    return out


def _torch_call(job: Job, spec, x, past_key, past_value, torch, device, dtype):
    p = past_key.shape[2]
    block = zoo.create(job.name, **job.overrides).to(device=device, dtype=dtype).eval()
    where = f"torch {job.provider}"
    if job.path == BASELINE:

        def call() -> None:
            k, v = past_key, past_value
            for i in range(STEPS):
                _, k, v = block.decode(x[:, i : i + 1], k, v)

        return call, where
    if job.path == "eager-static":
        cache = zoo.StaticCache.from_past(past_key, past_value, max_len=p + STEPS)

        def call() -> None:
            cache.length = p
            for i in range(STEPS):
                block.decode(x[:, i : i + 1], cache=cache)

        return call, where
    if job.path == "transformers-static":
        return _transformers_static(block, x, past_key, past_value, torch), f"transformers {job.provider}"
    raise BenchError(f"unknown eager decode path {job.path!r}")


def _ort_call(job: Job, x, past_key, past_value):
    from runtime.session import OnnxSession

    sess = OnnxSession(
        job.model, job.provider, threads=job.threads if job.provider == "cpu" else None, verbose=False, tf32=job.tf32
    )
    x, past_key, past_value = x.cpu().numpy(), past_key.cpu().numpy(), past_value.cpu().numpy()
    where = f"onnxruntime {sess.provider}"
    if sess.cache == "static":
        p = past_key.shape[2]
        cache = sess.static_cache(x.shape[0], past_key, past_value, max_len=p + STEPS)

        def call() -> None:
            cache.rewind(p)
            for i in range(STEPS):
                cache.step(x[:, i : i + 1])

        return call, where

    def call() -> None:
        sess.generate_steps(x, past_key, past_value)

    return call, where


def transformers_static_why_not(spec: zoo.AttentionSpec) -> str | None:
    """Why the transformers-static peer is not measured for `spec`, or None."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        return "transformers is not installed (pip install attnzoo[test])"
    mods = {m.name for m in zoo.modifiers.active(spec)}
    if (
        spec.bias
        or mods != {"rope"}
        or spec.rope_dim not in (None, spec.d_k_)
        or spec.rope_interleaved
        or spec.rope_scale is not None
        or spec.d_v_ != spec.d_k_
    ):
        return "measured for LLaMA-shaped blocks (full unscaled rotary, no bias, no window/softcap/QK-norm/ALiBi)"
    return None


def _transformers_static(block, x, past_key, past_value, torch):
    """transformers' LlamaAttention with the block's weights, its StaticCache and SDPA."""
    from transformers import LlamaConfig
    from transformers.cache_utils import StaticCache
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding

    s = block.spec
    b, p = past_key.shape[0], past_key.shape[2]
    n = p + STEPS
    config = LlamaConfig(
        hidden_size=s.d_model,
        num_attention_heads=s.heads,
        num_key_value_heads=s.kv_heads_,
        head_dim=s.d_k_,
        rope_parameters={"rope_type": "default", "rope_theta": s.rope_theta},
        attention_bias=False,
        max_position_embeddings=n,
        num_hidden_layers=1,
    )
    config._attn_implementation = "sdpa"
    attn = LlamaAttention(config, layer_idx=0).to(device=x.device, dtype=x.dtype).eval()
    zoo.to_hf(block, attn)
    rope = LlamaRotaryEmbedding(config).to(x.device)
    cache = StaticCache(config=config, max_cache_len=n)
    cache.update(past_key, past_value, 0)  # the past: positions 0..p-1
    layer = cache.layers[0]
    allowed = torch.ones(n, n, dtype=torch.bool, device=x.device).tril()
    positions = torch.arange(p, n, device=x.device)

    def call() -> None:
        # transformers' StaticLayer writes at its own running length: set it back to p, as the
        # zoo's static paths rewind (nothing is copied either way).
        layer.cumulative_length.fill_(p)
        for i in range(STEPS):
            cos_sin = rope(x, positions[i : i + 1][None].expand(b, 1))
            mask = allowed[p + i][None, None, None, :]
            attn(x[:, i : i + 1], cos_sin, mask, cache)

    return call
