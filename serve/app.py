"""The Ray Serve application: starting a replica of the right kind for the model (locally on loopback, or on a
cluster), and reading its replicas' states."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zoo import MissingFileError

from . import failover
from .auth import key_digest
from .blocks.app import OnnxServer
from .blocks.protocol import (
    DEFAULT_MAX_BODY,
    DEFAULT_MAX_TOKENS,
    ModelInfo,
    ServeError,
)
from .embeddings.app import EmbeddingServer, embed_files, is_sentence_encoder
from .generate.app import GenerateServer
from .generate.continuous import BATCHINGS, DEFAULT_CAPACITY, check_continuous
from .generate.protocol import DEFAULT_MAX_NEW_TOKENS, GenInfo, is_lm
from .generate.speculating import ServeSpeculation
from .openai.serving import text_files
from .ops import ServeOps
from .replica import (
    check_port_free,
    model_files,
)

# -- starting a deployment ---------------------------------------------------------------------


@dataclass
class Deployment:
    """A running deployment: its URL and how it was asked for."""

    url: str
    app: str
    replicas: int
    provider: str
    model: Path
    started_ray: bool  # this process connected to Ray in `start`
    own_cluster: bool = False  # ...and the cluster is its own (embedded), not one it joined
    autoscale: tuple[int, int] | None = None  # (min, max) replicas when Ray Serve's autoscaler sizes it

    @property
    def size(self) -> str:
        """ "2 replica(s)", or "1..4 replicas (autoscaled)"."""
        if self.autoscale:
            return f"{self.autoscale[0]}..{self.autoscale[1]} replicas (autoscaled)"
        return f"{self.replicas} replica(s)"

    def shutdown(self) -> None:
        """Delete the application; stop Serve and Ray when they are this process's own (a joined
        cluster keeps running, with its other applications)."""
        import ray
        from ray import serve

        serve.delete(self.app)
        if self.own_cluster:
            serve.shutdown()
        if self.started_ray:
            ray.shutdown()


def check_options(
    *,
    provider: str,
    replicas: int,
    max_batch: int,
    max_tokens: int,
    port: int,
    max_new_tokens: int,
    capacity: int,
    batching: str,
    batch_wait_ms: float,
    cpus_per_replica: float,
    route_prefix: str,
    autoscale: tuple[int, int] | None = None,
    target_ongoing_requests: float = 2.0,
    max_ongoing_requests: int | None = None,
    upscale_delay_s: float = 30.0,
    downscale_delay_s: float = 600.0,
    autoscale_window_s: float = 30.0,
) -> None:
    """ServeError for the first of `start`'s settings that cannot serve (a caller that makes the model first,
    such as the CLI exporting a checkpoint folder, checks them before that work)."""
    from export.names import PROVIDERS

    if provider not in PROVIDERS:
        raise ServeError(f"provider={provider!r} is not one of {', '.join(PROVIDERS)}")
    counts = (("replicas", replicas), ("max_batch", max_batch), ("max_tokens", max_tokens), ("port", port))
    for name, v in (*counts, ("max_new_tokens", max_new_tokens), ("capacity", capacity)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ServeError(f"{name}={v!r} must be a positive integer")
    if port > 65535:
        raise ServeError(f"port={port} is not a TCP port; give one in 1..65535")
    if batching not in BATCHINGS:
        raise ServeError(f"batching={batching!r} is not one of {', '.join(BATCHINGS)}")
    if not 0 <= batch_wait_ms <= 10_000:
        raise ServeError(f"batch_wait_ms={batch_wait_ms!r} must be between 0 and 10000")
    if cpus_per_replica < 0:
        raise ServeError(f"cpus_per_replica={cpus_per_replica!r} must be >= 0")
    if not route_prefix.startswith("/"):
        raise ServeError(f"route_prefix={route_prefix!r} must start with '/'")
    if max_ongoing_requests is not None and (isinstance(max_ongoing_requests, bool) or max_ongoing_requests < 1):
        raise ServeError(f"max_ongoing_requests={max_ongoing_requests!r} must be a positive integer")
    if autoscale is None:
        return
    low, high = autoscale
    if not (isinstance(low, int) and isinstance(high, int) and 0 <= low <= high and high >= 1):
        raise ServeError(f"autoscale={autoscale!r} must be MIN:MAX replicas with 0 <= MIN <= MAX and MAX >= 1")
    if not target_ongoing_requests > 0:
        raise ServeError(f"target_ongoing_requests={target_ongoing_requests!r} must be > 0")
    for name, v in (("upscale_delay_s", upscale_delay_s), ("downscale_delay_s", downscale_delay_s)):
        if not 0 <= v <= 86_400:
            raise ServeError(f"{name}={v!r} must be between 0 and 86400 seconds")
    if not 0 < autoscale_window_s <= 3600:
        raise ServeError(f"autoscale_window_s={autoscale_window_s!r} must be > 0 and at most 3600 seconds")


def scaling(
    *,
    replicas: int,
    max_batch: int,
    autoscale: tuple[int, int] | None,
    target_ongoing_requests: float,
    max_ongoing_requests: int | None,
    upscale_delay_s: float,
    downscale_delay_s: float,
    autoscale_window_s: float,
) -> dict[str, Any]:
    """serve.deployment's sizing options: a fixed num_replicas, or Ray Serve's own autoscaler (autoscaling_config:
    min/max replicas, starting from `replicas` clipped into them, target_ongoing_requests per replica, its delays and
    look-back window); max_ongoing_requests, by default room for a full batch waiting while another runs."""
    out: dict[str, Any] = {"max_ongoing_requests": max_ongoing_requests or max(2 * max_batch, 8)}
    if autoscale is None:
        out["num_replicas"] = replicas
        return out
    low, high = autoscale
    out["autoscaling_config"] = {
        "min_replicas": low,
        "max_replicas": high,
        "initial_replicas": min(max(replicas, low), high),
        "target_ongoing_requests": target_ongoing_requests,
        "upscale_delay_s": upscale_delay_s,
        "downscale_delay_s": downscale_delay_s,
        "look_back_period_s": autoscale_window_s,
    }
    if autoscale_window_s <= 10:  # Ray asks the window to be longer than its (deprecated) 10 s metrics interval
        out["autoscaling_config"]["metrics_interval_s"] = autoscale_window_s / 2
    return out


def start(
    model: str | os.PathLike,
    *,
    replicas: int = 1,
    provider: str = "cpu",
    max_batch: int = 16,
    batch_wait_ms: float = 5.0,
    port: int = 8000,
    host: str = "127.0.0.1",
    address: str | None = None,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    max_body: int = DEFAULT_MAX_BODY,
    threads: int | None = None,
    tf32: bool = False,
    cpus_per_replica: float = 1.0,
    app: str = "attnzoo",
    route_prefix: str = "/",
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    batching: str = "static",
    capacity: int = DEFAULT_CAPACITY,
    api_key: str | None = None,
    text_from: str | os.PathLike | None = None,
    cuda_graph: bool = False,
    tool_call_parser: str | None = None,
    ops: ServeOps | None = None,
    speculation: ServeSpeculation | None = None,
    autoscale: tuple[int, int] | None = None,
    target_ongoing_requests: float = 2.0,
    max_ongoing_requests: int | None = None,
    upscale_delay_s: float = 30.0,
    downscale_delay_s: float = 600.0,
    autoscale_window_s: float = 30.0,
) -> Deployment:
    """Serve the .onnx file `model` with Ray Serve at http://host:port{route_prefix} and return at once.

    address None: start Ray on this machine (or use the Ray this process already joined);
    otherwise join that cluster ("auto", or "HOST:6379"). With provider "cuda" each replica asks
    Ray for one GPU; "auto" means cuda when ONNX Runtime's CUDA provider works on this machine.
    A whole-model export (export_onnx of a zoo.DecoderLM) is served on POST /generate
    (GenerateServer: greedy tokens, at most `max_new_tokens` per request, `batching` "static" or
    "continuous" with buffers of `capacity` slots), and on OpenAI's API under /v1 (serve/openai/serving.py: its
    tokenizer and chat template from `text_from`, a checkpoint folder or an .onnx, default `model`: the
    copies beside it); a block on POST /predict. api_key: every route but /healthz asks for it as a Bearer
    token (serve/auth.py). tf32: each replica's session runs fp32 products in TF32 on CUDA
    (OnnxSession(tf32=True)); off by default. cuda_graph: a packed-rows whole model's decode steps captured as
    CUDA graphs (OnnxSession(cuda_graph=True)). tool_call_parser: the format /v1/chat/completions reads tool calls
    in (serve/openai/tools.py: hermes, llama3_json, mistral; default: the one the chat template teaches). A sentence
    encoder's export (export_encoder) is served on OpenAI's POST /v1/embeddings (serve/embeddings/app.py: its
    tokenizer the MODEL.tokenizer.json beside it, requests batched across clients up to `max_batch` rows, at most
    `max_tokens` tokens a request). ops: a whole model's admission control, request timeout, prefix cache and access
    log (serve/ops.py ServeOps; default ServeOps()). speculation: a whole model's generations verify candidates
    (serve/generate/speculating.ServeSpeculation: prompt lookup or a draft; the export must have all_logits).

    autoscale (MIN, MAX): Ray Serve's own autoscaler sizes the deployment between MIN and MAX replicas (`replicas`
    the start), aiming at `target_ongoing_requests` per replica, after `upscale_delay_s` / `downscale_delay_s` of
    load above / below that, averaged over `autoscale_window_s`; max_ongoing_requests: the most requests a replica
    takes at once (others wait in Serve's router). Replicas spread over the cluster's nodes as Ray places them
    (each asks `cpus_per_replica` CPUs). A replica lost mid-request: serve/failover.py, in the HTTP proxy.
    """
    from runtime.session import OnnxSession, cuda_status

    if not isinstance(tf32, bool):
        raise ServeError(f"tf32={tf32!r} must be True or False")
    check_options(
        provider=provider,
        replicas=replicas,
        max_batch=max_batch,
        max_tokens=max_tokens,
        port=port,
        max_new_tokens=max_new_tokens,
        capacity=capacity,
        batching=batching,
        batch_wait_ms=batch_wait_ms,
        cpus_per_replica=cpus_per_replica,
        route_prefix=route_prefix,
        autoscale=autoscale,
        target_ongoing_requests=target_ongoing_requests,
        max_ongoing_requests=max_ongoing_requests,
        upscale_delay_s=upscale_delay_s,
        downscale_delay_s=downscale_delay_s,
        autoscale_window_s=autoscale_window_s,
    )
    sizing = scaling(
        replicas=replicas,
        max_batch=max_batch,
        autoscale=autoscale,
        target_ongoing_requests=target_ongoing_requests,
        max_ongoing_requests=max_ongoing_requests,
        upscale_delay_s=upscale_delay_s,
        downscale_delay_s=downscale_delay_s,
        autoscale_window_s=autoscale_window_s,
    )
    path = Path(model)
    if not path.is_file():
        raise MissingFileError(f"{path}: no such file; export one with `attnzoo export NAME --mask -o {path}`")
    # Check here, in one process, what every replica would otherwise fail on.
    probe = OnnxSession(path, provider="cpu", verbose=False)
    server: type = OnnxServer
    extra: dict[str, Any] = {}
    if is_lm(probe):
        GenInfo.of(probe)
        if batching == "continuous":
            check_continuous(probe, path)
        server, extra = GenerateServer, {"max_new_tokens": max_new_tokens, "batching": batching, "capacity": capacity}
        extra["cuda_graph"] = cuda_graph
        extra["ops"] = ops or ServeOps()
        extra["text"] = text_files(text_from if text_from is not None else path)
        extra["tool_call_parser"] = tool_call_parser
        if speculation is not None:
            speculation.open(probe)  # the target's and the draft's refusals, here once
            extra["speculation"] = speculation
    elif is_sentence_encoder(probe):  # POST /v1/embeddings (serve/embeddings/app.py), with the export's tokenizer
        server, extra = EmbeddingServer, {"text": embed_files(path)}
    else:
        ModelInfo.of(probe, max_tokens=max_tokens, max_rows=max_batch)
    if speculation is not None and "speculation" not in extra:
        raise ServeError(f"speculative decoding runs a whole model's generations; {path} is not a whole model")
    if cuda_graph and probe.metadata.get("attnzoo.padding") != "packed":
        raise ServeError(f"cuda_graph replays a packed-rows whole model's decode step; {path} is not one")
    del probe
    import ray
    from ray import serve

    if address is None:
        # Embedded: everything runs here, so what would only fail (or hang) later is checked now.
        if provider == "cuda" and not cuda_status()[0]:
            raise ServeError(f"provider='cuda' asked for, but {cuda_status()[1]}; use --provider cpu")
        if not ray.is_initialized():  # else Serve may already listen there, for another application
            check_port_free(host, port)
    if provider == "auto":
        provider = "cuda" if cuda_status()[0] else "cpu"

    started_ray = False
    if not ray.is_initialized():
        # "local": a Ray of our own, never a stray cluster that ray.init() would otherwise find.
        try:
            if address is None:
                init_local_ray()
            else:
                ray.init(address=address, include_dashboard=False, log_to_driver=False)
        except ConnectionError as e:
            raise ServeError(f"cannot join the Ray cluster at {address!r}: {str(e).splitlines()[0]}") from None
        started_ray = True
    own_cluster = started_ray and address is None
    try:
        if provider == "cuda" and ray.cluster_resources().get("GPU", 0) < 1:
            raise ServeError("provider='cuda' asks one GPU per replica, but this Ray cluster has no GPU")
        try:
            # A proxy on every node binds `host` there: only a wildcard exists on every node; an address of one
            # machine (the head's, loopback) gets one proxy, on the head node.
            location = "EveryNode" if host in ("0.0.0.0", "::") else "HeadOnly"
            serve.start(proxy_location=location, http_options={"host": host, "port": port})
        except ray.exceptions.RayError as e:  # the HTTP proxy did not come up (killed when its ready check ran out)
            lines = [ln for ln in str(e).splitlines() if ln.strip()]
            raise ServeError(
                f"Ray Serve's HTTP proxy did not start: {lines[-1] if lines else type(e).__name__}; on a busy "
                f"host raise RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S before Ray starts"
            ) from e
        options: dict[str, Any] = {"num_cpus": cpus_per_replica}
        if provider == "cuda":
            options["num_gpus"] = 1
        deployment = serve.deployment(
            server,
            name="onnx",
            ray_actor_options=options,
            health_check_period_s=2,
            **sizing,
        )
        handle = deployment.bind(
            model_files(path),
            path.stem,
            provider=provider,
            max_batch=max_batch,
            batch_wait_ms=batch_wait_ms,
            max_tokens=max_tokens,
            max_body=max_body,
            threads=threads,
            tf32=tf32,
            loopback=ray_on_loopback(),
            key_digest=key_digest(api_key),
            **extra,
        )
        try:
            serve.run(handle, name=app, route_prefix=route_prefix, blocking=False)
        except Exception as e:  # noqa: BLE001 - Ray reports a replica that failed to start this way
            lines = [ln for ln in str(e).splitlines() if ln.strip()]
            raise ServeError(f"the deployment did not start: {lines[-1] if lines else type(e).__name__}") from e
    except BaseException:
        if started_ray:
            if own_cluster:
                serve.shutdown()
            ray.shutdown()
        raise
    url = f"http://{host}:{port}{route_prefix.rstrip('/')}/"
    return Deployment(url, app, replicas, provider, path, started_ray, own_cluster, autoscale)


_RAY_CLUSTER_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
# Ray Serve's controller kills an HTTP proxy that is not ready within 5 s (ray.kill), and serve.start then fails
# with ActorDiedError "killed by ray.kill": on 2 cores shared with a test run or a build, a proxy takes longer
# than that to start (reproduced with the timeout lowered). A Ray of our own gives its proxies a minute; the
# controller reads these when it starts, from the environment the raylet passes on. A value already set wins.
SLOW_HOST_TIMEOUTS = {"RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "60", "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S": "60"}


def init_local_ray(**options: Any) -> None:
    """ray.init a Ray of this process's own that listens on loopback only, without a dashboard.

    Ray 2.60 binds its gRPC servers (GCS, raylet, workers) to all interfaces unless the node's
    address is 127.0.0.1, and it rewrites a 127.0.0.1 given to ray.init to the machine's network
    address unless clusters are turned off (ray_constants.ENABLE_RAY_CLUSTER, read from the
    environment variable RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER). So for the length of ray.init they
    are turned off, in this process and in the environment that Ray's daemons (and, through the
    raylet, every worker) inherit: the node is 127.0.0.1, and its gRPC servers, agents and
    Prometheus endpoints listen there. `options` go to ray.init (num_cpus=..., ...).
    """
    import ray
    from ray._private import ray_constants

    had_env, had_flag = os.environ.get(_RAY_CLUSTER_ENV), getattr(ray_constants, "ENABLE_RAY_CLUSTER", None)
    os.environ[_RAY_CLUSTER_ENV] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    for name, value in SLOW_HOST_TIMEOUTS.items():
        os.environ.setdefault(name, value)
    os.environ.setdefault(failover.CALLBACK_ENV, failover.CALLBACK)  # the proxy retries a lost replica's requests
    try:
        ray.init(
            address="local",
            _node_ip_address="127.0.0.1",
            include_dashboard=False,
            log_to_driver=False,
            **options,
        )
    finally:
        if had_env is None:
            os.environ.pop(_RAY_CLUSTER_ENV, None)
        else:
            os.environ[_RAY_CLUSTER_ENV] = had_env
        if had_flag is not None:
            ray_constants.ENABLE_RAY_CLUSTER = had_flag


def ray_on_loopback() -> bool:
    """Whether the Ray this process is connected to runs on a loopback address (init_local_ray)."""
    import ipaddress

    import ray

    try:
        return ipaddress.ip_address(ray.util.get_node_ip_address()).is_loopback
    except ValueError:
        return False


def replica_states(app: str = "attnzoo") -> dict[str, int]:
    """{state: count} for the app's replicas, from the Serve controller (e.g. {"RUNNING": 2})."""
    from ray import serve

    status = serve.status()
    if app not in status.applications:
        return {}
    out: dict[str, int] = {}
    for dep in status.applications[app].deployments.values():
        for state, n in dep.replica_states.items():
            if not n:
                continue
            key = getattr(state, "value", str(state))
            out[key] = out.get(key, 0) + n
    return out
