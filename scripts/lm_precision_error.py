"""The error of int8 and int4 whole-model exports against fp32 (docs/generation.md's precision table).

    python scripts/lm_precision_error.py models/tiny-llama [--text FILE] [--prompts 8] [--new 64]
    python scripts/lm_precision_error.py --random          # issue 27's random LLaMA, random prompts

For each prompt (32 tokens cut from held-out text, read with the folder's tokenizer.json; default text: a
Python standard-library file, `--text` to choose), it states the relative L2 error of the prompt's
next-token logits, ||q - f|| / ||f||, and the greedy agreement: the share of the 64 new tokens equal to
fp32's, position by position, until the first divergence (after it the two continue from different
texts). Prints a Markdown table; the exports are made in a temporary folder.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def prompts(folder: Path | None, text_file: Path, count: int, t: int, vocab: int) -> list[np.ndarray]:
    if folder is None or not (folder / "tokenizer.json").is_file():
        rng = np.random.default_rng(1)
        return [rng.integers(3, vocab, (1, t)) for _ in range(count)]
    from tokenizers import Tokenizer

    ids = Tokenizer.from_file(str(folder / "tokenizer.json")).encode(text_file.read_text()).ids
    step = max((len(ids) - t) // count, 1)
    return [np.array([ids[i * step : i * step + t]], np.int64) for i in range(count) if len(ids) >= i * step + t]


def main() -> None:
    from export import OnnxSession, export_onnx
    from export.precision import rel_l2
    from runtime.generation import ROUND

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", nargs="?", help="a checkpoint folder (config.json, model.safetensors, tokenizer.json)")
    p.add_argument("--random", action="store_true", help="issue 27's random LLaMA instead of a folder")
    p.add_argument("--text", default=str(Path(argparse.__file__)), help="held-out text (default: argparse.py)")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--new", type=int, default=64)
    args = p.parse_args()
    if args.random:
        sys.path.insert(0, str(Path(__file__).parent))
        from profile_generate import hf_model

        from peers.lm import lm_from_hf

        lm, folder = lm_from_hf(hf_model()), None
    else:
        from peers.lm import lm_from_checkpoint

        folder = Path(args.folder)
        lm = lm_from_checkpoint(folder)
    vocab = lm.spec.vocab
    cases = prompts(folder, Path(args.text), args.prompts, args.prompt_len, vocab)
    tmp = Path(tempfile.mkdtemp(prefix="attnzoo-prec-"))
    sessions = {}
    for precision in ("fp32", "int8", "int4"):
        path = export_onnx(lm, tmp / f"{precision}.onnx", precision=precision).path
        sessions[precision] = OnnxSession(path, provider="cpu", verbose=False)
    ref = sessions["fp32"]
    rows = []
    for precision in ("int8", "int4"):
        errs, agree = [], []
        for ids in cases:
            n = -(-ids.shape[1] // ROUND) * ROUND
            feeds = {"input_ids": ids, "attention_mask": np.ones((1, n), np.bool_), "past_len": np.array(0)}
            for i in ref._sess.get_inputs()[3:]:
                feeds[i.name] = np.zeros((1, i.shape[1], n, i.shape[3]), np.float32)
            errs.append(rel_l2(sessions[precision].run_feeds(feeds)[0], ref.run_feeds(feeds)[0]))
            a = sessions[precision].generate(ids, args.new)[0, ids.shape[1] :]
            b = ref.generate(ids, args.new)[0, ids.shape[1] :]
            same = np.cumprod(a == b)
            agree.append(int(same.sum()))
        rows.append(
            (
                precision,
                sessions[precision].precision,
                float(np.mean(errs)),
                float(np.max(errs)),
                float(np.mean(agree)),
                min(agree),
            )
        )
    src = f"{args.folder}" if folder else "random LLaMA (issue 27's shape), random prompts"
    print(f"model: {src}; {len(cases)} prompts of {args.prompt_len} tokens, {args.new} new tokens")
    print(
        "| precision | method | next-token logits rel. error (mean / max) | greedy tokens equal to fp32 before the "
        "first divergence (mean / min) |"
    )
    print("|---|---|---:|---:|")
    for prec, method, mean_e, max_e, mean_a, min_a in rows:
        errs = f"{100 * mean_e:.2f}% / {100 * max_e:.2f}%"
        print(f"| {prec} | {method} | {errs} | {mean_a:.1f} / {min_a} of {args.new} |")


if __name__ == "__main__":
    main()
