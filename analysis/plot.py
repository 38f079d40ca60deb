"""Pictures: a layers x heads grid of attention maps with token labels (matplotlib, Agg)."""

from __future__ import annotations

import importlib.util
import math
import os
from collections.abc import Sequence
from pathlib import Path

from torch import Tensor

from zoo import files

from .errors import AnalysisError

NEEDS_MATPLOTLIB = "pictures need matplotlib: pip install 'attnzoo[plot]' (or drop --plot)"
MAX_LABELS = 64  # beyond this many tokens, label every k-th one so the text stays readable


def _matplotlib():
    try:
        import matplotlib
    except ImportError:
        raise AnalysisError(NEEDS_MATPLOTLIB) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _ticks(labels: Sequence[str] | None, n: int) -> tuple[list[int], list[str]]:
    if labels is None:
        labels = [str(i) for i in range(n)]
    if len(labels) != n:
        raise AnalysisError(f"{len(labels)} labels for an axis of {n} positions")
    step = max(1, math.ceil(n / MAX_LABELS))
    idx = list(range(0, n, step))
    return idx, [str(labels[i]) for i in idx]


def plot_attention_grid(
    maps: Tensor,
    path: str | os.PathLike,
    *,
    query_labels: Sequence[str] | None = None,
    key_labels: Sequence[str] | None = None,
    titles: Sequence[Sequence[str]] | None = None,
    suptitle: str | None = None,
) -> Path:
    """Write a PNG grid of attention maps, one panel per (layer, head).

    maps: (layers h t s), or (h t s) / (b h t s) from any zoo block (b: the first item is drawn),
    or (layers b h t s) from a model (the first batch item). titles[layer][head] under each panel.
    """
    maps = maps.detach().float().cpu()
    if maps.dim() == 3:
        maps = maps[None]
    elif maps.dim() == 5:
        maps = maps[:, 0]
    if maps.dim() != 4:
        raise AnalysisError(
            f"maps have shape {tuple(maps.shape)}; expected (h,t,s), (layers,h,t,s) or (layers,b,h,t,s)"
        )
    layers, heads, t, s = maps.shape
    qi, ql = _ticks(query_labels, t)
    ki, kl = _ticks(key_labels, s)
    plt = _matplotlib()
    panel = min(8.0, max(2.6, 0.13 * max(t, s)))
    fig, axes = plt.subplots(
        layers, heads, figsize=(panel * heads, panel * layers + 0.6), squeeze=False, layout="constrained"
    )
    fs = max(4.0, min(8.0, 300.0 / max(len(qi), len(ki), 1)))
    # Tokens are labelled once per row and column of panels (the left column, each column's lowest
    # panel), as a shared axis is: every panel shows the same tokens, and laying out the ticks and
    # labels of every panel took most of a picture's time.
    shown = ~maps.isnan().flatten(2).all(-1)  # (layers, heads): False for a layer with fewer heads
    lowest = [max((layer for layer in range(layers) if shown[layer, h]), default=-1) for h in range(heads)]
    for layer in range(layers):
        for h in range(heads):
            ax = axes[layer][h]
            if not shown[layer, h]:  # a layer with fewer heads than the widest one
                ax.axis("off")
                continue
            ax.imshow(maps[layer, h].numpy(), cmap="viridis", vmin=0.0, vmax=1.0, interpolation="nearest")
            if layer == lowest[h]:
                ax.set_xticks(ki, kl, rotation=90, fontsize=fs)
            else:
                ax.set_xticks([])
            if h == 0:
                ax.set_yticks(qi, ql, fontsize=fs)
            else:
                ax.set_yticks([])
            title = f"L{layer}H{h}"
            if titles is not None:
                title += f"  {titles[layer][h]}"
            ax.set_title(title, fontsize=12)
            if h == 0:
                ax.set_ylabel("query t", fontsize=8)
            if layer == layers - 1:
                ax.set_xlabel("key s", fontsize=8)
    if suptitle:
        fig.suptitle(suptitle, fontsize=14)
    return _save(fig, plt, Path(path))


def plot_curve(
    xs: Sequence[float],
    ys: Sequence[float],
    path: str | os.PathLike,
    *,
    xlabel: str,
    ylabel: str,
    title: str,
    threshold: float | None = None,
    point_labels: Sequence[str] | None = None,
    extra: Sequence[tuple[float, float, str]] = (),
) -> Path:
    """A line plot (the pruning sweep), with an optional horizontal threshold line; point_labels[i]
    is written beside point i (the heads it removed), and each of `extra` (x, y, label) is drawn as a
    marked point of its own, in the legend (the "half the heads" point)."""
    xs, ys = list(xs), list(ys)
    if point_labels is not None and len(point_labels) != len(xs):
        raise AnalysisError(f"{len(point_labels)} point labels for {len(xs)} points; give one each")
    plt = _matplotlib()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(xs, ys, marker="o", label="sweep (each point: + the heads it zeroed)" if point_labels else None)
    for x, y, text in zip(xs, ys, point_labels or ()):
        if text:
            ax.annotate(text, (x, y), textcoords="offset points", xytext=(4, 6), fontsize=7, rotation=30)
    for x, y, text in extra:
        ax.plot([x], [y], marker="*", markersize=14, linestyle="none", color="tab:red", label=text)
    if threshold is not None:
        ax.axhline(threshold, color="gray", linestyle="--", label=f"0.9 x start = {threshold:.3f}")
    if threshold is not None or point_labels or extra:
        ax.legend(fontsize=8, loc="best")
    ax.margins(x=0.08, y=0.12)  # room for the labels at the ends
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return _save(fig, plt, Path(path))


PICTURE_FORMATS = ("png", "svg", "pdf")  # the suffix names the format written


def picture_format(path: str | os.PathLike) -> str:
    """The format a picture path names by its suffix (PNG for a device or pipe such as /dev/null);
    refuses, before any work, a suffix naming no format written here, or a path that cannot be
    written (a folder, a socket)."""
    path = Path(path)
    fmt = path.suffix.lower().lstrip(".")
    if fmt not in PICTURE_FORMATS:
        if not files.is_special(files.resolve_output(path)):
            raise AnalysisError(
                f"{path}: a picture's name ends in one of {', '.join('.' + f for f in PICTURE_FORMATS)}"
            )
        fmt = "png"
    target = files.resolve_output(path)
    if not target.parent.is_dir():
        raise AnalysisError(f"the folder {path.parent} does not exist; create it first")
    files.ensure_writable_parent(path)
    if importlib.util.find_spec("matplotlib") is None:  # before the work, not after it
        raise AnalysisError(NEEDS_MATPLOTLIB)
    return fmt


def _save(fig, plt, path: Path) -> Path:
    """Written atomically in the format the suffix names (a symlink replaced, /dev/null written through)."""
    try:
        fmt = picture_format(path)
        files.write_atomic(path, lambda tmp: fig.savefig(tmp, dpi=110, format=fmt))
    finally:
        plt.close(fig)
    return path


def score_titles(
    best: Sequence[Sequence[tuple[str, float]]], shut: Sequence[Sequence[bool]] | None = None
) -> list[list[str]]:
    """Panel titles from `scores.best_scores`: "induction 0.83"; "shut (output 0)" for a head
    whose output is zero (`shut`, per layer and head), whose map is then not in use."""

    def title(name: str, value: float, is_shut: bool) -> str:
        if is_shut:
            return "shut (output 0)"
        return f"{name.replace('_token', '')} {value:.2f}" if value == value else ""  # NaN: nothing scored

    return [
        [title(n, v, shut is not None and shut[layer][h]) for h, (n, v) in enumerate(row)]
        for layer, row in enumerate(best)
    ]


def plot_head_formats(
    maps: Sequence[Tensor],
    sources: Sequence[str],
    targets: Sequence[str],
    path: str | os.PathLike,
    *,
    titles: Sequence[str],
    suptitle: str | None = None,
    marked: Sequence[int] = (),
) -> Path:
    """One row per head, one column per example: maps[j] (heads t s) is example j's attention
    (e.g. cross-attention, query = target character, key = source character); titles[r] names
    head r's role, written over its row, in bold for the rows in `marked` (the day and year heads)."""
    if len(maps) != len(sources) or len(sources) != len(targets) or not maps:
        raise AnalysisError(f"{len(maps)} maps for {len(sources)} sources and {len(targets)} targets; give one each")
    heads = maps[0].shape[0]
    if len(titles) != heads:
        raise AnalysisError(f"{len(titles)} titles for {heads} heads; give one per head")
    plt = _matplotlib()
    cols = len(maps)
    widths = [max(len(s), 4) for s in sources]
    fig, axes = plt.subplots(
        heads,
        cols,
        figsize=(0.3 * sum(widths) + 1.5, 1.9 * heads + 0.8),
        squeeze=False,
        layout="constrained",
        gridspec_kw={"width_ratios": widths},
    )
    for r in range(heads):
        for j in range(cols):
            ax = axes[r][j]
            a = maps[j][r, :, : len(sources[j])].detach().float().cpu()
            ax.imshow(a.numpy(), cmap="viridis", vmin=0.0, vmax=1.0, interpolation="nearest", aspect="auto")
            ax.set_xticks(range(len(sources[j])), list(sources[j]), fontsize=7)
            ax.set_yticks(range(len(targets[j])), list(targets[j]), fontsize=6)
            if j == 0:
                ax.set_title(titles[r], fontsize=9, loc="left", fontweight="bold" if r in marked else "normal")
    if suptitle:
        fig.suptitle(suptitle, fontsize=11)
    return _save(fig, plt, Path(path))


def plot_head_values(
    values: Tensor,
    path: str | os.PathLike,
    *,
    title: str,
    label: str,
    shut: Sequence[Sequence[bool]] | None = None,
    prefix: str = "L",
) -> Path:
    """A layers x heads grid of one number per head (patching's restored share, an attribution),
    each cell written out; a head shut by the gates is marked; NaN (no such head) left blank."""
    values = values.detach().float().cpu()
    if values.dim() != 2:
        raise AnalysisError(f"values have shape {tuple(values.shape)}; expected (layers, heads)")
    plt = _matplotlib()
    layers, heads = values.shape
    fig, ax = plt.subplots(figsize=(1.1 * heads + 2.2, 0.9 * layers + 1.6), layout="constrained")
    finite = values[~values.isnan()]
    top = float(finite.abs().max()) if finite.numel() else 1.0
    im = ax.imshow(values.numpy(), cmap="RdBu_r", vmin=-max(top, 1e-9), vmax=max(top, 1e-9))
    for layer in range(layers):
        for h in range(heads):
            v = float(values[layer, h])
            if v != v:
                continue
            mark = "\nshut" if shut is not None and shut[layer][h] else ""
            color = "white" if abs(v) > 0.6 * top else "black"
            ax.text(h, layer, f"{v:.2f}{mark}", ha="center", va="center", fontsize=8, color=color)
    ax.set_xticks(range(heads), [f"H{h}" for h in range(heads)])
    ax.set_yticks(range(layers), [f"{prefix}{layer}" for layer in range(layers)])
    ax.set_title(title, fontsize=9)
    fig.colorbar(im, ax=ax, label=label)
    return _save(fig, plt, Path(path))
