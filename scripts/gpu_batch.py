"""The server's continuous batching over a packed-rows whole model on one device (scripts/gpu_check.sh, call 2):
serve/generate/packed.py's PackedBatcher binds each joining request's cache row by pointer and shape into buffers on
the device, which only a GPU run proves there. Requests of different prompt lengths arrive a few ms apart into
fewer rows than requests; each answer is compared with the same request run alone (OnnxSession.generate), and
the batch's tokens/s printed, without and with the decode steps captured as CUDA graphs.

Env: PROVIDER (cuda|cpu), EXPORT (a packed-rows whole-model .onnx; default /tmp/lmgpu-float16-fp32.onnx, which
call 1's scripts/gpu_lm.py leaves on a warm machine; else a small random LLaMA is exported here), OUT (folder for
batch-PROVIDER.json), REQUESTS (default 12), ROWS (default 4), NEW (default 32), GRAPHS (off,on).
Run from the project root with PYTHONPATH set. Exit 1 when a request fails outright; token disagreement in a half
dtype is reported, not failed (a batch's matrix products may round otherwise than one row's)."""

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback

import numpy as np

# scripts/bench.py would shadow the bench package: import from the repository root, not this folder
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

from runtime.core import onnx_metadata  # noqa: E402
from runtime.session import OnnxSession  # noqa: E402
from serve.generate.packed import PackedBatcher  # noqa: E402
from serve.generate.protocol import GenItem  # noqa: E402

PROVIDER = os.environ.get("PROVIDER", "cuda")
OUT = os.environ.get("OUT", "/tmp")
REQUESTS, ROWS, NEW = (int(os.environ.get(k, d)) for k, d in (("REQUESTS", 12), ("ROWS", 4), ("NEW", 32)))
GRAPHS = [g == "on" for g in os.environ.get("GRAPHS", "off,on").split(",")]
res = {"provider": PROVIDER, "requests": REQUESTS, "rows": ROWS, "new": NEW, "runs": [], "errors": []}


def save() -> None:
    with open(os.path.join(OUT, f"batch-{PROVIDER}.json"), "w") as f:
        json.dump(res, f, indent=1)


def export_small() -> str:
    """A small random LLaMA exported with packed rows for PROVIDER (float16 for CUDA, float32 on the CPU)."""
    from bench.checkpoints import random_llama

    folder = tempfile.mkdtemp()
    random_llama(f"{folder}/ck", hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=256, vocab_size=1000, max_position_embeddings=1024)  # fmt: skip
    dtype = "float16" if PROVIDER == "cuda" else "float32"
    path = f"{folder}/lm.onnx"
    cmd = [sys.executable, "-m", "cli", "export", "--checkpoint", f"{folder}/ck", "--whole", "--target", PROVIDER,
           "--dtype", dtype, "--padding", "packed", "--max-len", "512", "-o", path]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, timeout=240)
    return path


def requests(vocab: int) -> list[GenItem]:
    rng = np.random.default_rng(0)
    lengths = rng.integers(8, 200, REQUESTS)
    return [GenItem(rng.integers(3, vocab, (1, int(t))).astype(np.int64), NEW) for t in lengths]


def served(batcher, items: list[GenItem], gap_s: float = 0.002) -> list:
    async def main():
        async def one(i, it):
            await asyncio.sleep(gap_s * i)
            return await batcher.submit(GenItem(it.ids, it.max_new_tokens))

        return await asyncio.gather(*(one(i, it) for i, it in enumerate(items)))

    return asyncio.run(main())


path = os.environ.get("EXPORT", "/tmp/lmgpu-float16-fp32.onnx")
if not os.path.isfile(path) or onnx_metadata(path).get("attnzoo.padding") != "packed":
    print(f"{path}: none, or not packed rows; exporting a small random LLaMA", flush=True)
    path = export_small()
res["export"] = path
status = 0
for graph in GRAPHS:
    try:
        sess = OnnxSession(path, provider=PROVIDER, verbose=False, cuda_graph=graph)
        vocab = int(sess._sess.get_outputs()[0].shape[-1])
        items = requests(vocab)
        # the requests name no eos (as a /generate request without eos_token_id): alone ends at none either
        alone = [sess.generate(it.ids, it.max_new_tokens, eos_token_id=[]) for it in items]
        batcher = PackedBatcher(sess, max_rows=ROWS, capacity=512)
        served(batcher, items[:ROWS])  # warm-up (and, with graphs, the captures of each batch size)
        t = time.perf_counter()
        answers = served(batcher, items)
        took = time.perf_counter() - t
        failed = [str(a) for a, _ in answers if isinstance(a, Exception)]
        equal = sum(not isinstance(a, Exception) and np.array_equal(a, w) for (a, _), w in zip(answers, alone))
        made = sum(
            np.asarray(a).shape[-1] - it.ids.shape[-1]
            for (a, _), it in zip(answers, items)
            if not isinstance(a, Exception)
        )
        run = {"cuda_graph": graph, "equal_to_alone": equal, "failed": failed, "tok_s": made / took, "s": took}
        res["runs"].append(run)
        print(
            f"packed batcher on {PROVIDER}, cuda_graph={graph}: {equal} of {len(items)} requests token-equal to "
            f"alone, {len(failed)} failed; {made / took:.0f} tok/s ({ROWS} rows, {len(items)} requests)",
            flush=True,
        )
        status |= bool(failed)
    except Exception as e:  # noqa: BLE001 - the script reports each run's failure and goes on
        res["errors"].append(f"cuda_graph={graph}: {type(e).__name__}: {e}")
        print(res["errors"][-1], flush=True)
        traceback.print_exc()
        status = 1
    save()
sys.exit(status)
