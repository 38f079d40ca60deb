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

SCORE_NAMES = (
    "previous_token",
    "induction",
    "duplicate_token",
    "first_token",
    "confidence",
    "positional",
    "punctuation",
)
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


def band_cells(t: int, s: int, width: int = 1, offset: int = 0) -> Tensor:
    """(t s) bool: keys within `width` of `offset` positions back, |(t - s) - offset| <= width."""
    rel = torch.arange(t)[:, None] - torch.arange(s)[None, :]
    return (rel - offset).abs() <= width


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


def positional_score(maps: Tensor, allowed: Tensor, rows: Tensor, *, width: int = 1, offset: int = 0) -> Tensor:
    """(layers b h): how much more weight a head puts on a narrow band of relative positions
    than a uniform map would, whatever the tokens are. Per row t,

        B_t = sum_s A[t, s] [|t - s - offset| <= width]       the head's share in the band
        U_t = #(band & allowed) / #allowed                    a uniform map's share
        positional_t = (B_t - U_t) / (1 - U_t)                1: all in the band; 0: uniform

    averaged over `rows` (b t) whose band holds some but not all allowed keys (elsewhere U_t is 0
    or 1 and the row says nothing). allowed (b t s): the keys the row may see (causal, padding).
    A previous-token head scores 1 at width >= 1 (or offset=1, width=0); a stripe on one key
    scores about (2 * width + 1) / t.
    """
    _, b, _, t, s = maps.shape
    band = band_cells(t, s, width, offset)[None] & allowed  # (b t s)
    u = band.sum(-1) / allowed.sum(-1).clamp_min(1)  # (b t)
    share = torch.einsum("l b h t s, b t s -> l b h t", maps, band.to(maps.dtype))
    per_row = (share - u[None, :, None]) / (1 - u).clamp_min(1e-9)[None, :, None]
    return _per_sequence(per_row, rows & (u > 0) & (u < 1))


def punctuation_score(maps: Tensor, is_punct: Tensor, rows: Tensor) -> Tensor:
    """(layers b h): the share of weight on punctuation keys, mean_t sum_s A[t, s] [token s is
    punctuation], over `rows` (b t); is_punct (b s) bool. A sequence with no punctuation gives NaN.
    A uniform map scores (punctuation keys) / (keys); a head that collapses on separators, 1.
    """
    on = torch.einsum("l b h t s, b s -> l b h t", maps, is_punct.to(maps.dtype))
    has = is_punct.any(-1)[:, None]  # (b 1)
    return _per_sequence(on, rows & has)


def field_score(maps: Tensor, rows: Tensor, span: Tensor) -> Tensor:
    """(layers b h): cross-attention's share of weight on a source span while the rows that
    write that field are written, mean_t sum_s A[t, s] span[s] over rows[t];
    maps (layers b h t s), rows (b t) bool, span (b s) bool."""
    on = torch.einsum("l b h t s, b s -> l b h t", maps, span.to(maps.dtype))
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
    maps: Tensor,
    tokens: Tensor,
    *,
    exclude_bos: bool = False,
    exclude_current_token: bool = False,
    punctuation: Tensor | None = None,
    width: int = 1,
) -> dict[str, Tensor]:
    """{name: (layers b h)} per sequence, from causal maps A (layers b h t t) and tokens (b t).

    previous_token   mean_t A[t, t-1]                                         (rows t >= 1)
    induction        mean_t sum_s A[t, s] [tokens[s-1] == tokens[t], s-1 < t]  (rows with an earlier copy)
    duplicate_token  mean_t sum_s A[t, s] [tokens[s] == tokens[t], s < t]      (rows with an earlier copy)
    first_token      mean_t A[t, 0]                                           (rows t >= 1)
    confidence       mean_t max_s A[t, s]  (Voita et al. 2019)                (rows t >= 1)
    positional       mean_t (B_t - U_t) / (1 - U_t): the share B_t within |t - s| <= width against
                     a uniform map's share U_t (`positional_score`)           (rows t >= 1)
    punctuation      mean_t sum_s A[t, s] [tokens[s] in punctuation] (token ids; only with
                     `punctuation`; `punctuation_score`)                      (rows t >= 1)
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
    causal = torch.ones(t, s, dtype=torch.bool).tril().expand(b, t, s)
    out["positional"] = positional_score(maps, causal, rows, width=width)
    if punctuation is not None:
        out["punctuation"] = punctuation_score(maps, torch.isin(tokens, punctuation), rows)
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


def punctuation_ids(model, punctuation: str | Sequence[int] | Tensor | None = None) -> Tensor | None:
    """The token ids of a punctuation set: characters (a str) or token ids; None: those of the
    model's own `punctuation` characters (e.g. " ,/-" for tiny-dates) that its vocabulary has
    (None if it has none: a small random-token vocabulary, say)."""
    vocab = _char_ids(model)
    if punctuation is None:
        own = [vocab[ch] for ch in model.punctuation if ch in vocab]
        return torch.tensor(sorted(own)) if own else None
    if isinstance(punctuation, str):
        if not punctuation:
            raise AnalysisError("punctuation is empty; give characters such as ' ,/-' or token ids")
        bad = [ch for ch in dict.fromkeys(punctuation) if ch not in vocab]
        if bad:
            raise AnalysisError(
                f"punctuation character {bad[0]!r} is not in the model's vocabulary; use characters from "
                f"{''.join(sorted(ch for ch in vocab if ch.isprintable() and not ch.isalnum()))!r} or token ids"
            )
        return torch.tensor(sorted({vocab[ch] for ch in punctuation}))
    ids = torch.as_tensor(punctuation)
    n = len(vocab) if hasattr(model, "vocab") else model.vocab_size
    if ids.dim() != 1 or ids.numel() == 0 or ids.dtype.is_floating_point or ids.dtype == torch.bool:
        raise AnalysisError(f"punctuation {punctuation!r} is not a set of token ids; give a str of characters or ids")
    if int(ids.min()) < 0 or int(ids.max()) >= n:
        raise AnalysisError(
            f"punctuation id {int(ids.max()) if int(ids.max()) >= n else int(ids.min())} is "
            f"outside the vocabulary 0..{n - 1}"
        )
    return ids.long()


def _char_ids(model) -> dict[str, int]:
    """character -> token id: the model's own vocabulary list, or ASCII for a TinyLM (vocab 128)."""
    if hasattr(model, "vocab"):
        return {ch: i for i, ch in enumerate(model.vocab) if len(ch) == 1}
    return {chr(i): i for i in range(model.vocab_size)}


def head_scores(
    model,
    tokens: Tensor | Sequence,
    *,
    exclude_bos: bool = False,
    exclude_current_token: bool = False,
    punctuation: str | Sequence[int] | Tensor | None = None,
    width: int = 1,
) -> dict[str, Tensor]:
    """{name: (layers h)}: every score of `scores_from_maps`, averaged over sequences.

    tokens: (b t), (t), or a list of those (any lengths up to model.context). Each sequence
    counts once; a list gives the same result as scoring each item and averaging.
    punctuation: characters or token ids (default: the model's `punctuation`); width: the
    band of the positional score.

    An encoder-decoder model (tiny-dates) takes source texts instead of tokens and scores its
    encoder's self-attention (positional, punctuation, confidence: (encoder layers h)) and its
    cross-attention (field_day, field_month, field_year: (decoder layers h), `field_scores`).
    """
    if width < 0:
        raise AnalysisError(f"width={width} must be >= 0 (keys within |t - s| <= width)")
    punct = punctuation_ids(model, punctuation)
    if getattr(model, "kind", "lm") == "seq2seq":
        return _seq2seq_scores(model, tokens, punct, width)
    per_seq: dict[str, list[Tensor]] = {}
    with torch.no_grad():
        for batch in _as_batches(tokens):
            batch = model.check_tokens(batch)
            for name, v in scores_from_maps(
                model.attention_maps(batch),
                batch,
                exclude_bos=exclude_bos,
                exclude_current_token=exclude_current_token,
                punctuation=punct,
                width=width,
            ).items():
                per_seq.setdefault(name, []).append(v)
    return {name: torch.cat(vs, dim=1).nanmean(dim=1) for name, vs in per_seq.items()}


def _sources(sources) -> list[str]:
    if isinstance(sources, str):
        return [sources]
    out = list(sources)
    if not out or not all(isinstance(x, str) for x in out):
        raise AnalysisError("an encoder-decoder model scores source texts: pass e.g. ['29 August 1958']")
    return out


def encoder_scores(
    model, sources: Sequence[str], punctuation: str | Sequence[int] | Tensor | None = None, width: int = 1
) -> dict[str, Tensor]:
    """{"positional", "punctuation", "confidence": (encoder layers h)} on the encoder's
    self-attention over the sources (every real character is a row; PAD keys are not allowed).
    punctuation: characters or token ids (`punctuation_ids`; default the model's own)."""
    if width < 0:
        raise AnalysisError(f"width={width} must be >= 0 (keys within |t - s| <= width)")
    if not isinstance(punctuation, Tensor) or punctuation.dtype != torch.long:
        punctuation = punctuation_ids(model, punctuation)
    sources = _sources(sources)
    maps, real = model.encoder_attention_maps(sources)  # (l b h s s), (b s)
    maps = maps.float()
    src = model.encode_sources(sources)
    allowed = real[:, None, :] & real[:, :, None]  # (b s s): padding rows and keys are out
    rows = real
    out = {
        "positional": positional_score(maps, allowed, rows, width=width),
        "punctuation": punctuation_score(maps, torch.isin(src, punctuation) & real, rows),
        "confidence": _per_sequence(maps.amax(-1), rows),
    }
    return {k: v.nanmean(dim=1) for k, v in out.items()}


def field_scores(
    model, sources: Sequence[str], targets: Sequence[str] | None = None, fields: Sequence[str] | None = None
) -> dict[str, Tensor]:
    """{field: (decoder layers h)}: per cross-attention head, the share of its weight on the
    source span of the field being written, while that field's characters are written
    (`field_score`, rows of model.fields[field]); sources averaged with equal weight.
    targets default to the model's own translations."""
    if getattr(model, "kind", None) != "seq2seq" or not hasattr(model, "cross_attention_maps"):
        name = getattr(model, "name", None) or type(model).__name__
        raise AnalysisError(
            f"field scores read cross-attention, and {name} is a decoder-only model with none; "
            f"use an encoder-decoder model such as tiny-dates"
        )
    known = tuple(model.fields)
    fields = known if fields is None else ((fields,) if isinstance(fields, str) else tuple(fields))
    for f in fields:
        if f not in known:
            raise AnalysisError(f"field {f!r} is not one of this model's fields: {', '.join(known)}")
    sources = _sources(sources)
    maps = model.cross_attention_maps(sources, targets).float()  # (l b h t s)
    _, b, _, t, s = maps.shape
    out = {}
    for f in fields:
        rows = torch.zeros(b, t, dtype=torch.bool)
        rows[:, list(model.fields[f])] = True
        span = torch.zeros(b, s, dtype=torch.bool)
        for i, text in enumerate(sources):
            lo, hi = model.field_spans(text)[f]
            span[i, lo:hi] = True
        out[f] = field_score(maps, rows, span).nanmean(dim=1)
    return out


def _seq2seq_scores(model, sources, punct: Tensor, width: int) -> dict[str, Tensor]:
    out = encoder_scores(model, sources, punct, width)
    out.update({f"field_{k}": v for k, v in field_scores(model, sources).items()})
    return out


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
