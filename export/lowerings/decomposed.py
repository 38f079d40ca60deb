"""`decomposed`: the explicit path (einsum, a NaN-safe masked softmax, einsum) at opset 18.
It expresses every request, the attention weights included, and runs anywhere."""

from .base import Lowering


def _cannot(spec, *, dtype=None, provider=None) -> str | None:
    # ONNX's Einsum types T as float16/float/double (and ints): a bfloat16 graph fails onnx.checker
    if dtype == "bfloat16":
        return (
            "decomposed writes Einsum, which ONNX does not type for bfloat16; export bfloat16 with "
            "lowering='onnx-attention' or 'auto' (or float16 with decomposed)"
        )
    return None


LOWERING = Lowering(
    name="decomposed",
    opset=18,
    graph="MatMul/Einsum, an explicit NaN-safe softmax, opset 18",
    weights_out=True,
    encoder_decoder=True,
    int8_cache=True,
    fused=False,
    # The static cache: ScatterElements writes this call's keys into the bound buffer in place, and
    # the folded query heads read each kv head once (zoo/attend.py, folded_attention).
    static_cache=None,
    cannot=_cannot,
)
