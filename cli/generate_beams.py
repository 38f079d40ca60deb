"""`attnzoo generate --num-beams K` (or a checkpoint whose generation_config.json asks num_beams > 1): beam
search from a whole decoder (runtime/beam_generation.py), each returned hypothesis printed with its score
(transformers' sequences_scores); cmd_generate hands the call here once the session is open."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from zoo.files import write_atomic

from . import interrupt
from .generate_flags import beam_options, refuse_with_beams


def beams_asked(args, config: dict | None):
    """The call's beam settings over the checkpoint's generation_config (runtime.beam_search.Beams); refuses the
    flags beams do not take, in one line."""
    from runtime.beam_search import beam_settings

    beams = beam_settings(beam_options(args), config)
    if beams.on:
        refuse_with_beams(args, beams.num_beams, args.stream is True)
    return beams


def print_hypotheses(tokens, scores, prompt_len: int, tok, decode=None) -> list:
    """One line per hypothesis: its rank, score and new tokens (and text with a tokenizer) -> the texts."""
    texts = []
    for rank, (row, score) in enumerate(zip(tokens.tolist(), scores.tolist()), 1):
        new = row[prompt_len:]
        print(f"beam {rank} score {score:.4f} tokens", " ".join(map(str, new)))
        if tok is not None:
            texts.append((decode or tok.decode)(new))
            print(f"       text {texts[-1]!r}")
    return texts


def run_beams(args, sess, ids: list[int], tok, config: dict | None, beams, model_path: Path, source: str) -> int:
    import numpy as np

    from runtime.beam_generation import BeamGeneration

    run = BeamGeneration(
        sess,
        np.array([ids], np.int64),
        args.max_new_tokens,
        eos_token_id=args.eos_token_id,
        beams=beams,
        generation_config=config,
        max_time=args.max_time,
        repetition_penalty=args.repetition_penalty,
    )
    started = time.perf_counter()
    try:
        run.run()
    except KeyboardInterrupt:
        interrupt.handled()
        print("\nattnzoo generate: interrupted (beam search returns nothing before its end)", file=sys.stderr)
        return 130
    total = time.perf_counter() - started
    out = run.output
    texts = print_hypotheses(out.sequences, out.sequences_scores, len(ids), tok)
    timings = dict(run.timings, total_s=total)
    print(
        f"took   {total:.3f} s for {run.timings['steps']} steps of {beams.num_beams} beams (prefill "
        f"{1e3 * timings['prefill_s']:.1f} ms, {1e3 * timings['decode_s'] / max(timings['steps'], 1):.2f} ms per "
        f"step with its cache reorder), {sess.precision}, on {sess.provider}, beam search"
    )
    if args.json:
        doc = {
            "tokens": out.sequences.tolist(),
            "sequences_scores": [float(s) for s in out.sequences_scores],
            "text": texts or None,
            "num_beams": beams.num_beams,
            "length_penalty": beams.length_penalty,
            "early_stopping": beams.early_stopping,
            "timings": timings,
            "source": source,
            "model": str(model_path),
            "provider": sess.provider,
        }
        write_atomic(Path(args.json), lambda tmp: tmp.write_text(json.dumps(doc, indent=2)))
        print(f"wrote {args.json}")
    return 0


__all__ = ["beams_asked", "print_hypotheses", "run_beams"]
