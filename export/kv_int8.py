"""An int8 KV cache for whole-model exports (kv_precision="int8"): the traced static-cache graph rewritten so
that each layer keeps its keys and values as int8 with one scale per position and kv head, and runs both
attention products as integer products (MatMulInteger), as `scripts/decode_products.py`'s `kv8` measured.

    export_onnx(model, "lm.onnx", kv_precision="int8")     # the decomposed lowering's folded products

Per layer i (g kv heads, capacity n, r query heads per kv head folded into the query axis):

    past_key_values.i.key          int8 (b g dk n)   keys stored transposed: the scores' product reads them as is
    past_key_values.i.key_scale    fp32 (b g 1 n)    max |k| / 127 over dk, per position and kv head
    past_key_values.i.value        int8 (b g n dv)
    past_key_values.i.value_scale  fp32 (b g 1 n)

each bound as past and as present (present.i.key, present.i.key_scale, ...), so a step writes its new
positions in place, as the fp32 cache does. A new position quantizes alone (symmetric, round to nearest),
so what is written never depends on the batch or on later tokens.

The products (both operands within 7 bits: see Q_STEPS):
    scores = (MatMulInteger([q_hi; q_lo], K8) split, * its q scales, summed) * k_scale
                    q per row (one query head, one position) in two levels of -63..63 (the second rounds what
                    the first left), stacked on the rows so that ONE integer product reads K for both
    out    = MatMulInteger(a8, V8) * a_scale
                    a = softmax * v_scale (>= 0), per row in 0..127: a_scale = max a / 127 over the positions
Each scale is a row's own, so no row's answer depends on its batch mates. The losses are the cache's
rounding (half a step of max |k| / 127 per element) and the weights' per-call rounding: a weight below a
row's largest / 254 rounds to zero, the price of the integer product (the error on the shipped checkpoint is
in docs/generation.md). Positions, masks and the softmax stay fp32 and exact.

The rewrite matches the decomposed lowering's static step (ScatterElements into the past, Transpose(present
key) into a MatMul, present value into a MatMul); a layer whose graph reads its cache otherwise is refused by
name (KVPrecisionError), never left fp32.
"""

from __future__ import annotations

import numpy as np

from runtime.io import LM_PAST, LM_PRESENT, TensorIO

from .errors import ExportError
from .lowerings import able
from .names import KV_PRECISIONS

SCALE_KINDS = ("key_scale", "value_scale")
# The integer products' operands stay within 7 bits (u8 <= 127): x86's u8 x s8 kernels without VNNI add pairs
# of products in int16 (VPMADDUBSW), which saturates past 2 x 127 x 127; full-range u8 (255 x 127 x 2) did, on
# an AVX2 EPYC, and scores came out wrong by 9% of their scale. q then takes two 7-bit levels (hi, lo).
Q_STEPS, Q_MID = 63, 64  # q / scale in -63..63, stored + 64 (the zero point): 1..127
A_STEPS = 127  # the weights (>= 0) in 0..127, zero point 0
TINY = float(np.finfo(np.float32).tiny)  # a zero row's scale: its int8 values are then 0, never NaN


class KVPrecisionError(ExportError):
    """A kv_precision the export cannot carry (unknown, or a lowering / dtype that cannot hold it)."""


def why_not(kv_precision, lowering: str, dtype: str) -> str | None:
    """Why `kv_precision` cannot go with `lowering` (a name, or "auto") and `dtype`, or None."""
    if not isinstance(kv_precision, str) or kv_precision not in KV_PRECISIONS:
        return f"kv_precision={kv_precision!r} is not one of {', '.join(KV_PRECISIONS)}"
    if kv_precision == "fp32":
        return None
    carriers = able("int8_cache")  # the lowerings whose traced static step the rewrite matches (their records')
    if lowering != "auto" and lowering not in carriers:
        return (
            f"kv_precision='int8' is carried by the {' / '.join(carriers)} lowering only, not "
            f"lowering={lowering!r}: pass lowering='decomposed' (or 'auto')"
        )
    if dtype != "float32":
        return f"kv_precision='int8' needs dtype='float32' (its scales and products are fp32), got dtype={dtype!r}"
    return None


def interface(ins: list[TensorIO], outs: list[TensorIO]) -> tuple[list[TensorIO], list[TensorIO]]:
    """io.lm_interface's lists with each layer's fp32 buffers as int8 + scales (the module docstring)."""

    def per_layer(items: list[TensorIO], pattern: str) -> list[TensorIO]:
        prefix = pattern.split("{", 1)[0]
        result = []
        for io in items:
            if not io.name.startswith(prefix):
                result.append(io)
                continue
            b, g, n, d = io.axes
            layer, kv = io.name[len(prefix) :].split(".")
            axes = (b, g, d, n) if kv == "key" else (b, g, n, d)
            result.append(TensorIO(io.name, axes, "int8", f"layer {layer}'s int8 {kv} buffer of capacity n"))
            scale = pattern.format(i=layer, kv=f"{kv}_scale")
            result.append(TensorIO(scale, (b, g, 1, n), "float", f"layer {layer}'s {kv} scale per position"))
        return result

    return per_layer(ins, LM_PAST), per_layer(outs, LM_PRESENT)


def rewrite(model, layers: int):
    """Rewrite `model` (onnx_ir, io.lm_interface's names, the decomposed static step) in place to the int8
    cache of the module docstring; returns it. KVPrecisionError names a layer the rewrite cannot match."""
    import onnx_ir as ir
    from onnx_ir.passes.common import RemoveUnusedNodesPass

    graph = model.graph
    inputs = {v.name: v for v in graph.inputs}
    outputs = {v.name: v for v in graph.outputs}
    consts: dict = {}

    def const(name: str, array: np.ndarray):
        if name not in consts:
            node = ir.node("Constant", [], {"value": ir.tensor(array, name=name)}, name=f"kv8/{name}")
            node.outputs[0].name = f"kv8/{name}"
            graph.insert_before(graph[0], node)
            consts[name] = node.outputs[0]
        return consts[name]

    new_inputs, new_outputs = list(graph.inputs), list(graph.outputs)
    for i in range(layers):
        scales = {}
        for kv in ("key", "value"):
            past = inputs.get(LM_PAST.format(i=i, kv=kv))
            present = outputs.get(LM_PRESENT.format(i=i, kv=kv))
            if past is None or present is None:
                raise KVPrecisionError(f"layer {i}: the graph has no {LM_PAST.format(i=i, kv=kv)} buffer to quantize")
            writer = _Writer(ir, graph, const, i, kv, past, present)
            past8, scale_in, present8, scale_out, fp32 = writer.build()
            scales[kv] = (present8, scale_out, fp32, past, past8)
            at = new_inputs.index(past)
            new_inputs[at : at + 1] = [past8, scale_in]
            at = new_outputs.index(present)
            new_outputs[at : at + 1] = [present8, scale_out]
        _replace_products(ir, graph, const, i, scales)
        _move_shape_reads(i, scales)
    graph.inputs.clear()
    graph.inputs.extend(new_inputs)
    graph.outputs.clear()
    graph.outputs.extend(new_outputs)
    RemoveUnusedNodesPass()(model)
    return model


class _Writer:
    """One buffer's write: the new positions quantized per position and kv head, scattered into the int8
    buffer and its scales at the indices (and under the validity) the traced step computed."""

    def __init__(self, ir, graph, const, layer: int, kv: str, past, present) -> None:
        self.ir, self.graph, self.const, self.layer, self.kv = ir, graph, const, layer, kv
        self.past, self.present = past, present
        self.anchor = present.producer()
        self.prefix = f"kv8/L{layer}/{kv}/"

    def op(self, op_type: str, inputs, name: str, **attrs):
        node = self.ir.node(op_type, inputs, attrs or None, name=self.prefix + name)
        node.outputs[0].name = self.prefix + name
        self.graph.insert_before(self.anchor, node)
        return node.outputs[0]

    def build(self):
        ir, scatter = self.ir, self.anchor
        where = scatter.inputs[2].producer() if scatter is not None and scatter.op_type == "ScatterElements" else None
        gather = where.inputs[2].producer() if where is not None and where.op_type == "Where" else None
        if gather is None or gather.op_type != "GatherElements" or gather.inputs[0] is not self.past:
            raise KVPrecisionError(
                f"layer {self.layer}: its {self.kv} buffer is not written as the decomposed static step writes it "
                "(ScatterElements of Where(valid, new, GatherElements(past))); kv_precision='int8' needs "
                "lowering='decomposed'"
            )
        cond, new, index = where.inputs[0], where.inputs[1], scatter.inputs[1]
        b, g, n, d = self.past.shape
        key = self.kv == "key"
        buf_shape = [b, g, d, n] if key else [b, g, n, d]
        past8 = ir.val(self.past.name, ir.DataType.INT8, ir.Shape(buf_shape))
        scale_in = ir.val(f"{self.past.name}_scale", ir.DataType.FLOAT, ir.Shape([b, g, 1, n]))
        last = self.const("axes_last", np.array([-1], np.int64))
        amax = self.op("ReduceMax", [self.op("Abs", [new], "abs"), last], "amax", keepdims=1)
        tiny = self.const("tiny", np.array(TINY, np.float32))
        scale = self.op(
            "Div", [self.op("Max", [amax, tiny], "amax_pos"), self.const("i8max", np.float32(127))], "scale"
        )
        q = self.op("Round", [self.op("Div", [new, scale], "scaled")], "rounded")
        q8 = self.op("Cast", [q], "q8", to=ir.DataType.INT8)
        perm = [0, 1, 3, 2]
        # the scales' indices and validity: the first element of each position's row (b g t 1) -> (b g 1 t)
        zero, one = self.const("zero", np.array([0], np.int64)), self.const("one", np.array([1], np.int64))
        first = [zero, one, self.const("axis3", np.array([3], np.int64))]
        index_s = self.op("Transpose", [self.op("Slice", [index, *first], "index_s")], "index_sT", perm=perm)
        # the traced step's validity is one scalar (the whole write); a per-element one is sliced as the indices
        per_element = cond.shape is None or len(cond.shape) == 4
        cond_s = cond
        if per_element:
            cond_s = self.op("Transpose", [self.op("Slice", [cond, *first], "cond_s")], "cond_sT", perm=perm)
        scale_t = self.op("Transpose", [scale], "scaleT", perm=perm)
        if key:  # stored (b g dk n): the write goes along the last axis
            index, q8 = (self.op("Transpose", [x], f"{nm}T", perm=perm) for x, nm in ((index, "index"), (q8, "q8")))
            if per_element:
                cond = self.op("Transpose", [cond], "condT", perm=perm)
        axis = 3 if key else 2
        old = self.op("GatherElements", [past8, index], "old", axis=axis)
        present8 = self.op(
            "ScatterElements", [past8, index, self.op("Where", [cond, q8, old], "update")], "present", axis=axis
        )
        old_s = self.op("GatherElements", [scale_in, index_s], "old_scale", axis=3)
        update_s = self.op("Where", [cond_s, scale_t, old_s], "update_scale")
        scale_out = self.op("ScatterElements", [scale_in, index_s, update_s], "present_scale", axis=3)
        present8.name, scale_out.name = self.present.name, f"{self.present.name}_scale"
        present8.shape, present8.type = ir.Shape(buf_shape), ir.TensorType(ir.DataType.INT8)
        scale_out.shape, scale_out.type = ir.Shape([b, g, 1, n]), ir.TensorType(ir.DataType.FLOAT)
        self.present.name = f"{self.prefix}fp32_present"
        return past8, scale_in, present8, scale_out, self.present


def _move_shape_reads(layer: int, buffers: dict) -> None:
    """The traced step reads sizes (b, g, n) off the fp32 buffers: those Shape nodes read the int8 value
    buffer (b g n dv) instead, whose first three axes are the same; any other reader is refused."""
    value8 = buffers["value"][4]
    for kv, (_, _, fp32_present, past, _) in buffers.items():
        for node, idx in list(past.uses()):
            if node is fp32_present.producer() or (node.op_type == "GatherElements" and node.outputs[0].uses()):
                continue
            start = node.attributes.get("start")
            end = node.attributes.get("end")
            axes_ok = start is not None and end is not None and 0 <= start.as_int() and end.as_int() <= 3
            if node.op_type != "Shape" or not (axes_ok or kv == "value"):
                raise KVPrecisionError(
                    f"layer {layer}: its {kv} buffer is read by {node.op_type} ({node.name}), which the int8 cache "
                    "does not carry; kv_precision='int8' needs lowering='decomposed'"
                )
            node.replace_input_with(idx, value8)


def _split_rows(ir, graph, anchor, x):
    """x (b g 2m n) -> its two halves along the rows, (b g m n) each."""
    node = ir.node("Split", [x], {"axis": 2, "num_outputs": 2}, num_outputs=2, name=f"{x.name}_split")
    for k, out in enumerate(node.outputs):
        out.name = f"{x.name}_half{k}"
    graph.insert_before(anchor, node)
    return node.outputs


def _replace_products(ir, graph, const, layer: int, scales: dict) -> None:
    """Both products of `layer` read the int8 buffers: Transpose(present key) -> MatMul(q, .) becomes the
    integer scores, MatMul(a, present value) the integer output (module docstring)."""
    prefix = f"kv8/L{layer}/"
    (k8, k_scale, fp32_key, _, _), (v8, v_scale, fp32_value, _, _) = scales["key"], scales["value"]
    last = const("axes_last", np.array([-1], np.int64))
    tiny = const("tiny", np.array(TINY, np.float32))
    q_steps, q_mid = const("q_steps", np.float32(Q_STEPS)), const("q_mid", np.float32(Q_MID))

    def op(anchor, op_type, inputs, name, **attrs):
        node = ir.node(op_type, inputs, attrs or None, name=prefix + name)
        node.outputs[0].name = prefix + name
        graph.insert_before(anchor, node)
        return node.outputs[0]

    def refuse(what: str):
        return KVPrecisionError(
            f"layer {layer}: its cache's {what} is not the decomposed lowering's folded product; "
            "kv_precision='int8' needs lowering='decomposed'"
        )

    key_uses = [node for node, _ in fp32_key.uses()]
    if not key_uses or any(
        n.op_type != "Transpose" or list(n.attributes["perm"].as_ints()) != [0, 1, 3, 2] for n in key_uses
    ):
        raise refuse("key read")
    for k, transpose in enumerate(key_uses):
        for matmul, idx in list(transpose.outputs[0].uses()):
            if matmul.op_type != "MatMul" or idx != 1:
                raise refuse("key read")
            # q = q_hi * s_hi + q_lo * s_lo, both halves 8-bit per row, stacked on the rows: ONE integer
            # product reads K once for both (one level alone cost up to 4% of the logits on the shipped model)
            q, halves = matmul.inputs[0], []
            for level in ("hi", "lo"):
                name = f"q_{level}{k}"
                amax = op(
                    matmul, "ReduceMax", [op(matmul, "Abs", [q], f"{name}_abs"), last], f"{name}_amax", keepdims=1
                )
                scale = op(matmul, "Div", [op(matmul, "Max", [amax, tiny], f"{name}_pos"), q_steps], f"{name}_scale")
                rounded = op(matmul, "Round", [op(matmul, "Div", [q, scale], f"{name}_scaled")], f"{name}_round")
                halves.append((op(matmul, "Add", [rounded, q_mid], f"{name}_shift"), scale))
                if level == "hi":  # the residual, at most half a step of the first level
                    q = op(matmul, "Sub", [q, op(matmul, "Mul", [rounded, scale], f"{name}_back")], f"q_rest{k}")
            stacked = op(matmul, "Concat", [halves[0][0], halves[1][0]], f"q_stack{k}", axis=2)
            q8 = op(matmul, "Cast", [stacked], f"q8_{k}", to=ir.DataType.UINT8)
            s32 = op(matmul, "MatMulInteger", [q8, k8, const("q_zero", np.array(Q_MID, np.uint8))], f"s32_{k}")
            s_hi, s_lo = _split_rows(ir, graph, matmul, op(matmul, "Cast", [s32], f"s_int{k}", to=ir.DataType.FLOAT))
            s = op(
                matmul,
                "Add",
                [
                    op(matmul, "Mul", [s_hi, halves[0][1]], f"s_hi{k}"),
                    op(matmul, "Mul", [s_lo, halves[1][1]], f"s_lo{k}"),
                ],
                f"s_q{k}",
            )
            scores = op(matmul, "Mul", [s, k_scale], f"scores{k}")
            matmul.outputs[0].replace_all_uses_with(scores)
    value_uses = list(fp32_value.uses())
    if not value_uses or any(n.op_type != "MatMul" or idx != 1 for n, idx in value_uses):
        raise refuse("value read")
    for k, (matmul, _) in enumerate(value_uses):
        a = op(matmul, "Mul", [matmul.inputs[0], v_scale], f"av{k}")
        amax = op(matmul, "ReduceMax", [a, last], f"a_max{k}", keepdims=1)
        a_scale = op(
            matmul,
            "Div",
            [op(matmul, "Max", [amax, tiny], f"a_max_pos{k}"), const("a_steps", np.float32(A_STEPS))],
            f"a_scale{k}",
        )
        a8 = op(
            matmul,
            "Cast",
            [op(matmul, "Round", [op(matmul, "Div", [a, a_scale], f"a_scaled{k}")], f"a_round{k}")],
            f"a8_{k}",
            to=ir.DataType.UINT8,
        )
        y32 = op(matmul, "MatMulInteger", [a8, v8], f"y32_{k}")
        y = op(matmul, "Mul", [op(matmul, "Cast", [y32], f"y_int{k}", to=ir.DataType.FLOAT), a_scale], f"out{k}")
        matmul.outputs[0].replace_all_uses_with(y)


__all__ = [
    "KV_PRECISIONS",
    "KVPrecisionError",
    "rewrite",
    "why_not",
]
