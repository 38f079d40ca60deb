"""Parity cases for Llama 4's text attention (Llama4TextAttention), merged into tests/peers/test_hf.py's CASES:
a tiny random Llama4TextModel with two layers, layer 0 a chunked rotary layer (chunks of 16, its weightless
QK-norm after the complex rotary) and layer 1 a NoPE layer (full attention, query temperature with a floor of
32 positions), run over 160 positions so that ten chunks and five floors pass; the second row right-padded.
"""

from __future__ import annotations

from hf_cases_copies import BASE, T
from hf_cases_long import long_model

CHUNK, FLOOR = 16, 32
LLAMA4 = dict(
    BASE,
    head_dim=16,
    intermediate_size_mlp=64,
    num_local_experts=2,
    num_experts_per_tok=1,
    no_rope_layers=[1, 0],  # 1 = rotary (chunked), 0 = NoPE
    attention_chunk_size=CHUNK,
    floor_scale=FLOOR,
    attn_scale=0.1,
    attn_temperature_tuning=True,
    use_qk_norm=True,
)


def _layer(i: int):
    return lambda model: model.layers[i].self_attn


CASES: dict[str, dict] = {
    "llama4-chunked": dict(
        make=long_model("Llama4TextModel", "Llama4TextConfig", T, layer=_layer(0), **LLAMA4),
        spec_checks={"chunk": CHUNK, "qk_l2": 1e-5, "rope_interleaved": True, "temperature_floor": None},
    ),
    "llama4-nope": dict(
        make=long_model("Llama4TextModel", "Llama4TextConfig", T, layer=_layer(1), **LLAMA4),
        spec_checks={"chunk": None, "rope_theta": None, "qk_l2": None, "temperature_floor": FLOOR},
        variant=True,
    ),
}
