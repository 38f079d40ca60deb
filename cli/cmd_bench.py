"""`attnzoo bench`: its arguments and their checks; runs the full-sequence or the decode benchmark."""

from __future__ import annotations

import argparse
import importlib.util
import math
import sys
from pathlib import Path

import zoo
from bench.jobs import (  # the vocabulary only: what measures (torch, onnxruntime) is imported when it runs
    CONTENDED,
    DECODE_PATHS,
    DECODE_PRECISIONS,
    DEFAULT_NAME,
    DEFAULT_SEQ,
    PATHS,
    BenchError,
    Budget,
)
from bench.report import PLOT_FORMATS, format_table, plot, write_json
from export.names import DEVICES, PRECISIONS, SESSION_DTYPES

from .bench_serve import add_serve_arguments, run_serve
from .common import choice_list, int_list, with_set, with_tf32


def _path_list(text: str) -> list[str]:
    return [p for p in text.replace(",", " ").split() if p]


def _gguf_map(text: str) -> dict[str, str]:
    """An argparse type: PREC=FILE pairs separated by commas."""
    pairs = [p.split("=", 1) for p in text.split(",") if p]
    if not pairs or any(len(p) != 2 or not p[0] or not p[1] for p in pairs):
        raise argparse.ArgumentTypeError(f"{text!r}: give PREC=FILE pairs, e.g. fp32=a.gguf,int4=b.gguf")
    return dict(pairs)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `attnzoo bench` options (also scripts/bench.py)."""
    parser.add_argument("name", nargs="?", default=DEFAULT_NAME, help=f"a zoo name (default {DEFAULT_NAME})")
    with_set(parser)
    parser.add_argument("--provider", choices=DEVICES, default="cpu", help="where to run (default cpu)")
    with_tf32(parser)
    parser.add_argument(
        "--dtype", choices=SESSION_DTYPES, default="float32", help="the block's float type (default float32)"
    )
    parser.add_argument(
        "--precision",
        type=choice_list(DECODE_PRECISIONS),
        action="extend",
        metavar="LIST",
        help="weight precisions of the ONNX Runtime paths, e.g. fp32,int8,int4 (default fp32; eager paths stay "
        "fp32): int8 / int4 = weight-only 8-bit / 4-bit MatMulNBits (export --precision); each quantized row also "
        "shows its speed-up over the same path in fp32. With --decode also fp16,bf16: eager rows in that dtype",
    )
    parser.add_argument(
        "--batch",
        "-b",
        type=int_list,
        action="extend",
        metavar="LIST",
        help="batch sizes, e.g. 1,4 (default 1)",
    )
    parser.add_argument(
        "--seq",
        "-t",
        type=int_list,
        action="extend",
        metavar="LIST",
        help=f"sequence lengths (default {','.join(map(str, DEFAULT_SEQ))})",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch and ONNX Runtime intra-op threads (default: every usable core)",
    )
    parser.add_argument(
        "--paths",
        type=_path_list,
        default=list(PATHS),
        metavar="LIST",
        help=f"a subset of {','.join(PATHS)}; with --decode of {','.join(DECODE_PATHS)}",
    )
    parser.add_argument("--warmup", type=int, default=Budget.warmup, help="warm-up calls (default %(default)s)")
    parser.add_argument("--repeats", type=int, default=Budget.repeats, help="timed calls at most (default %(default)s)")
    parser.add_argument(
        "--min-repeats",
        type=int,
        default=Budget.min_repeats,
        help="timed calls at least (default %(default)s)",
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=Budget.seconds,
        metavar="SECONDS",
        help="stop timing a path after this long, once --min-repeats are done (default %(default)s)",
    )
    parser.add_argument(
        "--roofline-size",
        type=int,
        default=None,
        metavar="N",
        help="n of the n^3 matmul roofline (default: the largest power of two, up to 2048 on cpu and 8192 on "
        "cuda, whose product takes at most about 50 ms here)",
    )
    parser.add_argument(
        "--retries",
        type=int,
        default=2,
        help=f"re-measure a path while other processes use over {CONTENDED} CPUs (default %(default)s)",
    )
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per measurement process (default 1800)")
    parser.add_argument("--json", metavar="PATH", help="write the full report as JSON")
    parser.add_argument("--plot", metavar="PATH", help="write a PNG of latency and memory against T")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    parser.add_argument(
        "--decode",
        action="store_true",
        help="per-token decode latency instead: eager block.decode vs each decode lowering's generate_steps",
    )
    parser.add_argument(
        "--past",
        type=int_list,
        action="extend",
        metavar="LIST",
        help="with --decode: past lengths, e.g. 128,1024,4096,16384 (the default)",
    )
    add_serve_arguments(parser)
    gen = parser.add_argument_group("whole-model generation (--generate; bench/generate.py)")
    gen.add_argument(
        "--generate",
        action="store_true",
        help="greedy generation from --checkpoint, each path in its own process: attnzoo's ONNX export, "
        "transformers' generate (dynamic and static cache), onnxruntime-genai and llama.cpp from their environments",
    )
    gen.add_argument(
        "--checkpoint",
        metavar="DIR",
        help="with --generate: a transformers checkpoint folder, or 'random' for the benchmark's random LLaMA",
    )
    gen.add_argument(
        "--prompt", type=int_list, action="extend", metavar="LIST", help="prompt lengths (default 128,1024)"
    )
    gen.add_argument("--new", type=int, default=64, metavar="N", help="new tokens per call (default %(default)s)")
    gen.add_argument(
        "--num-beams",
        type=int,
        default=1,
        metavar="K",
        help="beam search with K beams on attnzoo and transformers (eos off; default 1: greedy)",
    )
    gen.add_argument(
        "--rounds",
        type=int,
        default=1,
        metavar="N",
        help="time every path N times over, path after path in each round (a fresh process each time), and keep "
        "each row's best round: a machine whose speed drifts then slows every path alike (default %(default)s)",
    )
    gen.add_argument(
        "--cuda-graph",
        action="store_true",
        help="with --provider cuda: attnzoo's decode step captured as a CUDA graph (generate --cuda-graph; not yet "
        "run on a GPU: docs/gpu.md)",
    )
    gen.add_argument("--genai-python", metavar="PATH", help="the python of an environment with onnxruntime-genai")
    gen.add_argument(
        "--llama-python",
        metavar="PATH",
        help="the python of an environment with llama-cpp-python, numpy, gguf and safetensors: the bench writes "
        "each precision's GGUF there (F32; int8 Q8_0, int4 Q4_0 by llama_model_quantize) unless --gguf gives it",
    )
    gen.add_argument(
        "--speculative",
        action="store_true",
        help="with --generate: speculative decoding side by side (bench/generate_spec.py): attnzoo and transformers "
        "plain, with prompt lookup and with --draft DIR; with --llama-python / --genai-python llama.cpp's and "
        "onnxruntime-genai's own too",
    )
    gen.add_argument(
        "--workload",
        type=_path_list,
        default=["grounded", "free"],
        metavar="LIST",
        help="with --speculative: grounded = the prompt ends by repeating its own start (the continuation is in "
        "the prompt), free = the bench's text continued (default grounded,free)",
    )
    gen.add_argument("--spec-k", type=int, default=10, metavar="K", help="with --speculative: candidates a round")
    gen.add_argument("--ngram", type=int, default=3, metavar="N", help="with --speculative: prompt lookup's n-gram")
    gen.add_argument("--draft", metavar="DIR", help="with --speculative: a draft checkpoint of the same tokenizer")
    gen.add_argument(
        "--gguf",
        type=_gguf_map,
        default={},
        metavar="PREC=FILE,...",
        help="with --llama-python: bring your own GGUF for a precision instead of the one the bench writes, "
        "e.g. fp32=model-f32.gguf,int4=model-q4_0.gguf",
    )


def _check_flags(args: argparse.Namespace) -> None:
    """Every numeric flag in range and finite, and the plot's name says its format."""
    ints = {
        "--threads": (args.threads, 1, 1024),
        "--warmup": (args.warmup, 0, 10**6),
        "--repeats": (args.repeats, 1, 10**7),
        "--min-repeats": (args.min_repeats, 1, 10**7),
        "--retries": (args.retries, 0, 100),
        "--rounds": (args.rounds, 1, 1000),
        "--roofline-size": (args.roofline_size, 1, 65536),
    }
    for flag, (value, low, high) in ints.items():
        if value is not None and not low <= value <= high:
            raise BenchError(f"{flag} {value} is outside {low}..{high}")
    if args.min_repeats > args.repeats and not args.generate:  # --generate times whole calls: --repeats alone
        raise BenchError(f"--min-repeats {args.min_repeats} is more than --repeats {args.repeats}")
    for flag, value in (("--budget", args.budget), ("--timeout", args.timeout)):
        if not math.isfinite(value) or value <= 0:
            raise BenchError(f"{flag} {value} must be a positive number of seconds")
    if args.timeout < args.budget:
        raise BenchError(
            f"--timeout {args.timeout:g} s is shorter than --budget {args.budget:g} s: every path would time out"
        )
    if args.plot and Path(args.plot).suffix.lower().lstrip(".") not in PLOT_FORMATS:
        raise BenchError(f"--plot {args.plot}: name a .png, .svg or .pdf file (the suffix is the format)")
    if args.plot and importlib.util.find_spec("matplotlib") is None:  # before minutes of measuring
        raise BenchError("--plot needs matplotlib: pip install 'attnzoo[plot]' (or drop --plot)")


def run_from_args(args: argparse.Namespace) -> int:
    """`attnzoo bench`: measure, print the markdown table, write JSON and the plot."""

    _check_flags(args)
    from zoo.files import ensure_writable_parent

    if args.serve:  # the serving benchmark against llama-server (cli/bench_serve.py)
        return run_serve(args)
    for out in (args.json, args.plot):  # fail now, not after minutes of measuring
        if out:
            ensure_writable_parent(Path(out))
    budget = Budget(args.warmup, args.repeats, args.min_repeats, args.budget)
    generate_only = [
        f
        for f, v in (
            ("--checkpoint", args.checkpoint),
            ("--prompt", args.prompt),
            ("--genai-python", args.genai_python),
            ("--llama-python", args.llama_python),
            ("--gguf", args.gguf),
            ("--rounds", args.rounds != 1),
            ("--num-beams", args.num_beams != 1),
            ("--cuda-graph", args.cuda_graph),
            ("--speculative", args.speculative),
            ("--draft", args.draft),
        )
        if v
    ]
    if args.generate:
        return _run_generate_from_args(args)
    if generate_only:
        raise BenchError(f"{', '.join(generate_only)} go(es) with --generate (whole-model generation)")
    if args.decode:
        return _run_decode_from_args(args, budget)
    if args.past:
        raise BenchError("--past goes with --decode (past lengths of the KV cache)")
    eager_only = sorted(set(args.precision or []) - set(PRECISIONS))
    if eager_only:
        raise BenchError(f"--precision {','.join(eager_only)}: eager half-precision rows are a --decode option")
    from bench.plan import benchmark

    report = benchmark(
        args.name,
        overrides=zoo.parse_overrides(args.set),
        provider=args.provider,
        dtype=args.dtype,
        batches=args.batch or [1],
        seqs=args.seq or list(DEFAULT_SEQ),
        threads=args.threads,
        paths=args.paths,
        budget=budget,
        roofline_size=args.roofline_size,
        tf32=args.tf32,
        timeout=args.timeout,
        retries=args.retries,
        progress=not args.no_progress,
        precisions=args.precision or ["fp32"],
    )
    failed = any(r["status"] == "error" for r in report["rows"])
    return _finish(args, report, format_table(report), failed)


def _finish(args: argparse.Namespace, report: dict, table: str, failed: bool) -> int:
    """Print the table, write the JSON and the plot where asked; the exit code (1: a row failed)."""
    print(table)
    if args.json:
        write_json(report, args.json)
        print(f"wrote {args.json}")
    if args.plot:
        why = plot(report, args.plot)
        print(why or f"wrote {args.plot}", file=sys.stderr if why else sys.stdout)
    return 1 if failed else 0


def _run_decode_from_args(args: argparse.Namespace, budget: Budget) -> int:
    from bench.decode import benchmark_decode, format_decode_table
    from bench.jobs import DEFAULT_PAST

    if args.seq or args.plot:
        raise BenchError("--decode measures t = 1 per step: give past lengths with --past (no --seq, no --plot)")
    paths = list(DECODE_PATHS) if args.paths == list(PATHS) else args.paths  # an unknown one is refused
    report = benchmark_decode(
        args.name,
        overrides=zoo.parse_overrides(args.set),
        provider=args.provider,
        dtype=args.dtype,
        batches=args.batch or [1],
        pasts=args.past or list(DEFAULT_PAST),
        paths=paths,
        precisions=args.precision or ["fp32"],
        threads=args.threads,
        budget=budget,
        timeout=args.timeout,
        tf32=args.tf32,
        retries=args.retries,
        progress=not args.no_progress,
    )
    return _finish(args, report, format_decode_table(report), any(not r.get("ok") for r in report["rows"]))


def _run_generate_from_args(args: argparse.Namespace) -> int:
    from bench.generate import PRECISIONS, benchmark_generate, format_generate_table

    if not args.checkpoint:
        raise BenchError("--generate needs --checkpoint DIR (a transformers folder, or 'random')")
    if args.decode or args.seq or args.past or args.plot or args.name != DEFAULT_NAME:
        raise BenchError("--generate measures a checkpoint: no zoo name, --decode, --seq, --past or --plot")
    bad = sorted(set(args.precision or []) - set(PRECISIONS))
    if bad:
        raise BenchError(f"--precision {','.join(bad)}: --generate takes {','.join(PRECISIONS)}")
    if not 1 <= args.new <= 100_000:
        raise BenchError(f"--new {args.new} is outside 1..100000")
    if not 1 <= args.num_beams <= 64:
        raise BenchError(f"--num-beams {args.num_beams} is outside 1..64")
    report = benchmark_generate(
        args.checkpoint,
        prompts=args.prompt or [128, 1024],
        new=args.new,
        precisions=args.precision or ["fp32"],
        threads=args.threads,
        warmup=1 if args.warmup == Budget.warmup else args.warmup,  # whole generate calls: 1 and best of 3
        repeats=3 if args.repeats == Budget.repeats else args.repeats,
        rounds=args.rounds,
        genai_python=args.genai_python,
        llama_python=args.llama_python,
        gguf=args.gguf,
        paths=None if args.paths == list(PATHS) else args.paths,
        timeout=args.timeout,
        progress=not args.no_progress,
        device={"provider": args.provider, "dtype": args.dtype, "cuda_graph": args.cuda_graph, "tf32": args.tf32},
        num_beams=args.num_beams,
        speculative=_speculative(args),
    )
    if args.speculative:
        from bench.generate_spec import format_speculative_table

        table = format_speculative_table(report)
    else:
        table = format_generate_table(report)
    code = _finish(args, report, table, any(not r.get("ok") for r in report["rows"]))
    if args.json:  # the table beside the JSON, with the command that made both
        from zoo.files import write_atomic

        command = (
            f"attnzoo bench --generate --checkpoint {args.checkpoint} --prompt {','.join(map(str, report['prompts']))}"
            f" --new {args.new} --precision {','.join(report['precisions'])} --threads {report['threads']}"
            f" --repeats {report['repeats']}" + (f" --rounds {report['rounds']}" if report["rounds"] > 1 else "")
        )
        command += f" --num-beams {args.num_beams}" * (args.num_beams > 1)
        command += f" --paths {','.join(args.paths)}" * (args.paths != list(PATHS))
        if args.provider != "cpu":
            command += f" --provider {args.provider} --dtype {args.dtype}"
            command += " --cuda-graph" * args.cuda_graph + " --tf32" * args.tf32
        for flag, value in (("--genai-python", args.genai_python), ("--llama-python", args.llama_python)):
            command += f" {flag} {value}" if value else ""
        if args.speculative:
            command += (
                f" --speculative --workload {','.join(args.workload)} --spec-k {args.spec_k} --ngram {args.ngram}"
            )
            command += f" --draft {args.draft}" if args.draft else ""
        command += f" --json {args.json}"
        text = f"{table}\n\nCommand: `{command}`\n"
        write_atomic(Path(args.json).with_suffix(".md"), lambda tmp: tmp.write_text(text))
    return code


def _speculative(args: argparse.Namespace) -> dict | None:
    if not args.speculative:
        return None
    for flag, value in (("--spec-k", args.spec_k), ("--ngram", args.ngram)):
        if not 1 <= value <= 64:
            raise BenchError(f"{flag} {value} is outside 1..64")
    if args.draft and not (Path(args.draft) / "config.json").is_file():
        raise BenchError(f"--draft {args.draft} has no config.json; name a checkpoint folder of the same tokenizer")
    return {"k": args.spec_k, "ngram": args.ngram, "draft": args.draft, "workloads": args.workload}


def add_commands(sub) -> None:
    sp = sub.add_parser(
        "bench",
        help="eager torch vs every ONNX lowering: latency, GFLOP/s, memory",
        description="Measure a block's paths side by side, each in its own process: eager torch and every ONNX "
        "lowering over --seq (latency, GFLOP/s, memory, against the roofline); with --decode the per-token step "
        "against a cache and transformers' StaticCache; with --generate --checkpoint DIR whole-model generation "
        "against transformers, onnxruntime-genai and llama.cpp. Tables on stdout, --json writes the report.",
    )
    add_arguments(sp)
    sp.set_defaults(func=run_from_args)
