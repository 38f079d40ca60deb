"""The error of int8 and int4 whole-model exports against fp32 (docs/generation.md's precision table).

    python scripts/lm_precision_error.py models/tiny-llama [--text FILE] [--prompts 8] [--new 64]
    python scripts/lm_precision_error.py --random          # issue 27's random LLaMA, random prompts

For each prompt (32 tokens cut from held-out text, read with the folder's tokenizer.json; default text: a
Python standard-library file, `--text` to choose), it states the relative L2 error of the prompt's
next-token logits, ||q - f|| / ||f||, and the greedy agreement: the share of the 64 new tokens equal to
fp32's, position by position, until the first divergence (after it the two continue from different
texts). Prints a Markdown table; the exports are made in a temporary folder.

`--precisions` picks the rows (default int8,int4, the weights'); `kv8` is fp32 weights with the int8 KV cache
(kv_precision="int8", export/kv_int8.py), against the fp32 export of the same lowering (decomposed).
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


def _prompt_logits(sess, ids: np.ndarray, n: int) -> np.ndarray:
    """The prompt's next-token logits (1 1 v) in one call into empty buffers of capacity n."""
    from runtime.kv_buffers import buffer_arrays

    feeds = {"input_ids": ids, "attention_mask": np.ones((1, n), np.bool_), "past_len": np.array(0)}
    feeds.update(buffer_arrays(sess._sess.get_inputs(), 1, n, "past_key_values."))
    return sess.run_feeds(feeds)[0]


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
    p.add_argument("--precisions", default="int8,int4", help="rows among int8, int4, kv8 (default int8,int4)")
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
    chosen = args.precisions.split(",")
    # kv8's reference is fp32 in its own lowering, so that the row states the cache's error alone
    exports = {"fp32": {"lowering": "decomposed"} if "kv8" in chosen else {}}
    for precision in chosen:
        exports[precision] = (
            {"kv_precision": "int8", **exports["fp32"]} if precision == "kv8" else {"precision": precision}
        )
    for precision, options in exports.items():
        path = export_onnx(lm, tmp / f"{precision}.onnx", **options).path
        sessions[precision] = OnnxSession(path, provider="cpu", verbose=False)
    ref = sessions["fp32"]
    rows = []
    for precision in chosen:
        errs, agree = [], []
        for ids in cases:
            n = -(-ids.shape[1] // ROUND) * ROUND
            got, want = (_prompt_logits(sessions[k], ids, n) for k in (precision, "fp32"))
            errs.append(rel_l2(got, want))
            a = sessions[precision].generate(ids, args.new, eos_token_id=[])[0, ids.shape[1] :]
            b = ref.generate(ids, args.new, eos_token_id=[])[0, ids.shape[1] :]
            same = np.cumprod(a == b)
            agree.append(int(same.sum()))
        rows.append(
            (
                precision,
                "int8 KV cache (a scale per position and kv head)"
                if precision == "kv8"
                else sessions[precision].precision,
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
