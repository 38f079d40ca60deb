"""tiny-dates: a small encoder-decoder from zoo blocks that translates dates to ISO 8601.

    "29 August 1958" | "August 29, 1958" | "29/08/1958"  ->  "1958-08-29"

Characters are the tokens. Source (b s) --encoder--> memory (b s c); the decoder reads
BOS + the target so far (b t) with causal self-attention, then cross-attention to memory.
Positions are learned embeddings in the residual stream: reading "the year is the last four
characters" by position is one of the strategies the task allows, finding the year by content
(after a comma, after a month name) the other.
"""

from __future__ import annotations

import calendar
import dataclasses
import datetime as dt
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

import zoo
from zoo.hooks import RESID, HookedModel, layer_blocks

from .errors import AnalysisError
from .gates import shut
from .head_mask import per_layer

MONTHS = [calendar.month_name[i] for i in range(1, 13)]
FORMATS = ("D Month YYYY", "Month D, YYYY", "DD/MM/YYYY")
FIRST_DAY = dt.date(1900, 1, 1).toordinal()
LAST_DAY = dt.date(2099, 12, 31).toordinal()
TARGET_LEN = 10  # YYYY-MM-DD
READ_FIRST = ("none", "token", "fixed")
PAD, BOS = 0, 1
PUNCTUATION = " ,/-"  # the source's separators (and the target's "-"): `punctuation` scores' default
CHARS = sorted(set(PUNCTUATION + "0123456789" + "".join(MONTHS)))
VOCAB = ["<pad>", "<bos>", *CHARS]
INDEX = {ch: i for i, ch in enumerate(VOCAB)}
# Query row i of the decoder writes target character i: YYYY-MM-DD.
TARGET_FIELDS = {"day": range(8, 10), "month": range(5, 7), "year": range(0, 4)}


def format_date(d: dt.date, fmt: str) -> str:
    if fmt == "D Month YYYY":
        return f"{d.day} {MONTHS[d.month - 1]} {d.year}"
    if fmt == "Month D, YYYY":
        return f"{MONTHS[d.month - 1]} {d.day}, {d.year}"
    if fmt == "DD/MM/YYYY":
        return f"{d.day:02d}/{d.month:02d}/{d.year}"
    raise AnalysisError(f"format {fmt!r} is not one of {FORMATS}")


# One pattern per FORMATS entry, in the same order.
PATTERNS = [
    re.compile(r"^(?P<day>\d{1,2}) (?P<month>[A-Za-z]+) (?P<year>\d{4})$"),
    re.compile(r"^(?P<month>[A-Za-z]+) (?P<day>\d{1,2}), (?P<year>\d{4})$"),
    re.compile(r"^(?P<day>\d{2})/(?P<month>\d{2})/(?P<year>\d{4})$"),
]


def field_spans(text: str) -> dict[str, tuple[int, int]]:
    """{"day"|"month"|"year": (start, end)} character spans of a source date in one of FORMATS."""
    for pat in PATTERNS:
        m = pat.match(text)
        if m:
            return {f: m.span(f) for f in ("day", "month", "year")}
    raise AnalysisError(f"{text!r} is not a date in one of the formats {', '.join(FORMATS)}")


def held_out(ordinal: int) -> bool:
    """Dates whose day number is 7 mod 10 are never trained on: the evaluation uses only them."""
    return ordinal % 10 == 7


def sample_dates(gen: torch.Generator, n: int, *, split: str) -> list[tuple[str, str]]:
    """n (source, target) pairs; split "train" never yields a held-out day, "test" only those."""
    out = []
    while len(out) < n:
        o = int(torch.randint(FIRST_DAY, LAST_DAY + 1, (1,), generator=gen))
        if held_out(o) != (split == "test"):
            continue
        d = dt.date.fromordinal(o)
        fmt = FORMATS[int(torch.randint(len(FORMATS), (1,), generator=gen))]
        out.append((format_date(d, fmt), d.isoformat()))
    return out


def encode_sources(sources: Sequence[str], max_source: int = 24) -> Tensor:
    """sources -> src (b s) character ids, PAD-filled on the right."""
    if isinstance(sources, str):
        sources = [sources]
    if len(sources) == 0:
        raise AnalysisError("no dates given; pass at least one, e.g. '29 August 1958'")
    rows = []
    for text in sources:
        if not text:
            raise AnalysisError("an empty date was given; pass text such as '29 August 1958'")
        bad = sorted(set(text) - set(CHARS))
        if bad:
            raise AnalysisError(f"{text!r} has characters outside the model's vocabulary: {''.join(bad)!r}")
        if len(text) > max_source:
            raise AnalysisError(f"{text!r} is longer than {max_source} characters")
        rows.append([INDEX[ch] for ch in text])
    s = max(len(r) for r in rows)
    return torch.tensor([r + [PAD] * (s - len(r)) for r in rows])


@dataclass(frozen=True)
class DatesConfig:
    """A small encoder-decoder; every default says why."""

    d_model: int = 64  # the measured size for one format; three formats fit too
    encoder_layers: int = 2
    decoder_layers: int = 2
    heads: int = 4  # self-attention heads (encoder and decoder)
    cross_heads: tuple[int, ...] = (4, 4)  # per decoder layer: the heads importance and pruning act on
    d_head: int = 16  # fixed, so pruned cross-attention heads keep their width
    d_ff: int = 256  # 4 x d_model, as usual
    max_source: int = 24  # "September 30, 2099" is 18 characters
    # "none": the usual decoder layer (self-attention, cross-attention, MLP), target positions in
    # the residual stream from the start: every cross head can follow the character being written.
    # "token" / "fixed": decoder layer 0 reads the source before it knows which character it
    # writes. Its cross-attention comes first, with queries from the previous character alone
    # ("token") or from one learned vector, the same for every row ("fixed"); the target
    # positions join the residual stream after it. A head whose query cannot follow the output
    # reads one place only ("one head sees one thing at a time"), so the fields must be split
    # among heads instead of every head following the character being written.
    read_first: str = "none"
    # Encoder self-attention over |s - s'| < encoder_window only (None: every source character).
    # A narrow encoder keeps each field's characters where they are written, so a cross head
    # that wants the day reads the day's own span instead of wherever the encoder moved it.
    encoder_window: int | None = None

    def __post_init__(self) -> None:
        if self.read_first not in READ_FIRST:
            raise AnalysisError(f"read_first={self.read_first!r} is not one of {READ_FIRST}")
        w = self.encoder_window
        if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w < 1):
            raise AnalysisError(f"encoder_window={w!r} is not None or a positive number of characters")
        if isinstance(self.cross_heads, int):
            object.__setattr__(self, "cross_heads", (self.cross_heads,) * self.decoder_layers)
        object.__setattr__(self, "cross_heads", tuple(int(h) for h in self.cross_heads))
        if len(self.cross_heads) != self.decoder_layers or any(h <= 0 for h in self.cross_heads):
            raise AnalysisError(f"cross_heads={self.cross_heads} needs one positive count per decoder layer")

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["cross_heads"] = list(self.cross_heads)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DatesConfig:
        return cls(**{**d, "cross_heads": tuple(d["cross_heads"])})


def _mlp(c: int, f: int) -> nn.Sequential:
    return nn.Sequential(nn.LayerNorm(c), nn.Linear(c, f), nn.GELU(), nn.Linear(f, c))


class DatesModel(HookedModel, nn.Module):
    """Encoder-decoder of zoo blocks; head_mask and pruning address the cross-attention heads.

    run_with_cache / run_with_hooks (zoo.hooks.HookedModel) name the blocks "E{l}" (encoder
    self-attention), "L{l}" (decoder self-attention) and "X{l}" (decoder cross-attention), e.g.
    "X0.pattern"; the residual stream "E{l}.resid_pre" / "E{l}.resid_post" around encoder layer l
    and "L{l}.resid_pre" / "L{l}.resid_post" around decoder layer l (b t c).
    """

    kind = "seq2seq"
    punctuation = PUNCTUATION
    fields = TARGET_FIELDS  # field -> the target rows that write it

    @staticmethod
    def field_spans(text: str) -> dict[str, tuple[int, int]]:
        """{"day"|"month"|"year": (start, end)} of a source date (module function `field_spans`)."""
        return field_spans(text)

    def __init__(self, config: DatesConfig) -> None:
        super().__init__()
        self.config = c = config
        self.vocab = VOCAB
        self.embed = nn.Embedding(len(VOCAB), c.d_model)
        self.src_pos = nn.Embedding(c.max_source, c.d_model)
        self.tgt_pos = nn.Embedding(TARGET_LEN, c.d_model)

        def spec(**kw: Any) -> zoo.AttentionSpec:
            return zoo.AttentionSpec(d_model=c.d_model, d_k=c.d_head, **kw)

        self.enc_attn = nn.ModuleList(
            zoo.MultiHeadAttention(spec(heads=c.heads, window=c.encoder_window)) for _ in range(c.encoder_layers)
        )
        self.enc_ln = nn.ModuleList(nn.LayerNorm(c.d_model) for _ in range(c.encoder_layers))
        self.enc_mlp = nn.ModuleList(_mlp(c.d_model, c.d_ff) for _ in range(c.encoder_layers))
        self.enc_final = nn.LayerNorm(c.d_model)
        self.dec_self = nn.ModuleList(
            zoo.MultiHeadAttention(spec(heads=c.heads, causal=True)) for _ in range(c.decoder_layers)
        )
        self.dec_cross = nn.ModuleList(
            zoo.MultiHeadAttention(spec(heads=h, d_context=c.d_model)) for h in c.cross_heads
        )
        self.dec_ln_self = nn.ModuleList(nn.LayerNorm(c.d_model) for _ in range(c.decoder_layers))
        self.dec_ln_cross = nn.ModuleList(nn.LayerNorm(c.d_model) for _ in range(c.decoder_layers))
        self.dec_mlp = nn.ModuleList(_mlp(c.d_model, c.d_ff) for _ in range(c.decoder_layers))
        self.dec_final = nn.LayerNorm(c.d_model)
        self.unembed = nn.Linear(c.d_model, len(VOCAB))

    @property
    def layers(self) -> int:
        """Decoder layers: the rows of a head_mask."""
        return self.config.decoder_layers

    @property
    def heads(self) -> int:
        """The most cross-attention heads in any decoder layer: the width of a head_mask row."""
        return max(self.config.cross_heads)

    @property
    def heads_per_layer(self) -> tuple[int, ...]:
        return self.config.cross_heads

    # -- tokens ----------------------------------------------------------------------------

    def encode_sources(self, sources: Sequence[str]) -> Tensor:
        """sources -> src (b s) character ids, PAD-filled on the right."""
        return encode_sources(sources, self.config.max_source)

    @staticmethod
    def encode_targets(targets: Sequence[str]) -> Tensor:
        """ISO dates -> (b, TARGET_LEN) ids."""
        for t in targets:
            if len(t) != TARGET_LEN or set(t) - set(CHARS):
                raise AnalysisError(f"target {t!r} is not a YYYY-MM-DD date")
        return torch.tensor([[INDEX[ch] for ch in t] for t in targets])

    # -- forward -------------------------------------------------------------------------------

    def hook_blocks(self) -> dict[str, nn.Module]:
        """{"E0": encoder block, ..., "L0": decoder self-attention, ..., "X0": cross-attention, ...}."""
        return {
            **layer_blocks(self.enc_attn, "E", attr=None),
            **layer_blocks(self.dec_self, "L", attr=None),
            **layer_blocks(self.dec_cross, "X", attr=None),
        }

    def resid_names(self) -> list[str]:
        layers = [f"E{i}" for i in range(self.config.encoder_layers)]
        layers += [f"L{i}" for i in range(self.config.decoder_layers)]
        return [f"{p}.{r}" for p in layers for r in RESID]

    def maps(self, prefix: str, run, *args) -> list[Tensor]:
        """The patterns of the blocks named prefix0, prefix1, ... while run(*args) runs."""
        names = [f"{p}.pattern" for p in self.hook_blocks() if p[0] == prefix]
        with self.hooks(cache={}, names=names) as cache:
            run(*args)
        return [cache[n] for n in names]

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """src (b s) -> memory (b s c) and the key mask (b 1 1 s), True = a real character."""
        keys = (src != PAD)[:, None, None, :]
        x = self.embed(src) + self.src_pos(torch.arange(src.shape[1], device=src.device))
        for i, (attn, ln, mlp) in enumerate(zip(self.enc_attn, self.enc_ln, self.enc_mlp)):
            x = self.resid(f"E{i}.resid_pre", x)
            x = x + attn(ln(x), mask=keys)
            x = x + mlp(x)
            x = self.resid(f"E{i}.resid_post", x)
        return self.enc_final(x), keys

    @torch.no_grad()
    def encoder_attention_maps(self, sources: Sequence[str]) -> tuple[Tensor, Tensor]:
        """Encoder self-attention A (layers b h s s) and the real characters (b s) bool
        (PAD columns get weight 0; PAD rows are not characters)."""
        src = self.encode_sources(sources)
        maps = self.maps("E", self.encode, src)
        return torch.stack(maps), (src != PAD)

    def decode(self, memory: Tensor, keys: Tensor, tgt_in: Tensor, head_mask=None) -> Tensor:
        """tgt_in (b t) (BOS + target so far) -> logits (b t vocab)."""
        t = tgt_in.shape[1]
        pos = self.tgt_pos(torch.arange(t, device=tgt_in.device))
        first = self.config.read_first != "none"
        x = self.embed(tgt_in) + (0 if first else pos)
        masks = per_layer(head_mask, self.config.cross_heads, "decoder layer")
        for i in range(self.config.decoder_layers):
            x = self.resid(f"L{i}.resid_pre", x)
            if not (first and i == 0):
                x = x + self.dec_self[i](self.dec_ln_self[i](x))
            q = x
            if first and i == 0 and self.config.read_first == "fixed":  # BOS's embedding on every row
                q = self.embed.weight[BOS].expand_as(x)
            x = x + self.dec_cross[i](self.dec_ln_cross[i](q), context=memory, mask=keys, head_mask=masks[i])
            if first and i == 0:  # now the position, then the self-attention this layer skipped above
                x = x + pos
                x = x + self.dec_self[i](self.dec_ln_self[i](x))
            x = x + self.dec_mlp[i](x)
            x = self.resid(f"L{i}.resid_post", x)
        return self.unembed(self.dec_final(x))

    final_norm = property(lambda self: self.dec_final)  # what logit attribution reads (analysis.patching)

    def forward(self, src: Tensor, tgt_in: Tensor, head_mask=None) -> Tensor:
        """src (b s), tgt_in (b t) -> logits (b t vocab); head_mask (layers h) on cross-attention."""
        memory, keys = self.encode(src)
        return self.decode(memory, keys, tgt_in, head_mask)

    @staticmethod
    def shift(tgt: Tensor) -> Tensor:
        """Teacher forcing input: BOS + tgt[:, :-1]."""
        return torch.cat([torch.full_like(tgt[:, :1], BOS), tgt[:, :-1]], dim=1)

    @torch.no_grad()
    def generate(self, src: Tensor, head_mask=None) -> Tensor:
        """Greedy decoding: src (b s) -> (b TARGET_LEN) ids."""
        memory, keys = self.encode(src)
        out = torch.full((src.shape[0], 1), BOS, dtype=torch.long, device=src.device)
        for _ in range(TARGET_LEN):
            logits = self.decode(memory, keys, out, head_mask)
            out = torch.cat([out, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        return out[:, 1:]

    def translate(self, sources: Sequence[str], head_mask=None) -> list[str]:
        """["29 August 1958", ...] -> ["1958-08-29", ...] (greedy)."""
        was = self.training
        self.eval()
        try:
            ids = self.generate(self.encode_sources(sources), head_mask)
        finally:
            self.train(was)
        return ["".join(VOCAB[i] for i in row) for row in ids.tolist()]

    @torch.no_grad()
    def cross_attention_maps(self, sources: Sequence[str], targets: Sequence[str] | None = None) -> Tensor:
        """A (layers b h t s): query row i is the step that writes target character i.

        targets default to the model's own translations.
        """
        if isinstance(sources, str):
            sources = [sources]
        src = self.encode_sources(sources)
        targets = self.translate(sources) if targets is None else list(targets)
        tgt = self.encode_targets(targets)
        maps = self.maps("X", self, src, self.shift(tgt))
        if len(set(self.config.cross_heads)) != 1:
            raise AnalysisError(f"cross-attention heads per layer differ ({self.config.cross_heads})")
        return torch.stack(maps)

    def shut_heads(self) -> list[list[bool]]:
        """(decoder layers, model.heads): True for a cross-attention head whose W_O columns are all
        zero (shut by the training's L0 gates); padding entries of a smaller layer are False."""
        return [shut(block) + [False] * (self.heads - block.spec.heads) for block in self.dec_cross]

    # -- head surgery --------------------------------------------------------------------------

    def prune(self, heads: dict[int, Sequence[int]]) -> DatesModel:
        """A smaller model with cross-attention heads {layer: [head, ...]} removed (zoo.prune_heads)."""
        hs = list(self.config.cross_heads)
        for layer, drop in heads.items():
            if not 0 <= layer < len(hs) or any(not 0 <= r < hs[layer] for r in drop):
                raise AnalysisError(f"cannot prune layer {layer} heads {list(drop)}: cross heads are {tuple(hs)}")
            hs[layer] -= len(set(drop))
        new = DatesModel(dataclasses.replace(self.config, cross_heads=tuple(hs)))
        touched = tuple(f"dec_cross.{layer}." for layer, drop in heads.items() if drop)
        new.load_state_dict({k: v for k, v in self.state_dict().items() if not k.startswith(touched)}, strict=False)
        for layer, drop in heads.items():
            if drop:
                new.dec_cross[layer] = zoo.prune_heads(self.dec_cross[layer], list(drop))
        return new


def field_weights(maps: Tensor, sources: Sequence[str]) -> dict[str, Tensor]:
    """{"day"|"month"|"year": (layers h)}: the mean weight that the rows writing a field put on
    the same field in the source, from cross maps (layers b h t s).

    For each source, rows TARGET_FIELDS[f] of each head's map are summed over the source span of
    field f and averaged; then the sources are averaged (each counts once).
    """
    out = {}
    for f, rows in TARGET_FIELDS.items():
        per_source = []
        for i, text in enumerate(sources):
            a, b = field_spans(text)[f]
            per_source.append(maps[:, i, :, rows.start : rows.stop, a:b].sum(-1).mean(-1))
        out[f] = torch.stack(per_source).mean(0)
    return out
