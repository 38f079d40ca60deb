"""`attnzoo bench --serve`: the serving benchmark against llama.cpp's llama-server (bench/serve_bench.py), its flags
and their checks."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .common import choice_list, int_list, number_in

SERVERS = ("attnzoo", "llama-server")


def _float_list(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.replace(",", " ").split()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give numbers separated by commas, e.g. 1,4") from None
    if not values or any(not v > 0 or v != v or v == float("inf") for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: each rate must be a positive number of requests/s")
    return values


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("serving against llama.cpp's llama-server (--serve; bench/serve_bench.py)")
    g.add_argument("--serve", action="store_true", help="benchmark attnzoo serve against llama-server over /v1")
    g.add_argument(
        "--llama-server",
        type=Path,
        default=None,
        metavar="PATH",
        help="llama.cpp's llama-server binary (scripts/build_llama_server.sh makes one; llama-quantize beside it)",
    )
    g.add_argument(
        "--servers", type=choice_list(SERVERS), default=None, metavar="LIST", help="default: attnzoo,llama-server"
    )
    g.add_argument("--concurrency", type=int_list, default=None, help="fixed concurrency levels (default 1,4,8,16)")
    g.add_argument("--rate", type=_float_list, default=None, help="Poisson arrival rates, requests/s (default 1,4)")
    g.add_argument("--requests", type=number_in(int, 1), default=32, help="requests per level (default 32)")
    g.add_argument(
        "--slots", type=number_in(int, 1), default=16, help="concurrent rows: attnzoo --max-batch, llama-server -np"
    )
    g.add_argument("--capacity", type=number_in(int, 64), default=1536, help="positions per row/slot (default 1536)")
    g.add_argument("--max-prompt", type=number_in(int, 4), default=1024, help="longest prompt drawn (default 1024)")
    g.add_argument("--max-output", type=number_in(int, 4), default=256, help="longest output drawn (default 256)")
    g.add_argument("--seed", type=int, default=0, help="the workload's and the arrivals' seed (default 0)")
    g.add_argument(
        "--serve-dir",
        type=Path,
        default=Path("/tmp/attnzoo-serve-bench"),
        help="where the models and server logs go (kept: a second run reuses the models)",
    )


def run_serve(args: argparse.Namespace) -> int:
    from bench.jobs import BenchError
    from bench.machine import default_threads
    from bench.serve_bench import plot, run
    from serve.loadtest.openai_bench import format_table, run_level, sharegpt_like
    from zoo.files import write_atomic

    servers = args.servers or list(SERVERS)
    precisions = args.precision or ["fp32"]
    bad = sorted(set(precisions) - {"fp32", "int8", "int4"})
    if bad:
        raise BenchError(f"--precision {','.join(bad)}: --serve takes fp32, int8, int4")
    if args.max_prompt + args.max_output > args.capacity:
        raise BenchError(f"--max-prompt + --max-output ({args.max_prompt + args.max_output}) exceed --capacity")
    threads = args.threads or default_threads()
    concurrency = args.concurrency or [1, 4, 8, 16]
    rates = args.rate if args.rate is not None else [1.0, 4.0]
    report = run(
        precisions=precisions,
        servers=servers,
        concurrency=concurrency,
        rates=rates,
        threads=threads,
        slots=args.slots,
        capacity=args.capacity,
        seed=args.seed,
        work=args.serve_dir,
        llama=args.llama_server,
        asks=sharegpt_like(args.requests, args.seed, max_prompt=args.max_prompt, max_output=args.max_output),
        run_level=run_level,
        progress=lambda r: print(
            f"{r['server']} {r['precision']} {r['mode']} {r['value']}: {r['output_tokens_per_s']} tok/s, "
            f"TTFT p99 {r['ttft_ms']['p99']} ms, {r['errors']} errors",
            file=sys.stderr,
            flush=True,
        ),
    )
    command = (
        f"attnzoo bench --serve --servers {','.join(servers)} --precision {','.join(precisions)} --concurrency "
        f"{','.join(map(str, concurrency))} --rate {','.join(f'{r:g}' for r in rates)} --requests {args.requests} "
        f"--threads {threads} --slots {args.slots} --capacity {args.capacity} --max-prompt {args.max_prompt} "
        f"--max-output {args.max_output} --seed {args.seed}"
        + (f" --llama-server {args.llama_server}" if args.llama_server else "")
    )
    report["command"] = command
    table = format_table(report["rows"])
    print(table)
    if args.json:
        import json

        from bench.serve_bench import markdown

        write_atomic(Path(args.json), lambda tmp: tmp.write_text(json.dumps(report, indent=2)))
        page = markdown(report, table)
        write_atomic(Path(args.json).with_suffix(".md"), lambda tmp: tmp.write_text(page))
        print(f"wrote {args.json} and {Path(args.json).with_suffix('.md')}")
    if args.plot:
        plot(report, Path(args.plot))
        print(f"wrote {args.plot}")
    return 1 if any(r["errors"] for r in report["rows"]) else 0
