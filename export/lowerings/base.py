"""What a lowering is, as data: one `Lowering` record per file in this package, read by generic
code (export_onnx, why_not, auto, sessions, the decode path, parity, the benchmark's paths, the README's
table). A new lowering is a new file, one line in `__init__.LOWERING_LIST` and its name in
export/names.py; nothing else branches on a lowering's name."""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import zoo
from runtime.lowering_facts import RUN_FACTS, RunFacts

from ..errors import ExportError
from .kernel_rules import KernelRules

# A spec -> the reason it cannot be expressed, or None.
Check = Callable[[zoo.AttentionSpec], "str | None"]


@dataclass(frozen=True)
class Limit:
    """What a lowering cannot express for one modifier: `text` for the README's table, `check`
    for a spec (None: never for this modifier, whatever its values, and `text` says why).
    `always`: never either, with `check` giving the reason for a spec."""

    text: str
    check: Check | None = None
    always: bool = False

    def reason(self, spec: zoo.AttentionSpec) -> str | None:
        return self.text if self.check is None else self.check(spec)

    @property
    def never(self) -> bool:
        """Whether it refuses every value of the modifier (the table's "no"; else "yes, <text>")."""
        return self.check is None or self.always


@dataclass(frozen=True)
class Lowering:
    name: str
    opset: int
    graph: str  # what the graph holds, in a few words (the README's "graph" column)
    op: str | None = None  # the fused node it relies on, for messages; None for plain ops
    weights_out: bool = False  # can output the softmax weights (need_weights)
    # How it is produced: `build(module, dtype, ins, outs) -> onnx.ModelProto` builds the graph by
    # hand; otherwise torch's exporter traces the block's eager path, configured by these flags,
    # and `after_trace(model) -> model` rewrites or checks the result (raises ExportError).
    build: Callable[..., Any] | None = None
    fused: bool = True  # trace the SDPA path (False: the explicit einsum/softmax path)
    sdpa_fp32: bool = False  # run SDPA in fp32 inside an fp16 export
    combined_as_separate: bool = False  # write a combined projection as three MatMuls
    after_trace: Callable[[Any], Any] | None = None
    # What it cannot express: for a spec whatever its modifiers (with dtype and provider), and
    # per modifier, keyed by the modifier's name (zoo/modifiers/).
    cannot: Callable[..., str | None] | None = None
    modifiers: Mapping[str, Limit] = field(default_factory=dict)
    # Why it cannot keep a static, in-place cache (export_onnx(decode=True, cache="static")), with the
    # fix, or None; `static_cache_note` says why in the README's table (empty: `static_cache` itself).
    static_cache: str | None = "not offered for this lowering"
    static_cache_note: str = ""
    # A whole encoder-decoder in one traced graph per stack (export/seq2seq_export.py): a position bias on the
    # scores (T5's buckets) and cross-attention to the encoder's cached keys, in every layer.
    encoder_decoder: bool = False
    # Its traced static step is the one export/kv_int8.py rewrites to an int8 cache (kv_precision="int8").
    int8_cache: bool = False
    fp16: str = "yes"  # the README's fp16 cell
    kinds: str = "yes"  # the README's cell for non-causal, cross-attention, d_v != d_k
    # What the CUDA kernels of its fused nodes accept (kernel_rules.KernelRules, one per op it may write;
    # () for plain ops), and the node it would write for (spec, dtype, masked), for those rules to read
    # before an export (None: only the built graph is checked, export/cuda_check.py).
    cuda: tuple[KernelRules, ...] = ()
    cuda_node: Callable[..., Any] | None = None

    @property
    def traced(self) -> bool:
        return self.build is None

    @property
    def run_facts(self) -> RunFacts:
        """What a session must know of this lowering's graphs (score copies, batched chunks): the run
        time's table, runtime/lowering_facts.py, read by name (a session reads no export record)."""
        return RUN_FACTS[self.name]

    @property
    def score_copies(self) -> int:
        return self.run_facts.score_copies

    @property
    def batched_chunks(self) -> bool:
        return self.run_facts.batched_chunks

    def why_not(
        self, spec: zoo.AttentionSpec, *, dtype: str | None = None, provider: str | None = None, masked: bool = False
    ) -> str | None:
        """The first reason this lowering cannot express `spec` (in `dtype`, for `provider`; `masked`: a
        mask is fed), or None."""
        if provider == "cuda" and dtype is not None:
            for rules in self.cuda:  # no CUDA kernel for the element type: the node would run on the CPU
                if dtype not in rules.dtypes:
                    return (
                        f"ONNX Runtime's CUDA {rules.op.split('::')[-1]} has {'/'.join(rules.dtypes)} kernels only "
                        f"(a {dtype} node would run on the CPU); export {rules.dtypes[0]} or use another lowering"
                    )
        if self.cannot is not None:
            reason = self.cannot(spec, dtype=dtype, provider=provider)
            if reason:
                return reason
        for mod in zoo.modifiers.active(spec):
            limit = self.modifiers.get(mod.name)
            reason = limit.reason(spec) if limit else None
            if reason:
                return reason
        if provider == "cuda" and self.cuda_node is not None:
            facts = self.cuda_node(spec, dtype or "float32", masked)
            for rules in self.cuda:
                broken = rules.refusals(facts) if rules.op == facts.op else []
                if broken:
                    return f"ONNX Runtime's CUDA {rules.op.split('::')[-1]} refuses {broken[0]}; use another lowering"
        return None


# How many fused attention nodes an `after_trace` check expects: one for a block; a whole encoder's export
# (export/encoder_export.py) traces every layer at once and sets it to the number of layers.
EXPECTED_NODES: contextvars.ContextVar[int] = contextvars.ContextVar("EXPECTED_NODES", default=1)


def expect_ops(model: Any, ops: tuple[str, ...], why: str, *, absent: tuple[str, ...] = ()) -> Any:
    """`model` if it holds exactly one node among `ops` (onnx op types, "domain::Op" outside the
    default domain) and none of `absent`; else ExportError(`why`, its "{counts}" filled with the
    model's op counts). For an `after_trace` that checks what the exporter or a rewriter made."""
    from ..graphs import op_counts

    counts = op_counts(model)
    if sum(counts.get(op, 0) for op in ops) != EXPECTED_NODES.get() or any(counts.get(op, 0) for op in absent):
        raise ExportError(why.format(counts=counts))
    return model
