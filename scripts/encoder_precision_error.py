#!/usr/bin/env python3
"""The error of int8 and int4 sentence-encoder exports against fp32, on an encoder trained here
(docs/embeddings.md's precision table): python scripts/encoder_precision_error.py [--json PATH].

Random weights quantize meaninglessly, so a small BERT is trained first, in a few minutes on 2 cores:
- the text: the Python standard library's own .py files (scripts/train_lm.py's corpus: sorted, without
  site-packages and the test suites); train_lm.HELD_OUT's six modules are held out, never trained on;
- a WordPiece tokenizer (the `tokenizers` library's trainer, vocab 4096, cased) trained on the training files;
- a BERT (4 layers, hidden 256, 4 heads, intermediate 1024) trained with masked-LM (15% of tokens: 80%
  [MASK], 10% random, 10% kept; the loss on those only) on random 64-token windows, batch 16, AdamW,
  --steps steps (150), learning rate 1e-3;
- wrapped as a sentence-transformers folder by its own classes (max_seq_length 128, mean pooling, Normalize).

Then export_encoder writes it at fp32, int8 and int4 (MatMulNBits, block 32: export/precision.py), and
EmbeddingSession embeds the held-out texts (the held-out files cut into --texts snippets of a few lines)
with each. Reported per precision: cos(fp32, q) over the held-out texts (mean, min, and the 1st percentile),
and the top-1 neighbour agreement (for each text, is its nearest other text under q the one under fp32).
For scale, the mean cosine between two different texts' fp32 embeddings; and as a check, the fp32
graph's max difference from sentence-transformers' own encode. Prints a Markdown table, --json writes
the figures. Seeds fixed; the figures depend on the thread count and the Python version's stdlib.
`--smoke`: a 1-layer hidden-32 model, 3 steps, 16 texts (seconds of training; the tests run it).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from train_lm import HELD_OUT, corpus_files, split_files, stdlib_root  # noqa: E402  (the same corpus and split)

SEED = 0
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
FULL = dict(vocab=4096, hidden=256, layers=4, heads=4, intermediate=1024, window=64, batch=16, steps=150, texts=256)
SMOKE = dict(vocab=256, hidden=32, layers=1, heads=4, intermediate=64, window=16, batch=4, steps=3, texts=16)
MAX_SEQ_LENGTH = 128
PRECISIONS = ("int8", "int4")
COLUMNS = ("precision", "mean cos", "min cos", "1st pct cos", "top-1 neighbour agreement")


def train_tokenizer(files: list[Path], vocab: int):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=False)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train([str(f) for f in files], trainers.WordPieceTrainer(vocab_size=vocab, special_tokens=SPECIAL))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    return tok


def train_mlm(tok, files: list[Path], shape: dict, threads: int, log) -> tuple[object, list[float]]:
    """A BertForMaskedLM trained on random windows of the training files; (its bert, the losses)."""
    import torch
    import transformers

    torch.manual_seed(SEED)
    torch.set_num_threads(threads)
    ids = []
    for enc in tok.encode_batch([f.read_text(errors="replace") for f in files], add_special_tokens=False):
        ids.extend(enc.ids)
    stream = torch.tensor(ids)
    cfg = transformers.BertConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=shape["hidden"],
        num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"],
        intermediate_size=shape["intermediate"],
        max_position_embeddings=512,
    )
    model = transformers.BertForMaskedLM(cfg).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    steps, w, b = shape["steps"], shape["window"], shape["batch"]
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 30) * max(0.05, 1 - s / steps))
    g = torch.Generator().manual_seed(SEED)
    cls, sep, mask_id = (tok.token_to_id(t) for t in ("[CLS]", "[SEP]", "[MASK]"))
    losses, started = [], time.perf_counter()
    for step in range(steps):
        starts = torch.randint(0, len(stream) - w + 2, (b,), generator=g)
        body = torch.stack([stream[s : s + w - 2] for s in starts])
        x = torch.cat([torch.full((b, 1), cls), body, torch.full((b, 1), sep)], 1)
        labels = x.clone()
        pick = torch.rand(x.shape, generator=g) < 0.15
        pick[:, 0] = pick[:, -1] = False
        labels[~pick] = -100
        roll = torch.rand(x.shape, generator=g)
        x = torch.where(pick & (roll < 0.8), mask_id, x)
        x = torch.where(
            pick & (roll >= 0.8) & (roll < 0.9), torch.randint(len(SPECIAL), cfg.vocab_size, x.shape, generator=g), x
        )
        h = model.bert(input_ids=x).last_hidden_state[pick]  # the head only where a token is to be predicted
        loss = torch.nn.functional.cross_entropy(model.cls(h), labels[pick])
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if step % 25 == 0 or step == steps - 1:
            log(f"step {step}: masked-LM loss {loss:.3f} ({time.perf_counter() - started:.0f} s)")
    return model.bert.eval(), losses


def sentence_folder(bert, tok, folder: Path) -> Path:
    """The trained encoder as a sentence-transformers folder (mean pooling, Normalize), by its own classes."""
    import transformers
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    hf = folder.parent / f"{folder.name}-hf"
    bert.save_pretrained(hf)
    special = dict(unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]", mask_token="[MASK]")
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, **special).save_pretrained(hf)
    t = Transformer(str(hf), max_seq_length=MAX_SEQ_LENGTH)
    SentenceTransformer(modules=[t, Pooling(bert.config.hidden_size, "mean"), Normalize()], device="cpu").save(
        str(folder)
    )
    return folder


def held_out_texts(files: list[Path], count: int) -> list[str]:
    """`count` snippets of 2 to 8 consecutive non-blank lines from the held-out files, spread evenly."""
    lines = [ln.strip() for f in files for ln in f.read_text().splitlines() if ln.strip()]
    rng = random.Random(SEED)
    step = max(len(lines) // count, 1)
    return [" ".join(lines[i * step : i * step + rng.randint(2, 8)]) for i in range(count)]


def compare(ref: np.ndarray, got: np.ndarray) -> dict[str, float]:
    """Cosine of each row of got to the same row of ref (mean, min, 1st percentile), and the share of rows
    whose nearest other row (by cosine) is the same under got as under ref."""

    def unit(a):
        return a / np.linalg.norm(a, axis=1, keepdims=True)

    r, g = unit(ref.astype(np.float64)), unit(got.astype(np.float64))
    cos = (r * g).sum(1)
    sim_r, sim_g = r @ r.T, g @ g.T
    np.fill_diagonal(sim_r, -np.inf)
    np.fill_diagonal(sim_g, -np.inf)
    agree = float((sim_r.argmax(1) == sim_g.argmax(1)).mean())
    return {
        "mean_cos": float(cos.mean()),
        "min_cos": float(cos.min()),
        "p1_cos": float(np.percentile(cos, 1)),
        "top1_agreement": agree,
    }


def format_table(report: dict) -> str:
    s = report["shape"]
    lines = [
        f"Trained here: BERT {s['layers']} layers, hidden {s['hidden']}, {s['heads']} heads, vocab {report['vocab']}, "
        f"masked-LM {s['steps']} steps (loss {report['loss_first']:.2f} -> {report['loss_last']:.2f}); "
        f"{report['texts']} held-out snippets ({', '.join(report['held_out'])}).",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|---|---:|---:|---:|---:|",
    ]
    for p in PRECISIONS:
        r = report["precisions"][p]
        lines.append(
            f"| {p} | {r['mean_cos']:.6f} | {r['min_cos']:.6f} | {r['p1_cos']:.6f} | {r['top1_agreement'] * 100:.1f}% |"
        )
    lines += [
        "",
        f"Scale: two different held-out texts' fp32 embeddings have mean cosine {report['fp32_mean_pair_cos']:.3f}. "
        "Check: the fp32 graph against sentence-transformers' encode, max abs difference "
        f"{report['fp32_vs_st_max_abs']:.1e}.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, help=f"masked-LM steps (default {FULL['steps']})")
    p.add_argument("--texts", type=int, help=f"held-out snippets (default {FULL['texts']})")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", metavar="PATH", help="write the figures as JSON")
    p.add_argument("--keep", metavar="DIR", help="keep the trained sentence-transformers folder here")
    p.add_argument("--smoke", action="store_true", help="a tiny model, 3 steps, 16 texts (the tests)")
    args = p.parse_args(argv)
    shape = dict(SMOKE if args.smoke else FULL)
    shape.update({k: v for k, v in (("steps", args.steps), ("texts", args.texts)) if v is not None})

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    from sentence_transformers import SentenceTransformer

    import zoo
    from export.encoder_export import export_encoder
    from runtime.embedding import EmbeddingSession

    root = stdlib_root()
    train_files, held_files = split_files(corpus_files(root), root)
    if args.smoke:
        train_files = train_files[:20]
    tok = train_tokenizer(train_files, shape["vocab"])
    bert, losses = train_mlm(tok, train_files, shape, args.threads, log)
    texts = held_out_texts(held_files, shape["texts"])
    with tempfile.TemporaryDirectory(prefix="attnzoo-encoder-precision-") as tmp:
        folder = sentence_folder(bert, tok, Path(args.keep or tmp) / "stdlib-bert")
        model = zoo.sentence_encoder(folder)
        embedded = {}
        for precision in ("fp32", *PRECISIONS):
            path = Path(tmp) / f"{precision}.onnx"
            export_encoder(model, path, precision=precision)
            sess = EmbeddingSession(path, "cpu", tokenizer=folder / "tokenizer.json", threads=args.threads)
            embedded[precision] = sess.encode(texts, batch_size=32)
            log(f"{precision}: exported and embedded {len(texts)} texts")
        st = SentenceTransformer(str(folder), device="cpu").encode(texts, batch_size=32)
    fp32 = embedded["fp32"] / np.linalg.norm(embedded["fp32"], axis=1, keepdims=True)
    pairs = fp32 @ fp32.T
    report = {
        "shape": shape,
        "vocab": tok.get_vocab_size(),
        "loss_first": losses[0],
        "loss_last": float(np.mean(losses[-10:])),
        "texts": len(texts),
        "held_out": list(HELD_OUT),
        "precisions": {p: compare(embedded["fp32"], embedded[p]) for p in PRECISIONS},
        "fp32_mean_pair_cos": float((pairs.sum() - np.trace(pairs)) / (len(texts) * (len(texts) - 1))),
        "fp32_vs_st_max_abs": float(np.abs(embedded["fp32"] - st).max()),
        "threads": args.threads,
        "python": sys.version.split()[0],
    }
    print(format_table(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0 if all(math.isfinite(r["mean_cos"]) for r in report["precisions"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
