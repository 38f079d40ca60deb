"""What an ONNX Runtime CUDA attention kernel accepts, as data (`KernelRules`), and the one reading of
those rules against one node (`NodeFacts`): a lowering's record carries the rules of the fused node it
writes (export/lowerings/), export/cuda_check.py reads a graph's nodes into facts and asks the rules.

The rules are read from ONNX Runtime's source (each record names its files); where no GPU run has shown
a rule, `proven` is empty and the docs say "read from source, not yet run on a GPU" (docs/gpu.md).

A node's *features* are the words the rules speak in: each present optional input by its schema name
(`attention_bias`, `head_sink`, `past_key`, ...), each attribute set away from its default
(`KernelRules.attribute_features`: `softcap`, `smooth_softmax`, `local_window`, ...), `output_qk` when the
node has more outputs than `KernelRules.max_outputs` allows, and its element type (`float32`, ...)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class NodeFacts:
    """One attention node as the rules see it: its present inputs by schema name, each with its element
    type ("float16", ...; None unknown) and shape (a tuple of ints / dim names / None; None unknown),
    its attributes, and how many outputs it has."""

    op: str  # "com.microsoft::GroupQueryAttention", "MultiHeadAttention" ... ("domain::Op" off the default domain)
    name: str
    inputs: Mapping[str, tuple[str | None, tuple | None]]
    attributes: Mapping[str, Any] = field(default_factory=dict)
    outputs: int = 1

    def dtype(self, name: str) -> str | None:
        return self.inputs[name][0] if name in self.inputs else None

    def shape(self, name: str) -> tuple | None:
        return self.inputs[name][1] if name in self.inputs else None

    def last_dim(self, name: str) -> int | None:
        shape = self.shape(name)
        return shape[-1] if shape and isinstance(shape[-1], int) else None


# A node's head size (or None where its shapes do not say): per op, from its query's last axis.
HeadSize = Callable[[NodeFacts], "int | None"]


@dataclass(frozen=True)
class KernelRules:
    """What one op's CUDA kernel accepts, with the source files it was read from."""

    op: str  # "domain::Op" as export/graphs.op_counts spells it
    sources: tuple[str, ...]  # onnxruntime source files (paths in its repository) the rules come from
    inputs: tuple[str, ...]  # the op's inputs in schema order (a node's positional inputs get these names)
    dtypes: tuple[str, ...]  # the element types T the CUDA kernel is registered for
    t_input: str = "query"  # the input whose element type is T
    # input -> the element type it must have ("T": the node's T)
    typed: Mapping[str, str] = field(default_factory=dict)
    # input -> the (T, its type) pairs the kernels are registered for, where its type may differ from T
    typed_pairs: Mapping[str, tuple[tuple[str, str], ...]] = field(default_factory=dict)
    # input -> its allowed ranks
    ranks: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    # input -> the axis that must be 1 or the node's num_heads (a bias broadcast over heads, or one per head)
    heads_axis: Mapping[str, int] = field(default_factory=dict)
    pairs: tuple[tuple[str, str], ...] = ()  # inputs present together or not at all
    # attribute-made features: feature -> (attribute, its default); on when the node sets another value
    attribute_features: Mapping[str, tuple[str, Any]] = field(default_factory=dict)
    # attribute -> the values the kernel takes (a node setting another is refused)
    attribute_values: Mapping[str, tuple] = field(default_factory=dict)
    # features the kernel refuses, alone or together, each with the kernel's own words
    refused: tuple[tuple[tuple[str, ...], str], ...] = ()
    requires: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # feature -> inputs it needs
    head_size: HeadSize | None = None
    head_multiple: int = 1  # head_size % this == 0, always
    head_multiple_with: Mapping[str, int] = field(default_factory=dict)  # feature -> a stricter multiple
    max_heads: int = 1024  # num_heads <= the device's maxThreadsPerBlock (1024 on every NVIDIA GPU)
    max_outputs: int = 3  # more outputs (the QK scores) is the feature "output_qk"
    padding: str = ""  # how a padded batch reaches the kernel, in a few words
    attention: bool = True  # an attention op (heads, a QK output); False for a projection (MatMulNBits)
    # the fast kernels in the order the kernel tries them (the unfused one last, not listed), and which
    # features rule each out: a node runs the first kernel left
    fast_kernels: tuple[str, ...] = ()
    disqualifies: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # rules on values (shapes at run time), which a static reading cannot check: documented, and
    # kept by the graph builder (export/gqa.py) and the session's feeds
    run_time: tuple[str, ...] = ()
    proven: str = ""  # the GPU run that showed these rules ("" = read from source, not yet run on a GPU)
    # feature -> what puts it in our graphs, for messages ("head_sink" -> "head_sink (attention sinks)")
    words: Mapping[str, str] = field(default_factory=dict)

    def features(self, facts: NodeFacts) -> set[str]:
        """The node's features (module docstring) in this op's words."""
        on = set(facts.inputs)
        for feature, (attr, default) in self.attribute_features.items():
            value = facts.attributes.get(attr, default)
            if isinstance(value, bytes):
                value = value.decode()
            if value != default and not (isinstance(default, str) and str(value).upper() == default):
                on.add(feature)
        if facts.outputs > self.max_outputs:
            on.add("output_qk")
        t = facts.dtype(self.t_input)
        if t is not None:
            on.add(t)
        return on

    def refusals(self, facts: NodeFacts) -> list[str]:
        """Every rule the node breaks, one line each naming the input, attribute or feature; [] if none."""
        out: list[str] = []
        t = facts.dtype(self.t_input)
        if t is not None and t not in self.dtypes:
            out.append(
                f"{self.t_input} is {t}: the CUDA kernel is registered for T in {{{', '.join(self.dtypes)}}} only"
            )
        for name, want in self.typed.items():
            got = facts.dtype(name)
            need = t if want == "T" else want
            if got is not None and need is not None and got != need:
                out.append(
                    f"input {name} is {got}: it must be {need}" + (" (T, the query's type)" if want == "T" else "")
                )
        for name, pairs in self.typed_pairs.items():
            got = facts.dtype(name)
            if t is not None and got is not None and (t, got) not in pairs:
                listed = ", ".join(f"({a}, {b})" for a, b in pairs)
                which = f"({self.t_input}, {name})"
                out.append(f"input {name} is {got} with {self.t_input} {t}: the CUDA kernels take {which} in {listed}")
        for name, allowed in self.ranks.items():
            shape = facts.shape(name)
            if shape is not None and len(shape) not in allowed:
                out.append(f"input {name} has rank {len(shape)}: it must have rank {' or '.join(map(str, allowed))}")
        heads = facts.attributes.get("num_heads")
        for name, axis in self.heads_axis.items():
            shape = facts.shape(name)
            dim = shape[axis] if shape is not None and len(shape) > axis else None
            if isinstance(dim, int) and isinstance(heads, int) and dim not in (1, heads):
                out.append(f"input {name} has {dim} on axis {axis}: it must be 1 or num_heads={heads}")
        for a, b in self.pairs:
            if (a in facts.inputs) != (b in facts.inputs):
                out.append(f"inputs {a} and {b} must be given together (only {a if a in facts.inputs else b} is)")
        for attr, allowed in self.attribute_values.items():
            value = facts.attributes.get(attr)
            if value is not None and value not in allowed:
                out.append(f"attribute {attr}={value}: the CUDA kernel takes {', '.join(map(str, allowed))}")
        on = self.features(facts)
        for together, why in self.refused:
            if all(f in on for f in together):
                out.append(f"{' with '.join(self.words.get(f, f) for f in together)}: {why}")
        for feature, needed in self.requires.items():
            missing = [n for n in needed if n not in facts.inputs]
            if feature in on and missing:
                out.append(f"{feature} needs input(s) {', '.join(missing)}")
        if isinstance(heads, int) and heads > self.max_heads:
            out.append(f"num_heads={heads}: at most {self.max_heads} (the kernel's threads per block)")
        size = self.head_size(facts) if self.head_size else None
        if size is not None:
            multiple = max([self.head_multiple] + [m for f, m in self.head_multiple_with.items() if f in on])
            if size % multiple:
                why = [f for f, m in self.head_multiple_with.items() if f in on and m == multiple]
                out.append(f"head size {size} is not a multiple of {multiple}" + (f" ({why[0]})" if why else ""))
        return out

    def kernels_left(self, facts: NodeFacts) -> tuple[str, ...]:
        """The fast kernels no feature of the node rules out, in the kernel's order (() = the unfused one)."""
        on = self.features(facts)
        out = {k for f in on for k in self.disqualifies.get(f, ())}
        return tuple(k for k in self.fast_kernels if k not in out)

    def table(self) -> str:
        """The rules as Markdown lines, for docs/gpu.md (tests/export/test_cuda_rules.py keeps the page in step)."""
        lines = [
            f"- element type T: {', '.join(self.dtypes)}",
            *(f"- `{n}`: {'T' if w == 'T' else w}" for n, w in self.typed.items()),
            *(
                f"- (`{self.t_input}`, `{n}`): " + ", ".join(f"({a}, {b})" for a, b in p)
                for n, p in self.typed_pairs.items()
            ),
            *(f"- `{n}`: rank {' or '.join(map(str, r))}" for n, r in self.ranks.items()),
            *(f"- `{n}` axis {a}: 1 or num_heads" for n, a in self.heads_axis.items()),
            *(f"- `{a}` and `{b}` together or neither" for a, b in self.pairs),
            *(f"- `{a}` one of {', '.join(map(str, v))}" for a, v in self.attribute_values.items()),
            *(f"- refused: {' with '.join(f)}: {why}" for f, why in self.refused),
            *(f"- `{f}` needs {', '.join(n)}" for f, n in self.requires.items()),
        ]
        if self.head_size:
            lines.append(
                f"- head size a multiple of {self.head_multiple}"
                + "".join(f"; of {m} with {f}" for f, m in self.head_multiple_with.items())
            )
        if self.attention:
            lines.append(f"- at most {self.max_outputs} outputs (no QK output); num_heads <= {self.max_heads}")
        if self.padding:
            lines.append(f"- padding: {self.padding}")
        if self.fast_kernels:
            rest = "unfused" if self.attention else "the generic kernels"
            lines.append(f"- fast kernels, in the kernel's order: {', '.join(self.fast_kernels)}; then {rest}")
            lines += [f"  - `{f}` rules out {', '.join(k)}" for f, k in self.disqualifies.items()]
        lines += [f"- at run time: {r}" for r in self.run_time]
        lines.append(f"- read from: {', '.join(f'`{s}`' for s in self.sources)}")
        lines.append(f"- {self.proven or 'read from source, not yet run on a GPU'}")
        return "\n".join(lines)
