"""The `ort-gqa` lowering: ONNX Runtime's com.microsoft GroupQueryAttention, built node by node.

torch has no op that exports to GroupQueryAttention and onnxscript's ORT fusion rules match
transformers' graphs (with a KV cache), not a zoo block, so the graph is written here from
the block's weights, with the axis vocabulary as dim names:

    x (b t c) -> MatMul(+bias) -> Q (b t (h dk)), K (b t (g dk)), V (b t (g dv))
              -> each modifier's nodes on Q, K, V (gqa_qkv)
              -> GroupQueryAttention(num_heads=h, kv_num_heads=g, scale, past/present, seqlens_k,
                                     each modifier's attributes and inputs (gqa_op),
                                     attention_bias = the modifiers' terms (gqa_bias) + the user mask)
                                                                                     (b t (h dv))
              -> zero rows where no key is allowed (user mask, causal, the modifiers' terms: gqa_allowed)
              -> each modifier's nodes on Z (gqa_z) -> head_mask -> MatMul(+bias) -> y (b t c)

A layer of a whole model (in_model, export/splice.py) leaves the op to do the last piece on Q and K
where its modifier says the op can (gqa_inside: rotary, at cache slots; then no Split when it was the
only one), and zeroes its pad rows by the key mask alone (they become the next layer's pad keys: a NaN
there would reach every real row through 0 * NaN).

The modifiers write their pieces themselves (zoo/modifiers/graph.py) through `_Graph`, and say what
they cannot carry (`gqa_refusal`, which the ort-gqa record reads too); nothing here names one. The op
is always causal, self-attention, d_v = d_k. Measured on onnxruntime 1.31.1 CPU against the eager
block (tests keep it): a row whose bias is all -inf gives 0 without a logit cap and NaN with one.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

import zoo
from runtime.io import TensorIO
from zoo.modifiers import OpPart, per_head

from .errors import ExportError

OPSET = 18
MS_DOMAIN = "com.microsoft"
HEAD_MULTIPLE = 8  # "head_size must be a multiple of 8", at run time
_ONNX_TYPE = {
    "float32": TensorProto.FLOAT,
    "float16": TensorProto.FLOAT16,
    "bfloat16": TensorProto.BFLOAT16,
    "int32": TensorProto.INT32,
    "int64": TensorProto.INT64,
    "bool": TensorProto.BOOL,
}
# The op's inputs, in order (optional ones left empty); the modifiers fill some by name (OpPart.inputs).
GQA_INPUTS = (
    "query",
    "key",
    "value",
    "past_key",
    "past_value",
    "seqlens_k",
    "total_sequence_length",
    "cos_cache",
    "sin_cache",
    "position_ids",
    "attention_bias",
    "head_sink",
)
# the inputs a modifier may fill; the rest are the block's (attention_bias: a sum)
MODIFIER_INPUTS = ("cos_cache", "sin_cache", "position_ids", "head_sink")


def why_not(
    spec: zoo.AttentionSpec, *, need_weights: bool = False, dtype: str | None = None, provider: str | None = None
) -> str | None:
    """The one-line reason GroupQueryAttention cannot express `spec` (in `dtype`), or None; what its CUDA
    kernel refuses is the ort-gqa record's CUDA rules (export/lowerings/ort_gqa.py)."""
    if dtype == "float16" and spec.d_k_ % 16:
        return f"com.microsoft GroupQueryAttention in fp16 needs d_k a multiple of 16 (the block has d_k={spec.d_k_})"
    if need_weights:
        return "com.microsoft GroupQueryAttention does not output the softmax weights"
    if spec.is_cross:
        return "com.microsoft GroupQueryAttention is self-attention only (no cross-attention context)"
    if not spec.causal:
        return "com.microsoft GroupQueryAttention is causal only; the block has causal=False"
    if spec.d_v_ != spec.d_k_:
        return f"com.microsoft GroupQueryAttention needs d_v == d_k (the block has d_k={spec.d_k_}, d_v={spec.d_v_})"
    if spec.d_k_ % HEAD_MULTIPLE:
        # Measured on onnxruntime 1.31 CPU, fp32 too: the kernel refuses the model at run time.
        return (
            f"ONNX Runtime's GroupQueryAttention kernels need d_k a multiple of {HEAD_MULTIPLE} "
            f"(the block has d_k={spec.d_k_})"
        )
    return None


class _Graph:
    """A small node list with fresh names, for building one graph by hand: what the modifiers write
    their pieces through (zoo.modifiers.GraphBuilder)."""

    def __init__(self, dtype: str, max_positions: int | None = None) -> None:
        self.dtype = dtype
        self.max_positions = max_positions  # GraphBuilder.max_positions
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._n = 0
        self._pos: tuple[str, str, str] | None = None  # every position (s,), q_pos (b|1 t), k_pos (b|1 s)
        self._positions: str | None = None
        self._bt: str | None = None  # (b, t): the shape of this call's positions
        self._distance: str | None = None

    def _name(self, hint: str) -> str:
        self._n += 1
        return f"{hint}_{self._n}"

    def const(self, value: Any, hint: str = "c", dtype: str | None = None) -> str:
        name = self._name(hint)
        if isinstance(value, torch.Tensor):
            value = value.detach().cpu().double().numpy()
        # np.array copies into C order and keeps a scalar 0-d (ascontiguousarray would make it 1-d).
        arr = np.array(value, dtype=np.dtype(dtype or self.dtype), order="C")
        self.inits.append(numpy_helper.from_array(arr, name))
        return name

    def ints(self, value: Any, hint: str = "i") -> str:
        return self.const(value, hint, "int64")

    def cast(self, x: str, dtype: str) -> str:
        return self.op("Cast", x, to=_ONNX_TYPE[dtype])

    def op(self, op_type: str, *inputs: str, name: str | None = None, **attrs: Any) -> str:
        out = name or self._name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], **attrs))
        return out

    def place(self, all_pos: str, q_pos: str, k_pos: str, bt: str) -> None:
        """The positions positions() and distance() read: int64 (s,), (b|1 t) and (b|1 s); bt: int64 (2,)."""
        self._pos = (all_pos, q_pos, k_pos)
        self._bt = bt

    def _placed(self) -> tuple[str, str, str]:
        if self._pos is None:  # pragma: no cover - build() places them before any modifier's piece
            raise ExportError("the GroupQueryAttention graph has no positions yet; place() them first")
        return self._pos

    def pair_positions(self) -> tuple[str, str]:
        _, q_pos, k_pos = self._placed()
        return self.op("Unsqueeze", q_pos, self.ints([2])), self.op("Unsqueeze", k_pos, self.ints([1]))

    def positions(self) -> str:
        if self._positions is None:
            self._positions = self.cast(self._placed()[0], "float32")
        return self._positions

    def call_positions(self) -> str:
        return self.op("Expand", self.op("Max", self._placed()[1], self.ints(0)), self._bt)

    def distance(self) -> str:
        if self._distance is None:
            _, q_pos, k_pos = self._placed()
            rel = self.op(
                "Sub", self.op("Unsqueeze", q_pos, self.ints([2])), self.op("Unsqueeze", k_pos, self.ints([1]))
            )
            self._distance = self.cast(rel, "float32")
        return self._distance


def _packed_bias(p) -> torch.Tensor | None:
    """The bias of the packed Q | K | V projection (zeros for a projection without one), or None."""
    pairs = ((p.w_q, p.b_q), (p.w_k, p.b_k), (p.w_v, p.b_v))
    if all(b_ is None for _, b_ in pairs):
        return None
    return torch.cat([b_ if b_ is not None else torch.zeros(w.shape[0]) for w, b_ in pairs])


def _linear(g: _Graph, x: str, w, b, hint: str, out: str | None = None) -> str:
    """x @ w.T (+ b) for an nn.Linear-style weight (out, in)."""
    y = g.op("MatMul", x, g.const(w.T, hint + "_w"), name=None if b is not None else out)
    return g.op("Add", y, g.const(b, hint + "_b"), name=out) if b is not None else y


def _op_parts(
    mods: list[zoo.modifiers.Modifier],
    g: _Graph,
    block: dict[str, Any],
    inside: tuple[zoo.modifiers.Modifier, OpPart] | None = None,
) -> tuple[dict[str, Any], dict[str, str]]:
    """The block's attributes of the op and the modifiers' attributes and inputs (gqa_op, and the part
    `inside` the op of one modifier), merged; a name set twice, or an input the op does not have, is refused."""
    attrs: dict[str, Any] = dict(block)
    inputs: dict[str, str] = {}
    owner = {("attribute", key): "the block" for key in block}
    owner.update({("input", key): "the block" for key in GQA_INPUTS if key not in MODIFIER_INPUTS})
    parts = [(mod, mod.gqa_op(g)) for mod in mods] + ([inside] if inside is not None else [])
    for mod, part in parts:
        for kind, have, new in (("attribute", attrs, part.attributes), ("input", inputs, part.inputs)):
            for key, value in new.items():
                if (kind, key) in owner:
                    raise ExportError(
                        f"modifier {mod.name!r} sets GroupQueryAttention {kind} {key!r}, which {owner[kind, key]} "
                        f"sets; each modifier's gqa_op (and gqa_inside) must set its own"
                    )
                if kind == "input" and key not in GQA_INPUTS:
                    raise ExportError(
                        f"modifier {mod.name!r} sets GroupQueryAttention input {key!r}, which is not one of "
                        f"{', '.join(GQA_INPUTS)}"
                    )
                owner[kind, key] = f"modifier {mod.name!r}"
                have[key] = value
    return attrs, inputs


def build(
    module: zoo.MultiHeadAttention,
    dtype: str,
    ins: list[TensorIO],
    outs: list[TensorIO],
    *,
    in_model: bool = False,
    max_positions: int | None = None,
) -> onnx.ModelProto:
    """The ort-gqa graph of `module` with the inputs/outputs of the I/O table (x [, mask] [, head_mask] -> y).

    in_model: a layer of a whole model (export/splice.py), whose static cache is the model's own and
    whose query rows without a real key are its pad rows. There the op rotates Q and K itself, at cache
    slots (Modifier.gqa_inside), and such rows are zeroed by the key mask at their own slots alone (a real
    query sees itself), not by the whole allowed-keys rule: no real row reads a pad row's output, but its
    keys and values are the next layer's, so it must be finite. max_positions: in a whole model with a
    max_len, the most positions a call holds (tables over positions become constants of that many rows)."""
    spec = module.spec
    reason = why_not(spec, need_weights=any(o.name == "attn" for o in outs))
    for mod in zoo.modifiers.active(spec):  # the record reads the same refusals; a direct call must not drop one
        reason = reason or mod.gqa_refusal(spec)
    if reason:
        raise ExportError(f"the GroupQueryAttention graph cannot express this request: {reason}")
    # The block's modifier modules (their weights with them), in order of application.
    mods = [module.mods[mod.name] for mod in zoo.modifiers.active(spec)]
    h, kv = spec.heads, spec.kv_heads_
    p = zoo.get_projections(module)

    g = _Graph(dtype, max_positions)
    names = {io.name for io in ins}
    # One MatMul makes Q | K | V.
    qkv = _linear(g, "x", torch.cat([p.w_q, p.w_k, p.w_v]), _packed_bias(p), "qkv")

    # Lengths and positions. Full sequence: s = t keys at positions 0..t-1. Decode: the cache holds
    # p positions, this call adds t, so s = p + t; with a key_mask (left padding) a row's positions
    # count its real keys. seqlens_k = s - 1 per row; GQA right-aligns the t queries on the s keys.
    shape = g.op("Shape", "x")
    b = g.op("Gather", shape, g.ints([0]), axis=0)  # (1,)
    t = g.op("Gather", shape, g.ints(1), axis=0)  # scalar
    decode = "past_key" in names
    # Packed rows (io.static_interface(packed=True), a whole model's layer): each row's tokens from slot 0,
    # its length through seqlens_k, no bias (docs/generation.md, "The padding rule").
    packed = "seqlens_k" in names
    rows = _packed_rows(g, b, t) if packed else _left_padded_rows(g, names, b, t, decode)
    seqlens, total, total_i32, q_pos, key_mask, key_real = rows

    # The modifiers' nodes on Q, K, V (rotary, QK-norm, clip, temperature), after the positions: a piece
    # may read them. In a whole model the last of them may be the op's own (gqa_inside), which it
    # applies after the others. The op takes Q | K | V packed as its query (key and value left empty)
    # unless some node is left to write on them: then a Split.
    writers = [mod for mod in mods if type(mod).gqa_qkv is not zoo.modifiers.Modifier.gqa_qkv]
    inside = None
    if in_model and writers:
        part = writers[-1].gqa_inside(g)
        if part is not None:
            inside = (writers.pop(), part)
    if not writers:
        q, k, v = qkv, "", ""
    else:
        widths = g.ints([p.w_q.shape[0], p.w_k.shape[0], p.w_v.shape[0]])
        split = helper.make_node("Split", [qkv, widths], [g._name(n) for n in "qkv"], axis=-1)
        g.nodes.append(split)
        q, k, v = split.output
        for mod in writers:
            q, k, v = mod.gqa_qkv(g, q, k, v)

    block_attrs = {"num_heads": h, "kv_num_heads": kv, "scale": float(spec.scale_)}
    attrs, op_inputs = _op_parts(mods, g, block_attrs, inside)

    # attention_bias (b|1, h|1, t, s): the modifiers' terms, and the user mask as 0 / -inf.
    bias = None
    for mod in mods:
        term = mod.gqa_bias(g)
        if term is not None:
            bias = term if bias is None else g.op("Add", bias, term)
    masked = "mask" in names or "key_mask" in names
    user_mask = "mask" if "mask" in names else None
    if key_mask:
        user_mask = g.op("Unsqueeze", key_mask, g.ints([1]))  # (b 1 s): the same for every query
    if user_mask is not None:
        neg = g.op("Where", user_mask, g.const(0.0, "zero", "float32"), g.const(-np.inf, "neg_inf", "float32"))
        neg = g.op("Unsqueeze", neg, g.ints([1]))  # (b 1 t|1 s)
        if "key_mask" in names:  # the op wants the bias's t axis whole: (b 1 1 s) -> (b 1 t s)
            one, s_ = g.ints([1]), g.op("Unsqueeze", total, g.ints([0]))
            neg = g.op("Expand", neg, g.op("Concat", b, one, g.op("Unsqueeze", t, g.ints([0])), s_, axis=0))
        bias = neg if bias is None else g.op("Add", bias, neg)
    if bias is not None and dtype != "float32":
        bias = g.cast(bias, dtype)

    named = {"query": q, "key": k, "value": v, "seqlens_k": seqlens, "total_sequence_length": total_i32}
    if decode:
        named.update(past_key="past_key", past_value="past_value")
    named.update(op_inputs)
    if bias is not None:
        named["attention_bias"] = bias
    inputs = [named.get(key, "") for key in GQA_INPUTS]
    while inputs and inputs[-1] == "":
        inputs.pop()
    z = g._name("groupqueryattention")
    # A static cache: the op's presents are the graph's outputs, no Identity between them and the buffers.
    static = "past_len" in names or packed
    presents = ["present_key", "present_value"] if static else [g._name("present_key"), g._name("present_value")]
    g.nodes.append(helper.make_node("GroupQueryAttention", inputs, [z, *presents], domain=MS_DOMAIN, **attrs))
    if decode and not static:
        g.op("Identity", presents[0], name="present_key")
        g.op("Identity", presents[1], name="present_value")

    if in_model and packed:
        # A right-padded prompt's pad queries (slots at or past the row's length): zeroed, as a left-padded
        # row's below, so they stay finite; the op reads no key past a row's length.
        real = g.op("Less", q_pos, g.op("Unsqueeze", g.op("Add", g.cast(seqlens, "int64"), g.ints(1)), g.ints([1])))
        z = g.op("Where", g.op("Unsqueeze", real, g.ints([2])), z, g.const(0.0, "zero"))
    if in_model and key_mask and not pad_rows_come_out_zero(spec, dtype):
        # A pad query row (left padding) has no real key. Without a logit cap (the op's tanh) the op gives
        # such a row 0, but with one it gives NaN (onnxruntime 1.31.1 CPU), which becomes the next layer's keys
        # and values at the pad slots, where 0 weight * NaN makes every real row NaN. A real query always sees
        # itself, so a query slot has a real key when its own key is real.
        z = g.op("Where", g.op("Unsqueeze", key_real, g.ints([2])), z, g.const(0.0, "zero"))
    if masked and not in_model:
        # A query row with no allowed key (user mask & causal & the modifiers' terms) gets Z = 0, as in eager torch.
        allowed = g.op("And", user_mask, g.op("GreaterOrEqual", g.distance(), g.const(0.0, "zero", "float32")))
        for mod in mods:
            term = mod.gqa_allowed(g)
            if term is not None:
                allowed = g.op("And", allowed, term)
        has_key = g.op("ReduceMax", g.cast(allowed, "int32"), g.ints([-1]), keepdims=1)
        z = g.op("Where", g.cast(has_key, "bool"), z, g.const(0.0, "zero"))
    for mod in mods:
        z = mod.gqa_z(g, "x", z)
    if "head_mask" in names:
        z = per_head(g, z, h, lambda t_: g.op("Mul", t_, g.op("Unsqueeze", "head_mask", g.ints([1, 3]))))
    _linear(g, z, p.w_o, p.b_o, "o", out="y")

    def value_info(io: TensorIO):
        elem = _ONNX_TYPE.get(io.kind, _ONNX_TYPE[dtype])
        return helper.make_tensor_value_info(io.name, elem, list(io.shape(spec)))

    graph = helper.make_graph(
        g.nodes, "attnzoo_ort_gqa", [value_info(io) for io in ins], [value_info(io) for io in outs], g.inits
    )
    # IR 10: what onnxruntime-gpu (which trails onnxruntime) accepts; onnx's default may be newer.
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(MS_DOMAIN, 1)], ir_version=10
    )


def pad_rows_come_out_zero(spec: zoo.AttentionSpec, dtype: str) -> bool:
    """Whether the op itself gives a left-padded layer's pad query rows (every key masked) 0, so the layer
    needs no Where of its own: float32 (which runs on the CPU alone: ONNX Runtime has no float32 CUDA kernel
    of the op) where no active modifier says otherwise (Modifier.gqa_masked_row_zero: a logit cap makes the
    CPU kernel's row NaN; tests/export/test_lm_export.py runs every spliced modifier with and without one).
    A decode step skips 8 Where nodes on an 8-layer LLaMA (docs/benchmarks.md, "One decode step")."""
    return dtype == "float32" and all(mod.gqa_masked_row_zero for mod in zoo.modifiers.active(spec))


def _packed_rows(g: _Graph, b: str, t: str) -> tuple:
    """Packed rows: each token's position is given (position_ids (b t), its cache slot; the op writes a row at
    seqlens_k + 1 - t, or from 0 on a first prompt, the same slots). Only the host-side total and shapes are
    read on the host; nothing goes from the host to the device (a captured CUDA graph refuses that). ->
    (seqlens, total, total_i32, q_pos, key_mask, key_real) as _left_padded_rows, with no key mask."""
    seqlens, total_i32 = "seqlens_k", "total_sequence_length"
    total = g.cast(total_i32, "int64")
    all_pos = g.op("Range", g.ints(0), total, g.ints(1))  # (s,) int64
    k_pos = g.op("Unsqueeze", all_pos, g.ints([0]))  # (1 s)
    g.place(all_pos, "position_ids", k_pos, g.op("Concat", b, g.op("Unsqueeze", t, g.ints([0])), axis=0))
    return seqlens, total, total_i32, "position_ids", None, None


def _left_padded_rows(g: _Graph, names: set[str], b: str, t: str, decode: bool) -> tuple:
    """Lengths and positions, rows left-padded through a key mask. Full sequence: s = t keys at positions
    0..t-1. Decode: the cache holds p positions, this call adds t, so s = p + t; with a key_mask (left
    padding) a row's positions count its real keys. seqlens_k = s - 1 per row; GQA right-aligns the t
    queries on the s keys. -> (seqlens (b) int32, total, total_i32, q_pos, key_mask (b s) | None, key_real
    (b t): whether each query's own key is real, | None)."""
    # A static cache (io.static_interface): the buffers hold capacity n, past_len says how many
    # positions are written; the op writes this call's keys at past_len into its present, which the
    # session binds to the same buffer as the past (the op then skips its past -> present copy).
    static = "past_len" in names
    if static:
        # The graph's guard: another runtime may feed any past_len. Outside 0..n-t it becomes n + 1,
        # which the op refuses (total n + 1 + t is neither within the buffer nor past + t), so a bad
        # past_len never writes: without it -1 with t = 1 asked the op for 0 keys, and n for a grown present.
        n_cap = g.op("Gather", g.op("Shape", "past_key"), g.ints(2), axis=0)
        bad = g.op("Or", g.op("Less", "past_len", g.ints(0)), g.op("Greater", g.op("Add", "past_len", t), n_cap))
        past_len = g.op("Where", bad, g.op("Add", n_cap, g.ints(1)), "past_len")
    else:
        past_len = g.op("Gather", g.op("Shape", "past_key"), g.ints(2), axis=0) if decode else None
    total = g.op("Add", past_len, t) if decode else t
    seqlens = g.op("Expand", g.cast(g.op("Sub", total, g.ints(1)), "int32"), b)
    all_pos = g.op("Range", g.ints(0), total, g.ints(1))  # (s,) int64

    def last_t(k_pos: str) -> str:  # the new positions: k_pos[:, p:s]
        start, end = g.op("Unsqueeze", past_len, g.ints([0])), g.op("Unsqueeze", total, g.ints([0]))
        return g.op("Slice", k_pos, start, end, g.ints([1]))

    key_mask = "key_mask" if "key_mask" in names else None
    if key_mask and static:  # (b n) over the capacity: the op sees the first p + t keys
        key_mask = g.op("Slice", key_mask, g.ints([0]), g.op("Unsqueeze", total, g.ints([0])), g.ints([1]))
    if key_mask:
        k_pos = g.op("Sub", g.op("CumSum", g.cast(key_mask, "int64"), g.ints(1)), g.ints(1))
        q_pos = last_t(k_pos)
    else:
        k_pos = g.op("Unsqueeze", all_pos, g.ints([0]))  # (1 s)
        q_pos = last_t(k_pos) if decode else k_pos
    g.place(all_pos, q_pos, k_pos, g.op("Concat", b, g.op("Unsqueeze", t, g.ints([0])), axis=0))
    key_real = last_t(key_mask) if key_mask else None
    return seqlens, total, g.cast(total, "int32"), q_pos, key_mask, key_real
