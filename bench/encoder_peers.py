"""One sentence-encoder path, timed in its own process: `PYTHON encoder_peers.py JOB_JSON`.

Only the standard library at the top: the sentence-transformers ONNX path runs under another
environment's python (optimum-onnx needs transformers < 4.58). The attnzoo path imports zoo, export and
runtime inside its functions (the parent sets PYTHONPATH for it).

A job (JSON): {"path": PATH, "folder": a sentence-transformers folder, "work": a folder of its own,
"shapes": [[B, T], ...], "texts": {"T": [texts of exactly T tokens]}, "threads": N, "warmup": W,
"repeats": R}. Each path's `encode(texts)` is what a user calls: tokenize, run, pool, normalize, float32
numpy out. For every (B, T): W warm-up calls on the first B texts of length T, then R timed calls; the
result lists every call's seconds (the parent takes median and spread) and the first embedding (the
parent checks the paths agree). The one result line on stdout starts with RESULT_MARK.
"""

from __future__ import annotations

import json
import os
import sys
import time

RESULT_MARK = "ATTNZOO-ENCODER-RESULT "


def _attnzoo(job: dict):
    import zoo
    from export.encoder_export import export_encoder
    from runtime.embedding import EmbeddingSession

    path = os.path.join(job["work"], "embed.onnx")
    started = time.perf_counter()
    model = zoo.sentence_encoder(job["folder"])
    export_encoder(model, path, overwrite=True)
    built = time.perf_counter() - started
    tokenizer = os.path.join(job["folder"], "tokenizer.json")
    sess = EmbeddingSession(path, "cpu", tokenizer=tokenizer, threads=job["threads"])
    lowering = sess.metadata.get("attnzoo.lowering")
    return (lambda texts: sess.encode(texts, batch_size=len(texts))), {"build_s": built, "lowering": lowering}


def _sentence_transformers(job: dict):
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(job["threads"])
    model = SentenceTransformer(job["folder"], device="cpu")

    def encode(texts):
        return model.encode(texts, batch_size=len(texts), convert_to_numpy=True)

    return encode, {"attn_implementation": model[0].auto_model.config._attn_implementation}


def _older_folder(job: dict) -> str:
    """The folder as this (older) sentence-transformers writes it: sentence-transformers 6 saves module
    classes and pooling configs that 5.x cannot read. The same transformer (the folder's config.json,
    safetensors and tokenizer), mean pooling and Normalize, through this version's own classes."""
    import shutil

    from sentence_transformers import SentenceTransformer, models

    hf = os.path.join(job["work"], "hf")
    os.makedirs(hf, exist_ok=True)
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(job["folder"], name), hf)
    with open(os.path.join(hf, "tokenizer_config.json")) as f:
        config = json.load(f)
    config["tokenizer_class"] = "PreTrainedTokenizerFast"  # transformers 5's TokenizersBackend: the same, renamed
    with open(os.path.join(hf, "tokenizer_config.json"), "w") as f:
        json.dump(config, f)
    folder = os.path.join(job["work"], "st-older")
    t = models.Transformer(hf, max_seq_length=job["max_seq_length"])
    pooling = models.Pooling(t.get_word_embedding_dimension(), "mean")
    SentenceTransformer(modules=[t, pooling, models.Normalize()], device="cpu").save(folder)
    return folder


def _sentence_transformers_onnx(job: dict):
    """sentence-transformers' backend="onnx": optimum-onnx exports the folder's model on first load."""
    import onnxruntime as ort
    import sentence_transformers
    import transformers
    from sentence_transformers import SentenceTransformer

    folder = _older_folder(job)  # the export lands in folder/onnx/
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = job["threads"], 1
    started = time.perf_counter()
    kwargs = {"provider": "CPUExecutionProvider", "session_options": options}
    model = SentenceTransformer(folder, device="cpu", backend="onnx", model_kwargs=kwargs)
    built = time.perf_counter() - started
    versions = {
        "sentence_transformers": sentence_transformers.__version__,
        "transformers": transformers.__version__,
        "onnxruntime": ort.__version__,
    }
    try:
        import optimum.version

        versions["optimum"] = optimum.version.__version__
    except ImportError:
        pass

    def encode(texts):
        return model.encode(texts, batch_size=len(texts), convert_to_numpy=True)

    return encode, {"build_s": built, "versions": versions}


def _transformers(job: dict):
    """AutoTokenizer + AutoModel (its default attention: SDPA) + the folder's pooling (mean) + Normalize."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    torch.set_num_threads(job["threads"])
    tok = AutoTokenizer.from_pretrained(job["folder"])
    model = AutoModel.from_pretrained(job["folder"], dtype=torch.float32).eval()
    max_len = job["max_seq_length"]

    def encode(texts):
        feeds = tok(texts, padding=True, truncation=True, max_length=max_len, return_tensors="pt")
        with torch.inference_mode():
            h = model(**feeds).last_hidden_state
            m = feeds["attention_mask"].unsqueeze(-1).to(h.dtype)
            e = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(e, p=2, dim=1).numpy()

    return encode, {"attn_implementation": model.config._attn_implementation}


PATHS = {
    "attnzoo": _attnzoo,
    "sentence-transformers": _sentence_transformers,
    "transformers": _transformers,
    "sentence-transformers-onnx": _sentence_transformers_onnx,
}


def run(job: dict) -> dict:
    encode, facts = PATHS[job["path"]](job)
    shapes = []
    for b, t in job["shapes"]:
        texts = job["texts"][str(t)][:b]
        for _ in range(job["warmup"]):
            out = encode(texts)
        seconds = []
        for _ in range(job["repeats"]):
            started = time.perf_counter()
            out = encode(texts)
            seconds.append(time.perf_counter() - started)
        shapes.append({"b": b, "t": t, "seconds": seconds, "first": [float(x) for x in out[0]]})
    return {"ok": True, **facts, "shapes": shapes}


def main(argv: list[str]) -> int:
    job = json.loads(argv[0])
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        result = run(job)
    except Exception as e:  # noqa: BLE001 - any failure becomes the row's note, not a crash
        first = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
        result = {"ok": False, "error": f"{type(e).__name__}: {first}"}
    print(RESULT_MARK + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
