"""`attnzoo loadtest URL`: load an `attnzoo serve` endpoint (serve/loadtest/): throughput, latency percentiles,
errors and faults; with --chat, streamed /v1/chat/completions (tokens/s, time to first token)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from zoo.files import ensure_writable_parent, write_atomic

from .cmd_serve import _count, _fraction, _http_url, _need, _nonneg
from .common import CliError, int_list, positive


def cmd_loadtest(args: argparse.Namespace) -> int:
    from serve.loadtest import format_report, loadtest

    if args.chat:
        return _chat_loadtest(args)
    if args.kill_after is not None:
        _need("ray", "--kill-after")
    if args.json:
        ensure_writable_parent(Path(args.json))
    if args.model and not Path(args.model).is_file():
        raise CliError(f"--model {args.model}: no such file (give the .onnx file the server runs)")
    report = loadtest(
        args.url,
        concurrency=args.concurrency,
        requests=args.requests,
        seqs=args.seq,
        batch=args.batch,
        binary=not args.json_bodies,
        bad_fraction=args.bad_fraction,
        model=args.model,
        kill_after=args.kill_after,
        ray_address=args.ray_address,
        app=args.app,
        retries=args.retries,
        warmup=args.warmup,
        seed=args.seed,
        new_tokens=args.new_tokens,
        progress=lambda lv: print(
            f"concurrency {lv['concurrency']}: {lv['throughput_rps']} req/s"
            + (f", {lv['tokens_per_s']} tokens/s" if lv.get("tokens_per_s") is not None else ""),
            file=sys.stderr,
            flush=True,
        ),
    )
    print(format_report(report))
    if args.json:
        write_atomic(Path(args.json), lambda tmp: tmp.write_text(json.dumps(report, indent=2)))
        print(f"wrote {args.json}")
    broken = sum(lv["good_wrong"] + (lv["bad"] - lv["bad_4xx"]) for lv in report["levels"])
    return 1 if broken else 0


def _chat_loadtest(args: argparse.Namespace) -> int:
    """--chat: streamed POST /v1/chat/completions (serve/loadtest/chat.py): tokens/s and time to first token."""
    from serve.auth import key_from
    from serve.loadtest.chat import chat_loadtest, format_chat_report

    if args.json:
        ensure_writable_parent(Path(args.json))
    report = chat_loadtest(
        args.url,
        concurrency=args.concurrency,
        requests=args.requests,
        max_tokens=args.new_tokens,
        api_key=key_from(args.api_key),
        warmup=args.warmup,
        seed=args.seed,
        progress=lambda lv: print(
            f"concurrency {lv['concurrency']}: {lv['tokens_per_s']} tokens/s, TTFT p50 {lv['ttft_p50_ms']} ms",
            file=sys.stderr,
            flush=True,
        ),
    )
    print(format_chat_report(report))
    if args.json:
        write_atomic(Path(args.json), lambda tmp: tmp.write_text(json.dumps(report, indent=2)))
        print(f"wrote {args.json}")
    return 1 if any(lv["errors"] for lv in report["levels"]) else 0


def add_commands(sub) -> None:
    sp = sub.add_parser(
        "loadtest", help="load an `attnzoo serve` URL: throughput (tokens/s for a whole model), p50/p95/p99, errors"
    )
    sp.add_argument("url", type=_http_url, help="e.g. http://127.0.0.1:8000/")
    sp.add_argument("--concurrency", type=int_list, default=[1, 16], help="levels, e.g. 1,16 (default 1,16)")
    sp.add_argument("--requests", type=positive, default=200, help="requests per level (default 200)")
    sp.add_argument(
        "--seq", type=int_list, default=[16, 32, 64, 128], help="T of the requests (a whole model: prompt lengths)"
    )
    sp.add_argument(
        "--new-tokens", type=positive, default=32, help="a whole model (POST /generate): new tokens per request"
    )
    sp.add_argument("--batch", type=positive, default=1, help="sequences per request (default 1)")
    sp.add_argument("--json-bodies", action="store_true", help="send JSON instead of .npy bodies")
    sp.add_argument("--bad-fraction", type=_fraction, default=0.0, help="share of malformed requests, e.g. 0.05")
    sp.add_argument("--model", help="the served .onnx file: every answer is checked against it")
    sp.add_argument("--kill-after", type=_nonneg, default=None, help="kill one replica this many seconds in")
    sp.add_argument("--ray-address", default="auto", help="the Ray cluster of the server (for --kill-after)")
    sp.add_argument("--app", default="attnzoo", help="the Ray Serve application name (for --kill-after)")
    sp.add_argument("--retries", type=_count, default=1, help="client retries of a failed request (default 1)")
    sp.add_argument("--warmup", type=_count, default=8, help="uncounted requests first (default 8)")
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument("--json", help="also write the report as JSON")
    sp.add_argument(
        "--chat",
        action="store_true",
        help="a whole model's POST /v1/chat/completions, streamed: tokens/s and time to first token "
        "(--new-tokens: max_tokens)",
    )
    sp.add_argument("--api-key", default=None, help="--chat: the server's API key (default: $ATTNZOO_API_KEY)")
    sp.set_defaults(func=cmd_loadtest)
