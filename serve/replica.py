"""What every Ray Serve replica of ours does first: open its session from the model's bytes, and keep
its own gRPC server on loopback when Ray runs there. Imported by the replicas in app.py (blocks) and
gen_app.py (whole models)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path


def open_session(model_bytes: bytes, name: str, provider: str, threads: int | None):
    """An OnnxSession over `model_bytes`: replicas may run on other machines, so the model travels as
    bytes, not as a path; its temporary file is gone once ONNX Runtime holds the model."""
    from export.session import OnnxSession

    folder = Path(tempfile.mkdtemp(prefix="attnzoo-serve-"))
    path = folder / f"{name}.onnx"
    path.write_bytes(model_bytes)
    try:
        return OnnxSession(path, provider=provider, threads=threads, verbose=False)
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
