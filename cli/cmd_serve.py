"""The serving half of the `attnzoo` CLI: serve (Ray Serve), triton (a model repository), loadtest."""

from __future__ import annotations

import argparse
import importlib.util
import signal
import sys
import tempfile
import time
from pathlib import Path

import zoo
from export.names import DTYPES, PROVIDERS, SESSION_DTYPES

from . import interrupt
from .common import CliError, number_in, positive, refuse_broken_cuda, shipped_folder, with_set, with_tf32
from .generate_flags import add_speculation_flags, speculates
from .serve_model import auth_header, capacity_line, folder_target, model_path, serve_speculation, served_facts
from .serve_ops import ops_from, with_ops
from .serve_scale import add_scale_flags, failover_on, scale_options


def _need(module: str, what: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise CliError(f"{what} needs the serve extra ({module} is not installed): pip install 'attnzoo[serve]'")


def cmd_serve(args: argparse.Namespace) -> int:
    _need("ray", "attnzoo serve")
    from serve.app import check_options, check_port_free, start
    from serve.auth import key_from

    args.model = str(shipped_folder(args.model) or args.model)  # the shipped checkpoint's bare name, as generate

    if args.max_tokens is not None:  # the old spelling: it never meant OpenAI's max_tokens (new tokens)
        print(
            "attnzoo serve: --max-tokens is now --max-positions (the most b*t positions per request); "
            "the old spelling will go",
            file=sys.stderr,
        )
        args.max_positions = args.max_tokens
    options = {
        "replicas": args.replicas,
        "provider": args.provider,
        "max_batch": args.max_batch,
        "batch_wait_ms": args.batch_wait_ms,
        "port": args.port,
        "max_tokens": args.max_positions,
        "cpus_per_replica": args.cpus_per_replica,
        "route_prefix": args.route_prefix,
        "max_new_tokens": args.max_new_tokens,
        "batching": args.batching,
        "capacity": args.capacity,
        **scale_options(args),
    }
    check_options(**options)  # before an export, which may take a while
    if args.cuda_graph:  # a CUDA graph replays packed rows on CUDA: said before Ray or an export starts
        from runtime.providers import cuda_graph_refusal

        folder = Path(args.model).is_dir()
        why = cuda_graph_refusal(folder_target(args.provider), args.dtype if folder else None)
        if why:
            raise CliError(why)
    if args.address is None:  # served here: CUDA must work and the port be free here (as start checks)
        refuse_broken_cuda(args.provider)
        check_port_free(args.host, args.port)
    api_key = key_from(args.api_key)
    with tempfile.TemporaryDirectory(prefix="attnzoo-serve-") as tmp:
        overrides = zoo.parse_overrides(args.set)
        speculation = serve_speculation(args)  # a draft folder exported first (once), refusals before the target's
        path = model_path(
            args.model,
            overrides,
            args.lowering,
            args.dtype,
            Path(tmp),
            args.decode,
            args.batching,
            args.provider,
            all_logits=speculates(args),
        )
        print(f"starting Ray Serve for {path} (a readiness line follows when it answers)", flush=True)
        # `kill PID` (a service manager's stop) shuts the deployment down like Ctrl-C does. Set again once Ray
        # runs: its core worker installs a fatal-signal handler of its own for SIGTERM, which dumped a C++
        # stack, aborted (exit 134) and left Ray's agents running
        signal.signal(signal.SIGTERM, _interrupt)
        own_ray = args.address is None and quiet_local_ray()
        signal.signal(signal.SIGTERM, _interrupt)
        try:
            dep = start(
                path,
                host=args.host,
                address=args.address,
                threads=args.threads,
                tf32=args.tf32,
                app=args.app,
                api_key=api_key,
                text_from=args.model,
                tool_call_parser=args.tool_call_parser,
                cuda_graph=args.cuda_graph,
                ops=ops_from(args),
                speculation=speculation,
                **options,
            )
        except BaseException:
            _stop_ray(own_ray)
            raise
        signal.signal(signal.SIGTERM, _interrupt)  # and again after Serve's start, on the same ground
        try:
            wait_ready(dep.url)
            print(f"ready: serving {path} at {dep.url} ({dep.size}, {dep.provider}); Ctrl-C stops")
            if args.address is not None and not failover_on(dep.url):
                print(
                    "  note: this cluster's HTTP proxy does not retry a lost replica's requests; start its head with "
                    "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH=serve.failover.proxy_middlewares (docs/serving.md)"
                )
            auth = auth_header(api_key, args.api_key)
            if api_key:
                print("  every route but /healthz asks for the API key: Authorization: Bearer KEY")
            print(f"  curl -s {dep.url}healthz; curl -s {auth}{dep.url}metadata")
            width, metadata = served_facts(path)
            if width == "embed":  # a sentence encoder: OpenAI's POST /v1/embeddings
                from .cmd_embed import serve_hints

                print("\n".join(serve_hints(dep.url, auth, path)))
            elif width is None:  # a whole model: token ids in, greedy tokens out; OpenAI's API under /v1
                body = '{"input_ids": [[72, 101, 108, 108, 111]], "max_new_tokens": 16}'
                print(f"  curl -s {auth}-H 'Content-Type: application/json' -d '{body}' {dep.url}generate")
                print(f"  OpenAI's API: {dep.url}v1 (GET /v1/models; POST /v1/completions, /v1/chat/completions)")
                print(f"  operations: GET {dep.url}health, /ready, /metrics (Prometheus); POST /tokenize, /detokenize")
                print(f"  {capacity_line(metadata, args.capacity, args.batching)}")
            else:
                save = f"np.save('x.npy', np.random.randn(16, {width}).astype('float32'))"
                print(f'  python -c "import numpy as np; {save}"')
                print(f"  curl -s --data-binary @x.npy -H 'Content-Type: application/x-npy' {dep.url}predict -o y.npy")
            sys.stdout.flush()
            ends = time.monotonic() + args.duration if args.duration else None
            while ends is None or time.monotonic() < ends:
                time.sleep(0.5)
        except KeyboardInterrupt:
            interrupt.handled()  # the stop below imports: nothing to raise again there
        finally:
            print("stopping", flush=True)
            dep.shutdown()
            _stop_ray(own_ray)
    print("stopped")
    return 0


def quiet_local_ray() -> bool:
    """Start this process's own Ray (serve.init_local_ray: loopback only) with its start-up chatter at WARNING
    and Ray's token-authentication notice left out (it stays on); True when it started one."""
    import logging

    import ray

    from serve.app import init_local_ray

    if ray.is_initialized():
        return False
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
    init_local_ray(logging_level=logging.WARNING)
    # Serve's INFO lines ("Connecting to existing Serve app ... New http_options ... will not be applied", "Deleting
    # app"): Serve sets its logger's level itself when it starts, so a filter, not a level
    logging.getLogger("ray.serve").addFilter(lambda record: record.levelno >= logging.WARNING)
    return True


def _stop_ray(own: bool) -> None:
    """Stop the Ray this process started: every process of it goes, Serve's with them. Not serve.shutdown(),
    whose controller, killed while its graceful_shutdown task runs, has the raylet print a raw "(raylet) Task
    ServeController.graceful_shutdown failed ... killed by ray.kill" on the terminal."""
    if own:
        import ray

        ray.shutdown()


def wait_ready(url: str, timeout: float = 120.0) -> None:
    """Return once GET {url}healthz answers 200 (Serve's proxy answers 404 for a route not yet there)."""
    from serve.client import Client

    ends = time.monotonic() + timeout
    with Client(url, retries=0) as client:
        while not client.health():
            if time.monotonic() > ends:
                raise CliError(f"{url}healthz did not answer within {timeout:.0f} s; see /tmp/ray/session_latest/logs")
            time.sleep(0.2)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def cmd_triton(args: argparse.Namespace) -> int:
    from serve.triton import check_model, write_repository

    written = write_repository(
        args.names,
        args.output,
        max_batch=args.max_batch,
        instances=args.instances,
        kind=args.kind,
        batch_wait_us=args.batch_wait_us,
        lowering=args.lowering,
        dtype=args.dtype,
        with_mask=args.mask,
        overwrite=args.force,
        **zoo.parse_overrides(args.set),
    )
    checkable = importlib.util.find_spec("tritonclient") is not None
    failed = 0
    for w in written:
        print(f"wrote {w.folder}/config.pbtxt and {w.folder}/1/model.onnx")
        if checkable:
            problems = check_model(w.folder)
            failed += bool(problems)
            verdict = "OK" if not problems else "MISMATCH: " + "; ".join(problems)
            print(f"  config vs model (Triton's schema): {verdict}")
    if not checkable:
        print("  (configs not checked: pip install 'attnzoo[serve]' for tritonclient's schema)")
    print(f"serve it with: tritonserver --model-repository {Path(args.output).resolve()}")
    return 1 if failed else 0


_fraction = number_in(float, 0, below=1)
_count = number_in(int, 0)
_nonneg = number_in(float, 0)
_port = number_in(int, 1, below=65536)


def _int_in(low: int, high: int):
    """An argparse type: an integer in low..high, refused in one line naming the value and the range."""

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not low <= v <= high:
            raise argparse.ArgumentTypeError(f"{v} must be an integer in {low}..{high}")
        return v

    return parse


_max_batch = _int_in(0, 2**31 - 1)  # Triton's max_batch_size is int32
_batch_wait_us = _int_in(0, 60_000_000)  # serve.triton.MAX_BATCH_WAIT_US


def _folder(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is no folder; give the model repository's path, e.g. -o model_repo")
    return text


def _http_url(text: str) -> str:
    """An argparse type: an http URL with a host and a port in 1..65535, refused in one line."""
    from serve.client import ClientOptionError, parse_url

    try:
        parse_url(text)
    except ClientOptionError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("url=")) from None
    return text


def add_commands(sub) -> None:
    from export.names import LOWERINGS

    sp = sub.add_parser(
        "serve",
        help="serve an exported block (POST /predict), whole model (POST /generate, /v1) or sentence encoder "
        "(POST /v1/embeddings) with Ray Serve",
    )
    sp.add_argument(
        "model",
        metavar="PATH_OR_NAME",
        help="an .onnx file (a block, a whole model or a sentence encoder: attnzoo export --checkpoint DIR --whole), a "
        "checkpoint folder (exported whole for --provider in --dtype; an encoder or sentence-transformers folder is "
        "served on /v1/embeddings), or a zoo name (exported with --mask first)",
    )
    sp.add_argument(
        "--replicas", type=positive, default=1, help="replicas (default 1); with --autoscale, the number it starts with"
    )
    add_scale_flags(sp)
    sp.add_argument("--provider", default="cpu", choices=PROVIDERS, help="cuda: one GPU per replica")
    with_tf32(sp)
    sp.add_argument("--max-batch", type=positive, default=16, help="rows (sequences) per model run (default 16)")
    sp.add_argument("--batch-wait-ms", type=_nonneg, default=5.0, help="how long a batch waits to fill (default 5)")
    sp.add_argument("--port", type=_port, default=8000, help="HTTP port, 1..65535 (default 8000)")
    sp.add_argument("--host", default="127.0.0.1", help="address the HTTP proxy listens on (default 127.0.0.1)")
    sp.add_argument("--address", default=None, help="join this Ray cluster ('auto' or HOST:PORT); default: start Ray")
    sp.add_argument(
        "--max-positions", type=positive, default=65_536, help="most b*t positions per request (larger: HTTP 413)"
    )
    sp.add_argument("--max-tokens", type=positive, default=None, help="deprecated: the old spelling of --max-positions")
    sp.add_argument(
        "--api-key",
        default=None,
        help="ask every request but GET /healthz for this Bearer token (default: $ATTNZOO_API_KEY, else none)",
    )
    sp.add_argument(
        "--max-new-tokens",
        type=positive,
        default=256,
        help="a whole model: most new tokens per request (/generate's max_new_tokens, OpenAI's max_tokens)",
    )
    sp.add_argument(
        "--batching",
        default="static",
        choices=["static", "continuous"],
        help="a whole model: static batches, or requests joining the running batch at its next step",
    )
    sp.add_argument(
        "--capacity", type=positive, default=512, help="--batching continuous: cache slots (prompt + new tokens)"
    )
    sp.add_argument(
        "--tool-call-parser",
        choices=["hermes", "llama3_json", "mistral"],
        help="the format /v1/chat/completions reads tool calls in (default: the one the chat template teaches)",
    )
    sp.add_argument(
        "--cuda-graph",
        action="store_true",
        help="a packed-rows whole model (--provider cuda): capture each decode step as a CUDA graph and replay it "
        "(not yet run on a GPU: docs/gpu.md)",
    )
    with_ops(sp)
    add_speculation_flags(
        sp,
        "a whole model: every generation, /generate and /v1, verifies candidates k at a time, exactly; a folder is "
        "exported with the logits of every position; docs/serving.md",
    )
    sp.add_argument("--threads", type=positive, default=None, help="ONNX Runtime threads per replica")
    sp.add_argument("--cpus-per-replica", type=_nonneg, default=1.0, help="CPUs each replica asks Ray for")
    sp.add_argument("--app", default="attnzoo", help="Ray Serve application name")
    sp.add_argument("--route-prefix", default="/", help="URL prefix of this application (default /)")
    sp.add_argument("--decode", action="store_true", help="when exporting a name: the token-by-token model")
    sp.add_argument("--duration", type=_nonneg, default=None, help="stop after this many seconds (default: Ctrl-C)")
    sp.add_argument("--lowering", default="auto", choices=["auto", *LOWERINGS], help="when exporting a name")
    sp.add_argument(
        "--dtype",
        default="float32",
        choices=DTYPES,
        help="when exporting a name (float32, float16) or a folder (for --provider cuda in float16/bfloat16: packed "
        "rows, which --batching continuous runs on the GPU)",
    )
    with_set(sp)
    sp.set_defaults(func=cmd_serve)

    sp = sub.add_parser("triton", help="write a Triton model repository (onnxruntime backend) of zoo blocks")
    sp.add_argument("names", nargs="+", metavar="NAME")
    sp.add_argument("-o", "--output", type=_folder, required=True, metavar="REPO", help="the model repository folder")
    sp.add_argument(
        "--max-batch", type=_max_batch, default=8, help="Triton max_batch_size; 0 = no batching (default 8)"
    )
    sp.add_argument("--instances", type=positive, default=1, help="model instances per device (default 1)")
    sp.add_argument("--kind", default="cpu", choices=["cpu", "gpu"], help="instance group kind (default cpu)")
    sp.add_argument(
        "--batch-wait-us", type=_batch_wait_us, default=5000, help="dynamic batching queue delay, us (default 5000)"
    )
    sp.add_argument("--mask", action="store_true", help="export with the bool mask input (b, t, s)")
    sp.add_argument("--lowering", default="auto", choices=["auto", *LOWERINGS])
    sp.add_argument("--dtype", default="float32", choices=SESSION_DTYPES)
    sp.add_argument("--force", action="store_true", help="replace existing model folders")
    with_set(sp)
    sp.set_defaults(func=cmd_triton)
