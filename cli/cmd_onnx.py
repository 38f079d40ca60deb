"""The ONNX commands: export, run, parity."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import zoo
from export.choice import AUTO_PREFERENCE, TARGETS
from export.names import (
    CACHE_CHOICES,
    CACHES,
    DEFAULT_MAX_LEN,
    DEVICES,
    DTYPES,
    KV_PRECISIONS,
    LOWERINGS,
    PRECISIONS,
    PROVIDERS,
    SESSION_DTYPES,
)
from zoo.files import ensure_writable_parent, write_atomic

from .common import CliError, choice_list, positive, source_of, with_set, with_source, with_tf32


def _block(args: argparse.Namespace, source: str) -> tuple[zoo.MultiHeadAttention, str]:
    """The block --config (random weights, seed 0) or --checkpoint (its weights) names, with a label."""
    import torch

    layer = args.layer or 0
    if source == "checkpoint":
        return zoo.from_checkpoint(args.checkpoint, layer=layer), f"{args.checkpoint} layer {layer}"
    spec = zoo.spec_from_config(args.config, layer=layer)
    spec = spec.replace(**zoo.parse_overrides(args.set)) if args.set else spec
    torch.manual_seed(0)
    return zoo.MultiHeadAttention(spec).eval(), f"{args.config} layer {layer} (random weights)"


def cmd_export(args: argparse.Namespace) -> int:
    from export.writer import export_onnx

    if args.whole:  # the whole model of a checkpoint, one graph (cli/cmd_generate.py)
        from .cmd_export_whole import export_whole

        return export_whole(args)
    if args.kv_precision != "fp32" or args.padding != "auto":
        flag = f"--kv-precision {args.kv_precision}" if args.kv_precision != "fp32" else f"--padding {args.padding}"
        raise CliError(f"{flag} is a whole model's: add --checkpoint DIR --whole")
    source = source_of(args, "name")
    what, overrides, label = args.name, zoo.parse_overrides(args.set), None
    if source != "name":
        ensure_writable_parent(args.output)  # before reading a checkpoint
        what, label = _block(args, source)
        overrides = {}
        print(f"block     {label}: {what.spec.describe()}")
    result = export_onnx(
        what,
        args.output,
        lowering=args.lowering,
        dtype=args.dtype,
        need_weights=args.weights,
        with_mask=args.mask,
        with_head_mask=args.head_mask,
        overwrite=args.force,
        provider=args.target,
        decode=args.decode,
        cache=args.cache,
        max_len=args.max_len,
        precision=args.precision,
        label=label,
        **overrides,
    )
    print(result.summary())
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    import numpy as np
    import torch

    from bench.timing import repeat_timed
    from export.tracing import DTYPES, example_inputs
    from runtime.io import interface
    from runtime.session import OnnxSession

    sess = OnnxSession(args.path, provider=args.provider, threads=args.threads, verbose=False, tf32=args.tf32)
    if args.threads:
        torch.set_num_threads(args.threads)
    spec = sess.spec
    if sess.is_lm:
        raise CliError(f"{args.path} is a whole model; run it with `attnzoo generate {args.path} --prompt-ids 1,2,3`")
    if spec is None:
        raise CliError(
            f"{args.path} carries no attnzoo metadata; `attnzoo run` needs a model written by `attnzoo export`"
        )
    if args.ctx_seq is not None and not spec.is_cross:
        raise CliError(
            f"--ctx-seq {args.ctx_seq}: {args.path} is self-attention (its keys are x itself, s = t); "
            f"give -s only for cross-attention models"
        )
    if sess.is_decode:
        return _run_decode(sess, args)
    sess.check_size(args.batch, args.seq, args.ctx_seq or args.seq)  # before the inputs are made
    ins, _ = interface(
        spec,
        need_weights=False,
        with_mask="mask" in sess.input_names,
        with_head_mask="head_mask" in sess.input_names,
    )
    dtype = DTYPES["float16" if sess.dtype == np.float16 else "float32"]
    feeds = example_inputs(spec, ins, dtype, args.batch, args.seq, args.ctx_seq or args.seq)
    device = "cuda" if sess.provider == "cuda" else "cpu"
    feeds = {k: v.to(device) for k, v in feeds.items()}
    call = lambda: sess.run(feeds["x"], feeds.get("context"), feeds.get("mask"), feeds.get("head_mask"))  # noqa: E731
    out = call()  # warm-up (first run allocates)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    times = [t * 1e3 for t in repeat_timed(call, args.repeats, sync=sync)]
    outs = out if isinstance(out, tuple) else (out,)
    name = sess.metadata.get("attnzoo.name", "?")
    print(
        f"model     {args.path}: {name}, lowering {sess.metadata.get('attnzoo.lowering', '?')}, "
        f"{sess.metadata.get('attnzoo.dtype', '?')}"
    )
    print(f"precision {sess.precision}")
    print(f"provider  {sess.provider} (asked: {args.provider}; session providers: {sess.session_providers})")
    if sess.note:
        print(f"          {sess.note.split(': ', 1)[-1]}")
    shapes = ", ".join(f"{k} {tuple(v.shape)}" for k, v in feeds.items())
    print(f"inputs    {shapes}")
    print("outputs   " + ", ".join(f"{n} {tuple(o.shape)}" for n, o in zip(sess.output_names, outs)))
    finite = all(bool(torch.isfinite(o).all()) for o in outs)
    print(f"finite    {finite}")
    print(
        f"latency   median {statistics.median(times):.3f} ms over {args.repeats} runs "
        f"(min {min(times):.3f}, max {max(times):.3f})"
    )
    if args.placement:
        placed = sess.summarize_placements(
            sess.node_placements(feeds["x"], feeds.get("context"), feeds.get("mask"), feeds.get("head_mask"))
        )
        print(
            "placement "
            + "; ".join(
                f"{op}: " + ", ".join(f"{p.replace('ExecutionProvider', '')} x{n}" for p, n in d.items())
                for op, d in placed.items()
            )
        )
    return 0 if finite else 1


def _run_decode(sess, args: argparse.Namespace) -> int:
    """A prompt of --seq positions, then --steps single-token steps; per-token latency."""
    import numpy as np

    spec = sess.spec
    b, t, steps = args.batch, args.seq, args.steps
    sess.check_size(b, t + steps, t + steps)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((b, t + steps, spec.d_model)).astype(sess.dtype)
    sess.generate_steps(x[:, : min(steps, 4) or 1])  # warm-up (first runs allocate)
    t0 = time.perf_counter()
    y0, pk, pv = sess.decode(x[:, :t])
    prompt_ms = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    ys, pk, pv = sess.generate_steps(x[:, t:], pk, pv)
    step_ms = (time.perf_counter() - t0) * 1e3 / max(steps, 1)
    finite = bool(np.isfinite(y0).all() and np.isfinite(ys).all())
    name = sess.metadata.get("attnzoo.name", "?")
    cache = sess.cache + (
        f" cache of capacity {sess.metadata.get('attnzoo.max_len')}" if sess.cache == "static" else " cache"
    )
    lowering = sess.metadata.get("attnzoo.lowering", "?")
    print(f"model     {args.path}: {name}, decode ({cache}), lowering {lowering}, {sess.dtype}")
    print(f"precision {sess.precision}")
    print(f"provider  {sess.provider} (asked: {args.provider}; session providers: {sess.session_providers})")
    print(f"prompt    x ({b}, {t}, {spec.d_model}) with an empty cache: {prompt_ms:.3f} ms")
    print(
        f"steps     {steps} x (b={b}, t=1), cache {t} -> {t + steps} positions {tuple(pk.shape)}: "
        f"{step_ms:.3f} ms per token ({1e3 / step_ms * b if step_ms else float('inf'):,.0f} tokens/s)"
    )
    print(f"finite    {finite}")
    return 0 if finite else 1


def cmd_parity(args: argparse.Namespace) -> int:
    from parity.matrix import CASES, format_matrix, run_parity
    from runtime.session import cuda_status

    lowerings = args.lowering or list(LOWERINGS)
    providers = list(dict.fromkeys(args.provider or ["cpu"]))
    if "auto" in providers:  # CUDA where it works, said in one line where it does not
        ok, why = cuda_status()
        providers = [p for p in providers if p != "auto"] + [p for p in DEVICES if p not in providers]
        if not ok:
            providers.remove("cuda")
            print(f"attnzoo parity: provider auto: no CUDA ({why}); CPU only", file=sys.stderr)
    elif "cuda" in providers:
        ok, why = cuda_status()
        if not ok:  # asked for by name: a run that tests nothing must not pass
            raise CliError(f"--provider cuda: {why}; drop it, or use --provider auto to include CUDA where it works")
    dtypes = args.dtype or ["float32"]
    precisions = list(dict.fromkeys(args.precision or ["fp32"]))
    if args.cache and not args.decode:
        raise CliError("--cache chooses the decode check's cache: add --decode")
    caches = list(dict.fromkeys(args.cache or CACHES))
    cases = [f"decode-{c}".replace("-grow", "") for c in caches] if args.decode else (args.case or list(CASES))
    implicit = args.pattern is None and args.checkpoint is None and args.layer is None  # all names
    source = "name" if implicit else source_of(args, "pattern")
    if source == "checkpoint" and args.decode:
        raise CliError("--decode checks registered names; --checkpoint runs the plain and masked cases")
    names = zoo.names(args.pattern or "*") if source == "name" else [args.checkpoint]
    block = _block(args, "checkpoint")[0].float() if source == "checkpoint" else None  # refusals before the bar
    if not names:
        raise CliError(f"no attention block matches {args.pattern!r}; see `attnzoo list`")
    if args.json:
        ensure_writable_parent(Path(args.json))
    total = len(names) * len(lowerings) * len(providers) * len(dtypes) * len(precisions) * len(cases)
    from zoo.progress import bar as progress_bar

    bar = progress_bar(total, "parity", unit="check", disable=args.quiet)

    def progress(row):
        bar.set_postfix_str(f"{row.name} {row.lowering} {row.dtype} {row.precision} {row.case}: {row.status}")
        bar.update()

    try:
        if source == "checkpoint":
            rows = _checkpoint_parity(block, args, lowerings, providers, dtypes, cases, progress)
        else:
            rows = run_parity(
                args.pattern or "*",
                lowerings=lowerings,
                providers=providers,
                dtypes=dtypes,
                cases=cases,
                precisions=precisions,
                progress=progress,
                tf32=args.tf32,
                **zoo.parse_overrides(args.set),
            )
    finally:
        bar.close()
    print(format_matrix(rows))
    if args.json:
        write_atomic(
            Path(args.json), lambda tmp: tmp.write_text(json.dumps([r.to_dict() for r in rows], indent=2, default=str))
        )
        print(f"wrote {args.json}")
    if any(r.status == "FAIL" for r in rows):
        return 1
    if not any(r.status == "PASS" for r in rows):
        print("attnzoo parity: every check was skipped: nothing was tested", file=sys.stderr)
        return 1
    return 0


def _checkpoint_parity(block, args, lowerings, providers, dtypes, cases, progress) -> list:
    """run_parity's matrix for one checkpoint layer's block (rows named DIR:layerN)."""
    from parity.matrix import check

    label = f"{args.checkpoint}:layer{args.layer or 0}"
    rows = []
    for lw in lowerings:
        for prov in providers:
            for dt in dtypes:
                for case in cases:
                    row = check(block, lw, case=case, dtype=dt, provider=prov, tf32=args.tf32)
                    row.name = label
                    rows.append(row)
                    progress(row)
    return rows


def _bounds() -> str:
    from export.names import ERROR_BOUNDS  # export.precision reads the lowerings' records (torch)

    return ", ".join(f"{ERROR_BOUNDS[p]:.0%} ({p})" for p in PRECISIONS if p != "fp32").replace("%", "%%")  # argparse


def add_commands(sub) -> None:
    lowering_help = (
        f"one of {', '.join(LOWERINGS)}, or auto (default): the measured-fastest that can express the "
        f"request (cpu: {' > '.join(AUTO_PREFERENCE[('cpu', 'unmasked')])}; "
        f"with a causal or user mask {' > '.join(AUTO_PREFERENCE[('cpu', 'masked')])})"
    )
    sp = sub.add_parser(
        "export",
        help="export a zoo entry, a checkpoint's layer or its whole model to ONNX",
        description="Export a registered block (NAME), one layer of a transformers checkpoint with its weights "
        "(--checkpoint DIR --layer N) or of a config with random weights (--config config.json --layer N), "
        "or a checkpoint's whole model as one graph with a static cache (--checkpoint DIR --whole).",
    )
    sp.add_argument("name", nargs="?", help="a registered name (or give --config / --checkpoint)")
    with_source(sp)
    sp.add_argument("-o", "--output", required=True, help="the .onnx file to write")
    sp.add_argument("--lowering", default="auto", choices=["auto", *LOWERINGS], help=lowering_help)
    sp.add_argument(
        "--dtype",
        default="float32",
        choices=DTYPES,
        help="the graph's float type (default float32; float16 runs where the provider has the kernels; bfloat16 "
        "is for --target cuda)",
    )
    sp.add_argument("--weights", action="store_true", help="also output the attention weights (decomposed only)")
    sp.add_argument("--mask", action="store_true", help="add a bool mask input (b, t, s), True = may attend")
    sp.add_argument("--head-mask", action="store_true", help="add a head_mask input (b, h)")
    sp.add_argument(
        "--target",
        default="cpu",
        choices=TARGETS,
        help="the provider lowering=auto optimises for (default cpu)",
    )
    sp.add_argument(
        "--decode",
        action="store_true",
        help="a token-by-token model with a KV cache: inputs x, past_key, past_value (+ key_mask with --mask); "
        "outputs y, present_key, present_value",
    )
    sp.add_argument(
        "--cache",
        default="auto",
        choices=CACHE_CHOICES,
        help="with --decode: static (buffers of capacity --max-len written in place: inputs past_key/past_value "
        "(b, g, n, d) and past_len), grow (each call returns a new, longer present), or auto (default: the "
        "measured-faster for --target where the lowering keeps it: static on the CPU)",
    )
    sp.add_argument(
        "--max-len",
        type=positive,
        default=None,
        help=f"with --cache static: the cache's capacity, recorded in the model (default {DEFAULT_MAX_LEN}); "
        "with --whole: the most positions a call allocates (default: the checkpoint's maximum positions when its "
        "rotary cos/sin tables of that many rows fit one stored constant, else no cap)",
    )
    sp.add_argument(
        "--precision",
        default="fp32",
        choices=PRECISIONS,
        help="weight precision (default fp32): int8 / int4 = weight-only 8-bit / 4-bit MatMulNBits (block 32, "
        "accuracy_level 4: activations quantized per row inside the kernel); quantized by onnxruntime.quantization "
        "after the lowering, float32 only",
    )
    sp.add_argument(
        "--kv-precision",
        default="fp32",
        choices=KV_PRECISIONS,
        help="with --whole: the KV cache's precision (default fp32); int8 = int8 keys and values with a scale per "
        "position and kv head, read by integer products (the decomposed lowering; its error: docs/generation.md)",
    )
    sp.add_argument(
        "--padding",
        default="auto",
        choices=("auto", "left", "packed"),
        help="with --whole: the graph's rows (default auto: packed for --target cuda where GroupQueryAttention is "
        "spliced, else left); packed = each row from cache slot 0, lengths through seqlens_k, no attention bias "
        "(docs/generation.md, the padding rule)",
    )
    sp.add_argument(
        "--whole",
        action="store_true",
        help="with --checkpoint DIR: the whole decoder model as one graph (input_ids, attention_mask, past_len, "
        "past_key_values.N.key/.value -> logits, next_token, present.N.key/.value; static cache), for generate; "
        "an encoder or sentence-transformers folder as its embeddings' graph (input_ids, attention_mask "
        "[, token_type_ids] -> sentence_embedding), for embed; "
        "the checkpoint's tokenizer.json is copied beside it as PATH's stem + .tokenizer.json",
    )
    sp.add_argument("--force", action="store_true", help="overwrite an existing file")
    sp.add_argument("--quiet", "-q", action="store_true", help="no progress bar (a --whole export's stages)")
    with_set(sp)
    sp.set_defaults(func=cmd_export)

    sp = sub.add_parser(
        "run",
        help="run an exported block on random input under ONNX Runtime",
        description="Run a block written by `attnzoo export` on random input under ONNX Runtime: its inputs and "
        "outputs, the provider that ran it and the median latency (a whole model: `attnzoo generate`).",
    )
    sp.add_argument("path", help="the .onnx file `attnzoo export` wrote")
    sp.add_argument(
        "--provider", default="auto", choices=PROVIDERS, help="where it runs (default auto: cuda where it works)"
    )
    sp.add_argument("--batch", "-b", type=positive, default=2, help="B, the batch (default 2)")
    sp.add_argument("--seq", "-t", type=positive, default=16, help="T, the sequence length (default 16)")
    sp.add_argument("--ctx-seq", "-s", type=positive, default=None, help="S for cross-attention (default T)")
    sp.add_argument("--repeats", type=positive, default=20, help="timed runs; the median is printed (default 20)")
    sp.add_argument(
        "--threads",
        type=positive,
        default=None,
        help="ONNX Runtime's intra-op threads (default: its own, a thread per core)",
    )
    sp.add_argument("--placement", action="store_true", help="profile once and print the provider of each op")
    sp.add_argument("--steps", type=positive, default=32, help="decode models: single-token steps after the prompt")
    with_tf32(sp)
    sp.set_defaults(func=cmd_run)

    sp = sub.add_parser(
        "parity",
        help="eager vs ONNX Runtime for every matching variant (exit 1 on FAIL)",
        description="Eager torch against ONNX Runtime for every registered block matching PATTERN (default *), "
        "or for one layer of a transformers checkpoint (--checkpoint DIR --layer N).",
    )
    sp.add_argument("pattern", nargs="?", default=None, help="fnmatch pattern over registered names (default *)")
    with_source(sp, config=False)
    sp.add_argument("--lowering", action="append", choices=LOWERINGS, help="repeatable; default all")
    sp.add_argument(
        "--provider",
        action="append",
        choices=[*DEVICES, "auto"],
        help="repeatable; default cpu. cuda fails where CUDA does not work; auto adds it only where it does",
    )
    sp.add_argument("--dtype", action="append", choices=SESSION_DTYPES, help="repeatable; default float32")
    sp.add_argument("--case", action="append", choices=["plain", "masked"], help="repeatable; default both")
    sp.add_argument(
        "--precision",
        type=choice_list(PRECISIONS),
        action="extend",
        metavar="LIST",
        help=f"weight precisions, e.g. fp32,int8,int4 (repeatable; default fp32). int8/int4 exports are compared "
        f"with the fp32 eager block: the relative L2 error of y must be within {_bounds()}",
    )
    sp.add_argument(
        "--decode",
        action="store_true",
        help="check token-by-token decode exports instead: a prompt of 7 then 25 single steps, batch 1 and 3 "
        "(left-padded), against the eager full forward (non-causal blocks are SKIP)",
    )
    sp.add_argument(
        "--cache",
        action="append",
        choices=CACHES,
        help="with --decode: the cache kinds to check, repeatable; default both (static: lowerings that "
        "cannot keep one are SKIP with the reason)",
    )
    sp.add_argument("--json", help="also write the rows as JSON")
    sp.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    with_set(sp)
    with_tf32(sp)
    sp.set_defaults(func=cmd_parity)
