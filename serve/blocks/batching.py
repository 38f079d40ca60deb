"""Dynamic batches: requests of similar lengths padded to one (b, t, s) run whose key mask hides
the padding, decode requests grouped by equal (t, p); each group fails alone."""

from __future__ import annotations

import numpy as np

from .protocol import PAD_FACTOR, Item, ModelInfo, ServeError

# -- batching ----------------------------------------------------------------------------------


def run_batch(sess, items: list[Item], info: ModelInfo) -> list[tuple[np.ndarray, ...] | Exception]:
    """Run `items` as few padded batches as the model allows; each item's outputs, cut back.

    Returns, per item, (y (b_i t_i c),) or (y, attn (b_i h t_i s_i)) when the model outputs weights
    ((y, present_key, present_value) for a decode model). Each group of items that shares a run
    succeeds or fails alone: the items of a group whose run raised get that exception in their
    place, and the other groups' answers stand.
    """
    out: list[tuple[np.ndarray, ...] | Exception | None] = [None] * len(items)
    if info.decode:
        # A cache cannot be padded without shifting positions: equal (t, p) share a run.
        same: dict[tuple[int, int], list[int]] = {}
        for i, it in enumerate(items):
            same.setdefault((it.t, it.p), []).append(i)
        groups, run = list(same.values()), _run_decode
    else:
        groups, run = [], _run_padded
        for side in _rope_sides(items, info.switch_at):  # padding must not move a request across the switch
            groups += [[side[k] for k in g] for g in length_groups([items[i] for i in side], has_mask=info.has_mask)]
    for idx in groups:
        try:
            results: list = run(sess, [items[i] for i in idx], info)
        except Exception as e:  # noqa: BLE001 - this group's requests get it; the others run on
            results = [e] * len(idx)
        for i, res in zip(idx, results):
            out[i] = res
    return out  # type: ignore[return-value]


def _rope_sides(items: list[Item], switch_at: int | None) -> list[list[int]]:
    """Indices of `items` split by the side of a longrope block's switch their own lengths fall on (a
    padded run takes the set of its longest sequence, so only requests on one side may share one)."""
    if switch_at is None:
        return [list(range(len(items)))]
    short = [i for i, it in enumerate(items) if it.t <= switch_at]
    long = [i for i, it in enumerate(items) if it.t > switch_at]
    return [side for side in (short, long) if side]


def _run_decode(sess, items: list[Item], info: ModelInfo) -> list[tuple[np.ndarray, ...]]:
    """Items of equal (t, p) as one `sess.decode` call: (y, present_key, present_value) each."""
    key_mask = None
    if info.has_key_mask:
        key_mask = np.concatenate(
            [it.key_mask if it.key_mask is not None else np.ones((it.rows, it.p + it.t), bool) for it in items]
        )
    y, pk, pv = sess.decode(
        np.concatenate([it.x for it in items]),
        np.concatenate([it.past_key for it in items]),
        np.concatenate([it.past_value for it in items]),
        key_mask,
    )
    results, r = [], 0
    for it in items:
        rows = slice(r, r + it.rows)
        results.append((y[rows], pk[rows], pv[rows]))
        r += it.rows
    return results


def length_groups(items: list[Item], *, has_mask: bool, pad_factor: float = PAD_FACTOR) -> list[list[int]]:
    """Indices of `items` that share one model run.

    Without a mask input, padding would change the answer: only equal (t, s) share a run. With
    one, lengths within `pad_factor` of each other do: padding a 16-position request to 128
    would cost 8x its projections (and 64x its scores), more than a second run costs.
    """
    if not has_mask:
        same: dict[tuple[int, int], list[int]] = {}
        for i, it in enumerate(items):
            same.setdefault((it.t, it.s), []).append(i)
        return list(same.values())
    groups: list[list[int]] = []
    t_min = s_min = s_max = 0
    for i in sorted(range(len(items)), key=lambda k: (items[k].t, items[k].s)):
        it = items[i]
        s_lo, s_hi = (min(s_min, it.s), max(s_max, it.s)) if groups else (it.s, it.s)
        if groups and it.t <= pad_factor * t_min and s_hi <= pad_factor * s_lo:
            groups[-1].append(i)
            s_min, s_max = s_lo, s_hi
        else:
            groups.append([i])
            t_min, s_min, s_max = it.t, it.s, it.s
    return groups


def pad_batch(items: list[Item], info: ModelInfo) -> dict[str, np.ndarray]:
    """One feed dict for `items`: x (B T c), context (B S c_ctx), mask (B T S), head_mask (B h).

    Padded keys are masked out; a padded query row attends to its item's real keys, so no row
    is empty under any lowering, and padded rows are cut away afterwards.
    """
    bsz = sum(it.rows for it in items)
    tmax = max(it.t for it in items)
    smax = max(it.s for it in items)
    same = all(it.t == tmax and it.s == smax for it in items)
    x = np.zeros((bsz, tmax, info.d_model), dtype=info.dtype)
    context = np.zeros((bsz, smax, info.d_context), dtype=info.dtype) if info.d_context else None
    mask = np.zeros((bsz, tmax, smax), dtype=bool) if info.has_mask else None
    head_mask = np.ones((bsz, info.heads), dtype=info.dtype) if info.has_head_mask else None
    r = 0
    for it in items:
        rows = slice(r, r + it.rows)
        x[rows, : it.t] = it.x
        if context is not None:
            context[rows, : it.s] = it.context
        if mask is not None:
            mask[rows, :, : it.s] = True  # padded query rows: see the docstring
            if it.mask is not None:
                mask[rows, : it.t, : it.s] = it.mask
        if head_mask is not None and it.head_mask is not None:
            head_mask[rows] = it.head_mask
        r += it.rows
    if not same and mask is None:
        raise ServeError("requests of different lengths need the model's mask input to share a batch")
    feeds = {"x": x}
    if context is not None:
        feeds["context"] = context
    if mask is not None:
        feeds["mask"] = mask
    if head_mask is not None:
        feeds["head_mask"] = head_mask
    return feeds


def _run_padded(sess, items: list[Item], info: ModelInfo) -> list[tuple[np.ndarray, ...]]:
    feeds = pad_batch(items, info)
    outs = sess.run(feeds["x"], feeds.get("context"), feeds.get("mask"), feeds.get("head_mask"))
    outs = outs if isinstance(outs, tuple) else (outs,)
    results, r = [], 0
    for it in items:
        rows = slice(r, r + it.rows)
        cut = [outs[0][rows, : it.t]]
        if len(outs) > 1:  # attn (b h t s)
            cut.append(outs[1][rows, :, : it.t, : it.s])
        results.append(tuple(np.ascontiguousarray(o) for o in cut))
        r += it.rows
    return results
