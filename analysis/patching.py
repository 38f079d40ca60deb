"""Activation patching, direct logit attribution and ablation at a named location (zoo/hooks.py).

    patch_heads(model, clean, corrupt, metric, location="z")    (layers h)
        restored_lr = (metric(corrupt run, head (l, r) at `location` taken from the clean run) - m_corrupt)
                      / (m_clean - m_corrupt)
        1: that head alone restores the clean metric; 0: it restores nothing.
    logit_attribution(model, inputs, target)                     (layers h)
        head (l, r)'s direct contribution to the target logit: its result z_r W_O^(r) through the
        final LayerNorm and the unembedding, the LayerNorm linearised (below).
    ablation_hooks(model, heads, location, mode)                  hooks that zero or mean-ablate heads

A model's heads are the blocks head_mask addresses: "L{l}" for a TinyLM, "X{l}" (cross-attention)
for tiny-dates. Inputs are what the model is called with: tokens (b t) for an LM, (src, tgt_in)
for tiny-dates. At k and v (one tensor per kv head) a head's slice is its kv head's, r // group:
under GQA patching or ablating one head there acts on its whole group.

The final-norm approximation: LN(x) = gamma * (x - mean(x)) / sigma(x) + beta is linear in x once
sigma(x) is frozen at its value on the actual residual stream of that position; each head's result
is centred, divided by that sigma and scaled by gamma, then read by W_U's target row. With sigma
frozen the sum over every component of the stream (embeddings, every head, W_O's biases) plus
beta and the unembedding's bias is the logit exactly; beta and the biases are nobody's head. An
RMSNorm (a whole model's, analysis.WholeModel) is the same with no centring and sigma the root mean
square (Gemma's 1 + w as its gamma); a final logit scale multiplies, and a final softcap, which is not
linear, is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from zoo.hooks import HEAD_AXIS

from .errors import AnalysisError
from .names import PATCH_LOCATIONS  # spelled in names.py, for the command line's help

MODES = ("zero", "mean")
Metric = Callable[[Tensor], Tensor]


def head_prefix(model) -> str:
    """The prefix of the blocks whose heads head_mask addresses."""
    return "X" if getattr(model, "kind", "lm") == "seq2seq" else "L"


def head_name(model, layer: int, h: int) -> str:
    """A head's one name in every output (heads, importance, ablate, patch): "L0H1" for a decoder's
    self-attention head, "X0H1" for tiny-dates' cross-attention head (the blocks head_mask addresses)."""
    return f"{head_prefix(model)}{layer}H{h}"


def check_location(location: str) -> str:
    if location not in PATCH_LOCATIONS:
        raise AnalysisError(f"location {location!r} is not one of {', '.join(PATCH_LOCATIONS)}")
    return location


def _args(inputs) -> tuple:
    return tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)


def _block(model, layer: int):
    return model.hook_blocks()[f"{head_prefix(model)}{layer}"]


def head_slice(model, layer: int, head: int, location: str, ndim: int) -> tuple:
    """The index of head `head`'s part of a location's tensor (its kv head's at k and v)."""
    axis = HEAD_AXIS[location]
    index = head // _block(model, layer).spec.group_size if location in ("k", "v") else head
    return tuple([slice(None)] * axis + [index] + [slice(None)] * (ndim - axis - 1))


def _grid(model) -> Tensor:
    return torch.full((model.layers, model.heads), torch.nan)


@torch.no_grad()
def patch_heads(model, clean, corrupt, metric: Metric, location: str = "z") -> Tensor:
    """(layers h): the share of the clean - corrupt metric gap that patching each head alone at
    `location` from the clean run into the corrupt run restores (NaN: no such head)."""
    check_location(location)
    clean, corrupt = _args(clean), _args(corrupt)
    for a, b in zip(clean, corrupt):
        if a.shape != b.shape:
            raise AnalysisError(f"clean {tuple(a.shape)} and corrupt {tuple(b.shape)} inputs must have one shape")
    names = [f"{head_prefix(model)}{layer}.{location}" for layer in range(model.layers)]
    clean_logits, cache = model.run_with_cache(*clean, names=names)
    m_clean, m_corrupt = float(metric(clean_logits)), float(metric(model(*corrupt)))
    gap = m_clean - m_corrupt
    if not abs(gap) > 1e-6:
        raise AnalysisError(
            f"the metric is {m_clean:.4g} on the clean run and {m_corrupt:.4g} on the corrupt one: "
            "no gap to restore; choose inputs the model tells apart"
        )
    out = _grid(model)
    for layer, n in enumerate(model.heads_per_layer):
        for head in range(n):

            def patch(t: Tensor, name: str, layer=layer, head=head) -> Tensor:
                idx = head_slice(model, layer, head, location, t.dim())
                t = t.clone()
                t[idx] = cache[name][idx]
                return t

            patched = model.run_with_hooks(*corrupt, hooks={names[layer]: patch})
            out[layer, head] = (float(metric(patched)) - m_corrupt) / gap
    return out


@torch.no_grad()
def logit_attribution(model, inputs, target: int | Tensor, positions: Tensor | None = None) -> Tensor:
    """(layers h): each head's direct contribution to the target logit, mean over the batch and
    `positions` ((b t) bool, None: all); target an id or (b t) ids. The final LayerNorm is
    linearised at the actual stream (module docstring)."""
    refusal = getattr(model, "attribution_refusal", None)
    if refusal:
        raise AnalysisError(f"direct logit attribution does not apply to this model: {refusal}")
    args = _args(inputs)
    p = head_prefix(model)
    last = f"L{_decoder_layers(model) - 1}.resid_post"
    names = [f"{p}{layer}.result" for layer in range(model.layers)] + [last]
    logits, cache = model.run_with_cache(*args, names=names)
    b, t = logits.shape[:2]
    target = torch.as_tensor(target)
    target = target.expand(b, t) if target.dim() == 0 else target
    if tuple(target.shape) != (b, t):
        raise AnalysisError(f"target has shape {tuple(target.shape)}; give one id or (b={b}, t={t}) ids")
    where = torch.ones(b, t, dtype=torch.bool) if positions is None else torch.as_tensor(positions, dtype=torch.bool)
    ln = model.final_norm
    kind = getattr(ln, "kind", "layer")  # a zoo Norm says its kind; a torch LayerNorm is "layer"
    x = cache[last].float()
    centre = kind in ("layer", "layer_plain")  # LayerNorms centre; RMSNorms do not
    spread = x.var(-1, unbiased=False, keepdim=True) if centre else x.pow(2).mean(-1, keepdim=True)
    sigma = (spread + ln.eps).sqrt()  # (b t 1), frozen at the actual stream
    weight = torch.ones(x.shape[-1]) if ln.weight is None else ln.weight.float()  # OLMo's norm has none
    gamma = 1.0 + weight if kind == "rms_plus1" else weight
    w_u = model.unembed.weight[target].float() * gamma * getattr(model, "logit_scale", 1.0)  # (b t c)
    out = _grid(model)
    for layer in range(model.layers):
        r = cache[f"{p}{layer}.result"].float()  # (b t h c)
        if centre:
            r = r - r.mean(-1, keepdim=True)
        per = torch.einsum("b t h c, b t c -> b t h", r / sigma[:, :, None], w_u)
        out[layer, : r.shape[2]] = per[where].mean(0)
    return out


def _decoder_layers(model) -> int:
    return model.config.decoder_layers if getattr(model, "kind", "lm") == "seq2seq" else model.layers


def ablation_hooks(model, heads: Sequence[tuple[int, int]], location: str = "z", mode: str = "zero") -> dict:
    """{name: fn} that replace each (layer, head)'s part of `location` by zeros ("zero") or by its
    mean over the batch of the same call ("mean", position by position). Zeroing the scores keeps
    their -inf cells (the mask), so the head attends uniformly to the keys it may see."""
    check_location(location)
    if mode not in MODES:
        raise AnalysisError(f"mode {mode!r} is not one of {', '.join(MODES)}")
    by_layer: dict[int, list[int]] = {}
    for layer, head in heads:
        by_layer.setdefault(layer, []).append(head)
    hooks = {}
    for layer, hs in by_layer.items():

        def ablate(t: Tensor, name: str, layer=layer, hs=tuple(hs)) -> Tensor:
            t = t.clone()
            for head in hs:
                idx = head_slice(model, layer, head, location, t.dim())
                part = t[idx]
                if mode == "mean":
                    t[idx] = part.mean(0, keepdim=True).expand_as(part)
                elif location == "scores":  # zero the scores the mask allows: the -inf cells stay masked
                    t[idx] = torch.where(part.isfinite(), 0.0, part)
                else:
                    t[idx] = torch.zeros_like(part)
            return t

        hooks[f"{head_prefix(model)}{layer}.{location}"] = ablate
    return hooks


# -- the default experiments ------------------------------------------------------------------------


def induction_experiment(model, *, n: int = 16, span: int = 16, seed: int = 12345):
    """(clean, corrupt, metric, what): a random block repeated twice against the same first half
    followed by fresh tokens; metric: the mean log-probability of the clean run's next token over
    the second copy's predictable positions (tokens 2..span of the copy)."""
    from .tasks import repeated_block

    gen = torch.Generator().manual_seed(seed)
    clean = repeated_block(gen, n, model.vocab_size, span)
    corrupt = clean.clone()
    corrupt[:, span:] = torch.randint(model.vocab_size, (n, span), generator=gen)
    return (
        clean,
        corrupt,
        next_token_metric(clean, span),
        (
            f"{n} blocks of {span} random tokens repeated (clean) against the same first half and {span} fresh "
            f"tokens (corrupt), seed {seed}; metric: mean log-probability of the clean next token, positions "
            f"{span}..{2 * span - 2}"
        ),
    )


def next_token_metric(clean: Tensor, start: int) -> Metric:
    """Mean log-probability of clean's next token at positions start..t-2."""
    target = clean[:, start + 1 :]

    def metric(logits: Tensor) -> Tensor:
        logp = torch.log_softmax(logits[:, start:-1].float(), -1)
        return logp.gather(-1, target[..., None]).mean()

    return metric


def day_swap(text: str) -> str:
    """The same date with its day moved ten days (10-18 <-> 20-28), in the same format and length."""
    import datetime as dt

    from .dates import FORMATS, PATTERNS, format_date

    for fmt, pat in zip(FORMATS, PATTERNS):
        m = pat.match(text)
        if m:
            day = int(m.group("day"))
            if not (10 <= day <= 18 or 20 <= day <= 28):
                raise AnalysisError(f"{text!r}: the day swap moves days 10-18 and 20-28 by ten; this day is {day}")
            d = dt.date(int(m.group("year")), _month(m.group("month")), day)
            return format_date(d.replace(day=day + 10 if day < 20 else day - 10), fmt)
    raise AnalysisError(f"{text!r} is not a date in one of the formats {', '.join(FORMATS)}")


def _month(text: str) -> int:
    from .dates import MONTHS

    return int(text) if text.isdigit() else MONTHS.index(text) + 1


def dates_experiment(
    model, sources: Sequence[str] | None = None, corrupt: Sequence[str] | None = None, *, n: int = 32, seed: int = 12345
):
    """(clean, corrupt, metric, what) for tiny-dates: held-out dates against the same dates with the
    day swapped (`day_swap`), teacher-forced on the clean translation; metric: at the row that
    writes the day's first digit, the logit of the clean digit minus that of the corrupt one."""
    from . import dates

    given = len(sources or [])
    what = f"{given} date{'s' * (given != 1)} given (clean) against "
    what += "the corrupt ones given" if corrupt else "the day swapped"
    if sources is None:
        what = f"{n} held-out dates (seed {seed}, days 10-18 and 20-28) against the same dates with the day swapped"
        gen = torch.Generator().manual_seed(seed)
        sources = []
        while len(sources) < n:
            src, iso = dates.sample_dates(gen, 1, split="test")[0]
            if 10 <= int(iso[-2:]) <= 28 and int(iso[-2:]) != 19:
                sources.append(src)
    sources = list(sources)
    corrupt = [day_swap(s) for s in sources] if corrupt is None else list(corrupt)
    if len(corrupt) != len(sources):
        raise AnalysisError(f"{len(sources)} clean dates and {len(corrupt)} corrupt ones; give one each")
    src, bad = model.encode_sources(sources), model.encode_sources(corrupt)
    if src.shape != bad.shape:
        raise AnalysisError(
            "clean and corrupt dates must have the same lengths, e.g. '29 August 1958' and '19 August 1958'"
        )
    good_t = model.encode_targets(model.translate(sources))
    bad_t = model.encode_targets(model.translate(corrupt))
    differ = good_t != bad_t
    if not differ.any(1).all():
        raise AnalysisError("a clean date translates as its corrupt one; give dates that differ")
    row = differ.float().argmax(1)  # the first target row where the two translations differ
    tgt_in = model.shift(good_t)
    idx = torch.arange(len(sources))

    def metric(logits: Tensor) -> Tensor:
        at = logits[idx, row].float()
        return (at[idx, good_t[idx, row]] - at[idx, bad_t[idx, row]]).mean()

    what += (
        "; teacher-forced on the clean translation; metric: at the first row where the translations differ, "
        "the logit of the clean character minus that of the corrupt one"
    )
    return (src, tgt_in), (bad, tgt_in), metric, what
