"""Sentence-encoder throughput, each path in its own process: python scripts/bench_encoder.py.

The model: a random BERT of all-MiniLM-L6-v2's shape (6 layers, hidden 384, 12 heads of 32, intermediate
1536, vocab 30522), saved as a sentence-transformers folder by its own classes (Transformer with
max_seq_length 256, mean Pooling, Normalize) with a WordPiece tokenizer whose words are w0, w1, ...: a
text of T - 2 such words is exactly T tokens ([CLS] ... [SEP]), so every batch has the stated length and
no padding. Random weights time exactly as trained ones.

The paths (bench/encoder_peers.py): attnzoo (zoo.sentence_encoder, export_encoder, EmbeddingSession under
ONNX Runtime), sentence-transformers (torch backend), transformers (AutoTokenizer + AutoModel + mean
pooling + normalize, as sentence-transformers computes them), and sentence-transformers' backend="onnx"
from another environment's python (--st-onnx-python: optimum-onnx needs transformers < 4.58). Each call is
what a user calls: texts in, float32 embeddings out, tokenizing included. Every path's first embedding is
checked against sentence-transformers' (max abs difference, in the JSON and the table's last column).
"""

from __future__ import annotations

import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from .encoder_peers import RESULT_MARK
from .jobs import BenchError
from .machine import default_threads
from .side_by_side import footer, machine, machine_line, spawn, stats

PATHS = ("attnzoo", "sentence-transformers", "transformers", "sentence-transformers-onnx")
REFERENCE = "sentence-transformers"
WORKER = Path(__file__).resolve().parent / "encoder_peers.py"
MINILM = dict(layers=6, hidden=384, heads=12, intermediate=1536, vocab=30522)
SMOKE = dict(layers=1, hidden=32, heads=4, intermediate=64, vocab=64)
MAX_SEQ_LENGTH = 256


def make_folder(folder: Path, shape: dict[str, int], seed: int = 0) -> Path:
    """A random BERT of `shape` as a sentence-transformers folder (mean pooling, Normalize)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    import transformers
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    words = special + [f"w{i}" for i in range(shape["vocab"] - len(special))]
    tok = Tokenizer(models.WordPiece({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.normalizer, tok.pre_tokenizer = normalizers.BertNormalizer(lowercase=True), pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=MAX_SEQ_LENGTH,
    )
    cfg = transformers.BertConfig(
        vocab_size=shape["vocab"],
        hidden_size=shape["hidden"],
        num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"],
        intermediate_size=shape["intermediate"],
        max_position_embeddings=512,
    )
    torch.manual_seed(seed)
    hf = folder.parent / f"{folder.name}-hf"
    transformers.BertModel(cfg).save_pretrained(hf)
    fast.save_pretrained(hf)
    t = Transformer(str(hf), max_seq_length=MAX_SEQ_LENGTH)
    modules = [t, Pooling(shape["hidden"], "mean"), Normalize()]
    SentenceTransformer(modules=modules, device="cpu").save(str(folder))
    return folder


def texts_of(t: int, count: int, vocab: int, seed: int = 0) -> list[str]:
    """`count` texts of exactly t tokens each: t - 2 words w0.. (one token each) between [CLS] and [SEP]."""
    rng = random.Random(seed * 1000 + t)
    return [" ".join(f"w{rng.randrange(vocab - 5)}" for _ in range(t - 2)) for _ in range(count)]


def benchmark_encoder(
    *,
    batches: list[int],
    lengths: list[int],
    threads: int | None = None,
    warmup: int = 2,
    repeats: int = 10,
    shape: dict[str, int] | None = None,
    st_onnx_python: str | None = None,
    paths: list[str] | None = None,
    timeout: float = 900.0,
    progress: bool = True,
) -> dict[str, Any]:
    """Every path over every (B, T), one process per path; the report (rows with median and spread)."""
    paths = list(paths or PATHS)
    if sorted(set(paths) - set(PATHS)):
        raise BenchError(f"unknown path(s) {sorted(set(paths) - set(PATHS))}; paths: {', '.join(PATHS)}")
    if not batches or not lengths or min(batches) < 1 or min(lengths) < 3 or repeats < 1 or warmup < 0:
        raise BenchError(f"batches {batches}, lengths {lengths} (>= 3), repeats {repeats} must be positive")
    shape = dict(shape or MINILM)
    if max(lengths) > MAX_SEQ_LENGTH:
        raise BenchError(f"lengths {lengths}: at most {MAX_SEQ_LENGTH} (the folder's max_seq_length)")
    threads = threads or default_threads()
    report: dict[str, Any] = {"kind": "encoder", **machine(), "threads": threads}
    shapes = [[b, t] for t in lengths for b in batches]
    texts = {str(t): texts_of(t, max(batches), shape["vocab"]) for t in lengths}
    rows, skipped, facts = [], [], {}
    with tempfile.TemporaryDirectory(prefix="attnzoo-bench-encoder-") as tmp:
        folder = make_folder(Path(tmp) / "st", shape)
        for path in paths:
            python = st_onnx_python if path == "sentence-transformers-onnx" else sys.executable
            if not python:
                skipped.append({"path": path, "why": "no --st-onnx-python given (optimum-onnx's environment)"})
                continue
            work = Path(tmp) / path
            work.mkdir()
            job = {
                "path": path,
                "folder": str(folder),
                "work": str(work),
                "shapes": shapes,
                "texts": texts,
                "threads": threads,
                "warmup": warmup,
                "repeats": repeats,
                "max_seq_length": MAX_SEQ_LENGTH,
            }
            started = time.perf_counter()
            result = spawn(python, WORKER, RESULT_MARK, job, timeout, threads)
            if progress:
                said = "ok" if result.get("ok") else result.get("error")
                print(f"{path}: {said} ({time.perf_counter() - started:.0f} s)", file=sys.stderr)
            if not result.get("ok"):
                skipped.append({"path": path, "why": result.get("error", "?")})
                continue
            facts[path] = {k: v for k, v in result.items() if k not in ("ok", "shapes")}
            for s in result["shapes"]:
                st = stats(s["seconds"])
                rows.append({"path": path, "b": s["b"], "t": s["t"], **st, "sentences_per_s": s["b"] / st["median"]})
                rows[-1]["first"] = s["first"]
    _agreement(rows)
    report.update(
        load_avg_end=list(os.getloadavg()),
        shape=shape,
        max_seq_length=MAX_SEQ_LENGTH,
        batches=batches,
        lengths=lengths,
        warmup=warmup,
        repeats=repeats,
        rows=rows,
        skipped=skipped,
        paths=facts,
    )
    return report


def _agreement(rows: list[dict[str, Any]]) -> None:
    """Each row's first embedding against the reference path's at the same (B, T): max abs difference."""
    ref = {(r["b"], r["t"]): r["first"] for r in rows if r["path"] == REFERENCE}
    for r in rows:
        if (r["b"], r["t"]) in ref:
            r["max_abs_diff"] = float(np.abs(np.asarray(r["first"]) - np.asarray(ref[(r["b"], r["t"])])).max())
        del r["first"]


def format_table(report: dict[str, Any], command: str) -> str:
    s = report["shape"]
    lines = [
        "# Sentence-encoder throughput (sentences/s), each path in its own process",
        "",
        f"Model: a random BERT of all-MiniLM-L6-v2's shape ({s['layers']} layers, hidden {s['hidden']}, "
        f"{s['heads']} heads, intermediate {s['intermediate']}, vocab {s['vocab']}), mean pooling + Normalize, "
        f"as a sentence-transformers folder. Every text is exactly T tokens (no padding); a call is `encode` "
        f"of one batch of B texts, tokenizing included. {report['warmup']} warm-up calls, then "
        f"{report['repeats']} timed; median ms per call, quartiles in brackets.",
        "",
        machine_line(report) + ".",
        "",
        "| T | B | path | sentences/s | ms per call (median) | [q1, q3] ms | vs sentence-transformers | max abs diff |",
        "|---:|---:|---|---:|---:|---|---:|---:|",
    ]
    ref = {(r["b"], r["t"]): r for r in report["rows"] if r["path"] == REFERENCE}
    for r in sorted(report["rows"], key=lambda r: (r["t"], r["b"], PATHS.index(r["path"]))):
        base = ref.get((r["b"], r["t"]))
        ratio = f"{base['median'] / r['median']:.2f}x" if base else ""
        diff = f"{r['max_abs_diff']:.1e}" if "max_abs_diff" in r else ""
        lines.append(
            f"| {r['t']} | {r['b']} | {r['path']} | {r['sentences_per_s']:.1f} | {r['median'] * 1e3:.1f} "
            f"| [{r['q1'] * 1e3:.1f}, {r['q3'] * 1e3:.1f}] | {ratio} | {diff} |"
        )
    for sk in report["skipped"]:
        lines.append(f"| | | {sk['path']} | skipped: {sk['why']} | | | | |")
    return "\n".join(lines + footer(report, command, "this environment: "))
