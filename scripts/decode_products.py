"""The two attention products of one decode step, alone, in each operand order ONNX can give MLAS.

    python scripts/decode_products.py --past 16384 --batch 1,8 --threads 2 [--orders qk,kq,qkT,h1,h1c,h1cT,...]

A GQA block at decode (g kv heads, r query heads per kv head, d dims, one new token) reads its cache in
two products. Which order of operands streams the cache fastest is a property of ONNX Runtime's CPU
GEMM (MLAS) on the machine at hand, so it is measured, not assumed:

    qk    scores = Q K^T (M = r query rows per kv head), out = A V: the folded graph's order (zoo.attend)
    qkT   the same with K stored transposed (b g d n): B is copy-packed instead of transpose-packed
    kq    scores^T = K Q^T (the cache as the streamed A operand, M = n), out^T = V^T A^T, V stored (b g d n)
    h1    one query row per GEMM (M = 1, MLAS's GEMV path), r query heads broadcast against their kv head
    h1c   h1 over chunks of CHUNK past positions, so the r rows of a group read a chunk while it is in cache
    h1cT  h1c with K stored transposed per chunk (b g c d chunk): both products are then plain GEMVs (no
          transposed operand, nothing packed)
    qk16  qk in float16 (Q, K, V and the softmax): half the bytes, if the CPU provider has the kernels
    attention  ONNX's own Attention operator (opset 23: kv heads, no scale), as ONNX Runtime runs it
    kv8   an int8 cache (a precision of its own): K stored (b g d n) and V (b g n d) as int8, symmetric, with a
          scale per position and kv head; Q and the probabilities (times V's scales) quantized per call to
          uint8 (DynamicQuantizeLinear); both products MatMulInteger, each int32 result scaled back
    k8    K alone as int8 (stored (b g d n), a scale per position and kv head), Q quantized per call to uint8,
          Q K^T as MatMulInteger; the probabilities and V stay fp32 (five eighths of the bytes, a smaller error)
    torch      not ONNX: torch's scaled_dot_product_attention on the folded layout, as transformers runs one
               query token with its static cache (the peer's kernel), same cache, same threads

Each order runs in one session over several copies of the cache (more bytes than the last-level cache
holds, read in turn, counted in the order's own storage: fp16 and int8 caches have more copies), so the
reads come from memory as in a model's step; the figure is the fp32 cache's bytes over the best time of 5
passes (for every order, so the rates compare). The softmax between the
products is included (small beside them). Each row also gives its largest error against float64 numpy on the
first copy, relative to the output's largest value: rounding for the fp32 orders, the quantization for kv8.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

G, R, D = 4, 4, 128  # the bench's GQA block: llama-3-8b at d_model 2048 (16 heads, 4 kv heads, d_k 128)
CHUNK = 512  # h1c's chunk of past positions
ORDERS = ("qk", "qkT", "kq", "h1", "h1c", "h1cT", "qk16", "attention", "k8", "kv8", "torch")


def _chunk(n: int) -> int:
    """h1c's chunk: CHUNK positions, or the whole past when CHUNK does not divide it."""
    return CHUNK if n % CHUNK == 0 else n


def model(order: str, b: int, n: int) -> bytes:
    from onnx import TensorProto, helper

    def node(op, ins, out, **attrs):
        return helper.make_node(op, ins, [out], **attrs)

    def value(name, shape, dtype=TensorProto.FLOAT):
        return helper.make_tensor_value_info(name, dtype, shape)

    inits, opset = [], 17

    if order in ("qk", "qkT", "qk16"):
        k_shape = [b, G, D, n] if order == "qkT" else [b, G, n, D]
        k = "k" if order == "qkT" else "kt"
        nodes = [node("Transpose", ["k"], "kt", perm=[0, 1, 3, 2])] if order != "qkT" else []
        nodes += [node("MatMul", ["q", k], "s"), node("Softmax", ["s"], "a", axis=-1), node("MatMul", ["a", "v"], "y")]
        dtype = TensorProto.FLOAT16 if order == "qk16" else TensorProto.FLOAT
        ins = [value("q", [b, G, R, D], dtype), value("k", k_shape, dtype), value("v", [b, G, n, D], dtype)]
    elif order == "kq":
        nodes = [
            node("Transpose", ["q"], "qt", perm=[0, 1, 3, 2]),
            node("MatMul", ["k", "qt"], "st"),
            node("Softmax", ["st"], "at", axis=-2),
            node("MatMul", ["v", "at"], "yt"),
            node("Transpose", ["yt"], "y", perm=[0, 1, 3, 2]),
        ]
        ins = [value("q", [b, G, R, D]), value("k", [b, G, n, D]), value("v", [b, G, D, n])]
    elif order in ("h1c", "h1cT"):  # (b g c 1 chunk d): scores (b g c r 1 chunk), softmax over (c, chunk), sum over c
        c = n // _chunk(n)
        stored_t = order == "h1cT"  # K given as (b g c 1 d chunk)
        nodes = [] if stored_t else [node("Transpose", ["k"], "kt", perm=[0, 1, 2, 3, 5, 4])]
        nodes += [
            node("MatMul", ["q", "k" if stored_t else "kt"], "s"),
            node("ReduceMax", ["s", "axes"], "m", keepdims=1),
            node("Sub", ["s", "m"], "z"),
            node("Exp", ["z"], "e"),
            node("ReduceSum", ["e", "axes"], "den", keepdims=1),
            node("Div", ["e", "den"], "a"),
            node("MatMul", ["a", "v"], "yc"),
            node("ReduceSum", ["yc", "chunks"], "y", keepdims=0),
        ]
        shape = [b, G, c, 1, n // c, D]
        k_shape = [b, G, c, 1, D, n // c] if stored_t else shape
        ins = [value("q", [b, G, 1, R, 1, D]), value("k", k_shape), value("v", shape)]
        inits = [
            helper.make_tensor("axes", TensorProto.INT64, [2], [2, 5]),
            helper.make_tensor("chunks", TensorProto.INT64, [1], [2]),
        ]
        opset = 18  # ReduceMax's axes as an input
    elif order in ("k8", "kv8"):  # scores = (Q's scale x K's scale per position) Q8 K8^T
        nodes = [
            helper.make_node("DynamicQuantizeLinear", ["q"], ["q8", "q_scale", "q_zero"]),
            node("MatMulInteger", ["q8", "k", "q_zero"], "s32"),
            node("Cast", ["s32"], "s_int", to=TensorProto.FLOAT),
            node("Mul", ["s_int", "q_scale"], "s_q"),
            node("Mul", ["s_q", "k_scale"], "s"),
            node("Softmax", ["s"], "a", axis=-1),
        ]
        ins = [value("q", [b, G, R, D]), value("k", [b, G, D, n], TensorProto.INT8), value("k_scale", [b, G, 1, n])]
        if order == "k8":  # out = A V in fp32
            nodes.append(node("MatMul", ["a", "v"], "y"))
            ins.append(value("v", [b, G, n, D]))
        else:  # out = (A x V's scales)8 V8
            nodes += [
                node("Mul", ["a", "v_scale"], "av"),
                helper.make_node("DynamicQuantizeLinear", ["av"], ["a8", "a_scale", "a_zero"]),
                node("MatMulInteger", ["a8", "v", "a_zero"], "y32"),
                node("Cast", ["y32"], "y_int", to=TensorProto.FLOAT),
                node("Mul", ["y_int", "a_scale"], "y"),
            ]
            ins += [value("v", [b, G, n, D], TensorProto.INT8), value("v_scale", [b, G, 1, n])]
    elif order == "attention":
        nodes = [node("Attention", ["q", "k", "v"], "y", scale=1.0)]
        ins = [value("q", [b, G * R, 1, D]), value("k", [b, G, n, D]), value("v", [b, G, n, D])]
        opset = 23
    else:  # h1
        nodes = [
            node("Transpose", ["k"], "kt", perm=[0, 1, 2, 4, 3]),
            node("MatMul", ["q", "kt"], "s"),
            node("Softmax", ["s"], "a", axis=-1),
            node("MatMul", ["a", "v"], "y"),
        ]
        ins = [value("q", [b, G, R, 1, D]), value("k", [b, G, 1, n, D]), value("v", [b, G, 1, n, D])]
    graph = helper.make_graph(
        nodes,
        order,
        ins,
        [helper.make_tensor_value_info("y", ins[0].type.tensor_type.elem_type, None)],
        initializer=inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10).SerializeToString()


# The int8 operand's largest level. MatMulInteger takes the other operand as uint8 from DynamicQuantizeLinear
# (0..255); on an x86 CPU without AVX-512 VNNI, onnxruntime's u8 x s8 kernel adds products in pairs in int16
# (vpmaddubsw), which saturates past 32767: 255 x 127 x 2 does, 255 x 63 x 2 = 32130 does not. 63 levels keep
# the products exact on every x86 host (measured: K at 127 levels was 6.8% off on an AVX2 AMD EPYC).
INT8_LEVELS = 63


def int8_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x (b g n d) as int8 per (b, g, position) over d, symmetric in INT8_LEVELS levels: (the int8 values, the
    scales (b g 1 n))."""
    scale = np.maximum(np.abs(x).max(-1, keepdims=True), np.finfo(np.float32).tiny) / INT8_LEVELS
    return np.round(x / scale).astype(np.int8), np.ascontiguousarray(scale.transpose(0, 1, 3, 2), np.float32)


def feeds(order: str, q, k, v) -> dict:
    b, n = k.shape[0], k.shape[2]
    if order in ("k8", "kv8"):
        k8, k_scale = int8_rows(k)
        k8 = np.ascontiguousarray(k8.transpose(0, 1, 3, 2))
        if order == "k8":
            return {"q": q, "k": k8, "k_scale": k_scale, "v": v}
        v8, v_scale = int8_rows(v)
        return {"q": q, "k": k8, "k_scale": k_scale, "v": v8, "v_scale": v_scale}
    if order == "qk16":
        return {"q": q.astype(np.float16), "k": k.astype(np.float16), "v": v.astype(np.float16)}
    if order == "h1":
        return {"q": q.reshape(b, G, R, 1, D), "k": k.reshape(b, G, 1, n, D), "v": v.reshape(b, G, 1, n, D)}
    if order in ("h1c", "h1cT"):
        c = n // _chunk(n)
        k, v = (x.reshape(b, G, c, 1, n // c, D) for x in (k, v))
        if order == "h1cT":
            k = np.ascontiguousarray(k.transpose(0, 1, 2, 3, 5, 4))
        return {"q": q.reshape(b, G, 1, R, 1, D), "k": k, "v": v}
    if order == "attention":
        return {"q": q.reshape(b, G * R, 1, D), "k": k, "v": v}
    if order == "torch":
        import torch

        return {"q": torch.from_numpy(q), "k": torch.from_numpy(k), "v": torch.from_numpy(v)}
    if order == "qkT":
        return {"q": q, "k": np.ascontiguousarray(k.transpose(0, 1, 3, 2)), "v": v}
    if order == "kq":
        return {"q": q, "k": k, "v": np.ascontiguousarray(v.transpose(0, 1, 3, 2))}
    return {"q": q, "k": k, "v": v}


def runner(order: str, b: int, n: int, threads: int):
    """One call of `order` on a feed from `feeds`: returns the output as numpy."""
    if order == "torch":
        import torch
        import torch.nn.functional as F

        torch.set_num_threads(threads)
        allowed = torch.ones(b, 1, 1, n, dtype=torch.bool)  # transformers passes its static cache's mask

        def call(f):
            with torch.no_grad():
                return F.scaled_dot_product_attention(f["q"], f["k"], f["v"], attn_mask=allowed, scale=1.0).numpy()

        return call
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.add_session_config_entry("session.intra_op.allow_spinning", "1")
    sess = ort.InferenceSession(model(order, b, n), opts, providers=["CPUExecutionProvider"])
    return lambda f: sess.run(None, f)[0]


def reference(q, k, v) -> np.ndarray:
    """softmax(Q K^T) V per query head against its kv head, in float64 numpy (b g r d)."""
    scores = np.einsum("bgrd,bgnd->bgrn", q.astype(np.float64), k)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    return np.einsum("bgrn,bgnd->bgrd", weights / weights.sum(-1, keepdims=True), v)


def measure(order: str, b: int, n: int, threads: int, total_bytes: float) -> tuple[float, float, float]:
    """(ms per call, GB/s of the fp32 cache, largest error relative to the output's largest value)."""
    rng = np.random.default_rng(0)
    cache_bytes = 2 * b * G * n * D * 4
    q = rng.standard_normal((b, G, R, D), np.float32) * D**-0.5  # the block's scale, folded into Q
    first = rng.standard_normal((b, G, n, D), np.float32), rng.standard_normal((b, G, n, D), np.float32)
    runs = [feeds(order, q, *first)]
    # as many copies as make total_bytes of what this order stores (an int8 cache is smaller: more copies)
    copies = max(2, int(total_bytes // sum(x.nbytes for x in runs[0].values())))
    runs += [
        feeds(order, q, rng.standard_normal((b, G, n, D), np.float32), rng.standard_normal((b, G, n, D), np.float32))
        for _ in range(copies - 1)
    ]
    call = runner(order, b, n, threads)
    want = reference(q, *first)
    error = float(np.abs(call(runs[0]).reshape(want.shape) - want).max() / np.abs(want).max())
    for f in runs:  # warm-up
        call(f)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for f in runs:
            call(f)
        best = min(best, (time.perf_counter() - t0) / copies)
    return best * 1e3, cache_bytes / best / 1e9, error


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--past", type=int, default=16384)
    p.add_argument("--batch", default="1,8")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--orders", default=",".join(ORDERS), help=f"a subset of {','.join(ORDERS)}")
    p.add_argument("--bytes", type=float, default=400e6, help="bytes of cache copies read in turn (default 400 MB)")
    args = p.parse_args()
    orders = args.orders.split(",")
    unknown = sorted(set(orders) - set(ORDERS))
    if unknown:
        p.error(f"unknown order(s) {unknown}; choose from {', '.join(ORDERS)}")
    print("| B | past | order | ms | GB/s of cache | largest error |\n|---:|---:|---|---:|---:|---:|")
    for b in (int(x) for x in args.batch.split(",")):
        for order in orders:
            ms, gbs, error = measure(order, b, args.past, args.threads, args.bytes)
            print(f"| {b} | {args.past} | {order} | {ms:.2f} | {gbs:.1f} | {error:.1e} |", flush=True)


if __name__ == "__main__":
    main()
