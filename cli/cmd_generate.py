"""`attnzoo generate`: greedy tokens from a checkpoint folder or a whole-model export, under ONNX
Runtime; and `attnzoo export --checkpoint DIR --whole`, the export it runs (export/lm_export.py).

A folder is exported once into the cache folder (cli/export_cache.py), so the second run starts at once.
Without --max-len both export with the checkpoint's maximum positions as max_len when the rotary tables
of that many rows fit one constant (export.lm_export.stored_tables_max_len): the export stores cos and sin
instead of computing them at every step; each call's buffers stay what it needs."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from export.names import DTYPES, KV_PRECISIONS, PRECISIONS, PROVIDERS
from zoo.files import ensure_writable_parent, write_atomic

from .common import CliError, number_in, positive, refuse_broken_cuda, with_tf32
from .export_cache import (
    _cache_root,
    _export_key,
    _max_positions,
    cached_lm,
    checkpoint_config,
    exported,
    generation_config,
)
from .families import check_generate_family
from .generate_beams import beams_asked, run_beams
from .generate_flags import (
    add_generation_flags,
    add_speculation_flags,
    chat_prompt,
    options,
    read_prompt,
    run_live,
    short,
    speculates,
)
from .generate_sources import draft_session, source_path, whole_model


def tokenizer_file(source: Path) -> Path | None:
    """The tokenizer.json a source reads, or None: a folder's own; for a .onnx the one its export wrote
    beside it (STEM.tokenizer.json: one per export, so two models in one folder keep theirs), else a
    tokenizer.json in its folder."""
    if source.is_dir():
        candidates = [source / "tokenizer.json"]
    else:
        candidates = [tokenizer_beside(source), source.parent / "tokenizer.json"]
    return next((c for c in candidates if c.is_file()), None)


def tokenizer_beside(onnx_path: Path) -> Path:
    """Where `export --whole` writes an export's tokenizer: MODEL.onnx -> MODEL.tokenizer.json."""
    return onnx_path.with_name(onnx_path.stem + ".tokenizer.json")


def _tokenizer(source: Path):
    path = tokenizer_file(source)
    if path is None:
        return None
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # noqa: BLE001 - the tokenizers library raises its own exception type
        raise CliError(f"{path} cannot be read: {str(e).splitlines()[0][:200]}") from None


def _prompt_ids(args, tok, source: Path) -> list[int]:
    if args.prompt is not None and args.prompt_ids is not None:
        raise CliError("give --prompt TEXT or --prompt-ids 1,2,3, not both")
    if args.prompt is None and args.prompt_ids is None:
        raise CliError(
            "give the prompt: --prompt TEXT (needs a tokenizer.json), --prompt-file PATH, text on stdin "
            "(echo TEXT | attnzoo generate ...) or --prompt-ids 1,2,3"
        )
    if args.prompt_ids is not None:
        text = args.prompt_ids.strip()
        # "1,2", "1, 2" and "1 2" are lists; "1,,2" and "1,2," have an empty place, not a shorter list
        items = re.split(r"\s*,\s*|\s+", text) if text else []
        if any(not p for p in items):
            raise CliError(f"--prompt-ids {args.prompt_ids!r} has an empty place: give token ids separated by commas")
        try:
            ids = [int(p) for p in items]
        except ValueError:
            raise CliError(f"--prompt-ids {args.prompt_ids!r}: give token ids separated by commas, e.g. 1,2") from None
        if not ids or any(i < 0 for i in ids):
            raise CliError(f"--prompt-ids {args.prompt_ids!r}: give non-negative token ids, e.g. 1,2,3")
        return ids
    if tok is None:
        if source.is_dir():
            raise CliError(f"--prompt TEXT needs a tokenizer.json in {source}; or give --prompt-ids 1,2,3")
        whole_model(source)  # a block export has no tokenizer either, and that is not the point
        raise CliError(
            f"--prompt TEXT needs {tokenizer_beside(source)} (`attnzoo export --checkpoint DIR --whole` writes it "
            "from the checkpoint's tokenizer.json) or a tokenizer.json beside the .onnx; or give --prompt-ids 1,2,3"
        )
    ids = tok.encode(args.prompt).ids
    if not ids:
        raise CliError(f"--prompt {args.prompt!r} encodes to no tokens; give some text")
    return ids


def _refuse_export_flags(args: argparse.Namespace, source: Path) -> None:
    """--precision, --dtype and --max-len choose a folder's export; a .onnx was made with its own: say which,
    and how to make another."""
    given = [
        f"--{name} {value}"
        for name, value, unset in (
            ("precision", args.precision, "fp32"),
            ("kv-precision", args.kv_precision, "fp32"),
            ("dtype", args.dtype, "float32"),
            ("max-len", args.max_len, None),
        )
        if value != unset
    ]
    if not given:
        return
    from runtime.core import SessionError, onnx_metadata

    try:
        meta = onnx_metadata(source)
    except SessionError:  # not an ONNX file: OnnxSession says so after this
        meta = {}
    made = (
        f" ({meta.get('attnzoo.precision', 'fp32')}, max_len {meta.get('attnzoo.max_len', 'per call')}, "
        f"{meta.get('attnzoo.dtype', 'float32')})"
    )
    raise CliError(
        f"{' and '.join(given)}: {source} is an export with its own precision, max_len and dtype"
        f"{made if meta else ''}; "
        f"for others, export the checkpoint again: attnzoo export --checkpoint DIR --whole {' '.join(given)} "
        "-o NEW.onnx"
    )


def _check_vocab(args, ids: list[int], vocab: int) -> None:
    """The prompt's ids and --eos-token-id inside the model's vocabulary (a folder: before its export)."""
    past = [i for i in ids if i >= vocab]
    if past:
        raise CliError(f"token id {past[0]} is past the vocabulary ({vocab} tokens: ids 0..{vocab - 1})")
    for eos in args.eos_token_id or ():
        if eos >= vocab:
            raise CliError(f"--eos-token-id {eos} is past the vocabulary ({vocab} tokens): no token can end")


def _check_device(args: argparse.Namespace) -> None:
    """--cuda-graph and a folder's half --dtype ask for CUDA: their rules (runtime.providers), before any export
    (an .onnx carries its own dtype and padding, which its session checks when it opens)."""
    from runtime.providers import cuda_graph_refusal, dtype_refusal

    dtype = None if args.source.endswith(".onnx") else args.dtype
    why = cuda_graph_refusal(args.provider, dtype) if args.cuda_graph else None
    why = why or (dtype_refusal(args.provider, dtype) if dtype else None)
    if why:
        raise CliError(why)


def _seq2seq_cached(args: argparse.Namespace, folder: Path) -> Path:
    """Where an encoder-decoder folder's pair is cached (PATH: PATH.encoder.onnx and PATH.decoder.onnx)."""
    key = _export_key(folder, args.precision, None, generation=True)
    return _cache_root() / "seq2seq" / f"{folder.resolve().name}-{key}.onnx"


def _seq2seq(args: argparse.Namespace, source: Path) -> int:
    from . import cmd_seq2seq

    if args.dtype != "float32":
        raise CliError(f"--dtype {args.dtype} is for decoder-only folders; an encoder-decoder pair runs float32")
    cached = _seq2seq_cached(args, source) if source.is_dir() else source
    return cmd_seq2seq.cmd_generate(args, source, cached, lambda tok: _prompt_ids(args, tok, source))


def cmd_generate(args: argparse.Namespace) -> int:
    import sys
    import warnings

    if args.json:
        ensure_writable_parent(Path(args.json))
    _check_device(args)
    read_prompt(args)  # --prompt-file, or a piped stdin
    refuse_broken_cuda(args.provider)  # before an export: a machine without CUDA learns it at once
    from . import cmd_seq2seq

    # an encoder-decoder pair is named by its base PATH (PATH.encoder.onnx, PATH.decoder.onnx) or either file
    if cmd_seq2seq.is_seq2seq_export(Path(args.source)):
        return _seq2seq(args, Path(args.source))
    source = source_path(args.source)  # a folder, an .onnx, or the shipped model's bare name; else the closest names
    import numpy as np

    from runtime.generation import Generation, generation_defaults, lm_vocab, positions_needed
    from runtime.session import OnnxSession

    args.source = str(source)
    config = model_path = None
    if source.is_dir():
        from runtime.providers import choose

        data = checkpoint_config(args.source)[1]  # before anything else: is it a checkpoint at all
        target = "cuda" if choose(args.provider)[0] else "cpu"  # export for where the session will run
        model_path = cached_lm(
            source,
            args.precision,
            args.max_len,
            target=target,
            dtype=args.dtype,
            kv_precision=args.kv_precision,
            all_logits=speculates(args),
        )  # a cache hit reads no model (no torch); a miss learns the folder's family first
        if model_path is None and (
            cmd_seq2seq.is_seq2seq_export(_seq2seq_cached(args, source)) or cmd_seq2seq.is_seq2seq_folder(source)
        ):
            return _seq2seq(args, source)
        if model_path is None:
            check_generate_family(source, data)  # an encoder: `attnzoo embed`; another family: which ones are read
        config = generation_config(source) or {}
    else:
        _refuse_export_flags(args, source)
        model_path = source
    tok = _tokenizer(source)
    if args.chat or args.messages is not None:
        chat_prompt(args, tok, source)
    ids = _prompt_ids(args, tok, source)  # before the export: a mistake costs nothing
    if config is not None:
        beams_asked(args, config)  # a folder's beam settings and the flags they refuse, before its export
    if source.is_dir():
        needed = positions_needed(len(ids), args.max_new_tokens)
        if args.max_len is not None and needed > args.max_len:
            raise CliError(
                f"--max-len {args.max_len}: a prompt of {len(ids)} tokens and {args.max_new_tokens} new ones need "
                f"{needed} cache positions; pass --max-len {needed} or more"
            )
    if model_path is None:
        model_path = exported(
            args.source,
            args.precision,
            args.max_len,
            lambda model: _check_vocab(args, ids, model.spec.vocab),
            target=target,
            dtype=args.dtype,
            kv_precision=args.kv_precision,
            quiet=args.quiet,
            all_logits=speculates(args),
        )
    if args.stop and tok is None:
        raise CliError("--stop matches text: it needs a tokenizer.json (see --prompt)")
    sess = OnnxSession(
        model_path,
        provider=args.provider,
        threads=args.threads,
        verbose=args.provider != "cpu",
        tf32=args.tf32,
        cuda_graph=args.cuda_graph,
    )
    if not sess.is_lm:
        raise CliError(f"{model_path} is not a whole-model export; make one: attnzoo export --checkpoint DIR --whole")
    _check_vocab(args, ids, lm_vocab(sess))
    beams = beams_asked(args, config if config is not None else generation_defaults(sess))
    if beams.on:
        if speculates(args):
            raise CliError(
                "--prompt-lookup and --draft verify one sequence a row: not with beam search (--num-beams 1)"
            )
        return run_beams(args, sess, ids, tok, config, beams, model_path, args.source)
    extra = {}
    if args.draft is not None:
        extra["assistant_model"] = draft_session(args)
    elif args.draft_tokens is not None:
        raise CliError("--draft-tokens K goes with --draft FOLDER (the model that proposes them)")
    with warnings.catch_warnings():  # a key the checkpoint sets that is not applied: the note line below
        warnings.simplefilter("ignore", UserWarning)
        run = Generation(
            sess,
            np.array([ids], np.int64),
            args.max_new_tokens,
            tokenizer=tok,
            generation_config=config,
            **options(args),
            **extra,
        )
    if run.note:
        print(f"note   the checkpoint's generation_config.json sets {run.note}: not applied")
    if source.is_dir():  # past the positions the model was made for, a rotary or position table extrapolates
        made_for = _max_positions(source)
        if made_for is not None and len(ids) + args.max_new_tokens > made_for:
            print(
                f"attnzoo generate: warning: {len(ids)} prompt + {args.max_new_tokens} new tokens go past the "
                f"{made_for} positions {source.name} was made for (max_position_embeddings): expect nonsense there",
                file=sys.stderr,
            )
    live = sys.stdout.isatty() if args.stream is None else args.stream
    total = run_live(run, tok, ids, live)
    if total is None:
        return 130
    timings = dict(run.timings)
    tokens = run.tokens
    new = tokens.shape[1] - len(ids)
    timings.update(total_s=total, new_tokens=new, tokens_per_s=new / total if total else None)
    row = tokens[0].tolist()
    # the new tokens in full; the prompt's ids only at their ends (a long prompt echoed whole drowned them)
    head = " ".join(map(str, ids[:6])) + (f" ... ({len(ids)} prompt ids)" if len(ids) > 6 else "")
    print("tokens", head, "->", " ".join(map(str, row[len(ids) :])))
    text = run.texts[0] if tok is not None else None
    if tok is not None and not live:
        print("text  ", repr(short(tok.decode(ids))), "->", repr(text))
    step = timings["decode_s"] / max(timings["steps"], 1)
    how = "greedy" if not run.params.do_sample else f"sampled, seed {run.seed}"
    spec = timings.get("speculation")
    if spec:
        print(
            f"spec   {spec['kind']} (k {spec['k']}): {spec['accepted']} of {spec['proposed']} candidates kept "
            f"(acceptance {spec['acceptance_rate']:.2f}), {spec['tokens_per_target_call']:.2f} tokens per target "
            f"call ({spec['target_calls']} calls)"
        )
    print(
        f"took   {total:.3f} s for {new} new tokens ({new / total:.1f} tokens/s end to end; prefill "
        f"{1e3 * timings['prefill_s']:.1f} ms, {1e3 * step:.2f} ms per decode step), {sess.precision}, "
        f"on {sess.provider}, {how}, finish: {run.finish_reason[0]}"
    )
    if args.json:
        doc = {
            "tokens": tokens.tolist(),
            "text": [text] if text is not None else None,
            "finish_reason": run.finish_reason,
            "seed": run.seed,
            "timings": timings,
            "source": args.source,
            "model": str(model_path),
            "precision": sess.metadata.get("attnzoo.precision", "fp32"),
            "kv_precision": sess.metadata.get("attnzoo.kv_precision", "fp32"),
            "precision_method": sess.precision if "attnzoo.precision.method" in sess.metadata else None,
            "provider": sess.provider,
        }
        write_atomic(Path(args.json), lambda tmp: tmp.write_text(json.dumps(doc, indent=2)))
        print(f"wrote {args.json}")
    return 0


def add_commands(sub) -> None:
    sp = sub.add_parser(
        "generate",
        help="tokens (greedy, sampled or beam search) from a checkpoint folder or a whole-model .onnx, under ONNX "
        "Runtime",
        description="Generation under ONNX Runtime (greedy unless a sampling or beam flag or the checkpoint says so). "
        "A checkpoint folder (config.json + *.safetensors) "
        "is exported whole once (cached in ATTNZOO_CACHE, default ~/.cache/attnzoo); a .onnx is a whole-model "
        "export (attnzoo export --checkpoint DIR --whole, which writes MODEL.tokenizer.json beside it from the "
        "checkpoint's tokenizer.json). With a tokenizer, --prompt takes text.",
    )
    sp.add_argument(
        "source",
        metavar="FOLDER|MODEL.onnx",
        help="a transformers checkpoint folder (config.json + *.safetensors) or a whole-model export",
    )
    sp.add_argument("--prompt", help="the prompt as text (needs the folder's tokenizer.json, or MODEL.tokenizer.json)")
    sp.add_argument("--prompt-ids", metavar="1,2,3", help="the prompt as token ids")
    sp.add_argument("--max-new-tokens", type=positive, default=32, help="tokens to generate (default 32)")
    sp.add_argument("--precision", default="fp32", choices=PRECISIONS, help="a folder's export precision")
    sp.add_argument(
        "--dtype",
        default="float32",
        choices=DTYPES,
        help="a folder's export: the activations' float type (default float32; float16 and bfloat16 are for "
        "--provider cuda, with --precision fp32, int8 or int4: not yet run on a GPU, docs/gpu.md)",
    )
    sp.add_argument(
        "--kv-precision",
        default="fp32",
        choices=KV_PRECISIONS,
        help="a folder's export: the KV cache's precision (default fp32; int8: a quarter of the cache's bytes, "
        "lossy, docs/generation.md)",
    )
    sp.add_argument(
        "--max-len",
        type=positive,
        default=None,
        help="a folder's export: the most cache positions a call allocates (default: the checkpoint's maximum "
        "positions when its rotary cos/sin tables of that many rows fit one stored constant, else no cap; "
        "each call's buffers are what it needs)",
    )
    sp.add_argument("--threads", type=positive, default=None, help="ONNX Runtime's intra-op threads")
    sp.add_argument(
        "--provider",
        default="cpu",
        choices=PROVIDERS,
        help="where ONNX Runtime runs (default cpu; cuda fails in one line where it does not work; auto says which)",
    )
    with_tf32(sp)
    sp.add_argument(
        "--cuda-graph",
        action="store_true",
        help="capture the decode step as a CUDA graph and replay it (with --provider cuda; a packed-rows export: a "
        "folder's export for CUDA in float16 or bfloat16 is one). Not yet run on a GPU: docs/gpu.md",
    )
    sp.add_argument(
        "--eos-token-id",
        type=number_in(int, 0),
        action="append",
        default=None,
        metavar="ID",
        help="stop a row when it makes this token (repeat for several; default: the checkpoint's "
        "generation_config.json eos_token_id)",
    )
    add_generation_flags(sp)
    sp.add_argument("--quiet", "-q", action="store_true", help="no progress bar (a folder's first export)")
    add_speculation_flags(sp)
    sp.add_argument(
        "--json",
        metavar="PATH",
        help="also write JSON: tokens (the prompt followed by the new tokens), text (the new tokens decoded, "
        "with a tokenizer.json), timings, source, model (the .onnx run), precision, precision_method, provider",
    )
    sp.set_defaults(func=cmd_generate)
