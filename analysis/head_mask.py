"""A model-level head_mask, split into one per zoo block (the block's own head_mask input)."""

from __future__ import annotations

from torch import Tensor

from .errors import AnalysisError


def per_layer(head_mask, heads: tuple[int, ...], layer: str = "layer") -> list[Tensor | None]:
    """One head_mask (or None) per block with `heads` heads each.

    head_mask: None; a tensor (layers, max(heads)) or (b, layers, max(heads)), where a layer
    with fewer heads reads the first entries of its row; or one (h) / (b h) tensor per layer.
    `layer` names a block in the error (e.g. "decoder layer").
    """
    if head_mask is None:
        return [None] * len(heads)
    if isinstance(head_mask, Tensor):
        if head_mask.dim() == 2 and tuple(head_mask.shape) == (len(heads), max(heads)):
            return [head_mask[i, :h] for i, h in enumerate(heads)]
        if head_mask.dim() == 3 and tuple(head_mask.shape[1:]) == (len(heads), max(heads)):
            return [head_mask[:, i, :h] for i, h in enumerate(heads)]
        raise AnalysisError(
            f"head_mask has shape {tuple(head_mask.shape)}; expected (layers={len(heads)}, heads={max(heads)}) "
            f"or (b, layers, heads)"
        )
    masks = list(head_mask)
    if len(masks) != len(heads):
        raise AnalysisError(f"head_mask has {len(masks)} entries; expected one per {layer} ({len(heads)})")
    return masks
