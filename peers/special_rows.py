"""Rows of the family table for attention with a mechanism of its own: multi-head latent attention
(DeepSeek-V2/V3, MiniCPM3), attention sinks (gpt-oss), and differential attention (DiffLlama, refused with
the reason). The plain families are in `peers.classes`; `peers.copies` assembles the whole table."""

from __future__ import annotations

from .classes import LLAMA, SLIDING, _like
from .latent import LatentRow
from .rows import Row

# latent attention (peers/latent.py reads and writes these; MiniCPM3 rotates halves, DeepSeek-V2 adjacent pairs,
# DeepSeek-V3 as its config's rope_interleave says)
DEEPSEEK_V3 = Row(
    family="DeepSeek-V3",
    cls="DeepseekV3Attention",
    covers="the whole module (multi-head latent attention, its decoupled rotary key and causal mask)",
    out="o_proj",
    h="num_heads",
    g=None,
    d="qk_head_dim",
    rope="full",
    latent=LatentRow("rope_interleave"),
)
SPECIAL_ROWS: tuple[Row, ...] = (
    DEEPSEEK_V3,
    _like(DEEPSEEK_V3, family="DeepSeek-V2", cls="DeepseekV2Attention", latent=LatentRow(True)),
    _like(DEEPSEEK_V3, family="MiniCPM3", cls="MiniCPM3Attention", latent=LatentRow(False)),
)

# refused as a whole, measured: read as plain attention with its q/k/v/o projections, a tiny random DiffLlama's
# second layer misses its module by 5.6 (outputs up to 2.5), so nothing short of its own modifier would do
SPECIAL_ROWS += (
    Row(
        family="DiffLlama",
        cls="DiffLlamaAttention",
        refused="differential attention: each output head pair is (softmax(Q_r K^T) - lambda * softmax(Q_r' K^T)) V "
        "over both value halves, lambda = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init(layer), then a weightless "
        "RMSNorm over the pair's 2 * head_dim and a factor 1 - lambda_init; the zoo's block has one softmax per head "
        "and nothing between the heads' Z and W_O (as plain attention with its projections it misses by 5.6 on outputs "
        "up to 2.5, measured on a tiny random model)",
    ),
)

# attention sinks (zoo/modifiers/sinks.py): gpt-oss's learned softmax logit per head, alternating sliding and full
# layers (layer_types), biases on all four projections, yarn-scaled rotary on halves
# (its module is causal whatever use_bidirectional_attention says: no check)
SPECIAL_ROWS += (_like(LLAMA, family="gpt-oss", cls="GptOssAttention", window=SLIDING, sinks="sinks", checks=()),)

__all__ = ["DEEPSEEK_V3", "SPECIAL_ROWS"]
