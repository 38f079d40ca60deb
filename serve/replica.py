"""What every Ray Serve replica of ours does: open its session from the model's bytes, keep its own gRPC
server on loopback when Ray runs there, and read a request the same way (its path below the route
prefix, GET /healthz and /metadata, a body within the size limit, timing headers); and, before any of them
starts, whether this machine can listen on the host and port asked for. Imported by the replicas in blocks/app.py
(blocks), generate/app.py (whole models) and embeddings/app.py (sentence encoders)."""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from pathlib import Path

from .schema import RequestError, ServeError


def model_files(path: Path) -> dict[str, bytes]:
    """An export's files by name, as they travel to the replicas: the graph first, then the weights
    file beside it when the export keeps its weights there (PATH.data: whole models, and blocks past
    the external-data size)."""
    from zoo.files import weights_file

    files = {path.name: path.read_bytes()}
    data = weights_file(path)
    if data.is_file():
        files[data.name] = data.read_bytes()
    return files


def files_digest(files: dict[str, bytes]) -> str:
    """The sha256 a server reports (GET /metadata) and a load test checks: over the graph's bytes,
    then the weights file's, in model_files' order."""
    h = hashlib.sha256()
    for blob in files.values():
        h.update(blob)
    return h.hexdigest()


def open_session(
    files: dict[str, bytes], provider: str, threads: int | None, tf32: bool = False, cuda_graph: bool = False
):
    """An OnnxSession over an export's files (model_files): replicas may run on other machines, so the
    model travels as bytes, not as a path; its temporary files are gone once ONNX Runtime holds the
    model (external weights it maps stay readable until the session closes). tf32, cuda_graph: OnnxSession's."""
    from runtime.session import OnnxSession

    folder = Path(tempfile.mkdtemp(prefix="attnzoo-serve-"))
    for name, blob in files.items():
        (folder / name).write_bytes(blob)
    try:
        return OnnxSession(
            folder / next(iter(files)),
            provider=provider,
            threads=threads,
            verbose=False,
            tf32=tf32,
            cuda_graph=cuda_graph,
        )
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def replica_grpc_on_loopback() -> None:
    """Ray Serve 2.60 binds each replica's inter-deployment gRPC server to [::]:0 whatever the
    node's address; on a loopback-only Ray, bind it to 127.0.0.1 instead (called in the replica's
    process, before Serve starts that server). A Serve without that hook is left as it is."""
    try:
        from ray.serve._private import replica
    except ImportError:
        return
    real = getattr(replica, "add_port_to_grpc_server", None)
    if real is None or getattr(real, "attnzoo_loopback", False):
        return

    def add_port(server, address: str, *args, **kwargs):
        host, _, port = address.rpartition(":")
        if host in ("[::]", "0.0.0.0", ""):
            address = f"127.0.0.1:{port}"
        return real(server, address, *args, **kwargs)

    add_port.attnzoo_loopback = True  # type: ignore[attr-defined]
    replica.add_port_to_grpc_server = add_port


def request_path(request) -> str:
    """The request's path below a route prefix (Serve passes the prefix, e.g. "/decode", as the ASGI
    root_path), without a trailing slash; "/" for the root."""
    path = request.url.path
    root = (request.scope.get("root_path") or "").rstrip("/")
    if root and path.startswith(root):
        path = path[len(root) :]
    return path.rstrip("/") or "/"


def answer_get(path: str, meta: dict, replica: str, post: str):
    """GET /healthz ("ok"), / or /metadata (the replica's metadata), else 404 naming what is served."""
    from starlette.responses import JSONResponse, PlainTextResponse

    if path.endswith("/healthz"):
        return PlainTextResponse("ok")
    if path == "/" or path.endswith("/metadata"):
        return JSONResponse({**meta, "replica": replica})
    return PlainTextResponse(f"no such path {path}; GET /healthz or /metadata, POST {post}", 404)


async def read_body(request, max_body: int) -> bytes:
    """The request's body, refused (413) past max_body bytes: first by its declared length, before
    reading (a bad header: the body's own length decides), then as it arrives, never read past the limit.
    A body that does not arrive in time (schema.BODY_SECONDS + its size at BODY_RATE) is a 408."""
    import asyncio

    from . import schema

    declared = request.headers.get("content-length") or "0"
    size = int(declared) if declared.isdigit() else 0
    if size > max_body:
        raise RequestError(f"the body is {size} bytes; this server takes at most {max_body}", 413)
    allowed = schema.BODY_SECONDS + (size or max_body) / schema.BODY_RATE
    try:
        return await asyncio.wait_for(_read_within(request, max_body), allowed)
    except asyncio.TimeoutError:
        raise RequestError(
            f"the body did not arrive within {allowed:.0f} s ({size} bytes declared); send it whole, at once", 408
        ) from None


async def _read_within(request, max_body: int) -> bytes:
    parts, got = [], 0
    async for chunk in request.stream():
        got += len(chunk)
        if got > max_body:
            raise RequestError(f"the body is over {max_body} bytes; this server takes at most {max_body}", 413)
        parts.append(chunk)
    return b"".join(parts)


def timing_headers(timing: dict, replica: str) -> dict[str, str]:
    """A request's timings as response headers (floats to 3 places), with the replica that answered."""
    headers = {k: f"{v:.3f}" if isinstance(v, float) else str(v) for k, v in timing.items()}
    headers["x-attnzoo-replica"] = replica
    return headers


def check_port_free(host: str, port: int) -> None:
    """Refuse (ServeError) a host:port this machine cannot listen on: a port something else holds (pick
    another --port), or a host that is not one of this machine's addresses (pick another --host)."""
    import errno
    import socket

    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]  # IPv6 hosts bind AF_INET6
    except socket.gaierror as e:
        raise ServeError(f"cannot listen on {host}:{port} ({e.strerror}); pick another --host") from None
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError as e:
            fix = "--port" if e.errno in (errno.EADDRINUSE, errno.EACCES) else "--host"
            raise ServeError(f"cannot listen on {host}:{port} ({e.strerror}); pick another {fix}") from None
