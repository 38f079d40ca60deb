"""Train the shipped tiny LLaMA on the Python standard library's own source: python scripts/train_lm.py.

What it makes (models/tiny-stdlib-llama/, transformers' own format, a few MB):
- a byte-level LLaMA: vocab 259 = the 256 bytes (id = byte value) + BOS 256, EOS 257, PAD 258;
  hidden 256, 4 layers, 4 heads of 64, 2 kv heads (GQA), SwiGLU intermediate 688, RoPE theta 10000,
  untied head; trained on windows of CONTEXT bytes;
- config.json, model.safetensors (weights stored in float16: half the size of float32, and 3 more
  mantissa bits than bfloat16; the losses in the README are measured with the stored weights),
  generation_config.json (greedy), tokenizer.json (bench.checkpoints.byte_tokenizer: the `tokenizers`
  library's byte-level BPE with no merges; any text round-trips, one token per UTF-8 byte) and
  tokenizer_config.json.

The data: every `*.py` under the running interpreter's standard library (sysconfig's "stdlib"),
sorted, without site-packages and the test suites; each file is BOS + its bytes + EOS. HELD_OUT
names the files kept for evaluation. The corpus's sha256 is printed and written to the README:
another Python version has other files, hence other weights.

Bit-reproducible: seeds fixed, torch.use_deterministic_algorithms(True), THREADS intra-op threads
(the result depends on the thread count, not on the machine's load). Check: run twice and compare
the sha256 of model.safetensors.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import sys
import sysconfig
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.checkpoints import BOS, EOS, PAD, save_tokenizer  # noqa: E402  (the tokenizer the bench uses too)
from scripts.train_lm_readme import COPIES, COPY_PROMPT, write_readme  # noqa: E402,F401  (the folder's README)

NAME = "tiny-stdlib-llama"
SEED = 1234
THREADS = 1  # bit-reproducible at any fixed count (--threads); 1 because 2 threads are slower than 1 on a shared box
VOCAB = 259  # the 256 bytes, then BOS, EOS, PAD
CONTEXT = 256
BATCH = 8
STEPS = 120
LR = 3e-3
WARMUP = 20
REPEATS = 0.0  # the fraction of windows that go back and repeat an earlier span of themselves (--repeats)
SYNTHETIC = 0.0  # the fraction of windows of random printable bytes shown, then repeated (--synthetic)
PRINTABLE = [9, 10, *range(32, 127)]  # a synthetic window's bytes
ALPHABET = 0  # a synthetic window's bytes from this many of PRINTABLE, drawn per window (0: all) (--alphabet)
SPAN = 0  # the longest synthetic span (0: CONTEXT // 4) (--span)
COPY_SPAN = 96  # copy_rate: bytes of held-out text shown, then shown again
RUN_SPAN = 320  # copy_run: bytes of held-out text shown, then re-written from its start
EXCLUDED_DIRS = {"site-packages", "test", "tests", "idle_test"}
# Held out for evaluation: small, long-lived modules every CPython 3.x has.
HELD_OUT = ("bisect.py", "colorsys.py", "fractions.py", "heapq.py", "shlex.py", "textwrap.py")
SHAPE = dict(
    hidden_size=256,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=688,
    max_position_embeddings=2048,
    rope_theta=10000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
)
# --hidden/--layers/--heads/--kv-heads/--intermediate: another shape of the same tokenizer (a draft for speculative
# decoding: runtime/speculative.py), the flag and the SHAPE key it sets
SHAPE_FLAGS = {
    "hidden": "hidden_size",
    "layers": "num_hidden_layers",
    "heads": "num_attention_heads",
    "kv_heads": "num_key_value_heads",
    "intermediate": "intermediate_size",
}


def stdlib_root() -> Path:
    """The standard library folder of the running interpreter."""
    return Path(sysconfig.get_paths()["stdlib"])


def corpus_files(root: Path) -> list[Path]:
    """Every .py file under root, sorted by relative path, outside EXCLUDED_DIRS."""
    found = [p for p in root.rglob("*.py") if p.is_file() and not (set(p.relative_to(root).parts[:-1]) & EXCLUDED_DIRS)]
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def split_files(files: list[Path], root: Path) -> tuple[list[Path], list[Path]]:
    """(train, held out): the held-out files are the top-level modules named in HELD_OUT."""
    held = [p for p in files if p.relative_to(root).as_posix() in HELD_OUT]
    missing = sorted(set(HELD_OUT) - {p.name for p in held})
    if missing:
        sys.exit(f"train_lm: the standard library at {root} lacks the held-out files {missing}")
    return [p for p in files if p not in held], held


def encode_files(files: list[Path]) -> list[int]:
    """BOS + bytes + EOS for each file, concatenated: the token ids are the byte values."""
    ids: list[int] = []
    for p in files:
        ids += [BOS, *p.read_bytes(), EOS]
    return ids


def corpus_sha256(files: list[Path], root: Path) -> str:
    """One digest over the relative paths and bytes of the files, in order."""
    h = hashlib.sha256()
    for p in files:
        data = p.read_bytes()
        h.update(f"{p.relative_to(root).as_posix()}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def build_model(seed: int = SEED, init: Path | None = None):
    """A fresh model of SHAPE from seed, or (init) the checkpoint folder's weights in fp32 to train on from."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    if init is not None:
        return LlamaForCausalLM.from_pretrained(init, dtype=torch.float32)
    config = LlamaConfig(vocab_size=VOCAB, bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD, **SHAPE)
    return LlamaForCausalLM(config)


def synthetic_window(gen):
    """CONTEXT + 1 ids: a span of 16 to SPAN (CONTEXT / 4) random printable bytes, then that span again and again:
    text no prior predicts, so only copying lowers its loss (what makes a model continue text it was just shown).
    With ALPHABET, the span's bytes come from that many printable ones: a byte, or two, recur in the span, so
    finding where to copy from takes the several bytes before it (as in text)."""
    import torch

    m = int(torch.randint(16, (SPAN or CONTEXT // 4) + 1, (1,), generator=gen))
    pool = torch.tensor(PRINTABLE)
    if ALPHABET:
        pool = pool[torch.randperm(len(PRINTABLE), generator=gen)[:ALPHABET]]
    span = pool[torch.randint(0, len(pool), (m,), generator=gen)]
    return span.repeat(CONTEXT // m + 2)[: CONTEXT + 1]


def window(data, start: int, repeat: bool, gen):
    """CONTEXT + 1 ids from start; with repeat, the text goes back at a random point k to an earlier
    point u and repeats from there (text, then a copy of its own earlier lines that runs on): the
    windows that teach the model to continue what it was just shown."""
    import torch

    text = data[start : start + CONTEXT + 1]
    if not repeat:
        return text
    k = int(torch.randint(CONTEXT // 4, 3 * CONTEXT // 4, (1,), generator=gen))
    u = int(torch.randint(0, k - 16, (1,), generator=gen))
    return torch.cat([text[:k], text[u : u + CONTEXT + 1 - k]])


def copy_rate(model, ids, span: int = COPY_SPAN, count: int = 64) -> float:
    """How often the model continues text it was just shown: over `count` held-out spans S of `span`
    bytes (evenly spaced), the input S + S, the fraction of the second copy's bytes (after its first)
    that the greedy next byte (argmax, teacher-forced) gets right."""
    import torch

    data = torch.tensor(ids, dtype=torch.long)
    starts = torch.linspace(0, len(data) - span - 1, count).long().tolist()
    rows = torch.stack([torch.cat([data[s : s + span], data[s : s + span]]) for s in starts])
    model.eval()
    hits = 0
    with torch.no_grad():
        for i in range(0, count, 8):
            x = rows[i : i + 8]
            guess = model(input_ids=x).logits.argmax(-1)
            hits += (guess[:, span : 2 * span - 1] == x[:, span + 1 :]).sum().item()
    return hits / (count * (span - 1))


def copy_run(model, ids, span: int = RUN_SPAN, cue: int = 32, new: int = 64, count: int = 16) -> float:
    """How far the model re-writes text it was shown, running free (what prompt lookup's candidates need): over
    `count` held-out spans S of `span` bytes (evenly spaced), the input S then S's first `cue` bytes again, the
    mean fraction of `new` greedy bytes (each after the model's own) equal to S's next bytes before the first
    wrong one."""
    import torch

    data = torch.tensor(ids, dtype=torch.long)
    starts = torch.linspace(0, len(data) - span - 1, count).long().tolist()
    model.eval()
    kept = 0
    with torch.no_grad():
        for s in starts:
            text = data[s : s + span]
            x = torch.cat([text, text[:cue]])[None]
            out = model.generate(x, max_new_tokens=new, do_sample=False, pad_token_id=PAD)[0, x.shape[1] :]
            wrong = (out != text[cue : cue + len(out)]).nonzero()  # an eos ends it early: the rest is not kept
            kept += int(wrong[0, 0]) if len(wrong) else len(out)
    return kept / (count * new)


def loss_on(model, ids, context: int = 256) -> float:
    """Mean next-byte cross-entropy (nats) over ids cut into consecutive windows of context + 1."""
    import torch

    data = torch.tensor(ids, dtype=torch.long)
    n = (len(data) - 1) // context
    total, count = 0.0, 0
    model.eval()
    with torch.no_grad():
        for i in range(0, n, 8):
            rows = [data[j * context : j * context + context + 1] for j in range(i, min(n, i + 8))]
            x = torch.stack(rows)
            logits = model(input_ids=x[:, :-1]).logits
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), x[:, 1:].reshape(-1), reduction="sum")
            total, count = total + loss.item(), count + x[:, 1:].numel()
    return total / count


def train(train_ids: list[int], steps: int, log, seed: int = SEED, init: Path | None = None):
    """(model, mean loss of the last 50 steps); autograd on whatever the caller's grad mode."""
    import torch

    with torch.enable_grad():
        return _train(train_ids, steps, log, seed, init)


def _train(train_ids: list[int], steps: int, log, seed: int, init: Path | None):
    import torch

    model = build_model(seed, init)
    data = torch.tensor(train_ids, dtype=torch.long)
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.95), weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / WARMUP) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))
    )
    model.train()
    t0, losses = time.time(), []
    for step in range(1, steps + 1):
        starts = torch.randint(0, len(data) - CONTEXT - 1, (BATCH,), generator=gen)
        draw = torch.rand(BATCH, generator=gen)
        repeat, synthetic = (draw < REPEATS).tolist(), (draw >= 1 - SYNTHETIC).tolist()
        x = torch.stack(
            [
                synthetic_window(gen) if f else window(data, s, r, gen)
                for s, r, f in zip(starts.tolist(), repeat, synthetic)
            ]
        )
        logits = model(input_ids=x[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if step % 10 == 0 or step == steps:
            recent = sum(losses[-10:]) / len(losses[-10:])
            log(f"step {step}/{steps} loss {recent:.4f} ({time.time() - t0:.0f} s)")
    return model, sum(losses[-50:]) / len(losses[-50:])


def write_folder(model, out: Path, facts: dict) -> str:
    """Write the folder whole (a temp folder renamed into place); returns the safetensors sha256."""
    import torch
    from transformers import GenerationConfig

    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.to(torch.float16)
    model.config.dtype = "float16"
    model.save_pretrained(tmp, safe_serialization=True)
    GenerationConfig(bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD, do_sample=False).save_pretrained(tmp)
    save_tokenizer(tmp, VOCAB, CONTEXT)
    digest = hashlib.sha256((tmp / "model.safetensors").read_bytes()).hexdigest()
    (tmp / "training.json").write_text(json.dumps({**facts, "safetensors_sha256": digest}, indent=2) + "\n")
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return digest


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=STEPS)
    p.add_argument("--seed", type=int, default=SEED)
    p.add_argument("-o", "--output", default=str(REPO / "models" / NAME))
    p.add_argument("--context", type=int, default=CONTEXT, help="window length in bytes (positions trained)")
    p.add_argument("--batch", type=int, default=BATCH, help="windows per step")
    p.add_argument("--repeats", type=float, default=REPEATS, help="fraction of windows that repeat their own text")
    p.add_argument(
        "--synthetic", type=float, default=SYNTHETIC, help="fraction of windows of random printable bytes, repeated"
    )
    p.add_argument("--alphabet", type=int, default=ALPHABET, help="synthetic bytes from this many printable (0: all)")
    p.add_argument("--span", type=int, default=SPAN, help="longest synthetic span in bytes (0: a quarter of --context)")
    p.add_argument("--lr", type=float, default=LR, help="peak learning rate")
    p.add_argument("--init", help="a checkpoint folder of the same shape to train on from (instead of fresh weights)")
    p.add_argument("--threads", type=int, default=THREADS, help="torch intra-op threads (the weights depend on it)")
    for flag, key in SHAPE_FLAGS.items():
        p.add_argument(f"--{flag.replace('_', '-')}", type=int, default=SHAPE[key], help=f"{key} (default %(default)s)")
    p.add_argument("--readme-only", action="store_true", help="rewrite README.md of an existing output folder")
    p.add_argument(
        "--evaluate", metavar="FOLDER", help="print FOLDER's held-out loss, copy rate and copy run, train nothing"
    )
    args = p.parse_args(argv)
    if args.readme_only:
        write_readme(Path(args.output))
        return 0
    shape = {**SHAPE, **{key: getattr(args, flag) for flag, key in SHAPE_FLAGS.items()}}
    if (
        shape["hidden_size"] % shape["num_attention_heads"]
        or shape["num_attention_heads"] % shape["num_key_value_heads"]
    ):
        p.error("--hidden must divide by --heads, and --heads by --kv-heads")
    if args.init and shape != SHAPE:
        p.error("--init trains on from a folder of its own shape: give no shape flag with it")
    if args.repeats + args.synthetic > 1:
        p.error(f"--repeats {args.repeats} and --synthetic {args.synthetic} add up past 1 (fractions of the windows)")
    globals().update(CONTEXT=args.context, BATCH=args.batch, REPEATS=args.repeats, LR=args.lr, SYNTHETIC=args.synthetic)
    if (
        not 0 <= args.alphabet <= len(PRINTABLE)
        or args.alphabet == 1
        or not (args.span == 0 or 16 <= args.span <= args.context)
    ):
        p.error(
            f"--alphabet is 0 or 2 to {len(PRINTABLE)}, --span 0 or 16 to --context: got {args.alphabet}, {args.span}"
        )
    globals().update(SHAPE=shape, THREADS=args.threads, ALPHABET=args.alphabet, SPAN=args.span)

    import torch

    torch.set_num_threads(THREADS)
    torch.use_deterministic_algorithms(True)
    if args.evaluate:
        return evaluate(Path(args.evaluate))

    def log(line: str) -> None:
        print(line, flush=True)

    root = stdlib_root()
    files = corpus_files(root)
    train_files, held = split_files(files, root)
    train_ids, held_ids = encode_files(train_files), encode_files(held)
    corpus = corpus_sha256(train_files, root)
    log(
        f"python {sys.version.split()[0]}, stdlib {root}: {len(train_files)} training files ({len(train_ids)} tokens, "
        f"sha256 {corpus[:16]}), held out {[p.name for p in held]} ({len(held_ids)} tokens)"
    )
    log(f"torch {torch.__version__}, {THREADS} thread(s), seed {args.seed}, {args.steps} steps of {BATCH}x{CONTEXT}")
    load_before = os.getloadavg()[0]
    t0 = time.time()
    init = Path(args.init) if args.init else None
    model, train_loss = train(train_ids, args.steps, log, args.seed, init)
    seconds = time.time() - t0
    held_fp32 = loss_on(model, held_ids)
    model.to(torch.float16).to(torch.float32)  # the stored weights, evaluated in fp32
    held_loss = loss_on(model, held_ids)
    held_long = loss_on(model, held_ids, CONTEXT)
    copies, run = copy_rate(model, held_ids), copy_run(model, held_ids)
    flags = {"--steps": (args.steps, STEPS), "--seed": (args.seed, SEED), "--context": (args.context, 256)}
    flags |= {"--batch": (args.batch, 8), "--repeats": (args.repeats, 0.0), "--lr": (args.lr, 3e-3)}
    flags |= {"--threads": (args.threads, 1), "--synthetic": (args.synthetic, 0.0)}
    flags |= {"--alphabet": (args.alphabet, 0), "--span": (args.span, 0)}
    flags |= {f"--{f.replace('_', '-')}": (getattr(args, f), p.get_default(f)) for f in SHAPE_FLAGS}
    facts = {
        "command": "python scripts/train_lm.py"
        + "".join(f" {k} {v}" for k, (v, default) in flags.items() if v != default)
        + (f" --init {init.as_posix()}" if init else ""),
        "init_safetensors_sha256": init and hashlib.sha256((init / "model.safetensors").read_bytes()).hexdigest(),
        "init_command": init and init_command(init),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "machine": machine(load_before),
        "parameters": sum(t.numel() for t in model.parameters()),
        "threads": THREADS,
        "seed": args.seed,
        "steps": args.steps,
        "batch": BATCH,
        "context": CONTEXT,
        "train_files": len(train_files),
        "train_tokens": len(train_ids),
        "corpus_sha256": corpus,
        "held_out_files": [p.name for p in held],
        "held_out_tokens": len(held_ids),
        "train_loss_last50": round(train_loss, 4),
        "held_out_loss_fp32": round(held_fp32, 4),
        "held_out_loss_stored_fp16": round(held_loss, 4),
        f"held_out_loss_stored_fp16_at_{CONTEXT}": round(held_long, 4),
        "copy_rate": round(copies, 4),
        "copy_run": round(run, 4),
        "repeats": REPEATS,
        "synthetic": SYNTHETIC,
        "alphabet": ALPHABET,
        "span": SPAN,
        "lr": LR,
        "train_seconds": round(seconds, 1),
    }
    digest = write_folder(model, Path(args.output), facts)
    write_readme(Path(args.output))
    log(
        f"train loss {train_loss:.4f}, held-out loss {held_fp32:.4f} (fp32) / {held_loss:.4f} (stored fp16) "
        f"nats/byte, {held_long:.4f} in windows of {CONTEXT}; copy rate {copies:.3f}, copy run {run:.3f}; "
        f"{seconds:.0f} s; wrote {args.output}; model.safetensors sha256 {digest}"
    )
    return 0


def init_command(init: Path) -> str:
    """The command that made the folder trained on from (its training.json), then ` <- ` the one before it, when it
    was trained on from another too (the chain, newest first)."""
    record = json.loads((init / "training.json").read_text()) if (init / "training.json").exists() else {}
    command = record.get("command", "unknown")
    return f"{command} <- {record['init_command']}" if record.get("init_command") else command


def machine(load_before: float) -> str:
    """The CPU and the load it trained under, for the README: 'a 2-core AMD EPYC (AVX-512), load 1.0 -> 2.1'."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "CPU")
    avx = "AVX-512" if " avx512f" in info else "no AVX-512"
    load = f"load average {load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at the end"
    return f"a {os.cpu_count()}-core {name} ({avx}), {load}"


def evaluate(folder: Path) -> int:
    """Held-out loss (windows of 256 and of CONTEXT), copy rate and copy run of a saved folder, in fp32."""
    import torch
    from transformers import AutoModelForCausalLM

    root = stdlib_root()
    _, held = split_files(corpus_files(root), root)
    held_ids = encode_files(held)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    facts = {
        "folder": str(folder),
        "held_out_loss_at_256": round(loss_on(model, held_ids, 256), 4),
        f"held_out_loss_at_{CONTEXT}": round(loss_on(model, held_ids, CONTEXT), 4),
        "copy_rate": round(copy_rate(model, held_ids), 4),
        "copy_run": round(copy_run(model, held_ids), 4),
    }
    print(json.dumps(facts), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
