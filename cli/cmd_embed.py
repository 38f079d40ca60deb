"""`attnzoo embed FOLDER|MODEL.onnx --text ...`: sentence embeddings, as SentenceTransformer.encode gives them;
and `export --checkpoint DIR --whole` for an encoder or sentence-transformers folder (export_encoder_whole)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .common import CliError


def export_encoder_whole(args: argparse.Namespace) -> int:
    """`attnzoo export --checkpoint DIR --whole -o PATH` where DIR holds an encoder: one graph, input_ids,
    attention_mask [, token_type_ids] -> sentence_embedding; the tokenizer copied to MODEL.tokenizer.json."""
    from export.encoder_export import export_encoder
    from peers.sentence import sentence_encoder, tokenizer_facts
    from runtime.embedding import tokenizer_beside
    from zoo.files import ensure_writable_parent, write_atomic

    if args.max_len is not None:
        raise CliError(
            "--max-len is for decoders (their cache); an encoder's graph takes any length up to its positions"
        )
    ensure_writable_parent(args.output)
    tok, pad, lower = tokenizer_facts(args.checkpoint)
    model = sentence_encoder(args.checkpoint)
    result = export_encoder(
        model,
        args.output,
        precision=args.precision,
        lowering=args.lowering,
        provider=args.target,
        dtype=args.dtype,
        overwrite=args.force,
        label=args.checkpoint,
        pad_id=pad,
        do_lower_case=lower,
    )
    print(result.summary())
    dst = tokenizer_beside(Path(args.output))
    data = tok.read_bytes()
    write_atomic(dst, lambda tmp: tmp.write_bytes(data))
    print(f"tokenizer: {tok} copied to {dst} (embed reads it)")
    return 0


def exported_encoder(folder: str) -> Path:
    """The sentence-embedding export of an encoder or sentence-transformers folder (fp32, for the CPU) with its
    tokenizer beside it (MODEL.tokenizer.json): made once, then found in the cache folder, as `attnzoo serve`
    finds a decoder's (export_cache.exported); a change to the folder's files makes a new one."""
    import hashlib

    import zoo
    from export.encoder_export import export_encoder
    from peers.sentence import sentence_encoder, tokenizer_facts
    from runtime.embedding import tokenizer_beside
    from zoo.files import write_atomic

    from .export_cache import _cache_root

    root = Path(folder)
    h = hashlib.sha256(f"{zoo.__version__}".encode())
    for f in sorted(root.rglob("*")):
        if f.suffix == ".json":
            h.update(str(f.relative_to(root)).encode() + f.read_bytes())
        elif f.suffix == ".safetensors":
            h.update(f"{f.relative_to(root)}:{f.stat().st_size}:{f.stat().st_mtime_ns}".encode())
    out = _cache_root() / "embed" / f"{root.resolve().name}-{h.hexdigest()[:20]}.onnx"
    tok_out = tokenizer_beside(out)
    if out.is_file() and tok_out.is_file():  # the tokenizer is written last
        return out
    tok, pad, lower = tokenizer_facts(root)
    model = sentence_encoder(root)
    print(f"exporting {folder} (fp32, sentence embeddings) to {out} (once)")
    out.parent.mkdir(parents=True, exist_ok=True)
    export_encoder(model, out, overwrite=True, label=str(folder), pad_id=pad, do_lower_case=lower)
    data = tok.read_bytes()
    write_atomic(tok_out, lambda tmp: tmp.write_bytes(data))
    return out


def serve_hints(url: str, auth: str, path: Path) -> list[str]:
    """The lines `attnzoo serve` prints for a sentence encoder's server: a curl and an openai call."""
    from runtime.session import OnnxSession

    label = OnnxSession(path, provider="cpu", verbose=False).metadata.get("attnzoo.name") or "SentenceEncoder"
    model = path.stem if label == "SentenceEncoder" else Path(label).name
    body = f'{{"model": "{model}", "input": ["hello world", "the cat sat"]}}'
    return [
        f"  curl -s {auth}-H 'Content-Type: application/json' -d '{body}' {url}v1/embeddings",
        f'  OpenAI(base_url="{url}v1", api_key=...).embeddings.create(model="{model}", input=["hello world"])',
    ]


def _eager(folder: Path, texts: list[str], prompt_name: str | None, batch: int):
    """(embeddings (n e), label) of a model folder, eager, tokenized as the exported graph's session does."""
    import numpy as np
    import torch

    from peers.sentence import sentence_encoder, tokenizer_facts
    from runtime.embedding import TextTokenizer, with_prompt

    model = sentence_encoder(folder)
    path, pad, lower = tokenizer_facts(folder)
    tok = TextTokenizer(path, model.max_seq_length, pad, lower=lower)
    texts = with_prompt(texts, model.prompts, model.default_prompt_name, prompt_name, None)
    out = []
    with torch.no_grad():
        for i in range(0, len(texts), batch):
            feeds = {k: torch.from_numpy(v) for k, v in tok(texts[i : i + batch]).items()}
            out.append(model(feeds["input_ids"], feeds["attention_mask"], feeds["token_type_ids"]).numpy())
    return np.concatenate(out), "eager torch"


def cmd_embed(args: argparse.Namespace) -> int:
    from zoo.files import ensure_writable_parent, write_atomic

    source = Path(args.source)
    texts = list(args.text or [])
    if args.file:
        try:
            texts += [line for line in Path(args.file).read_text(encoding="utf-8").splitlines() if line.strip()]
        except OSError as e:
            raise CliError(f"--file {args.file}: {e.strerror or e}") from None
    if not texts:
        raise CliError("give the texts: --text TEXT (repeat it for more) or --file PATH (one text a line)")
    if args.json:
        ensure_writable_parent(args.json)
    if source.is_dir():
        if (source / "config.json").is_file() and not (source / "modules.json").is_file():
            from .export_cache import checkpoint_config
            from .families import check_embed_family

            check_embed_family(source, checkpoint_config(str(source))[1])  # a decoder: `attnzoo generate`
        emb, ran = _eager(source, texts, args.prompt_name, args.batch_size)
    elif source.suffix == ".onnx" and source.is_file():
        from runtime.embedding import EmbeddingSession

        sess = EmbeddingSession(source, args.provider, verbose=False)
        emb = sess.encode(texts, prompt_name=args.prompt_name, batch_size=args.batch_size)
        ran = f"ONNX Runtime ({sess.provider})"
    else:
        from .common import refuse_hub_id

        refuse_hub_id(args.source)
        raise CliError(
            f"{source}: give a model folder (a sentence-transformers or transformers encoder folder) or an .onnx "
            f"written by `attnzoo export --checkpoint FOLDER --whole -o MODEL.onnx`"
        )
    print(f"{len(texts)} text{'s' * (len(texts) != 1)} -> {emb.shape[1]}-dim embeddings ({ran})")
    for text, e in zip(texts, emb):
        head = " ".join(f"{v:+.4f}" for v in e[:4])
        print(f"  [{head} ...] |e|={float((e**2).sum() ** 0.5):.4f}  {text[:60]!r}")
    if args.json:
        doc = {"model": str(source), "ran": ran, "dim": int(emb.shape[1]), "texts": texts, "embeddings": emb.tolist()}
        write_atomic(Path(args.json), lambda tmp: tmp.write_text(json.dumps(doc) + "\n"))
        print(f"wrote {args.json}")
    return 0


def add_commands(sub) -> None:
    from .common import positive

    sp = sub.add_parser(
        "embed",
        help="sentence embeddings from an encoder folder or its exported .onnx, as sentence-transformers encodes",
        description="Sentence embeddings (SentenceTransformer.encode's): a folder (sentence-transformers, or a "
        "transformers BERT / RoBERTa / XLM-RoBERTa / DistilBERT / ModernBERT folder, mean-pooled) runs eager in "
        "torch; an .onnx from `attnzoo export --checkpoint FOLDER --whole -o MODEL.onnx` runs under ONNX Runtime "
        "with the tokenizer the export wrote beside it (MODEL.tokenizer.json).",
    )
    sp.add_argument("source", metavar="FOLDER|MODEL.onnx", help="a model folder or an exported sentence encoder")
    sp.add_argument("--text", action="append", metavar="TEXT", help="a text to embed (repeat for more)")
    sp.add_argument("--file", metavar="PATH", help="texts to embed, one a line (blank lines skipped)")
    sp.add_argument(
        "--prompt-name",
        metavar="NAME",
        help="a prompt of the model's config_sentence_transformers.json (e.g. query) put before each text",
    )
    sp.add_argument("--batch-size", type=positive, default=32, help="texts per call (default 32, as encode's)")
    sp.add_argument("--provider", choices=("auto", "cpu", "cuda"), default="auto", help="for an .onnx (default auto)")
    sp.add_argument("--json", metavar="PATH", help="also write the texts and embeddings as JSON")
    sp.set_defaults(func=cmd_embed)
