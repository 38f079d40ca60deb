"""The `ort-gqa` lowering: ONNX Runtime's com.microsoft GroupQueryAttention, built node by node.

torch has no op that exports to GroupQueryAttention and onnxscript's ORT fusion rules match
transformers' graphs (with a KV cache), not a zoo block, so the graph is written here from
the block's weights, with the axis vocabulary as dim names:

    x (b t c) -> MatMul(+bias) -> Q (b t (h dk)), K (b t (g dk)), V (b t (g dv))
              -> Clip(-c, c) for clip_qkv -> QK-norm (plain ops, fp32 for half inputs)
              -> GroupQueryAttention(num_heads=h, kv_num_heads=g, scale, softcap,
                                     local_window_size=window, do_rotary with cos/sin caches
                                     computed in the graph for positions 0..t-1,
                                     attention_bias = ALiBi + user mask)     (b t (h dv))
              -> head_mask, zero rows where no key is allowed -> MatMul(+bias) -> y (b t c)

The rotary caches come from the block's frequencies (rope_scale included: positions / scale). T5's
relative buckets are not built here (the record refuses them). The op is always causal,
self-attention, d_v = d_k; its rotary wants rope_dim/2 a multiple of 8.
Conventions measured on onnxruntime 1.31.1 CPU against the eager block (tests keep them):
local_window_size = W attends to W keys, itself included (the zoo's `window`); softcap is
applied before the bias; a row whose bias is all -inf gives 0.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import zoo

from .errors import ExportError
from .io import TensorIO

OPSET = 18
MS_DOMAIN = "com.microsoft"
HEAD_MULTIPLE = 8  # "head_size must be a multiple of 8", at run time
ROTARY_MULTIPLE = 16  # the kernel wants cos_cache's width rope_dim / 2 to be a multiple of 8
_ONNX_TYPE = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16}
_NP_TYPE = {"float32": np.float32, "float16": np.float16}


def why_not(
    spec: zoo.AttentionSpec, *, need_weights: bool = False, dtype: str | None = None, provider: str | None = None
) -> str | None:
    """The one-line reason GroupQueryAttention cannot express `spec` (in `dtype`, for `provider`), or None."""
    if provider == "cuda" and dtype == "float32":
        # ORT registers the CUDA kernel for MLFloat16 and BFloat16 only: an fp32 node would be
        # placed on the CPU provider, silently, with copies in and out.
        return (
            "ONNX Runtime's CUDA GroupQueryAttention has float16/bfloat16 kernels only (an fp32 node would run "
            "on the CPU); export float16 or use another lowering"
        )
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
    """A small node list with fresh names, for building one graph by hand."""

    def __init__(self, dtype: str) -> None:
        self.dtype = dtype
        self.np = _NP_TYPE[dtype]
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._n = 0

    def _name(self, hint: str) -> str:
        self._n += 1
        return f"{hint}_{self._n}"

    def const(self, value, hint: str = "c", dtype=None) -> str:
        name = self._name(hint)
        # np.array copies into C order and keeps a scalar 0-d (ascontiguousarray would make it 1-d).
        arr = np.array(value, dtype=dtype if dtype is not None else self.np, order="C")
        self.inits.append(numpy_helper.from_array(arr, name))
        return name

    def ints(self, value, hint: str = "i") -> str:
        return self.const(value, hint, np.int64)

    def op(self, op_type: str, *inputs: str, outputs: int = 1, domain: str = "", name: str | None = None, **attrs):
        outs = [name] if name and outputs == 1 else [self._name(op_type.lower()) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, domain=domain or None, **attrs))
        return outs[0] if outputs == 1 else outs


def _linear(g: _Graph, x: str, w, b, hint: str, out: str | None = None) -> str:
    """x @ w.T (+ b) for an nn.Linear-style weight (out, in)."""
    y = g.op("MatMul", x, g.const(w.T, hint + "_w"), name=None if b is not None else out)
    return g.op("Add", y, g.const(b, hint + "_b"), name=out) if b is not None else y


def _rms(g: _Graph, x: str, weight, eps: float) -> str:
    """x / sqrt(mean(x^2, last axis) + eps) * weight, in fp32 for a half-precision graph."""
    xf = g.op("Cast", x, to=TensorProto.FLOAT) if g.dtype != "float32" else x
    ms = g.op("ReduceMean", g.op("Mul", xf, xf), g.ints([-1]), keepdims=1)
    inv = g.op("Reciprocal", g.op("Sqrt", g.op("Add", ms, g.const(eps, "eps", np.float32))))
    y = g.op("Mul", g.op("Mul", xf, inv), g.const(weight, "norm_w", np.float32))
    return g.op("Cast", y, to=_ONNX_TYPE[g.dtype]) if g.dtype != "float32" else y


def _per_head(g: _Graph, x: str, heads: int, fn) -> str:
    """Apply fn over each head's d of x (b t (n d)): reshape to (b t n d) and back."""
    split = g.op("Reshape", x, g.ints([0, 0, heads, -1]))
    return g.op("Reshape", fn(split), g.ints([0, 0, -1]))


def build(module: zoo.MultiHeadAttention, dtype: str, ins: list[TensorIO], outs: list[TensorIO]) -> onnx.ModelProto:
    """The ort-gqa graph of `module` with the inputs/outputs of the I/O table (x [, mask] [, head_mask] -> y)."""
    spec = module.spec
    reason = why_not(spec, need_weights=any(o.name == "attn" for o in outs))
    if spec.rel_buckets is not None:  # the record says so too (lowerings/ort_gqa.py); a direct call must not drop it
        reason = "the graph built here has no T5 relative-bucket bias"
    if reason:
        raise ExportError(f"lowering='ort-gqa' cannot express this request: {reason}")
    h, kv = spec.heads, spec.kv_heads_
    p = zoo.get_projections(module)

    def arr(t):
        return None if t is None else t.detach().cpu().double().numpy()

    g = _Graph(dtype)
    names = {io.name for io in ins}
    q = _linear(g, "x", arr(p.w_q), arr(p.b_q), "q")
    k = _linear(g, "x", arr(p.w_k), arr(p.b_k), "k")
    v = _linear(g, "x", arr(p.w_v), arr(p.b_v), "v")
    if spec.clip_qkv is not None:  # on the projections (bias included), before QK-norm and rotary
        lo, hi = g.const(-float(spec.clip_qkv), "clip_lo"), g.const(float(spec.clip_qkv), "clip_hi")
        q, k, v = (g.op("Clip", t_, lo, hi) for t_ in (q, k, v))
    if spec.qk_norm == "full":
        q, k = _rms(g, q, arr(p.q_norm), spec.qk_norm_eps), _rms(g, k, arr(p.k_norm), spec.qk_norm_eps)
    elif spec.qk_norm == "head":
        q = _per_head(g, q, h, lambda t: _rms(g, t, arr(p.q_norm), spec.qk_norm_eps))
        k = _per_head(g, k, kv, lambda t: _rms(g, t, arr(p.k_norm), spec.qk_norm_eps))

    # Lengths and positions. Full sequence: s = t keys at positions 0..t-1. Decode: the cache holds
    # p positions, this call adds t, so s = p + t; with a key_mask (left padding) a row's positions
    # count its real keys. seqlens_k = s - 1 per row; GQA right-aligns the t queries on the s keys.
    shape = g.op("Shape", "x")
    b = g.op("Gather", shape, g.ints([0]), axis=0)  # (1,)
    t = g.op("Gather", shape, g.ints(1), axis=0)  # scalar
    decode = "past_key" in names
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
    seqlens = g.op("Expand", g.op("Cast", g.op("Sub", total, g.ints(1)), to=TensorProto.INT32), b)
    total_i32 = g.op("Cast", total, to=TensorProto.INT32)
    all_pos = g.op("Range", g.ints(0), total, g.ints(1))  # (s,) int64

    def last_t(k_pos: str) -> str:  # the new positions: k_pos[:, p:s]
        start, end = g.op("Unsqueeze", past_len, g.ints([0])), g.op("Unsqueeze", total, g.ints([0]))
        return g.op("Slice", k_pos, start, end, g.ints([1]))

    key_mask = "key_mask" if "key_mask" in names else None
    if key_mask and static:  # (b n) over the capacity: the op sees the first p + t keys
        key_mask = g.op("Slice", key_mask, g.ints([0]), g.op("Unsqueeze", total, g.ints([0])), g.ints([1]))
    if key_mask:
        k_pos = g.op("Sub", g.op("CumSum", g.op("Cast", key_mask, to=TensorProto.INT64), g.ints(1)), g.ints(1))
        q_pos = last_t(k_pos)
    else:
        k_pos = g.op("Unsqueeze", all_pos, g.ints([0]))  # (1 s)
        q_pos = last_t(k_pos) if decode else k_pos
    pos = g.op("Cast", all_pos, to=TensorProto.FLOAT)  # rows of the rotary caches

    attrs: dict = {"num_heads": h, "kv_num_heads": kv, "scale": float(spec.scale_)}
    cos = sin = ""
    if spec.rope_theta is not None:
        inv_freq = zoo.modifiers.Rotary.frequencies(spec).numpy()
        angles = g.op("Mul", g.op("Unsqueeze", pos, g.ints([1])), g.const(inv_freq, "inv_freq", np.float32))
        cos, sin = g.op("Cos", angles), g.op("Sin", angles)  # (t, rope_dim / 2): the kernel's caches
        if dtype != "float32":
            cos, sin = g.op("Cast", cos, to=_ONNX_TYPE[dtype]), g.op("Cast", sin, to=_ONNX_TYPE[dtype])
        attrs.update(do_rotary=1, rotary_interleaved=int(spec.rope_interleaved))
    if spec.window is not None:
        attrs["local_window_size"] = spec.window
    if spec.softcap is not None:
        attrs["softcap"] = float(spec.softcap)

    # attention_bias (b|1, h|1, t, t): ALiBi slopes * (j - i), and the user mask as 0 / -inf.
    bias = None
    masked = "mask" in names or "key_mask" in names
    rel = None
    if spec.alibi or masked:  # i - j for every (query, key) pair: (b|1, t, s)
        rel = g.op(
            "Cast",
            g.op("Sub", g.op("Unsqueeze", q_pos, g.ints([2])), g.op("Unsqueeze", k_pos, g.ints([1]))),
            to=TensorProto.FLOAT,
        )
    if spec.alibi:
        slopes = g.const(arr(p.alibi_slopes).reshape(1, h, 1, 1), "alibi_slopes", np.float32)
        bias = g.op("Mul", slopes, g.op("Neg", g.op("Unsqueeze", rel, g.ints([1]))))
    user_mask = "mask" if "mask" in names else None
    if key_mask:
        user_mask = g.op("Unsqueeze", key_mask, g.ints([1]))  # (b 1 s): the same for every query
    if user_mask is not None:
        neg = g.op("Where", user_mask, g.const(0.0, "zero", np.float32), g.const(-np.inf, "neg_inf", np.float32))
        neg = g.op("Unsqueeze", neg, g.ints([1]))  # (b 1 t|1 s)
        if "key_mask" in names:  # the op wants the bias's t axis whole: broadcast it over rel's
            neg = g.op("Add", neg, g.op("Mul", g.op("Unsqueeze", rel, g.ints([1])), g.const(0.0, "zero", np.float32)))
        bias = neg if bias is None else g.op("Add", bias, neg)
    if bias is not None and dtype != "float32":
        bias = g.op("Cast", bias, to=_ONNX_TYPE[dtype])

    past = ["past_key", "past_value"] if decode else ["", ""]
    inputs = [q, k, v, *past, seqlens, total_i32, cos, sin, "", bias or ""]
    while inputs and inputs[-1] == "":
        inputs.pop()
    if static:  # the op's presents are the graph's outputs: no Identity between them and the buffers
        z = g._name("groupqueryattention")
        g.nodes.append(
            helper.make_node(
                "GroupQueryAttention", inputs, [z, "present_key", "present_value"], domain=MS_DOMAIN, **attrs
            )
        )
    else:
        z, present_k, present_v = g.op("GroupQueryAttention", *inputs, outputs=3, domain=MS_DOMAIN, **attrs)
    if decode and not static:
        g.op("Identity", present_k, name="present_key")
        g.op("Identity", present_v, name="present_value")

    if masked:
        # A query row with no allowed key (user mask & causal & window) gets Z = 0, as in eager torch.
        allowed = g.op("And", user_mask, g.op("GreaterOrEqual", rel, g.const(0.0, "zero", np.float32)))
        if spec.window is not None:
            allowed = g.op("And", allowed, g.op("Less", rel, g.const(float(spec.window), "window", np.float32)))
        has_key = g.op("ReduceMax", g.op("Cast", allowed, to=TensorProto.INT32), g.ints([-1]), keepdims=1)
        z = g.op("Where", g.op("Cast", has_key, to=TensorProto.BOOL), z, g.const(0.0, "zero"))
    if "head_mask" in names:
        z = _per_head(g, z, h, lambda t_: g.op("Mul", t_, g.op("Unsqueeze", "head_mask", g.ints([1, 3]))))
    _linear(g, z, arr(p.w_o), arr(p.b_o), "o", out="y")

    def value_info(io: TensorIO):
        elem = {"bool": TensorProto.BOOL, "int64": TensorProto.INT64}.get(io.kind, _ONNX_TYPE[dtype])
        return helper.make_tensor_value_info(io.name, elem, list(io.shape(spec)))

    graph = helper.make_graph(
        g.nodes, "attnzoo_ort_gqa", [value_info(io) for io in ins], [value_info(io) for io in outs], g.inits
    )
    # IR 10: what onnxruntime-gpu (which trails onnxruntime) accepts; onnx's default may be newer.
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(MS_DOMAIN, 1)], ir_version=10
    )
