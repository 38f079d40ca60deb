"""`decomposed`: the explicit path (einsum, a NaN-safe masked softmax, einsum) at opset 18.
It expresses every request, the attention weights included, and runs anywhere."""

from .base import Lowering

LOWERING = Lowering(
    name="decomposed",
    opset=18,
    graph="MatMul/Einsum, an explicit NaN-safe softmax, opset 18",
    weights_out=True,
    fused=False,
    # The static cache: ScatterElements writes this call's keys into the bound buffer in place, and
    # the folded query heads read each kv head once (zoo/attend.py, folded_attention).
    static_cache=None,
)
