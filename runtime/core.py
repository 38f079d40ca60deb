"""The ONNX Runtime session over an exported model: open it on a provider, read its metadata,
run it (plain, or with I/O binding over torch storage), and the raw runtime for loops that
manage their own inputs. Where it runs is runtime/providers.py; its inputs are checked by
runtime/feeds.py; OnnxSession (runtime/session.py) adds the token-by-token calls and node placement.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

import zoo

from .feeds import NP_DTYPE, RunInputError, np_of, run_feeds
from .io import CONTEXT, PAST_KEY, PAST_LEN, X
from .lowering_facts import RUN_FACTS, RunFacts
from .names import PROVIDERS
from .providers import (
    CUDA,
    SessionError,
    announce,
    choose,
    cuda_options,
    device_of,
    ort,
    providers_for,
    run_failure,
    session_options,
)
from .tensors import is_tensor, torch_dtype


class RuntimeSession:
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
        spin: bool | None = None,
        tf32: bool = False,
        cuda_graph: bool = False,
    ) -> None:
        """io_binding: bind torch tensors in place; None = on CUDA only (on the CPU a plain run
        over zero-copy numpy views measured as fast or a little faster at decode sizes).
        spin: let idle intra-op threads spin between nodes; None = for a whole-model export only
        (a generation loop runs ORT alone; a block shares the process with torch).
        verbose: say `note` (what "auto" chose, and why) on stdout; the CLI prints it its own way.
        tf32: on CUDA, let fp32 MatMul/Gemm run in TF32 (faster, ~1e-3 relative error a product:
        runtime/providers.py TF32_TOLERANCE); False (the default) passes use_tf32=0, so fp32 is fp32.
        cuda_graph: a whole model's decode step captured as a CUDA graph and replayed (enable_cuda_graph; a
        packed-rows export, runtime/device_decode.py); on the CPU the same fixed-buffer driver runs, uncaptured."""
        if not isinstance(provider, str) or provider not in PROVIDERS:
            raise zoo.ArgumentError(f"provider={provider!r} is not one of {', '.join(PROVIDERS)}")
        if not isinstance(path, (str, os.PathLike)):
            raise zoo.InputTypeError(f"path={path!r} must be the path of an .onnx file (str or os.PathLike)")
        bad_threads = isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= 1024
        if threads is not None and bad_threads:
            raise zoo.ArgumentError(f"threads={threads!r} must be an integer in 1..1024, or None")
        if not isinstance(tf32, bool):
            raise zoo.ArgumentError(f"tf32={tf32!r} must be True or False")
        if not isinstance(cuda_graph, bool):
            raise zoo.ArgumentError(f"cuda_graph={cuda_graph!r} must be True or False")
        self.tf32, self.cuda_graph = tf32, cuda_graph
        self.path = Path(path)
        if self.path.is_dir():
            raise SessionError(f"{self.path} is a folder; give the path of an .onnx file")
        if not self.path.is_file():
            raise zoo.MissingFileError(
                f"{self.path}: no such file; export one with `attnzoo export NAME -o {self.path}`"
            )
        self.metadata = self._read_metadata()
        if cuda_graph and self.metadata.get("attnzoo.padding") != "packed":
            raise zoo.ArgumentError(
                f"cuda_graph=True replays a whole model's decode step, which needs a packed-rows export (its "
                f"lengths on the device, no bias); {self.path.name} is not one: export it with padding='packed' "
                "(CLI: export --whole --target cuda --dtype float16: GroupQueryAttention has no fp32 CUDA kernel)"
            )
        use_cuda, self.note = choose(provider)
        if self.note and verbose:
            announce(self.note)
        if spin is not None and not isinstance(spin, bool):
            raise zoo.ArgumentError(f"spin={spin!r} must be True, False or None")
        if spin is None:
            spin = self.is_lm
        self.spinning = spin
        opts = session_options(threads, profile=profile, spin=spin)
        try:
            self._sess = ort().InferenceSession(
                str(self.path), opts, providers=providers_for(use_cuda, tf32=tf32, cuda_graph=cuda_graph)
            )
        except Exception as e:  # noqa: BLE001 - ORT raises its own exception types
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise SessionError(f"ONNX Runtime cannot load {self.path}: {first}") from None
        used = self._sess.get_providers()
        if use_cuda and used[0] != CUDA:
            raise SessionError(f"the CUDA provider did not start for {self.path}; session uses {used}")
        if use_cuda:
            self._check_cuda_options()
        self.provider = device_of(used)
        self.io_binding = self.provider == "cuda" if io_binding is None else io_binding
        self._inputs = {i.name: i for i in self._sess.get_inputs()}
        self._outputs = [o.name for o in self._sess.get_outputs()]
        self.spec = self._read_spec()
        self._graphs: dict = {}  # cuda_graph: generate's device buffers per (batch, capacity)
        self._graph_ids: dict = {}  # what each CUDA graph id (gpu_graph_id) of this session was given to

    def graph_id(self, key) -> int:
        """The CUDA graph id (run option gpu_graph_id) for `key`: the one it was given, else a fresh one (1, 2,
        ...). Every capture of a session needs an id of its own: generate's per (batch, capacity), a continuous
        batcher's per batch size."""
        return self._graph_ids.setdefault(key, len(self._graph_ids) + 1)

    def _check_cuda_options(self) -> None:
        """The CUDA provider runs with the options asked for (use_tf32 above all): read back from ONNX Runtime."""
        got = self._sess.get_provider_options().get(CUDA, {})
        wrong = {
            k: (v, got.get(k)) for k, v in cuda_options(self.tf32, self.cuda_graph).items() if str(got.get(k)) != v
        }
        if wrong:
            raise SessionError(f"the CUDA provider of {self.path} ignored options (asked, got): {wrong}")

    # -- what the model is ---------------------------------------------------------------

    def _read_metadata(self) -> dict[str, str]:
        return onnx_metadata(self.path)

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
        return np.dtype(NP_DTYPE[self._inputs[X.name].type]) if X.name in self._inputs else np.dtype(np.float32)

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

    @property
    def lowering(self) -> RunFacts | None:
        """What the run time knows of the lowering this file was exported with (runtime/lowering_facts.py;
        None: a file attnzoo did not write, or a lowering name this version does not know)."""
        return RUN_FACTS.get(self.metadata.get("attnzoo.lowering", ""))

    @property
    def is_lm(self) -> bool:
        """True for a whole decoder model (export_onnx of a zoo.DecoderLM): generated from, not run as a block."""
        return self.metadata.get("attnzoo.kind") == "lm"

    @property
    def is_decode(self) -> bool:
        """True for a token-by-token model (inputs x, past_key, past_value [, key_mask])."""
        return PAST_KEY.name in self._inputs

    @property
    def cache(self) -> str | None:
        """A decode model's cache: "static" (buffers written in place, runtime/static_decoding.py),
        "grow" (a new present each call), or None for a full-sequence model."""
        if not self.is_decode:
            return None
        return "static" if PAST_LEN.name in self._inputs else "grow"

    def describe(self) -> str:
        ins = ", ".join(f"{i.name} {i.type[7:-1]}{list(i.shape)}" for i in self._sess.get_inputs())
        outs = ", ".join(f"{o.name} {o.type[7:-1]}{list(o.shape)}" for o in self._sess.get_outputs())
        name = self.metadata.get("attnzoo.name", "?")
        lowering = self.metadata.get("attnzoo.lowering", "?")
        return f"{self.path}: {name} ({lowering}, {self.precision}) on {self.provider}; inputs {ins}; outputs {outs}"

    def check_size(self, b: int, t: int, s: int) -> None:
        """Raise zoo.ResourceError when a call at (b, t, s) would need more memory than this
        machine has (an estimate from zoo.accounting; `run` checks before ORT allocates)."""
        if self.spec is None:
            return
        from zoo.accounting import working_set_bytes
        from zoo.limits import check_fits

        # Score tensors (b h t s) the lowering's CPU kernels hold at once (measured peaks, README).
        copies = self.lowering.score_copies if self.lowering is not None else 0
        need = working_set_bytes(
            self.spec, b, t, s if self.spec.is_cross else None, itemsize=self.dtype.itemsize, score_copies=copies
        )
        check_fits(need, f"running {self.path.name} at (b, t, s) = ({b}, {t}, {s})")

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
        feeds = run_feeds(self._inputs, self.dtype, x, context, mask, head_mask, check_size=self.check_size)
        if is_tensor(x):
            import torch  # loaded: x is a tensor

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

    def run_with_iobinding(self, binding, run_options=None) -> None:
        """Run with a binding from new_binding(); the outputs stay where they were bound. run_options: an
        onnxruntime.RunOptions (a CUDA graph's gpu_graph_id, runtime/device_decode.py)."""
        try:
            self._sess.run_with_iobinding(binding, run_options)
        except Exception as e:  # noqa: BLE001 - ORT's own exception types
            raise run_failure(e, self.path.name, self.provider) from e

    def end_profiling(self) -> str:
        """The path of the profile of a session opened with profile=True (ONNX Runtime's JSON trace)."""
        return self._sess.end_profiling()

    def _ort_run(self, arrays: dict[str, np.ndarray]) -> list[np.ndarray]:
        try:
            return self._sess.run(self._outputs, arrays)
        except Exception as e:  # noqa: BLE001 - ORT's own exception types
            raise run_failure(e, self.path.name, self.provider) from e

    def _run_bound(self, feeds: dict[str, Any]) -> list[Any]:
        """IO binding over torch storage (feeds are torch tensors): no host round trip for CUDA tensors."""
        import torch

        device = "cuda" if self.provider == "cuda" else "cpu"
        binding = self._sess.io_binding()
        keep = []
        x = feeds[X.name]
        for name, t in feeds.items():
            if device == "cuda" and not t.is_cuda:
                t = t.cuda()
            if device == "cpu" and t.device.type != "cpu":
                raise RunInputError(f"{name} is on {t.device} but this session runs on the CPU")
            t = t.contiguous()
            keep.append(t)
            binding.bind_input(
                name, t.device.type, t.device.index or 0, np_of(t.dtype).type, tuple(t.shape), t.data_ptr()
            )
        b, tq = x.shape[0], x.shape[1]
        s_len = feeds[CONTEXT.name].shape[1] if CONTEXT.name in feeds else tq
        outs = []
        for name in self._outputs:
            shape = self._output_shape(name, b, tq, s_len)
            out = torch.empty(shape, dtype=torch_dtype(self.dtype.type), device=device)
            binding.bind_output(name, out.device.type, out.device.index or 0, self.dtype.type, shape, out.data_ptr())
            outs.append(out)
        if device == "cuda":
            # ORT computes on its own stream: the inputs torch just wrote must be ready first.
            torch.cuda.current_stream().synchronize()
        self.run_with_iobinding(binding)
        del keep
        return outs

    def _output_shape(self, name: str, b: int, t: int, s: int) -> tuple[int, ...]:
        dims = {"b": b, "t": t, "s": s}
        o = next(o for o in self._sess.get_outputs() if o.name == name)
        shape = tuple(d if isinstance(d, int) else dims.get(str(d)) for d in o.shape)
        if any(d is None for d in shape):
            raise SessionError(f"output {name} has axes {o.shape} that are not in the axis vocabulary b/t/s")
        return shape


__all__ = ["RuntimeSession"]


def onnx_metadata(path: str | Path) -> dict[str, str]:
    """An ONNX file's metadata_props, read without its weights; SessionError for a file that is not one."""
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # noqa: BLE001 - protobuf's DecodeError and friends
        raise SessionError(f"{path} is not an ONNX model ({type(e).__name__}: {str(e)[:120]})") from None
    if not model.graph.node and not model.graph.input:
        raise SessionError(f"{path} is not an ONNX model (it parsed to an empty graph)")
    return {p.key: p.value for p in model.metadata_props}
