"""Weight precision of an exported block, applied to the ONNX graph after the lowering, with
ONNX Runtime's own quantization tool (no quantizer of ours). One record per precision:

    fp32   the weights as exported (today's files)
    int8   weight-only 8-bit `MatMulNBits` (`MatMulNBitsQuantizer`), symmetric, block 32,
           accuracy_level 4, for full-sequence and decode exports alike
    int4   the same with 4 bits

accuracy_level 4 makes the CPU kernel quantize the activations to int8 itself, per row (one token)
and per block of 32 along K, at each call: a row's answer depends on that row alone, never on its
batch mates or on later positions. (Full-sequence int8 used to be `quantize_dynamic`, whose
DynamicQuantizeLinear takes one activation scale for the whole input tensor: a row beside a 20x
larger one lost most of its precision, and a causal block's past outputs moved with future tokens.)

Only projections are quantized: a MatMul whose weight input is an initializer of rank 2. The
attention MatMuls (both inputs activations) stay fp32, and so does a packed `com.microsoft.Attention`
node (MatMulNBitsQuantizer does not take it; its weights are named in a note). An export where
nothing was quantized is refused; one where some weight stayed fp32 says which.

The error is stated, not hidden: ERROR_BOUNDS is the relative L2 error of y,
||y_onnx - y_eager|| / ||y_eager||, against the fp32 eager block, per batch row, that parity holds
each precision to (measured on random blocks, in batches of rows of different scales, and on
transformers-initialised ones: README, "Precision").
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ExportError
from .graphs import op_counts, quiet
from .lowerings.kernel_rules import KernelRules
from .names import ERROR_BOUNDS, PRECISIONS

BLOCK_SIZE = 32  # MatMulNBits: weights per scale along K
ACCURACY_LEVEL = 4  # MatMulNBits: int8 activations in the dot products (AVX-512 VNNI / AVX2 on the CPU)

# The relative L2 error of y against the fp32 eager block that parity allows, per precision, per
# batch row. Re-measured 2026-12-01 on onnxruntime 1.31.1 CPU ("AMD EPYC" in
# /proc/cpuinfo, AVX-512 with VNNI, 2 cores) with parity's check as it is now, every row on its own
# and the scale-1 row of a mixed-scale batch (1x, 4x, 20x) included: every registered name x
# lowering (148 each; int8 worst 1.74%, int4 17.1%, both t5-base-encoder ort-mha), 21 decode exports
# (int8 1.19%, int4 12.6%) and 21 transformers families for int8 (worst 1.65%, gemma3-global); the
# int4 transformers worst, 17.1% (gemma3-sliding), is the earlier measurement (int4 did not change).
# README, "Weight precision". int8 keeps more than 2x headroom: only one CPU kind measured it, and
# ONNX Runtime's int8 kernels for MatMulNBits differ between AVX-512 VNNI and AVX2.
# The bounds are spelled in export/names.py (ERROR_BOUNDS), where the command line's help reads them
# without the lowerings' records (torch, onnx).


def rel_l2(got, ref) -> float:
    """||got - ref|| / ||ref|| (float64; inf when got is not finite, 0 for two zero tensors)."""
    import numpy as np

    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    if got.shape != ref.shape or not np.isfinite(got).all():
        return float("inf")
    den = float(np.linalg.norm(ref))
    num = float(np.linalg.norm(got - ref))
    return num / den if den else (0.0 if num == 0 else float("inf"))


@dataclass(frozen=True)
class Method:
    """How one precision is produced, for one kind of export (full sequence or decode)."""

    precision: str
    name: str  # what the metadata and the summary call it
    tool: str  # "none" | "nbits"
    bits: int = 32
    block_size: int | None = None
    accuracy_level: int | None = None
    ops: tuple[str, ...] = ()  # the node types a quantized weight ends up in
    cuda: str | None = None  # why ONNX Runtime's CUDA provider cannot run it, or None

    @property
    def tool_name(self) -> str:
        return {"nbits": "MatMulNBitsQuantizer"}.get(self.tool, "nothing")

    def describe(self) -> str:
        extra = f", block {self.block_size}, accuracy_level {self.accuracy_level}" if self.block_size else ""
        return f"{self.precision} ({self.name}{extra})"


FP32 = Method("fp32", "fp32 weights", "none")
INT4 = Method(
    "int4",
    "weight-only MatMulNBits, 4 bits, symmetric",
    "nbits",
    bits=4,
    block_size=BLOCK_SIZE,
    accuracy_level=ACCURACY_LEVEL,
    ops=("com.microsoft::MatMulNBits",),
)
INT8_NBITS = Method(
    "int8",
    "weight-only MatMulNBits, 8 bits, symmetric",
    "nbits",
    bits=8,
    block_size=BLOCK_SIZE,
    accuracy_level=ACCURACY_LEVEL,
    ops=("com.microsoft::MatMulNBits",),
)
# (precision, decode) -> method. int8 is weight-only MatMulNBits for both kinds of export: its
# activations are quantized per row (README, "Precision").
METHODS = {
    ("fp32", False): FP32,
    ("fp32", True): FP32,
    ("int8", False): INT8_NBITS,
    ("int8", True): INT8_NBITS,
    ("int4", False): INT4,
    ("int4", True): INT4,
}
if {p for p, _ in METHODS} != set(PRECISIONS):
    raise ImportError(f"export/precision.py METHODS {sorted(METHODS)} do not cover PRECISIONS {PRECISIONS}")


# What ONNX Runtime's CUDA MatMulNBits accepts, read from its source (a main snapshot; the 1.31.1 binary's
# strings agree on T and bits: ../shared/gpu/ort-cuda-kernels.md 5): kernels registered for T (A, scales,
# bias, Y) float, float16 and bfloat16, B uint8, zero points uint8 or T (we write none: symmetric);
# CheckInputs: bits 2, 4 or 8, block_size a power of 2 >= 16; accuracy_level is not read on CUDA (the
# CPU's int8-activation path; CUDA multiplies in T). export_onnx checks every MatMulNBits node against
# these rules (export/cuda_check.py) and refuses a request outside them before exporting (why_not).
NBITS_CUDA_RULES = KernelRules(
    op="com.microsoft::MatMulNBits",
    sources=(
        "onnxruntime/contrib_ops/cuda/quantization/matmul_nbits.cc",
        "onnxruntime/contrib_ops/cuda/quantization/matmul_nbits.h",
        "onnxruntime/contrib_ops/cpu/quantization/matmul_nbits_helper.h",
    ),
    inputs=("A", "B", "scales", "zero_points", "g_idx", "bias"),
    dtypes=("float32", "float16", "bfloat16"),
    t_input="A",
    typed={"B": "uint8", "scales": "T", "g_idx": "int32", "bias": "T"},
    ranks={"B": (3,), "scales": (1, 2), "g_idx": (1,), "bias": (1,)},
    attribute_values={"bits": (2, 4, 8), "block_size": tuple(2**i for i in range(4, 13))},
    attention=False,
    max_outputs=1,
    fast_kernels=("fpA_intB",),
    disqualifies={"float32": ("fpA_intB",), "g_idx": ("fpA_intB",)},
    run_time=(
        "bfloat16 needs compute capability >= 8.0 (NOT_IMPLEMENTED below)",
        "fpA_intB (CUTLASS GEMM / GEMV, prepacked weights) only with ORT_FPA_INTB_GEMM=1 or session config "
        "ep.cuda.fpa_intb_gemm=1, bits 4 or 8, block_size 32/64/128, N % 64 == 0 (4 bits) or % 32 (8 bits), "
        "K % block_size == 0; otherwise a GEMV for small M, else dequantize + cuBLAS GEMM in T",
    ),
)


class PrecisionError(ExportError):
    """A precision this export cannot have (unknown, with fp16, on a provider without its kernels)."""


def method(precision: str, *, decode: bool = False) -> Method:
    """The method `precision` uses for a full-sequence (decode=False) or decode export."""
    if not isinstance(precision, str) or precision not in PRECISIONS:
        raise PrecisionError(f"precision={precision!r} is not one of {', '.join(PRECISIONS)}")
    return METHODS[(precision, bool(decode))]


def why_not(precision: str, *, dtype: str, provider: str | None, decode: bool = False) -> str | None:
    """The one-line reason an export at `precision` cannot be made for this request, or None."""
    m = method(precision, decode=decode)
    if m.tool == "none":
        return None
    if provider == "cuda":
        if m.cuda:
            return f"precision={precision!r} cannot run on cuda: {m.cuda}; use precision='int4' or 'fp32' there"
        rules = NBITS_CUDA_RULES
        asked = {"bits": m.bits, "block_size": m.block_size}
        for attr, value in asked.items():
            allowed = rules.attribute_values[attr]
            if value not in allowed:
                return f"precision={precision!r}: CUDA's MatMulNBits takes {attr} in {allowed}, not {value}"
        if dtype not in rules.dtypes:
            return f"precision={precision!r}: CUDA's MatMulNBits has {'/'.join(rules.dtypes)} kernels, not {dtype}"
        return None
    if dtype != "float32":
        return (
            f"precision={precision!r} keeps fp32 activations on the {provider or 'cpu'} provider; "
            f"dtype={dtype!r} cannot be combined with it there: export with dtype='float32' "
            "(float16 and bfloat16 activations with int8/int4 weights are for provider='cuda')"
        )
    return None


@dataclass(frozen=True)
class Applied:
    """What apply() did: the method, and how many weight matrices (and weights) it quantized."""

    method: Method
    quantized: int
    matrices: int
    quantized_weights: int
    weights: int
    left: tuple[str, ...] = ()  # the node types whose weights stayed fp32

    def metadata(self) -> dict[str, str]:
        m = self.method
        out = {"attnzoo.precision": m.precision}
        if m.tool != "none":
            out["attnzoo.precision.method"] = m.name
            out["attnzoo.precision.quantized"] = f"{self.quantized} of {self.matrices} weight matrices"
            if m.block_size:
                out["attnzoo.precision.block_size"] = str(m.block_size)
                out["attnzoo.precision.accuracy_level"] = str(m.accuracy_level)
        return out

    def note(self) -> str | None:
        if not self.left:
            return None
        share = 100 * self.quantized_weights / max(self.weights, 1)
        return (
            f"{self.method.precision}: {self.quantized} of {self.matrices} weight matrices quantized "
            f"({share:.0f}% of the projection weights); the rest are inside {', '.join(sorted(set(self.left)))}, "
            f"which {self.method.tool_name} does not quantize"
        )


# Nodes a weight passes through unchanged on its way to a projection (the ORT rewriter packs
# Q/K/V weights for its Attention node with a Concat of the three initializers).
_WEIGHT_PATH_OPS = ("Concat", "Transpose", "Reshape", "Identity")


def _weight_nodes(model) -> list[tuple[object, list[object]]]:
    """(node, its weight initializers) for every projection: a MatMul, Gemm or packed Attention
    node that multiplies an activation by rank-2 initializers (directly, or through a Concat /
    Transpose of them). Unnamed nodes get a name (the quantizers select nodes by name)."""
    inits = {i.name: i for i in model.graph.initializer}
    producer = {o: n for n in model.graph.node for o in n.output}

    def weights_of(name: str, depth: int = 0) -> list | None:
        if name in inits:
            return [inits[name]] if len(inits[name].dims) == 2 else []
        node = producer.get(name)
        if node is None or node.op_type not in _WEIGHT_PATH_OPS or depth > 4:
            return None  # an activation
        parts = [weights_of(i, depth + 1) for i in node.input if i]
        return None if any(p is None for p in parts) else [w for p in parts for w in p]

    found = []
    for i, node in enumerate(model.graph.node):
        if not node.name:
            node.name = f"attnzoo_{node.op_type}_{i}"
        if node.op_type not in ("MatMul", "Gemm", "Attention") or len(node.input) < 2:
            continue
        if weights_of(node.input[0]) is not None:
            continue
        ws = weights_of(node.input[1])
        if ws:
            found.append((node, ws))
    return found


def _elements(weights) -> int:
    return sum(int(w.dims[0]) * int(w.dims[1]) for w in weights)


def apply(model, precision: str, *, decode: bool = False):
    """Quantize the projections of an ONNX model (onnx_ir) at `precision`: (new model, Applied).

    Works in memory; the caller publishes the result atomically as for any export."""
    import onnx_ir as ir

    from .progress import stage

    stage("quantize")

    m = method(precision, decode=decode)
    proto = ir.serde.serialize_model(model)
    targets = _weight_nodes(proto)
    matrices = sum(len(ws) for _, ws in targets)
    weights = sum(_elements(ws) for _, ws in targets)
    if m.tool == "none":
        return model, Applied(m, 0, matrices, 0, weights)
    if not targets:
        raise PrecisionError(f"precision={precision!r}: this graph has no projection with constant weights to quantize")
    before = op_counts(proto)
    with quiet():
        proto = _nbits(proto, m, targets)
    after = op_counts(proto)
    left_nodes = _weight_nodes(proto)
    left = tuple(n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}::{n.op_type}" for n, _ in left_nodes)
    left_matrices = sum(len(ws) for _, ws in left_nodes)
    made = sum(after.get(op, 0) - before.get(op, 0) for op in m.ops)
    if left_matrices >= matrices or made <= 0:
        raise PrecisionError(
            f"precision={precision!r}: {m.name} quantized none of the {matrices} weight matrices "
            f"(op counts after: {after}); use precision='fp32' or another lowering"
        )
    left_weights = sum(_elements(ws) for _, ws in left_nodes)
    applied = Applied(m, matrices - left_matrices, matrices, weights - left_weights, weights, left)
    return ir.from_proto(proto), applied


def _nbits(proto, m: Method, targets):
    from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer

    names = {n.name for n, _ in targets if n.op_type == "MatMul"}
    others = [n.name for n in proto.graph.node if n.op_type == "MatMul" and n.name not in names]
    config = DefaultWeightOnlyQuantConfig(
        block_size=m.block_size, is_symmetric=True, accuracy_level=m.accuracy_level, bits=m.bits
    )
    q = MatMulNBitsQuantizer(proto, nodes_to_exclude=others, algo_config=config)
    q.process()
    return q.model.model


__all__ = [
    "ACCURACY_LEVEL",
    "BLOCK_SIZE",
    "ERROR_BOUNDS",
    "METHODS",
    "NBITS_CUDA_RULES",
    "Applied",
    "Method",
    "PrecisionError",
    "rel_l2",
]
