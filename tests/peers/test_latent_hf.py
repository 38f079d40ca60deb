"""Latent attention against transformers' own modules at 160 positions, step by step: the model decodes with its
cache (a prompt, then one token at a time) and from_hf's block decodes the same steps with a growing and a static
cache that hold the latent and the rotary key; every step's output matches the module's, and the latent the block
caches is the one the model's cache holds."""

from __future__ import annotations

import inspect

import hf_cases
import pytest
import torch

import zoo

transformers = pytest.importorskip("transformers")

N, PROMPT = 160, 100  # positions in all; the prompt, then one token per step
ATOL = 1e-5  # fp32, as tests/peers/test_hf.py

MODELS = {
    "deepseek-v3": ("DeepseekV3ForCausalLM", "DeepseekV3Config", hf_cases.DEEPSEEK),
    "deepseek-v2": ("DeepseekV2ForCausalLM", "DeepseekV2Config", dict(hf_cases.DEEPSEEK, q_lora_rank=None)),
    "minicpm3": ("MiniCPM3ForCausalLM", "MiniCPM3Config", hf_cases.MLA),
}


def _steps(name: str):
    """The module's input and output at every call of a cached generation: [(x, y)], and the model's cache."""
    model_cls, config_cls, cfg = MODELS[name]
    config = getattr(transformers, config_cls)(**cfg)
    config._attn_implementation = "eager"
    model = hf_cases.randomize(getattr(transformers, model_cls)(config))
    module = model.model.layers[0].self_attn
    seen = []
    module.register_forward_pre_hook(lambda m, a, k: seen.append([a[0] if a else k["hidden_states"]]), with_kwargs=True)
    module.register_forward_hook(lambda m, a, k, out: seen[-1].append(out[0]), with_kwargs=True)
    ids = torch.randint(2, hf_cases.VOCAB, (2, N), generator=torch.Generator().manual_seed(3))
    # transformers 5.24 renamed forward's past_key_values to cache (the old name goes in 5.40); 5.0 has only it
    kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    with torch.no_grad():
        cache = getattr(model(input_ids=ids[:, :PROMPT], use_cache=True), kw)
        for i in range(PROMPT, N):
            cache = getattr(model(input_ids=ids[:, i : i + 1], **{kw: cache}, use_cache=True), kw)
    return module, seen, cache


# one model in the default run (the cheapest); the others under -m slow
@pytest.mark.parametrize("name", [n if n == "deepseek-v2" else pytest.param(n, marks=pytest.mark.slow) for n in MODELS])
def test_decode_matches_the_module_step_by_step(name):
    module, seen, hf_cache = _steps(name)
    block = zoo.from_hf(module)
    static = zoo.StaticCache.empty(block.spec, batch=2, max_len=N)
    past = (None, None)
    worst = 0.0
    with torch.no_grad():
        for x, y in seen:
            grown, *past = block.decode(x, *past)
            fixed = block.decode(x, cache=static)
            worst = max(worst, (grown - y).abs().max().item(), (fixed - y).abs().max().item())
    assert worst <= ATOL, f"{name}: max abs err over {len(seen)} steps {worst:.2e}"
    rot, latent = past
    assert tuple(latent.shape) == (2, 1, N, block.spec.kv_lora_rank) and tuple(rot.shape) == (2, 1, N, 8)
    # transformers' cache holds the same latent (its rotary key lies in its own pair order)
    held = hf_cache.layers[0].keys
    assert tuple(held.shape) == tuple(latent.shape) and (held - latent).abs().max().item() <= ATOL
    assert (static.value - latent).abs().max().item() <= ATOL
