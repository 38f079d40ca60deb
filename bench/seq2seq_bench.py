"""Seq2seq greedy generation or beam search, tokens/s, each path in its own process: python
scripts/bench_seq2seq.py [--num-beams K].

The models: a random T5 of t5-small's shape (6 + 6 layers, d_model 512, 8 heads of 64, ReLU d_ff 2048,
vocab 32128, 32 relative buckets) and a random BART of the same size (6 + 6 layers, d_model 512, 8 heads,
GELU ffn 2048, vocab 32128), made by transformers from their configs and saved with save_pretrained.
Random weights time exactly as trained ones.

The paths (bench/seq2seq_peers.py): attnzoo (zoo.seq2seq_from_checkpoint, export_seq2seq: encoder and
decoder graphs, the decoder's static self-attention cache bound in place; Seq2SeqSession.generate under
ONNX Runtime) and transformers' `generate(num_beams=K, do_sample=False)` (SDPA, its default cache). The
same prompts (random ids, no padding), greedy (K = 1) or beam search, eos off on both, so each call makes
exactly `new` tokens per row; tokens/s = B x new / the median call. The tokens of the two paths are compared,
row by row.
"""

from __future__ import annotations

import os
import random
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from .jobs import BenchError
from .machine import default_threads
from .seq2seq_peers import RESULT_MARK
from .side_by_side import footer, machine, machine_line, spawn, stats

PATHS = ("attnzoo", "transformers")
WORKER = Path(__file__).resolve().parent / "seq2seq_peers.py"
MODELS = ("t5", "bart")
SHAPE = dict(layers=6, d_model=512, heads=8, d_ff=2048, vocab=32128)
SMOKE = dict(layers=1, d_model=32, heads=4, d_ff=64, vocab=64)


def make_checkpoint(folder: Path, family: str, shape: dict[str, int], seed: int = 0) -> Path:
    """A random `family` ("t5" or "bart") of `shape`, saved with save_pretrained."""
    import torch
    import transformers as tf

    n, d, h = shape["layers"], shape["d_model"], shape["heads"]
    if family == "t5":
        cfg = tf.T5Config(
            vocab_size=shape["vocab"],
            d_model=d,
            d_kv=d // h,
            d_ff=shape["d_ff"],
            num_layers=n,
            num_decoder_layers=n,
            num_heads=h,
            decoder_start_token_id=0,
        )
    elif family == "bart":
        cfg = tf.BartConfig(
            vocab_size=shape["vocab"],
            d_model=d,
            encoder_layers=n,
            decoder_layers=n,
            encoder_attention_heads=h,
            decoder_attention_heads=h,
            encoder_ffn_dim=shape["d_ff"],
            decoder_ffn_dim=shape["d_ff"],
            max_position_embeddings=max(128, shape["d_model"]),
            forced_bos_token_id=None,
            forced_eos_token_id=None,
        )
    else:
        raise BenchError(f"model {family!r}: one of {', '.join(MODELS)}")
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tf.AutoModelForSeq2SeqLM.from_config(cfg).save_pretrained(folder)
    return folder


def benchmark_seq2seq(
    *,
    models: list[str],
    batches: list[int],
    prompt: int = 32,
    new: int = 32,
    threads: int | None = None,
    warmup: int = 1,
    repeats: int = 3,
    shape: dict[str, int] | None = None,
    timeout: float = 900.0,
    progress: bool = True,
    num_beams: int = 1,
) -> dict[str, Any]:
    """Each (model, path) in its own process over every B; the report (rows with median and spread)."""
    if sorted(set(models) - set(MODELS)):
        raise BenchError(f"unknown model(s) {sorted(set(models) - set(MODELS))}; models: {', '.join(MODELS)}")
    if not batches or min(batches) < 1 or prompt < 1 or new < 1 or repeats < 1 or warmup < 0:
        raise BenchError(f"batches {batches}, --prompt {prompt}, --new {new}, repeats {repeats} must be positive")
    shape = dict(shape or SHAPE)
    threads = threads or default_threads()
    report: dict[str, Any] = {"kind": "seq2seq", **machine(), "threads": threads}
    rng = random.Random(0)
    prompts = [[rng.randrange(4, shape["vocab"]) for _ in range(prompt)] for _ in range(max(batches))]
    rows, skipped, facts = [], [], {}
    with tempfile.TemporaryDirectory(prefix="attnzoo-bench-seq2seq-") as tmp:
        for family in models:
            folder = make_checkpoint(Path(tmp) / family, family, shape)
            for path in PATHS:
                work = Path(tmp) / f"{family}-{path}"
                work.mkdir()
                job = dict(path=path, checkpoint=str(folder), work=str(work), prompts=prompts, batches=batches)
                job.update(new=new, threads=threads, warmup=warmup, repeats=repeats, num_beams=num_beams)
                started = time.perf_counter()
                result = spawn(sys.executable, WORKER, RESULT_MARK, job, timeout, threads)
                if progress:
                    said = "ok" if result.get("ok") else result.get("error")
                    print(f"{family} {path}: {said} ({time.perf_counter() - started:.0f} s)", file=sys.stderr)
                if not result.get("ok"):
                    skipped.append({"model": family, "path": path, "why": result.get("error", "?")})
                    continue
                facts[f"{family} {path}"] = {k: v for k, v in result.items() if k not in ("ok", "rows")}
                for r in result["rows"]:
                    st = stats(r["seconds"])
                    tps = r["b"] * new / st["median"]
                    rows.append({"model": family, "path": path, "b": r["b"], **st, "tokens_per_s": tps, **r})
    _agreement(rows)
    report.update(
        load_avg_end=list(os.getloadavg()),
        shape=shape,
        prompt=prompt,
        new=new,
        batches=batches,
        warmup=warmup,
        repeats=repeats,
        num_beams=num_beams,
    )
    report.update(rows=rows, skipped=skipped, paths=facts, prompts=prompts)
    return report


def _agreement(rows: list[dict[str, Any]]) -> None:
    """Each attnzoo row's tokens against transformers' at the same (model, B): rows equal, tokens equal."""
    ref = {(r["model"], r["b"]): r["tokens"] for r in rows if r["path"] == "transformers"}
    for r in rows:
        other = ref.get((r["model"], r["b"]))
        if other is None:
            continue
        r["rows_equal"] = sum(a == b for a, b in zip(r["tokens"], other))
        r["tokens_equal"] = sum(x == y for a, b in zip(r["tokens"], other) for x, y in zip(a, b))
        r["tokens_total"] = sum(len(a) for a in other)


def format_table(report: dict[str, Any], command: str) -> str:
    s = report["shape"]
    k = report.get("num_beams", 1)
    how = "greedy" if k == 1 else f"beam search, {k} beams (each row's best hypothesis)"
    lines = [
        f"# Seq2seq {'greedy generation' if k == 1 else f'beam search ({k} beams)'} (tokens/s), each path in its "
        "own process",
        "",
        f"Models: a random T5 (t5-small's shape: {s['layers']} + {s['layers']} layers, d_model {s['d_model']}, "
        f"{s['heads']} heads, ReLU d_ff {s['d_ff']}, vocab {s['vocab']}) and a random BART of the same size "
        f"(GELU ffn {s['d_ff']}). Prompt {report['prompt']} tokens (random ids, no padding), {report['new']} new "
        f"tokens per row, {how}, eos off; tokens/s = B x {report['new']} / the median call, the call being "
        f"the whole generate (encoder, then every step). {report['warmup']} warm-up call(s), then "
        f"{report['repeats']} timed; quartiles in brackets.",
        "",
        machine_line(report) + ".",
        "",
        "| model | B | path | tokens/s | ms per call (median) | [q1, q3] ms | vs transformers | tokens equal |",
        "|---|---:|---|---:|---:|---|---:|---|",
    ]
    ref = {(r["model"], r["b"]): r for r in report["rows"] if r["path"] == "transformers"}
    for r in report["rows"]:
        base = ref.get((r["model"], r["b"]))
        ratio = f"{base['median'] / r['median']:.2f}x" if base else ""
        agree = f"{r['tokens_equal']} of {r['tokens_total']}" if "tokens_equal" in r else ""
        lines.append(
            f"| {r['model']} | {r['b']} | {r['path']} | {r['tokens_per_s']:.1f} | {r['median'] * 1e3:.1f} "
            f"| [{r['q1'] * 1e3:.1f}, {r['q3'] * 1e3:.1f}] | {ratio} | {agree} |"
        )
    for sk in report["skipped"]:
        lines.append(f"| {sk['model']} | | {sk['path']} | skipped: {sk['why']} | | | | |")
    return "\n".join(lines + footer(report, command))
