"""Head scores from attention maps: what each (layer, head) attends to, as one number.

Every score reads maps A (layers b h t s) (rows sum to 1) and the tokens (b t) they came from,
and never writes to them. A score is computed per sequence, then the sequences are averaged
with equal weight, so scoring a list of inputs gives the mean of scoring each one. Rows t = 0
are left out everywhere: in a causal map that row has one key and says nothing about the head.
A sequence with no row a score applies to (no repeated token, say) gives NaN for that score and
is left out of the mean.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .errors import AnalysisError

SCORE_NAMES = ("previous_token", "induction", "duplicate_token", "first_token", "confidence")
DETECTOR_NAMES = ("detector_previous_token", "detector_duplicate_token", "detector_induction")


# -- target cells --------------------------------------------------------------------------------


def previous_token_cells(tokens: Tensor, s: int) -> Tensor:
    """(b t s) bool: key t - 1 for query t."""
    b, t = tokens.shape
    cells = torch.zeros(t, s, dtype=torch.bool)
    idx = torch.arange(1, t)
    cells[idx, idx - 1] = True
    return cells.expand(b, t, s)


def duplicate_token_cells(tokens: Tensor) -> Tensor:
    """(b t t) bool: earlier keys s < t holding the same token as query t."""
    same = tokens[:, :, None] == tokens[:, None, :]
    return same & torch.ones_like(same[0]).tril(-1)


def induction_cells(tokens: Tensor) -> Tensor:
    """(b t t) bool: keys s <= t right after an earlier occurrence of query t's token
    (tokens[s - 1] == tokens[t], s - 1 < t). On a block repeated twice, row t of the second copy
    has exactly one such key, the token after its first occurrence: TransformerLens's recipe.
    """
    dup = duplicate_token_cells(tokens)  # (b t s'), s' < t
    cells = torch.zeros_like(dup)
    cells[:, :, 1:] = dup[:, :, :-1]  # key s = s' + 1 <= t
    return cells


def first_token_cells(tokens: Tensor, s: int) -> Tensor:
    b, t = tokens.shape
    cells = torch.zeros(b, t, s, dtype=torch.bool)
    cells[:, :, 0] = True
    return cells


# -- scores --------------------------------------------------------------------------------------


def _per_sequence(values: Tensor, rows: Tensor) -> Tensor:
    """values (l b h t), rows (b t) bool -> (l b h): mean over the rows that apply, NaN if none."""
    rows = rows.to(values.dtype)
    n = rows.sum(-1)  # (b)
    total = (values * rows[None, :, None, :]).sum(-1)
    return torch.where(n[None, :, None] > 0, total / n.clamp_min(1)[None, :, None], torch.nan)


def cell_score(maps: Tensor, cells: Tensor) -> Tensor:
    """(layers b h) : per sequence, the mean over rows t >= 1 that have a target cell of the
    weight on the target cells, sum_s A[t, s] * cells[t, s]."""
    cells = cells.to(maps.dtype)
    on = torch.einsum("l b h t s, b t s -> l b h t", maps, cells)
    rows = cells.sum(-1) > 0
    rows[:, 0] = False
    return _per_sequence(on, rows)


def detector_score(
    maps: Tensor, cells: Tensor, *, exclude_bos: bool = False, exclude_current_token: bool = False
) -> Tensor:
    """(layers b h): TransformerLens's head-detector form ("mul"), per sequence:
    sum(A * pattern) / sum(A) over the whole map, after zeroing column 0 (exclude_bos) and/or
    the diagonal (exclude_current_token) in A."""
    a = maps.clone()
    if exclude_bos:
        a[..., 0] = 0
    if exclude_current_token:
        t = a.shape[-2]
        idx = torch.arange(min(t, a.shape[-1]))
        a[..., idx, idx] = 0
    on = torch.einsum("l b h t s, b t s -> l b h", a, cells.to(a.dtype))
    total = a.sum((-1, -2))
    return torch.where(total > 0, on / total.clamp_min(torch.finfo(a.dtype).tiny), torch.nan)


def scores_from_maps(
    maps: Tensor, tokens: Tensor, *, exclude_bos: bool = False, exclude_current_token: bool = False
) -> dict[str, Tensor]:
    """{name: (layers b h)} per sequence, from maps A (layers b h t t) and tokens (b t).

    previous_token   mean_t A[t, t-1]                                         (rows t >= 1)
    induction        mean_t sum_s A[t, s] [tokens[s-1] == tokens[t], s-1 < t]  (rows with an earlier copy)
    duplicate_token  mean_t sum_s A[t, s] [tokens[s] == tokens[t], s < t]      (rows with an earlier copy)
    first_token      mean_t A[t, 0]                                           (rows t >= 1)
    confidence       mean_t max_s A[t, s]  (Voita et al. 2019)                (rows t >= 1)
    detector_*       TransformerLens's detector form on the same patterns: sum(A * P) / sum(A)
                     over the whole map, with its exclude_bos / exclude_current_token options
    """
    if maps.dim() != 5:
        raise AnalysisError(f"maps have shape {tuple(maps.shape)}; expected (layers, b, h, t, s)")
    _, b, _, t, s = maps.shape
    if tuple(tokens.shape) != (b, t):
        raise AnalysisError(f"tokens have shape {tuple(tokens.shape)}; the maps need (b={b}, t={t})")
    if s != t:
        raise AnalysisError(f"token-pattern scores need self-attention maps (t == s), got t={t}, s={s}")
    maps = maps.detach().float()
    prev, dup, ind, first = (
        previous_token_cells(tokens, s),
        duplicate_token_cells(tokens),
        induction_cells(tokens),
        first_token_cells(tokens, s),
    )
    rows = torch.ones(b, t, dtype=torch.bool)
    rows[:, 0] = False
    out = {
        "previous_token": cell_score(maps, prev),
        "induction": cell_score(maps, ind),
        "duplicate_token": cell_score(maps, dup),
        "first_token": cell_score(maps, first),
        "confidence": _per_sequence(maps.amax(-1), rows),
    }
    opts = {"exclude_bos": exclude_bos, "exclude_current_token": exclude_current_token}
    out["detector_previous_token"] = detector_score(maps, prev, **opts)
    out["detector_duplicate_token"] = detector_score(maps, dup, **opts)
    out["detector_induction"] = detector_score(maps, ind, **opts)
    return out


def _as_batches(tokens: Tensor | Sequence) -> list[Tensor]:
    if isinstance(tokens, Tensor):
        return [tokens[None] if tokens.dim() == 1 else tokens]
    if isinstance(tokens, (list, tuple)) and tokens and all(isinstance(x, Tensor) for x in tokens):
        return [x[None] if x.dim() == 1 else x for x in tokens]
    t = torch.as_tensor(tokens)
    return [t[None] if t.dim() == 1 else t]


def head_scores(
    model, tokens: Tensor | Sequence, *, exclude_bos: bool = False, exclude_current_token: bool = False
) -> dict[str, Tensor]:
    """{name: (layers h)}: every score of `scores_from_maps`, averaged over sequences.

    tokens: (b t), (t), or a list of those (any lengths up to model.context). Each sequence
    counts once; a list gives the same result as scoring each item and averaging.
    """
    per_seq: dict[str, list[Tensor]] = {}
    with torch.no_grad():
        for batch in _as_batches(tokens):
            batch = model.check_tokens(batch)
            for name, v in scores_from_maps(
                model.attention_maps(batch),
                batch,
                exclude_bos=exclude_bos,
                exclude_current_token=exclude_current_token,
            ).items():
                per_seq.setdefault(name, []).append(v)
    return {name: torch.cat(vs, dim=1).nanmean(dim=1) for name, vs in per_seq.items()}


def best_scores(scores: dict[str, Tensor], names: Sequence[str] = SCORE_NAMES[:4]) -> list[list[tuple[str, float]]]:
    """Per (layer, head): the name and value of its highest score among `names`."""
    layers, heads = scores[names[0]].shape
    out = []
    for layer in range(layers):
        row = []
        for h in range(heads):
            vals = [(n, float(scores[n][layer, h])) for n in names]
            vals = [(n, v) for n, v in vals if v == v]  # NaN: the input had no such rows
            row.append(max(vals, key=lambda nv: nv[1]) if vals else ("-", float("nan")))
        out.append(row)
    return out


def format_scores(
    scores: dict[str, Tensor], names: Sequence[str] = SCORE_NAMES, shut: Sequence[Sequence[bool]] | None = None
) -> str:
    """A plain table: one row per (layer, head), one column per score; with `shut` (per layer,
    per head) a last column says which heads have a zero output (their maps are not in use)."""
    layers, heads = scores[names[0]].shape
    lines = ["head  " + "  ".join(f"{n:>15}" for n in names) + ("  output" if shut is not None else "")]
    for layer in range(layers):
        for h in range(heads):
            if all(torch.isnan(scores[n][layer, h]) for n in names):
                continue  # no such head (a layer with fewer heads), or nothing to score
            row = f"L{layer}H{h}  " + "  ".join(f"{float(scores[n][layer, h]):>15.3f}" for n in names)
            if shut is not None:
                row += "  shut" if shut[layer][h] else "  in use"
            lines.append(row)
    return "\n".join(lines)
