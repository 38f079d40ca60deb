"""Writing an export: the output path's checks, and the atomic save (temp folder beside the target,
checked by onnx.checker or ONNX Runtime, then published), with external data past EXTERNAL_DATA_BYTES.
Shared by block exports (export/writer.py) and whole-model exports (export/lm_export.py)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import torch

import zoo
from zoo.files import TEMP_PREFIX, ensure_writable_parent, is_special, publish, resolve_output, weights_file

from .errors import ExportError
from .graphs import op_counts
from .tracing import DTYPES

# Ops ONNX Runtime registers in the default ONNX domain though ONNX itself has no such op.
ORT_DEFAULT_DOMAIN_OPS = ("SimplifiedLayerNormalization",)
# ONNX Runtime's words when a node has no kernel on the provider (after the graph's own checks passed)
NO_CPU_KERNEL = "Could not find an implementation for"
EXTERNAL_DATA_BYTES = 1_800_000_000  # protobuf's hard limit is 2 GiB; stay clear of it
# torch's exporter records on every node the Python stack that traced it: the exporting checkout's file
# paths. Dropped on save, so that a file names no file of the code that wrote it and one export of a zoo
# name is the same bytes from any checkout. (The node's module path and FX node, which name no file,
# stay; a checkpoint's export keeps the folder it was given as its name.)
MACHINE_METADATA = ("pkg.torch.onnx.stack_trace",)


def output_target(path: Path, overwrite: bool) -> Path:
    """The file an export writes (a symlink there is replaced, not followed; a device or FIFO is written
    through), refused when it exists (a link to nothing too) without overwrite or its folder cannot be written."""
    try:
        target = resolve_output(path)
        if os.path.lexists(target) and not overwrite and not is_special(target):
            raise zoo.OutputExistsError(f"{path} exists; pass overwrite=True (CLI: --force) to replace it")
        ensure_writable_parent(target)
    except zoo.OutputExistsError:  # stays what it was: a FileExistsError (and under the root)
        raise
    except zoo.OutputPathError as e:  # an export's refusals are ExportErrors, its path's too
        raise ExportError(str(e)) from None
    return target


def save_atomic(
    model, path: Path, module, dtype: str, *, overwrite: bool = False, limit: int = EXTERNAL_DATA_BYTES
) -> Path | None:
    """Write into a temp folder beside `path` (same filesystem), check it, then publish it.

        The no-overwrite rule is enforced by the publishing step itself (see `publish`), not only
        by a check before the work: two exports racing for one name cannot both win. Weights past `limit`
    bytes go to a .data file beside it (external data)."""
    import onnx_ir as ir

    path.parent.mkdir(parents=True, exist_ok=True)
    itemsize = torch.tensor([], dtype=DTYPES[dtype]).element_size()
    big = zoo.count_parameters(module) * itemsize > limit
    data_path = weights_file(path) if big else None
    special = is_special(path)
    if special and big:
        raise ExportError(f"{path} is not a regular file, and this model keeps its weights in a .data file beside it")
    if data_path is not None and data_path.exists() and not data_path.is_symlink() and not data_path.is_file():
        raise ExportError(f"cannot write {data_path} (the export's weights): it is not a regular file; remove it")
    try:
        tmpdir = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX, dir=None if special else path.parent))
    except OSError as e:
        raise ExportError(f"cannot write {path}: {e.strerror or e}") from None
    try:
        tmp = tmpdir / path.name
        _drop_machine_metadata(model)
        try:
            ir.save(model, tmp, external_data=data_path.name if data_path else None)
        except OSError as e:
            raise ExportError(f"cannot write {path}: {e.strerror or e}") from None
        _check_saved(tmp, model, dtype)
        if data_path is not None:
            publish(tmpdir / data_path.name, data_path, overwrite=overwrite, through=False)
        try:
            publish(tmp, path, overwrite=overwrite)
        except BaseException:
            if data_path is not None and not overwrite:
                data_path.unlink(missing_ok=True)  # ours: published a moment ago, now orphaned
            raise
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    return data_path


def _drop_machine_metadata(model) -> None:
    for graph in (model.graph, *model.functions.values()):
        for node in graph.all_nodes():
            for key in MACHINE_METADATA:
                node.metadata_props.pop(key, None)


def _check_saved(tmp: Path, model, dtype: str = "float32") -> None:
    """onnx.checker with strict shape inference; for a graph holding ORT-only ops in the default
    domain (onnx.checker rejects those), ONNX Runtime's own loader is the check instead. A bfloat16 graph
    (for CUDA) passes that loader's graph checks (types and shapes of every node, contrib ops included) and
    then stops at its first CPU kernel ("Could not find an implementation"): that one refusal is expected."""
    import onnx

    if not any(op in ORT_DEFAULT_DOMAIN_OPS for op in op_counts(model)):
        try:
            onnx.checker.check_model(str(tmp), full_check=True)
        except Exception as e:
            raise ExportError(f"the exported model fails onnx.checker (full check): {e}") from e
        return
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    try:
        ort.InferenceSession(str(tmp), opts, providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 - ORT raises its own types
        if dtype == "bfloat16" and NO_CPU_KERNEL in str(e):
            return  # the graph resolved; only the CPU provider's kernels are missing (tracing.BF16_CPU)
        raise ExportError(f"ONNX Runtime cannot load the exported model: {str(e).splitlines()[0]}") from e
