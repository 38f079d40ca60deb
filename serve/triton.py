"""A Triton Inference Server model repository of exported blocks (onnxruntime backend).

    REPO/NAME/config.pbtxt       inputs/outputs, max_batch_size, dynamic batching, instances
    REPO/NAME/1/model.onnx       the export (dynamic b, t, s)

With max_batch_size > 0 Triton owns the batch axis: it is left out of each tensor's `dims`
(x (b, t, c) is written as dims [-1, c]). The config is written as text here and checked with
Triton's own schema (`tritonclient`'s `model_config_pb2`, text format) where that is installed.
Triton's dynamic batcher joins only requests of equal shapes (no padding), unlike `attnzoo serve`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zoo import AttnzooError, OutputExistsError

KINDS = ("cpu", "gpu")
_TRITON_TYPE = {"float32": "TYPE_FP32", "float16": "TYPE_FP16", "bool": "TYPE_BOOL"}
# onnx.TensorProto element types -> Triton data types (only those an attnzoo export uses).
_ONNX_TO_TRITON = {1: "TYPE_FP32", 10: "TYPE_FP16", 9: "TYPE_BOOL"}


INT32_MAX = 2**31 - 1  # Triton's max_batch_size and instance count are int32
MAX_BATCH_WAIT_US = 60_000_000  # a minute: a queue delay beyond that is a mistake, not a setting


def _int_in(v, low: int, high: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and low <= v <= high


class TritonError(AttnzooError, ValueError):
    """A repository that cannot be written as asked, or a config that does not fit its model."""


@dataclass(frozen=True)
class Written:
    name: str
    folder: Path
    config: str
    export_summary: str


def config_text(
    name: str,
    inputs: list[tuple[str, str, tuple[int | str, ...]]],
    outputs: list[tuple[str, str, tuple[int | str, ...]]],
    *,
    max_batch: int,
    instances: int,
    kind: str,
    batch_wait_us: int = 5000,
) -> str:
    """config.pbtxt for one exported model: (name, dtype, shape) per tensor, as ExportResult has."""
    if kind not in KINDS:
        raise TritonError(f"kind={kind!r} is not one of {', '.join(KINDS)}")
    if not _int_in(max_batch, 0, INT32_MAX):
        raise TritonError(f"max_batch={max_batch!r} must be an integer in 0..{INT32_MAX} (0: no batching)")
    if not _int_in(instances, 1, INT32_MAX):
        raise TritonError(f"instances={instances!r} must be an integer in 1..{INT32_MAX}")
    if not _int_in(batch_wait_us, 0, MAX_BATCH_WAIT_US):
        raise TritonError(
            f"batch_wait_us={batch_wait_us!r} must be an integer in 0..{MAX_BATCH_WAIT_US} (microseconds)"
        )

    def tensor(n: str, dtype: str, shape: tuple[int | str, ...]) -> str:
        dims = [-1 if isinstance(d, str) else d for d in shape]
        if max_batch > 0:
            if shape[0] != "b":
                raise TritonError(f"{n} has shape {shape}; batching needs the batch axis 'b' first")
            dims = dims[1:]
        body = f'name: "{n}"\n    data_type: {_TRITON_TYPE[dtype]}\n    dims: [ {", ".join(map(str, dims))} ]'
        return f"  {{\n    {body}\n  }}"

    lines = [
        f'name: "{name}"',
        'backend: "onnxruntime"',
        f"max_batch_size: {max_batch}",
        "input [\n" + ",\n".join(tensor(*io) for io in inputs) + "\n]",
        "output [\n" + ",\n".join(tensor(*io) for io in outputs) + "\n]",
        f"instance_group [\n  {{\n    count: {instances}\n    kind: KIND_{kind.upper()}\n  }}\n]",
    ]
    if max_batch > 0:
        lines.append(f"dynamic_batching {{\n  max_queue_delay_microseconds: {batch_wait_us}\n}}")
    return "\n".join(lines) + "\n"


def write_repository(
    names: list[str],
    repo: str | os.PathLike,
    *,
    max_batch: int = 8,
    instances: int = 1,
    kind: str = "cpu",
    batch_wait_us: int = 5000,
    lowering: str = "auto",
    dtype: str = "float32",
    with_mask: bool = False,
    overwrite: bool = False,
    **overrides: Any,
) -> list[Written]:
    """Export each zoo name into REPO/NAME/1/model.onnx and write REPO/NAME/config.pbtxt.

    Each model folder is built beside its final place and renamed in, so a failed export leaves
    no half model that Triton would try to load.
    """
    from export.writer import export_onnx
    from zoo.files import ensure_writable_parent

    if not isinstance(repo, (str, os.PathLike)) or not os.fspath(repo):
        raise TritonError(f"repo={repo!r}: give the model repository's folder, e.g. -o model_repo")
    if not names:
        raise TritonError("give at least one zoo name (see `attnzoo list`)")
    if len(set(names)) != len(names):
        raise TritonError(f"names {names} repeat; each model folder is written once")
    for n in names:
        if not n or "/" in n or n.startswith("."):
            raise TritonError(f"{n!r} cannot be a Triton model folder name")
    # Check the cheap things for every name before the first (slow) export.
    config_text("probe", [], [], max_batch=max_batch, instances=instances, kind=kind, batch_wait_us=batch_wait_us)
    repo = Path(repo)
    if repo.exists() and not repo.is_dir():
        raise TritonError(f"{repo} is a file; give a folder for the model repository")
    ensure_writable_parent(repo / "probe")
    for n in names:
        if os.path.lexists(repo / n) and not overwrite:  # a link too: replaced, never followed
            raise OutputExistsError(f"{repo / n} exists; pass overwrite=True (CLI: --force) to replace it")
    provider = "cuda" if kind == "gpu" else "cpu"
    # Folders and files get the modes open() and mkdir() would give them (mkdtemp's is 0700).
    umask = os.umask(0)
    os.umask(umask)
    written = []
    for n in names:
        tmp = Path(tempfile.mkdtemp(prefix=f".{n}.", dir=repo))
        try:
            result = export_onnx(
                n,
                tmp / "1" / "model.onnx",
                lowering=lowering,
                dtype=dtype,
                with_mask=with_mask,
                provider=provider,
                **overrides,
            )
            text = config_text(
                n,
                result.inputs,
                result.outputs,
                max_batch=max_batch,
                instances=instances,
                kind=kind,
                batch_wait_us=batch_wait_us,
            )
            _check_text(text, n)  # Triton's own schema, where installed, before anything is published
            (tmp / "config.pbtxt").write_text(text)
            _apply_umask(tmp, umask)
            final = repo / n
            if os.path.lexists(final):
                old = Path(tempfile.mkdtemp(prefix=f".{n}.old.", dir=repo))
                os.replace(final, old / n)
                shutil.rmtree(old, ignore_errors=True)
            os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        written.append(Written(n, final, text, result.summary()))
    return written


def _apply_umask(folder: Path, umask: int) -> None:
    """chmod `folder` and everything in it as mkdir (0777) and open (0666) would under `umask`."""
    for d, _, files in os.walk(folder):
        os.chmod(d, 0o777 & ~umask)
        for f in files:
            os.chmod(os.path.join(d, f), 0o666 & ~umask)


def _check_text(text: str, name: str) -> None:
    """Parse a config with Triton's schema when tritonclient is installed (else nothing to check)."""
    try:
        from google.protobuf import text_format
        from tritonclient.grpc import model_config_pb2
    except ImportError:
        return
    try:
        text_format.Parse(text, model_config_pb2.ModelConfig())
    except text_format.ParseError as e:
        raise TritonError(f"the config written for {name} is not a valid Triton model config: {e}") from None


def parse_config(path: str | os.PathLike):
    """config.pbtxt -> tritonclient's ModelConfig message (Triton's own schema, text format)."""
    from google.protobuf import text_format

    try:
        from tritonclient.grpc import model_config_pb2
    except ImportError as e:
        raise TritonError(f"checking a config needs tritonclient[grpc] ({e}); pip install 'attnzoo[serve]'") from None
    msg = model_config_pb2.ModelConfig()
    try:
        text_format.Parse(Path(path).read_text(), msg)
    except text_format.ParseError as e:
        raise TritonError(f"{path}: not a valid Triton model config: {e}") from None
    return msg


def check_model(folder: str | os.PathLike) -> list[str]:
    """Problems with REPO/NAME against its 1/model.onnx (empty when the two agree)."""
    import onnx
    from tritonclient.grpc import model_config_pb2

    folder = Path(folder)
    cfg = parse_config(folder / "config.pbtxt")
    model_path = folder / "1" / "model.onnx"
    if not model_path.is_file():
        return [f"{model_path} is missing"]
    graph = onnx.load(str(model_path), load_external_data=False).graph
    problems = []
    if cfg.name != folder.name:
        problems.append(f"config name {cfg.name!r} differs from the folder name {folder.name!r}")
    if cfg.backend != "onnxruntime":
        problems.append(f"backend {cfg.backend!r}, expected 'onnxruntime'")
    batched = cfg.max_batch_size > 0
    for role, declared, actual in (("input", cfg.input, graph.input), ("output", cfg.output, graph.output)):
        onnx_io = {v.name: v for v in actual}
        if [t.name for t in declared] != list(onnx_io):
            problems.append(f"{role}s {[t.name for t in declared]} differ from the ONNX {role}s {list(onnx_io)}")
            continue
        for t in declared:
            v = onnx_io[t.name]
            ttype = v.type.tensor_type
            want_type = _ONNX_TO_TRITON.get(ttype.elem_type, f"onnx elem_type {ttype.elem_type}")
            got_type = model_config_pb2.DataType.Name(t.data_type)
            if got_type != want_type:
                problems.append(f"{t.name}: data_type {got_type}, the ONNX file has {want_type}")
            dims = [d.dim_value if d.HasField("dim_value") else -1 for d in ttype.shape.dim]
            if batched:
                if not dims or dims[0] != -1:
                    problems.append(f"{t.name}: ONNX shape {dims} has no dynamic batch axis first")
                    continue
                dims = dims[1:]
            if list(t.dims) != dims:
                problems.append(f"{t.name}: dims {list(t.dims)}, the ONNX file has {dims}")
    if batched and not cfg.HasField("dynamic_batching"):
        problems.append("max_batch_size > 0 but no dynamic_batching block")
    return problems
