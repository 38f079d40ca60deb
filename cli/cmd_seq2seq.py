"""Encoder-decoder models (T5, BART, mBART, Marian) in `attnzoo export --checkpoint DIR --whole` and `attnzoo
generate`: the pair of graphs export/seq2seq_export.py writes (PATH -> PATH.encoder.onnx, PATH.decoder.onnx)
and tokens from them (runtime/seq2seq_session.py: greedy, sampled or beam search, as a decoder's). cmd_generate hands
a source here when it is one."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from zoo.files import ensure_writable_parent, write_atomic

from .common import CliError


def _config(folder: Path) -> dict | None:
    try:
        data = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


def is_seq2seq_folder(folder: Path) -> bool:
    """A checkpoint folder of a family whose whole encoder-decoder model the zoo reads."""
    data = _config(folder) if folder.is_dir() else None
    if data is None:  # not a folder: no import of torch to say so
        return False
    from peers.seq2seq import is_seq2seq

    return is_seq2seq(data)


def is_seq2seq_export(source: Path) -> bool:
    """PATH (its pair written), PATH.encoder.onnx or PATH.decoder.onnx."""
    from export.names import seq2seq_paths

    enc, dec = seq2seq_paths(source)
    named = source.name.endswith((".encoder.onnx", ".decoder.onnx"))
    return (named or not source.exists()) and enc.is_file() and dec.is_file()


def _tokenizer_path(base: Path) -> Path:
    """Where an export's tokenizer goes: PATH -> PATH.tokenizer.json (the pair's stem)."""
    from export.names import seq2seq_paths

    enc, _ = seq2seq_paths(base)
    return enc.with_name(enc.name.removesuffix(".encoder.onnx") + ".tokenizer.json")


def _load(folder: str):
    from peers.seq2seq import generation_settings, seq2seq_from_checkpoint

    return seq2seq_from_checkpoint(folder), generation_settings(folder)


def export_whole(args: argparse.Namespace) -> int:
    """`attnzoo export --checkpoint DIR --whole -o PATH` for an encoder-decoder: the pair of graphs."""
    from export.seq2seq_export import export_seq2seq, seq2seq_paths

    if args.max_len is not None:
        raise CliError("--max-len: an encoder-decoder export sizes its buffers per call; leave it out")
    ensure_writable_parent(args.output)
    model, generation = _load(args.checkpoint)
    result = export_seq2seq(
        model,
        args.output,
        precision=args.precision,
        lowering=args.lowering,
        dtype=args.dtype,
        provider=args.target,
        overwrite=args.force,
        label=args.checkpoint,
        generation=generation,
    )
    print(result.summary())
    src = Path(args.checkpoint) / "tokenizer.json"
    if src.is_file():
        dst = _tokenizer_path(seq2seq_paths(args.output)[0])
        data = src.read_bytes()
        write_atomic(dst, lambda tmp: tmp.write_bytes(data))
        print(f"tokenizer: {src} copied to {dst} (generate --prompt reads it)")
    return 0


def _exported(folder: Path, precision: str, out: Path) -> Path:
    """A folder's pair, made once at `out` in the cache folder (as export_cache.exported does for decoders)."""
    from export.seq2seq_export import export_seq2seq, seq2seq_paths

    if all(p.is_file() for p in seq2seq_paths(out)):
        return out
    model, generation = _load(str(folder))
    print(f"exporting {folder} ({precision}) to {out.with_suffix('')}.{{encoder,decoder}}.onnx (once)")
    export_seq2seq(model, out, precision=precision, overwrite=True, label=str(folder), generation=generation)
    return out


def _refuse_decoder_flags(args: argparse.Namespace) -> None:
    """The flags of a decoder's export or session an encoder-decoder pair does not take, each in one line."""
    if args.max_len is not None:
        raise CliError("--max-len: an encoder-decoder export sizes its buffers per call; leave it out")
    if args.kv_precision != "fp32":
        raise CliError(
            f"--kv-precision {args.kv_precision} is for decoder-only folders; an encoder-decoder's cache is fp32"
        )
    if args.cuda_graph:
        raise CliError("--cuda-graph is for decoder-only exports; an encoder-decoder pair runs without CUDA graphs")
    if getattr(args, "tf32", False):
        raise CliError("--tf32 is for decoder-only exports; an encoder-decoder pair runs fp32 as fp32")


def cmd_generate(args: argparse.Namespace, source: Path, cached: Path, prompt_ids) -> int:  # noqa: ANN001
    """`attnzoo generate SOURCE` where SOURCE is an encoder-decoder folder or export; `cached`: where a folder's
    export goes; prompt_ids(tokenizer or None) -> the prompt's ids (cmd_generate's reading of --prompt). The
    prompt is the encoder's input; sampling, --seed, --stop, --max-time, --stream and --chat (with the folder's
    chat template) act as for a decoder."""
    import sys
    import warnings

    from runtime.seq2seq_generation import Seq2SeqGeneration
    from runtime.seq2seq_session import Seq2SeqSession

    from .generate_flags import chat_prompt, options, run_live, short

    if args.json:
        ensure_writable_parent(Path(args.json))
    _refuse_decoder_flags(args)
    tok_path = source / "tokenizer.json" if source.is_dir() else _tokenizer_path(source)
    if not source.is_dir() and not tok_path.is_file():
        tok_path = source.parent / "tokenizer.json"
    tok = None
    if tok_path.is_file():
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(tok_path))
    if args.chat or args.messages is not None:
        chat_prompt(args, tok, source)  # the folder's chat template, else one line saying there is none
    ids = prompt_ids(tok)
    if args.stop and tok is None:
        raise CliError("--stop matches text: it needs a tokenizer.json (see --prompt)")
    model_path = _exported(source, args.precision, cached) if source.is_dir() else source
    sess = Seq2SeqSession(model_path, provider=args.provider, threads=args.threads)
    past = [i for i in ids if i >= sess.vocab]
    if past:
        raise CliError(f"token id {past[0]} is past the vocabulary ({sess.vocab} tokens: ids 0..{sess.vocab - 1})")
    import numpy as np

    from .generate_beams import beams_asked

    beams = beams_asked(args, sess.generation)  # a folder's beam settings and the flags they refuse
    if beams.on:
        return _beam_generate(args, sess, ids, tok, beams, source, model_path)
    with warnings.catch_warnings():  # the checkpoint's keys not applied: the note line below
        warnings.simplefilter("ignore", UserWarning)
        run = Seq2SeqGeneration(
            sess, np.array([ids], np.int64), args.max_new_tokens, tokenizer=tok, logprobs=True, **options(args)
        )
    if sess.note:
        print(f"note   {sess.note}")
    live = sys.stdout.isatty() if args.stream is None else args.stream
    total = run_live(run, tok, ids, live)
    if total is None:
        return 130
    tokens, timings = run.tokens, dict(run.timings)
    row = tokens[0].tolist()
    new = len(row) - 1
    timings.update(total_s=total, new_tokens=new, tokens_per_s=new / total if total else None)
    print("tokens", " ".join(map(str, row)))
    text = run.texts[0] if tok is not None else None
    if tok is not None and not live:
        print("text  ", repr(short(tok.decode(ids))), "->", repr(text))
    how = "greedy" if not run.params.do_sample else f"sampled, seed {run.seed}"
    print(
        f"took   {total:.3f} s for {new} new tokens (encoder {1e3 * timings['encode_s']:.1f} ms, "
        f"{1e3 * timings['decode_s'] / max(timings['steps'], 1):.2f} ms per decoder step), on {sess.provider}, "
        f"{how}, finish: {run.finish_reason[0]}"
    )
    if args.json:
        doc = {
            "tokens": tokens.tolist(),
            "text": [text] if text is not None else None,
            "finish_reason": run.finish_reason,
            "seed": run.seed,
            "logprobs": run.logprobs.tolist(),
            "timings": timings,
        }
        doc.update(source=str(source), model=str(model_path), provider=sess.provider, note=sess.note)
        write_atomic(Path(args.json), lambda tmp: tmp.write_text(json.dumps(doc, indent=2)))
        print(f"wrote {args.json}")
    return 0


def _beam_generate(args: argparse.Namespace, sess, ids: list[int], tok, beams, source, model_path) -> int:
    """Beam search on a pair (runtime/seq2seq_beam.py): each returned hypothesis with its score."""
    import numpy as np

    from .generate_beams import print_hypotheses
    from .generate_flags import beam_options

    extra = {} if args.eos_token_id is None else {"eos_token_id": args.eos_token_id}
    extra.update(beam_options(args), return_dict_in_generate=True)
    timings: dict = {}
    started = time.perf_counter()
    out = sess.generate(np.array([ids], np.int64), args.max_new_tokens, timings=timings, **extra)
    total = time.perf_counter() - started
    tokens, scores = out.sequences, out.sequences_scores
    new = tokens.shape[1] - 1
    timings.update(total_s=total, new_tokens=new, tokens_per_s=new / total if total else None)
    texts = print_hypotheses(tokens, scores, 1, tok)
    text = texts[0] if texts else None
    print(
        f"took   {total:.3f} s for {new} new tokens (encoder {1e3 * timings['encode_s']:.1f} ms, "
        f"{1e3 * timings['decode_s'] / max(timings['steps'], 1):.2f} ms per decoder step), on {sess.provider}, "
        f"beam search ({beams.num_beams} beams)"
    )
    if args.json:
        doc = {"tokens": tokens.tolist(), "text": [text] if text is not None else None, "timings": timings}
        doc.update(sequences_scores=[float(x) for x in scores], num_beams=beams.num_beams)
        doc.update(source=str(source), model=str(model_path), provider=sess.provider, note=sess.note)
        write_atomic(Path(args.json), lambda tmp: tmp.write_text(json.dumps(doc, indent=2)))
        print(f"wrote {args.json}")
    return 0


def families_markdown() -> str:
    """The encoder-decoder families `attnzoo families` lists, one row each."""
    from peers.seq2seq_rows import SEQ2SEQ_FAMILIES

    lines = ["| model_type | parts besides attention |", "|---|---|"]
    lines += [f"| `{kind}` | {row.covers} |" for kind, row in SEQ2SEQ_FAMILIES.items()]
    return "\n".join(lines)


__all__ = ["cmd_generate", "export_whole", "families_markdown", "is_seq2seq_export", "is_seq2seq_folder"]
