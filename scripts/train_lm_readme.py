"""The README.md that scripts/train_lm.py writes into a trained folder: its facts (training.json, config.json) and
greedy samples by transformers' generate from the folder (the last prompt repeats its own lines)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from bench.checkpoints import BOS, PAD

NAME = "tiny-stdlib-llama"


# the last one repeats its own lines: a model that copies continues `sub(a, b):` (issue 54's prompt)
COPY_PROMPT = (
    "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\n"
    "def add(a, b):\n    return a + b\n\n\ndef sub("
)
SAMPLE_PROMPTS = ("def ", "import os\n\n\nclass ", COPY_PROMPT)
COPIES = 0.85  # a copy rate from which the README says the model continues what it was shown


def samples(folder: Path, new: int = 160) -> list[tuple[str, str]]:
    """Greedy continuations of SAMPLE_PROMPTS by transformers' generate from the saved folder, in fp32."""
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    out = []
    for prompt in SAMPLE_PROMPTS:
        ids = torch.tensor([[BOS, *tok.encode(prompt, add_special_tokens=False).ids]])
        with torch.inference_mode():
            got = model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False, pad_token_id=PAD
            )
        out.append((prompt, tok.decode(got[0, ids.shape[1] :].tolist(), skip_special_tokens=False)))
    return out


README = """# {name}

A tiny byte-level LLaMA trained on the Python standard library's own source, in transformers' own
format (config.json, model.safetensors, tokenizer.json): {role}. Made by `{command}`, {seconds:.0f} s on
{threads} thread(s) of {machine}.

- Architecture: LlamaForCausalLM, hidden {hidden}, {layers} layers, {heads} heads of {head_dim},
  **{kv_heads} kv heads**, SwiGLU intermediate {intermediate}, RoPE theta 10000, untied head, {params:,}
  parameters, vocab 259 (the 256 bytes with id = byte value,
  then `<s>` 256, `</s>` 257, `<pad>` 258). Trained on windows of {context} bytes; max_position_embeddings
  says 2048, but positions past {context} are RoPE extrapolation, never seen in training.
- Weights stored in **float16** (half of float32's size, 3 more mantissa bits than bfloat16); load with
  `dtype=torch.float32` to run in fp32 (transformers' default `dtype="auto"` would give float16).
  model.safetensors sha256 `{sha}`.
- Data: python {python}'s standard library (sysconfig's "stdlib"), every `*.py` outside site-packages
  and the test suites, sorted: {train_files} files, {train_tokens:,} bytes (corpus sha256
  `{corpus}`); each file is `<s>` + its bytes + `</s>`. Another Python version has other files,
  hence other weights.
- Held out: {held} ({held_tokens:,} bytes).
- Training: {steps} steps of {batch} x {context} bytes (about {seen:,} bytes, a small part of one pass),
  AdamW lr {lr:g} with warm-up and cosine decay, seed {seed}, torch {torch},
  `torch.use_deterministic_algorithms(True)`, {threads} thread(s): bit-reproducible at a fixed thread
  count.{init}{repeats}
- Loss (nats per byte): training {train_loss:.3f} (mean of the last 50 steps); held out {held_fp32:.3f}
  in fp32 and {held_fp16:.3f} with the stored float16 weights, in windows of 256 bytes. A uniform guess
  is 5.55.{copy}

It is small and briefly trained (a 2-core machine's budget): it has learned the bytes' statistics
(spaces, letter runs, `self.`, ` = `, `_`), not Python, and free greedy decoding soon falls into a
loop.{copying} That is enough for what attnzoo uses it for (real, not random, weights: next-token
logits with a margin, so int8/int4 error means something; tokens to compare across runtimes; text
to speculate on); `--steps N` trains longer (other weights, another sha256). Greedy continuations
with transformers' `generate` from this folder, as written by the script:

{samples}
"""


def write_readme(folder: Path) -> None:
    facts = json.loads((folder / "training.json").read_text())
    config = json.loads((folder / "config.json").read_text())
    copying = ""
    if "copy_rate" in facts:
        copying = (
            " Shown text again, it continues it from its earlier lines (the copy rate above; the last sample"
            " below): what prompt lookup's candidates need (docs/generation.md)."
            if facts["copy_rate"] >= COPIES
            else f" Its copy rate is under {COPIES}: shown text again, it mostly does not continue it."
        )
    shown = "\n\n".join(f"```\n{p}{c}\n```\n(prompt: {p!r})" for p, c in samples(folder))
    text = README.format(
        name=folder.name,
        role=(
            "the checkpoint attnzoo ships to generate\nfrom and to state quantization error on"
            if folder.name == NAME or not folder.name.endswith("-draft")
            else f"a draft for speculative decoding of\n{NAME} (the same tokenizer, a fraction of its size: "
            "runtime/speculative.py)"
        ),
        machine=facts.get(
            "machine", "a 2-core AMD EPYC shared with five other jobs (load about 15; a few minutes quiet)"
        ),
        hidden=config["hidden_size"],
        layers=config["num_hidden_layers"],
        heads=config["num_attention_heads"],
        head_dim=config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"],
        kv_heads=config["num_key_value_heads"],
        intermediate=config["intermediate_size"],
        params=facts.get("parameters", 0),
        copying=copying,
        sha=facts["safetensors_sha256"],
        seconds=facts["train_seconds"],
        command=facts["command"],
        threads=facts["threads"],
        context=facts["context"],
        python=facts["python"],
        train_files=facts["train_files"],
        train_tokens=facts["train_tokens"],
        corpus=facts["corpus_sha256"],
        held=", ".join(facts["held_out_files"]),
        held_tokens=facts["held_out_tokens"],
        steps=facts["steps"],
        batch=facts["batch"],
        seen=facts["steps"] * facts["batch"] * facts["context"],
        seed=facts["seed"],
        torch=facts["torch"],
        train_loss=facts["train_loss_last50"],
        held_fp32=facts["held_out_loss_fp32"],
        held_fp16=facts["held_out_loss_stored_fp16"],
        lr=facts.get("lr", 3e-3),
        init=(
            "\n  Trained on from the checkpoint whose model.safetensors has sha256 "
            f"`{facts['init_safetensors_sha256']}`"
            f" (made by `{facts.get('init_command') or 'python scripts/train_lm.py --steps 800'}`)."
            if facts.get("init_safetensors_sha256")
            else ""
        ),
        repeats=(
            f"\n  {facts['repeats']:.0%} of the windows go back at a random point and repeat their own earlier text"
            " from there (what teaches the model to continue what it was just shown)."
            if facts.get("repeats")
            else ""
        )
        + (
            f"\n  {facts['synthetic']:.0%} of the windows are random printable bytes shown, then repeated (text only"
            " copying predicts)"
            + (f", spans of up to {facts['span']} bytes" if facts.get("span") else "")
            + (f", each of {facts['alphabet']} of the printable bytes" if facts.get("alphabet") else "")
            + "."
            if facts.get("synthetic")
            else ""
        ),
        copy=(
            f"\n- Copy rate {facts['copy_rate']:.3f} (`copy_rate`: 64 held-out spans of 96 bytes shown twice, the share"
            " of the second copy's bytes the greedy next byte gets right)."
            if "copy_rate" in facts
            else ""
        )
        + (
            f"\n- Copy run {facts['copy_run']:.3f} (`copy_run`: 16 held-out spans of 320 bytes, then their first 32"
            " again; the share of 64 greedy bytes, each after the model's own, that re-write the span before the first"
            " wrong one: how far prompt lookup's candidates run)."
            if "copy_run" in facts
            else ""
        ),
        samples=shown,
    )
    tmp = folder / ".README.md.tmp"
    tmp.write_text(text)
    os.replace(tmp, folder / "README.md")
