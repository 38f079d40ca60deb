"""One seq2seq generation path, timed in its own process: `python seq2seq_peers.py JOB_JSON`.

A job (JSON): {"path": "attnzoo"|"transformers", "checkpoint": DIR, "work": a folder of its own,
"prompts": [[ids] * 8], "batches": [1, 8], "new": N, "threads": T, "warmup": W, "repeats": R,
"num_beams": K}. Greedy (or beam search with K > 1: each row's best hypothesis), eos off on both paths (so
every call makes exactly N tokens): attnzoo exports the checkpoint (export_seq2seq, both graphs) and times
Seq2SeqSession.generate; transformers times AutoModelForSeq2SeqLM.generate(num_beams=K, do_sample=False) with
its default attention (SDPA) and cache. For each B: W warm-up calls, then R timed calls on the first B prompts;
every call's seconds and the tokens. The one result line on stdout starts with RESULT_MARK.
"""

from __future__ import annotations

import json
import os
import sys
import time

RESULT_MARK = "ATTNZOO-SEQ2SEQ-RESULT "
OFF = dict(eos_token_id=None, forced_eos_token_id=None)  # eos off: every call makes `new` tokens


def _attnzoo(job: dict):
    import numpy as np

    import zoo
    from export.seq2seq_export import export_seq2seq
    from export.seq2seq_session import Seq2SeqSession

    path = os.path.join(job["work"], "model.onnx")
    with open(os.path.join(job["checkpoint"], "config.json")) as f:
        start = json.load(f)["decoder_start_token_id"]  # the only id a run with eos off needs
    started = time.perf_counter()
    model = zoo.seq2seq_from_checkpoint(job["checkpoint"])
    export_seq2seq(model, path, overwrite=True)
    built = time.perf_counter() - started
    sess = Seq2SeqSession(path, "cpu", threads=job["threads"])

    beams = job.get("num_beams", 1)

    def generate(prompts: list[list[int]]) -> list[list[int]]:
        out = sess.generate(
            np.asarray(prompts, np.int64),
            max_new_tokens=job["new"],
            decoder_start_token_id=start,
            num_beams=beams,
            **OFF,
        )
        return out[:, 1:].tolist()  # after the decoder start token

    return generate, {"build_s": built, "lowering": sess.decoder.metadata.get("attnzoo.lowering")}


def _transformers(job: dict):
    import torch
    from transformers import AutoModelForSeq2SeqLM

    torch.set_num_threads(job["threads"])
    model = AutoModelForSeq2SeqLM.from_pretrained(job["checkpoint"], dtype=torch.float32).eval()
    for k, v in OFF.items():  # on the model's own config: a None passed to generate falls back to it
        setattr(model.generation_config, k, v)

    def generate(prompts: list[list[int]]) -> list[list[int]]:
        ids = torch.tensor(prompts, dtype=torch.long)
        with torch.inference_mode():
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=job["new"],
                num_beams=job.get("num_beams", 1),
                do_sample=False,
            )
        return out[:, 1:].tolist()

    return generate, {"attn_implementation": model.config._attn_implementation}


PATHS = {"attnzoo": _attnzoo, "transformers": _transformers}


def run(job: dict) -> dict:
    generate, facts = PATHS[job["path"]](job)
    rows = []
    for b in job["batches"]:
        prompts = job["prompts"][:b]
        for _ in range(job["warmup"]):
            tokens = generate(prompts)
        seconds = []
        for _ in range(job["repeats"]):
            started = time.perf_counter()
            tokens = generate(prompts)
            seconds.append(time.perf_counter() - started)
        rows.append({"b": b, "seconds": seconds, "tokens": tokens})
    return {"ok": True, **facts, "rows": rows}


def main(argv: list[str]) -> int:
    job = json.loads(argv[0])
    try:
        result = run(job)
    except Exception as e:  # noqa: BLE001 - any failure becomes the row's note, not a crash
        first = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
        result = {"ok": False, "error": f"{type(e).__name__}: {first}"}
    print(RESULT_MARK + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
