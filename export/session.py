"""ONNX Runtime sessions that say where they really run.

`get_available_providers()` lists CUDA on any machine with the GPU wheel installed, GPU or
not, and ONNX Runtime then quietly falls back to the CPU. So "CUDA works" is judged on a
created session: its `get_providers()` must start with CUDAExecutionProvider.
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

import zoo

from .names import PROVIDERS

_ORT_NAME = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}
_NP_DTYPE = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(bool)": np.bool_}
_TORCH_DTYPE = {np.float32: torch.float32, np.float16: torch.float16, np.bool_: torch.bool}


class SessionError(zoo.AttnzooError, RuntimeError):
    """The model cannot be loaded, or the asked-for provider does not really work here."""


class RunInputError(zoo.AttnzooError, ValueError):
    """An input given to OnnxSession.run does not fit the model's inputs."""


def _ort():
    import onnxruntime as ort

    return ort


@functools.lru_cache(maxsize=1)
def cuda_status() -> tuple[bool, str]:
    """(usable, one-line reason): can ONNX Runtime really run a CUDA session here?"""
    ort = _ort()
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return False, f"onnxruntime {ort.__version__} ({ort.get_device()} build) has no CUDA provider"
    if hasattr(ort, "preload_dlls") and torch.version.cuda is not None:
        try:
            ort.preload_dlls()  # CUDA/cuDNN from the nvidia-* wheels beside torch
        except Exception:  # noqa: BLE001 - best effort; the probe below decides
            pass
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["a"], ["b"])],
        "probe",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("b", TensorProto.FLOAT, [1])],
    )
    # IR 10 / opset 18: what older runtimes (onnxruntime-gpu trails onnxruntime) accept.
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    try:
        ort.set_default_logger_severity(4)
        sess = ort.InferenceSession(
            model.SerializeToString(), opts, providers=["CUDAExecutionProvider", "CPUExecutionProvider"]
        )
    except Exception as e:  # noqa: BLE001
        return False, f"CUDA session failed to start: {str(e).splitlines()[0][:200]}"
    finally:
        ort.set_default_logger_severity(2)
    del onnx
    used = sess.get_providers()
    if not used or used[0] != "CUDAExecutionProvider":
        return False, (
            "the CUDA provider is installed but could not start (no GPU, or no CUDA/cuDNN "
            f"libraries it can load); a test session fell back to {used}"
        )
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "device 0"
    return True, f"CUDA works ({gpu}, onnxruntime {ort.__version__})"


@dataclass(frozen=True)
class NodePlacement:
    name: str
    op_type: str
    provider: str


class OnnxSession:
    """An ONNX Runtime session over an attnzoo model (or any model with x/context/mask inputs).

    provider: "auto" (CUDA when it really works, else CPU, with one line saying why),
    "cpu", or "cuda" (raises SessionError when CUDA does not really work).
    """

    def __init__(
        self,
        path: str | os.PathLike,
        provider: str = "auto",
        threads: int | None = None,
        *,
        verbose: bool = True,
        profile: bool = False,
        io_binding: bool | None = None,
    ) -> None:
        """io_binding: bind torch tensors in place; None = on CUDA only (on the CPU a plain run
        over zero-copy numpy views measured as fast or a little faster at decode sizes)."""
        if not isinstance(provider, str) or provider not in PROVIDERS:
            raise zoo.ArgumentError(f"provider={provider!r} is not one of {', '.join(PROVIDERS)}")
        if not isinstance(path, (str, os.PathLike)):
            raise zoo.InputTypeError(f"path={path!r} must be the path of an .onnx file (str or os.PathLike)")
        bad_threads = isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= 1024
        if threads is not None and bad_threads:
            raise zoo.ArgumentError(f"threads={threads!r} must be an integer in 1..1024, or None")
        self.path = Path(path)
        if self.path.is_dir():
            raise SessionError(f"{self.path} is a folder; give the path of an .onnx file")
        if not self.path.is_file():
            raise zoo.MissingFileError(
                f"{self.path}: no such file; export one with `attnzoo export NAME -o {self.path}`"
            )
        self.metadata = self._read_metadata()
        ort = _ort()
        self.note = ""
        if provider == "cpu":
            use_cuda = False
        else:
            ok, why = cuda_status()
            if provider == "cuda" and not ok:
                raise SessionError(f"provider='cuda' asked for, but {why}; use provider='cpu' or 'auto'")
            use_cuda = ok
            if provider == "auto":
                self.note = f"provider auto -> {'cuda' if ok else 'cpu'}: {why}"
                if verbose:
                    print(f"attnzoo: {self.note}")
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        # Idle ORT threads spin by default, stealing the cores torch (or a second session) in the
        # same process needs; measured no slower for ORT alone, faster when they alternate.
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        if threads is not None:
            opts.intra_op_num_threads = threads
        if profile:
            opts.enable_profiling = True
            opts.profile_file_prefix = str(Path(tempfile.gettempdir()) / f"attnzoo-profile-{os.getpid()}")
        providers = (["CUDAExecutionProvider"] if use_cuda else []) + ["CPUExecutionProvider"]
        try:
            self._sess = ort.InferenceSession(str(self.path), opts, providers=providers)
        except Exception as e:  # noqa: BLE001 - ORT raises its own exception types
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise SessionError(f"ONNX Runtime cannot load {self.path}: {first}") from None
        used = self._sess.get_providers()
        if use_cuda and used[0] != "CUDAExecutionProvider":
            raise SessionError(f"the CUDA provider did not start for {self.path}; session uses {used}")
        self.provider = "cuda" if used[0] == "CUDAExecutionProvider" else "cpu"
        self.io_binding = self.provider == "cuda" if io_binding is None else io_binding
        self._inputs = {i.name: i for i in self._sess.get_inputs()}
        self._outputs = [o.name for o in self._sess.get_outputs()]
        self.spec = self._read_spec()

    # -- what the model is ---------------------------------------------------------------

    def _read_metadata(self) -> dict[str, str]:
        import onnx

        try:
            model = onnx.load(str(self.path), load_external_data=False)
        except Exception as e:  # noqa: BLE001 - protobuf's DecodeError and friends
            raise SessionError(f"{self.path} is not an ONNX model ({type(e).__name__}: {str(e)[:120]})") from None
        if not model.graph.node and not model.graph.input:
            raise SessionError(f"{self.path} is not an ONNX model (it parsed to an empty graph)")
        return {p.key: p.value for p in model.metadata_props}

    def _read_spec(self) -> zoo.AttentionSpec | None:
        raw = self.metadata.get("attnzoo.spec")
        if not raw:
            return None
        try:
            return zoo.AttentionSpec(**json.loads(raw))
        except (TypeError, ValueError) as e:
            raise SessionError(f"{self.path}: its attnzoo.spec metadata is not a valid spec ({e})") from None

    @property
    def session_providers(self) -> list[str]:
        """What ONNX Runtime reports the created session uses, in priority order."""
        return list(self._sess.get_providers())

    @property
    def input_names(self) -> list[str]:
        return list(self._inputs)

    @property
    def output_names(self) -> list[str]:
        return list(self._outputs)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(_NP_DTYPE[self._inputs["x"].type]) if "x" in self._inputs else np.dtype(np.float32)

    @property
    def precision(self) -> str:
        """The weights' precision from the metadata ("fp32" for files written before it was recorded),
        with the method, block size and accuracy level where they apply (export/precision.py)."""
        md = self.metadata
        prec = md.get("attnzoo.precision", "fp32")
        if "attnzoo.precision.method" not in md:
            return prec
        extra = "".join(
            f", {k.rsplit('.', 1)[-1].replace('_', ' ')} {md[k]}"
            for k in ("attnzoo.precision.block_size", "attnzoo.precision.accuracy_level")
            if k in md
        )
        return f"{prec} ({md['attnzoo.precision.method']}{extra})"

    def describe(self) -> str:
        ins = ", ".join(f"{i.name} {i.type[7:-1]}{list(i.shape)}" for i in self._sess.get_inputs())
        outs = ", ".join(f"{o.name} {o.type[7:-1]}{list(o.shape)}" for o in self._sess.get_outputs())
        name = self.metadata.get("attnzoo.name", "?")
        lowering = self.metadata.get("attnzoo.lowering", "?")
        return f"{self.path}: {name} ({lowering}, {self.precision}) on {self.provider}; inputs {ins}; outputs {outs}"

    # -- running ---------------------------------------------------------------------------

    def run(self, x: Any, context: Any = None, mask: Any = None, head_mask: Any = None):
        """y (b t c), or (y, attn) when the model outputs weights. torch in -> torch out.

        On CUDA, torch tensors are bound in place (no host round trip); on the CPU they are
        passed as zero-copy numpy views and the outputs come back as tensors over ORT's arrays.
        """
        if self.is_decode:
            raise RunInputError(
                f"{self.path} is a token-by-token model: use sess.decode(x, past_key, past_value) "
                f"or sess.generate_steps(x_steps)"
            )
        feeds = self._prepare(x, context, mask, head_mask)
        if isinstance(x, torch.Tensor):
            if self.io_binding:
                outs = self._run_bound(feeds)
            else:
                for name, t in feeds.items():
                    if t.device.type != "cpu":
                        raise RunInputError(f"{name} is on {t.device} but this session runs on the CPU")
                arrays = {k: np.ascontiguousarray(v.detach().numpy()) for k, v in feeds.items()}
                outs = [torch.from_numpy(o) for o in self._ort_run(arrays)]
        else:
            outs = self._ort_run({k: np.ascontiguousarray(v) for k, v in feeds.items()})
        return outs[0] if len(outs) == 1 else tuple(outs)

    # -- the raw runtime, for loops that manage their own inputs (decoding, the benchmark) -----

    def run_feeds(self, arrays: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Run on numpy arrays named as the model's inputs, no checks: every output, in order."""
        return self._ort_run(arrays)

    def new_binding(self):
        """A fresh onnxruntime IOBinding of this session (bind inputs/outputs once, run many times)."""
        return self._sess.io_binding()

    def run_with_iobinding(self, binding) -> None:
        """Run with a binding from new_binding(); the outputs stay where they were bound."""
        self._sess.run_with_iobinding(binding)

    def _ort_run(self, arrays: dict[str, np.ndarray]) -> list[np.ndarray]:
        try:
            return self._sess.run(self._outputs, arrays)
        except Exception as e:  # noqa: BLE001 - ORT's own exception types
            text = str(e)
            if "allocate" in text.lower() or "bad_alloc" in text.lower():
                first = text.strip().splitlines()[0][:200]
                raise zoo.ResourceError(f"ONNX Runtime ran out of memory running {self.path.name}: {first}") from e
            raise

    def _prepare(self, x, context, mask, head_mask) -> dict[str, Any]:
        given = {"x": x, "context": context, "mask": mask, "head_mask": head_mask}
        for name, value in given.items():
            if value is not None and name not in self._inputs:
                hint = {"mask": "--mask", "head_mask": "--head-mask"}.get(name)
                fix = f"; re-export with {hint}" if hint else ""
                raise RunInputError(f"this model has no {name!r} input (inputs: {self.input_names}){fix}")
            if value is not None and not isinstance(value, (torch.Tensor, np.ndarray)):
                raise zoo.InputTypeError(f"{name} must be a torch.Tensor or numpy array, got {type(value).__name__}")
        if x is None:
            raise RunInputError("x is required")
        if "context" in self._inputs and context is None:
            raise RunInputError("this is a cross-attention model: pass context (b, s, d_context)")
        want_dtype = self.dtype
        lib = torch if isinstance(x, torch.Tensor) else np
        for name in ("context", "mask", "head_mask"):
            v = given[name]
            if v is not None and isinstance(v, torch.Tensor) != (lib is torch):
                raise zoo.InputTypeError(
                    f"x is a {'torch tensor' if lib is torch else 'numpy array'} but {name} is not; pass one kind"
                )
        self._check_float("x", x, 3, want_dtype)
        b, t = x.shape[0], x.shape[1]
        if context is not None:
            self._check_float("context", context, 3, want_dtype)
            if context.shape[0] != b:
                raise RunInputError(f"context has batch {context.shape[0]}, x has {b}")
        s_len = context.shape[1] if context is not None else t
        # ONNX Runtime's kernels are not all safe on empty axes (the decomposed graph's
        # Reshape divides by b: SIGFPE at b = 0), so an empty input never reaches them.
        if b == 0 or t == 0 or s_len == 0:
            axes = (("b", b), ("t", t)) + ((("s", s_len),) if context is not None else ())
            empty = ", ".join(f"{a}=0" for a, n in axes if n == 0)
            shapes = f"x {tuple(x.shape)}" + (f", context {tuple(context.shape)}" if context is not None else "")
            raise RunInputError(f"empty input ({empty}; {shapes}): every axis must be at least 1")
        self.check_size(b, t, s_len)
        feeds: dict[str, Any] = {"x": x}
        if context is not None:
            feeds["context"] = context
        if "mask" in self._inputs:
            feeds["mask"] = self._mask(mask, b, t, s_len, lib)
        if "head_mask" in self._inputs:
            feeds["head_mask"] = self._head_mask(head_mask, b, lib, want_dtype)
        return feeds

    def check_size(self, b: int, t: int, s: int) -> None:
        """Raise zoo.ResourceError when a call at (b, t, s) would need more memory than this
        machine has (an estimate from zoo.accounting; `run` checks before ORT allocates)."""
        if self.spec is None:
            return
        from zoo.accounting import working_set_bytes
        from zoo.limits import check_fits

        # Score tensors (b h t s) the lowering's CPU kernels hold at once (measured peaks, README).
        from .lowerings import RECORDS

        rec = RECORDS.get(self.metadata.get("attnzoo.lowering", ""))
        copies = rec.score_copies if rec is not None else 0
        need = working_set_bytes(
            self.spec, b, t, s if self.spec.is_cross else None, itemsize=self.dtype.itemsize, score_copies=copies
        )
        check_fits(need, f"running {self.path.name} at (b, t, s) = ({b}, {t}, {s})")

    def _check_float(self, name: str, v, rank: int, want: np.dtype) -> None:
        io = self._inputs[name]
        shape = tuple(v.shape)
        if len(shape) != rank:
            raise RunInputError(f"{name} has shape {shape}; the model takes {list(io.shape)}")
        for got, dim in zip(shape, io.shape):
            if isinstance(dim, int) and got != dim:
                raise RunInputError(f"{name} has shape {shape}; the model takes {list(io.shape)}")
        got_dtype = v.dtype if isinstance(v, np.ndarray) else v.dtype
        if _np_of(got_dtype) != want:
            raise zoo.InputTypeError(
                f"{name} has dtype {got_dtype}; this model takes {want} (convert with .astype/.to)"
            )

    def _mask(self, mask, b, t, s, lib):
        if mask is None:
            return lib.ones((b, t, s), dtype=lib.bool_ if lib is np else torch.bool)
        if _np_of(mask.dtype) != np.bool_:
            raise zoo.InputTypeError(f"mask has dtype {mask.dtype}; the ONNX mask is bool (True = may attend)")
        shape = tuple(mask.shape)
        if len(shape) == 4:  # (b|1, 1, t, s): the exported mask is shared by all heads
            if shape[1] != 1:
                raise RunInputError(f"mask {shape}: the exported model takes one mask for all heads, (b, t, s)")
            mask = mask[:, 0]
        try:
            out = np.broadcast_to(mask, (b, t, s)) if lib is np else mask.expand(b, t, s)
        except (ValueError, RuntimeError):
            raise RunInputError(f"mask of shape {shape} does not broadcast to (b, t, s) = {(b, t, s)}") from None
        return np.ascontiguousarray(out) if lib is np else out.contiguous()

    def _head_mask(self, hm, b, lib, dtype):
        h = self._inputs["head_mask"].shape[1]
        if hm is None:
            return np.ones((b, h), dtype=dtype) if lib is np else torch.ones(b, h, dtype=_TORCH_DTYPE[dtype.type])
        shape = tuple(hm.shape)
        if shape not in ((h,), (b, h), (1, h)):
            raise RunInputError(f"head_mask has shape {shape}; expected ({h},) or ({b}, {h})")
        if lib is np:
            return np.ascontiguousarray(np.broadcast_to(hm.astype(dtype), (b, h)))
        return hm.to(_TORCH_DTYPE[dtype.type]).expand(b, h).contiguous()

    def _run_bound(self, feeds: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        """IO binding over torch storage: no host round trip for CUDA tensors."""
        device = "cuda" if self.provider == "cuda" else "cpu"
        binding = self._sess.io_binding()
        keep = []
        x = feeds["x"]
        for name, t in feeds.items():
            if device == "cuda" and not t.is_cuda:
                t = t.cuda()
            if device == "cpu" and t.device.type != "cpu":
                raise RunInputError(f"{name} is on {t.device} but this session runs on the CPU")
            t = t.contiguous()
            keep.append(t)
            binding.bind_input(
                name, t.device.type, t.device.index or 0, _np_of(t.dtype).type, tuple(t.shape), t.data_ptr()
            )
        b, tq = x.shape[0], x.shape[1]
        s_len = feeds["context"].shape[1] if "context" in feeds else tq
        outs = []
        for name in self._outputs:
            shape = self._output_shape(name, b, tq, s_len)
            out = torch.empty(shape, dtype=_TORCH_DTYPE[self.dtype.type], device=device)
            binding.bind_output(name, out.device.type, out.device.index or 0, self.dtype.type, shape, out.data_ptr())
            outs.append(out)
        if device == "cuda":
            # ORT computes on its own stream: the inputs torch just wrote must be ready first.
            torch.cuda.current_stream().synchronize()
        self._sess.run_with_iobinding(binding)
        del keep
        return outs

    def _output_shape(self, name: str, b: int, t: int, s: int) -> tuple[int, ...]:
        dims = {"b": b, "t": t, "s": s}
        o = next(o for o in self._sess.get_outputs() if o.name == name)
        shape = tuple(d if isinstance(d, int) else dims.get(str(d)) for d in o.shape)
        if any(d is None for d in shape):
            raise SessionError(f"output {name} has axes {o.shape} that are not in the axis vocabulary b/t/s")
        return shape

    # -- where did it run ------------------------------------------------------------------

    def node_placements(self, x, context=None, mask=None, head_mask=None) -> list[NodePlacement]:
        """Run once with profiling and report the provider each node actually ran on."""
        prof = OnnxSession(self.path, "cuda" if self.provider == "cuda" else "cpu", verbose=False, profile=True)
        prof.run(x, context, mask, head_mask)
        trace = prof._sess.end_profiling()
        try:
            events = json.loads(Path(trace).read_text())
        finally:
            Path(trace).unlink(missing_ok=True)
        seen: dict[str, NodePlacement] = {}
        for ev in events:
            args = ev.get("args", {})
            if ev.get("cat") == "Node" and "provider" in args:
                node = ev["name"].rsplit("_kernel_time", 1)[0]
                seen.setdefault(node, NodePlacement(node, args.get("op_name", "?"), args["provider"]))
        return list(seen.values())

    # -- token by token (models exported with decode=True; export/decoding.py) ---------------

    @property
    def is_decode(self) -> bool:
        """True for a token-by-token model (inputs x, past_key, past_value [, key_mask])."""
        return "past_key" in self._inputs

    @property
    def cache(self) -> str | None:
        """A decode model's cache: "static" (buffers written in place, export/static_decoding.py),
        "grow" (a new present each call), or None for a full-sequence model."""
        if not self.is_decode:
            return None
        return "static" if "past_len" in self._inputs else "grow"

    def decode(self, x, past_key=None, past_value=None, key_mask=None):
        """One call: x (b t c) at positions p..p+t-1 -> (y, present_key, present_value)."""
        from . import decoding, static_decoding

        run = static_decoding.decode if self.cache == "static" else decoding.decode
        return run(self, x, past_key, past_value, key_mask)

    def generate_steps(self, x_steps, past_key=None, past_value=None, key_mask=None):
        """x_steps (b k c) fed one position at a time, the cache kept by the runtime -> (y (b k c), cache)."""
        from . import decoding, static_decoding

        run = static_decoding.generate_steps if self.cache == "static" else decoding.generate_steps
        return run(self, x_steps, past_key, past_value, key_mask)

    def static_cache(self, batch: int, past_key=None, past_value=None, key_mask=None, *, max_len=None):
        """A static-cache model's buffers, bound once: `.step(x)` writes in place (export/static_decoding.py)."""
        from .static_decoding import static_cache

        if self.cache != "static":
            raise zoo.ArgumentError(
                f"{self.path} keeps a {self.cache or 'no'} cache; export with --decode --cache static for a static one"
            )
        return static_cache(self, batch, past_key, past_value, key_mask, max_len=max_len)

    @staticmethod
    def summarize_placements(placements: list[NodePlacement]) -> dict[str, dict[str, int]]:
        """{op_type: {provider: count}}."""
        out: dict[str, Counter] = {}
        for p in placements:
            out.setdefault(p.op_type, Counter())[p.provider] += 1
        return {k: dict(v) for k, v in sorted(out.items())}


def _np_of(dtype) -> np.dtype:
    if isinstance(dtype, torch.dtype):
        return np.dtype(
            {
                torch.float32: np.float32,
                torch.float16: np.float16,
                torch.bool: np.bool_,
                torch.float64: np.float64,
            }.get(dtype, np.void)
        )
    return np.dtype(dtype)


__all__ = ["OnnxSession", "SessionError", "RunInputError", "NodePlacement", "cuda_status"]
