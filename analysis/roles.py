"""Roles of tiny-dates' cross-attention heads: which field each one reads, which are spares.

A head's role comes from measurements on held-out dates (days the training never saw):

  field role   the field f with the highest `field_scores` value, if that value >= FIELD_MIN
               (while f's characters are written, most of the head's weight is on f's source span)
  spare        zeroing the head (head_mask) changes exact match by less than SPARE_POINTS points

`follows` answers "by position or by content": per source format, the head's weight on the
field's span against its weight on the place that field has in the other formats.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from . import dates
from .errors import AnalysisError
from .importance import evaluate, mask_without
from .scores import field_scores

FIELD_MIN = 0.5
SPARE_POINTS = 1.0


def by_format(pairs: Sequence[tuple[str, str]]) -> dict[str, list[tuple[str, str]]]:
    """{format: [(source, target), ...]} in dates.FORMATS order."""
    out: dict[str, list[tuple[str, str]]] = {f: [] for f in dates.FORMATS}
    for src, tgt in pairs:
        out[dates.FORMATS[format_index(src)]].append((src, tgt))
    return out


def format_index(text: str) -> int:
    """Which of dates.FORMATS a source date is written in."""
    for i, pat in enumerate(dates.PATTERNS):
        if pat.match(text):
            return i
    raise AnalysisError(f"{text!r} is not a date in one of the formats {', '.join(dates.FORMATS)}")


def field_scores_by_format(model, pairs: Sequence[tuple[str, str]]) -> dict[str, dict[str, Tensor]]:
    """{format: {field: (layers h)}} and {"all": ...}: field scores on each format's dates
    (teacher-forced on the true targets) and on all of them (each date counts once)."""
    out = {
        fmt: field_scores(model, [s for s, _ in ps], [t for _, t in ps]) for fmt, ps in by_format(pairs).items() if ps
    }
    out["all"] = field_scores(model, [s for s, _ in pairs], [t for _, t in pairs])
    return out


def zeroing_points(model, task, batches: list) -> tuple[float, Tensor]:
    """(exact match in points, (layers h) change in points when each head alone is zeroed)."""
    _, full = evaluate(model, task, batches)
    shape = (model.layers, model.heads)
    delta = torch.full(shape, torch.nan)
    for layer, n in enumerate(model.heads_per_layer):
        for h in range(n):
            _, m = evaluate(model, task, batches, mask_without([(layer, h)], shape))
            delta[layer, h] = 100 * (m - full)
    return 100 * full, delta


@dataclass
class Role:
    head: tuple[int, int]
    reads: list[tuple[str, float]]  # fields with a field score >= FIELD_MIN, highest first
    zeroing: float  # change in exact match (points) when zeroed alone
    spare: bool  # zeroing changes exact match by less than SPARE_POINTS
    shut: bool = False  # its output is zero (shut by the training's L0 gates)

    def title(self) -> str:
        if self.shut:
            what = "shut by the gates"
        elif self.reads:
            what = " + ".join(f"{f} {v:.2f}" for f, v in self.reads)
        else:
            what = "no field"
        return f"{what}; zeroed {self.zeroing:+.1f} pt" + (" (spare)" if self.spare else "")


def roles(
    fields: dict[str, Tensor], zeroing: Tensor, heads_per_layer: Sequence[int], shut: Sequence[Sequence[bool]] = ()
) -> list[list[Role]]:
    """Per layer, per head: its Role from field scores {field: (layers h)}, zeroing (layers h)
    and which heads are shut (per layer, per head)."""
    out = []
    for layer, n in enumerate(heads_per_layer):
        row = []
        for h in range(n):
            reads = sorted(((f, float(w[layer, h])) for f, w in fields.items()), key=lambda fv: -fv[1])
            dz = float(zeroing[layer, h])
            is_shut = bool(shut[layer][h]) if shut else False
            row.append(
                Role((layer, h), [(f, v) for f, v in reads if v >= FIELD_MIN], dz, abs(dz) < SPARE_POINTS, is_shut)
            )
        out.append(row)
    return out


def follows(model, pairs: Sequence[tuple[str, str]], head: tuple[int, int], field: str = "day") -> dict[str, dict]:
    """Does the head find `field` by position or by content? Per format: its mean weight, while
    the field is written, on the field's span ("span") and on the source positions the field
    occupies in the other formats but not in this one ("elsewhere"), and the span itself.

    A head that reads by content keeps "span" high when the format moves the field; one that
    reads by position keeps looking at the old place ("elsewhere" high).
    """
    layer, h = head
    groups = by_format(pairs)
    places = {fmt: {p for s, _ in ps for p in range(*dates.field_spans(s)[field])} for fmt, ps in groups.items()}
    out = {}
    for fmt, ps in groups.items():
        if not ps:
            continue
        sources, targets = [s for s, _ in ps], [t for _, t in ps]
        maps = model.cross_attention_maps(sources, targets)[layer, :, h]  # (b t s)
        rows = list(model.fields[field])
        on, off = [], []
        for i, text in enumerate(sources):
            lo, hi = dates.field_spans(text)[field]
            other = sorted(set().union(*(places[f] for f in places if f != fmt)) - set(range(lo, hi)))
            other = [p for p in other if p < len(text)]
            a = maps[i, rows]  # (rows s)
            on.append(float(a[:, lo:hi].sum(-1).mean()))
            off.append(float(a[:, other].sum(-1).mean()) if other else 0.0)
        spans = sorted({dates.field_spans(s)[field] for s in sources})
        out[fmt] = {
            "span": sum(on) / len(on),
            "elsewhere": sum(off) / len(off),
            "spans": f"{spans[0][0]}-{spans[-1][1] - 1}" if spans else "",
        }
    return out


def example_date(seed: int) -> str:
    """A held-out date (a day the training never saw) with a two-digit day, as YYYY-MM-DD."""
    import datetime as dt

    gen = torch.Generator().manual_seed(seed)
    while True:
        _, target = dates.sample_dates(gen, 1, split="test")[0]
        if dt.date.fromisoformat(target).day >= 10:
            return target


def in_every_format(iso: str) -> list[str]:
    """The same date in each of dates.FORMATS: the fields move, the date does not."""
    import datetime as dt

    d = dt.date.fromisoformat(iso)
    return [dates.format_date(d, fmt) for fmt in dates.FORMATS]


@dataclass
class DatesHeads:
    """What `attnzoo heads tiny-dates` reports: all measured on held-out dates."""

    n: int
    seed: int
    exact: float  # points
    fields: dict[str, dict[str, Tensor]]  # format or "all" -> field -> (layers h)
    zeroing: Tensor  # (layers h) points
    roles: list[list[Role]]
    encoder: dict[str, Tensor]  # positional, punctuation, confidence: (encoder layers h)
    day_head: tuple[int, int] | None  # the head with the highest day score
    year_head: tuple[int, int] | None  # the highest year score among the other heads
    day_follows: dict[str, dict] | None

    def to_dict(self) -> dict:
        return {
            "n": self.n,
            "seed": self.seed,
            "exact_match": self.exact,
            "field_scores": {k: {f: v.tolist() for f, v in d.items()} for k, d in self.fields.items()},
            "zeroing_points": self.zeroing.tolist(),
            "roles": [[r.title() for r in row] for row in self.roles],
            "encoder": {k: v.tolist() for k, v in self.encoder.items()},
            "day_head": self.day_head,
            "year_head": self.year_head,
            "day_follows": self.day_follows,
        }


def best_head(fields: Tensor, exclude: Sequence[tuple[int, int]] = ()) -> tuple[int, int]:
    """(layer, head) with the highest score in fields (layers h), leaving out `exclude`."""
    score = fields.nan_to_num(-1.0).clone()
    for layer, h in exclude:
        score[layer, h] = -1.0
    return divmod(int(score.argmax()), fields.shape[1])


def dates_heads(model, task, *, n: int = 300, seed: int | None = None, batches: list | None = None) -> DatesHeads:
    """Field scores per format, zeroing per head, roles, encoder scores, and whether the day
    head follows the day, on n held-out dates drawn from `seed` (default the evaluation seed)."""
    from .importance import eval_batches
    from .scores import encoder_scores
    from .training import EVAL_SEED

    seed = EVAL_SEED if seed is None else seed
    if n < len(dates.FORMATS):
        raise AnalysisError(f"n={n} held-out dates cannot cover the {len(dates.FORMATS)} formats; use n >= 30")
    pairs = dates.sample_dates(torch.Generator().manual_seed(seed), n, split="test")
    fields = field_scores_by_format(model, pairs)
    if batches is None:
        batches = eval_batches(task, 1, n, seed=seed)
    exact, zeroing = zeroing_points(model, task, batches)
    rs = roles(fields["all"], zeroing, model.heads_per_layer, model.shut_heads())
    f = fields["all"]
    day = best_head(f["day"])
    year = best_head(f["year"], exclude=[day])  # the best year reader other than the day head
    return DatesHeads(
        n=n,
        seed=seed,
        exact=exact,
        fields=fields,
        zeroing=zeroing,
        roles=rs,
        encoder=encoder_scores(model, [s for s, _ in pairs]),
        day_head=day,
        year_head=year,
        day_follows=follows(model, pairs, day, "day"),
    )


def format_dates_heads(r: DatesHeads) -> str:
    """Plain tables: field scores per head and format, zeroing, role; the day head's target per
    format; the encoder's positional and punctuation scores."""
    fmts = [k for k in r.fields if k != "all"]
    lines = [
        f"{r.n} held-out dates (seed {r.seed}, days never trained on); exact match {r.exact:.1f}%",
        "cross-attention field scores: weight on the field's source span while the field is written",
        "head  "
        + "  ".join(f"{f:>5}" for f in ("day", "month", "year"))
        + "  "
        + "  ".join(f"{'day ' + fmt:>18}" for fmt in fmts)
        + "  zeroed (pt)  role",
    ]
    for row in r.roles:
        for role in row:
            layer, h = role.head
            a = r.fields["all"]
            lines.append(
                f"X{layer}H{h}  "
                + "  ".join(f"{float(a[f][layer, h]):>5.2f}" for f in ("day", "month", "year"))
                + "  "
                + "  ".join(f"{float(r.fields[fmt]['day'][layer, h]):>18.2f}" for fmt in fmts)
                + f"  {role.zeroing:>+11.1f}  {role.title()}"
            )
    for what, head in (("day", r.day_head), ("year", r.year_head)):
        if head is not None:
            a = r.fields["all"]
            lines.append(
                f"{what} head: X{head[0]}H{head[1]} (day {float(a['day'][head]):.2f}, month "
                f"{float(a['month'][head]):.2f}, year {float(a['year'][head]):.2f})"
            )
    if r.day_head is not None and r.day_follows:
        layer, h = r.day_head
        lines.append(
            f"\nday head X{layer}H{h}, while the day is written: weight on the day's span vs on the "
            "places the day has in the other formats"
        )
        for fmt, v in r.day_follows.items():
            lines.append(f"  {fmt:>14}  day at {v['spans']:>6}: span {v['span']:.2f}, elsewhere {v['elsewhere']:.2f}")
    lines.append("\nencoder self-attention (positional: band |s - s'| <= 1 vs uniform; punctuation: ' ,/-')")
    lines.append("head  positional  punctuation  confidence")
    enc = r.encoder
    for layer in range(enc["positional"].shape[0]):
        for h in range(enc["positional"].shape[1]):
            pos, punct, conf = (float(enc[k][layer, h]) for k in ("positional", "punctuation", "confidence"))
            lines.append(f"E{layer}H{h}  {pos:>10.3f}  {punct:>11.3f}  {conf:>10.3f}")
    return "\n".join(lines)
