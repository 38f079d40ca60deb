"""Hypothesis strategies for the fuzzers: valid specs, shapes and masks, drawn small.

`specs()` is the one place that says what a valid spec looks like to the fuzzers; a new spec
field (a modifier) is added here once and every fuzzer draws it.

Budget: FUZZ_EXAMPLES examples per fuzz test (derandomized, so a CI failure reproduces);
ATTNZOO_FUZZ_EXAMPLES=500 runs the long version (docs/testing.md, "The fuzzers").
"""

from __future__ import annotations

import os

import torch
from hypothesis import settings
from hypothesis import strategies as st

import zoo


def fuzz_settings(examples: int) -> settings:
    """`examples` by default, ATTNZOO_FUZZ_EXAMPLES when set; derandomized; no deadline (the
    first call of a shape compiles kernels and would trip one)."""
    n = int(os.environ.get("ATTNZOO_FUZZ_EXAMPLES", examples))
    return settings(max_examples=n, deadline=None, derandomize=True, database=None, print_blob=True)


@st.composite
def qk_norms(draw) -> dict:
    """QK-norm fields: off, or RMSNorm / LayerNorm (with or without its bias) per head with one shared
    weight, per head with a weight each, or over all heads; a large eps so that it bites at small d_k."""
    norm = draw(st.sampled_from([None, "head", "per_head", "full"]))
    if norm is None:
        return {}
    kind = draw(st.sampled_from(["rms", "layer"]))
    bias = kind == "layer" and draw(st.booleans())
    return dict(qk_norm=norm, qk_norm_kind=kind, qk_norm_bias=bias, qk_norm_eps=draw(st.sampled_from([1e-6, 0.1])))


@st.composite
def specs(
    draw, *, cross: bool | None = None, causal: bool | None = None, d_v_equals_d_k: bool = False
) -> zoo.AttentionSpec:
    """A valid AttentionSpec: widths, heads, kv heads dividing heads, d_k/d_v, layout, bias,
    causal (self-attention only), cross-attention, scale, window (causal or symmetric), clip_qkv, T5's
    relative buckets, QK-norm (RMS or LayerNorm), chunked attention, Llama 4's L2 QK-norm and temperature,
    the output gate, attention sinks.
    Small, so a forward costs little.
    Head sizes include multiples of 8 and the sizes fused kernels refuse (4, 12, 20)."""
    heads = draw(st.integers(1, 4))
    kv_heads = draw(st.sampled_from([g for g in range(1, heads + 1) if heads % g == 0]))
    d_k = draw(st.one_of(st.none(), st.integers(1, 12), st.sampled_from([8, 16, 20, 24])))
    d_model = draw(st.sampled_from([heads * w for w in (2, 4, 8, 12, 16)]) if d_k is None else st.integers(2, 40))
    d_v = None if d_v_equals_d_k else draw(st.one_of(st.none(), st.integers(1, 12)))
    is_cross = draw(st.booleans()) if cross is None else cross
    fields = dict(
        d_model=d_model,
        heads=heads,
        kv_heads=None if kv_heads == heads else kv_heads,
        d_k=d_k,
        d_v=d_v,
        layout=draw(st.sampled_from(["separate", "combined"])),
        bias=draw(st.booleans()),
        causal=False if is_cross else (draw(st.booleans()) if causal is None else causal),
        d_context=draw(st.integers(2, 24)) if is_cross else None,
        scale=draw(st.one_of(st.none(), st.floats(0.05, 2.0))),
    )
    # New modifier fields (rotary, ALiBi, window, softcap, QK-norm) go here, drawn with the
    # same care: values that bite at the shapes below (t, s <= 9).
    # window: self-attention only; on a non-causal block it is symmetric (|i - j| < window).
    if not is_cross:
        fields["window"] = draw(st.one_of(st.none(), st.integers(1, 6)))
    # chunked attention (Llama 4): self-attention, not with a window; chunks of 1..5 at t, s <= 9
    if not is_cross and fields["window"] is None:
        fields["chunk"] = draw(st.one_of(st.none(), st.integers(1, 5)))
    # clip_qkv: small enough that projections of unit inputs hit it.
    fields["clip_qkv"] = draw(st.one_of(st.none(), st.floats(0.05, 3.0)))
    fields.update(draw(qk_norms()))
    # Llama 4: its weightless QK-norm after the rotary, its query temperature (floors of 1..4 positions)
    if not is_cross:
        fields["qk_l2"] = draw(st.sampled_from([None, 1e-5, 0.1]))
        fields["temperature_floor"] = draw(st.one_of(st.none(), st.integers(1, 4)))
    # the gated output (Qwen3-Next): a sigmoid gate from x on every head's Z
    fields["output_gate"] = draw(st.booleans())
    # T5's relative buckets: self-attention only; few buckets and a short max_distance, so that
    # distances up to 8 reach the log-spaced buckets and the last one.
    if not is_cross:
        fields.update(draw(rel_buckets(fields["causal"])))
    # rotary (self-attention, an even d_k), plain or scaled by one of the kinds
    d_k_resolved = d_k if d_k is not None else d_model // heads
    if not is_cross and d_k_resolved % 2 == 0:
        fields.update(draw(rotary(d_k_resolved, long=True)))
    # attention sinks: a fresh block's logits are unit normals, so the sink takes a share that bites
    fields["sinks"] = draw(st.booleans())
    return zoo.AttentionSpec(**fields)


@st.composite
def rotary(draw, d_k: int, *, long: bool) -> dict:
    """Rotary on all of d_k (or nothing), its frequencies scaled by llama3 / yarn / (with `long`) longrope,
    with a pretraining length of 2..8 so that positions up to 9 pass it (longrope switches there: a
    decode split across the switch differs from the full forward, as in transformers, hence `long`)."""
    kind = draw(st.sampled_from([None, "off", "llama3", "yarn", *(["longrope"] if long else [])]))
    if kind is None:
        return {}
    out: dict = {"rope_theta": draw(st.sampled_from([10000.0, 500000.0]))}
    if kind == "off":
        return out
    out.update(rope_scaling=kind, rope_original_max=draw(st.integers(2, 8)))
    if kind in ("llama3", "yarn"):
        out["rope_factor"] = draw(st.sampled_from([2.0, 8.0, 32.0]))
    if kind == "yarn":
        out["rope_truncate"] = draw(st.sampled_from([None, False]))
    if kind == "longrope":
        factor = st.floats(0.5, 40.0)
        for name in ("rope_short_factor", "rope_long_factor"):
            out[name] = tuple(draw(st.lists(factor, min_size=d_k // 2, max_size=d_k // 2)))
    return out


@st.composite
def rel_buckets(draw, causal: bool) -> dict:
    """rel_buckets / rel_max_distance (or neither) valid for a causal or bidirectional block."""
    n = draw(st.one_of(st.none(), st.integers(2 if causal else 4, 12)))
    if n is None:
        return {}
    exact = (n if causal else n // 2) // 2
    return {"rel_buckets": n, "rel_max_distance": exact + draw(st.integers(1, 6))}


@st.composite
def shapes(draw) -> tuple[int, int, int]:
    """(b, t, s), each 1..9 with 1 drawn often (t = 1 and b = 1 are the edge cases that break)."""
    dim = st.one_of(st.just(1), st.integers(1, 9))
    return draw(dim), draw(dim), draw(dim)


def bool_mask(draw, b: int, t: int, s: int, *, empty_row: bool) -> torch.Tensor:
    """(b, 1, t, s) bool, True = may attend; with `empty_row`, query row 0 of batch 0 has no key."""
    bits = draw(st.lists(st.booleans(), min_size=b * t * s, max_size=b * t * s))
    mask = torch.tensor(bits, dtype=torch.bool).reshape(b, 1, t, s)
    if empty_row:
        mask[0, 0, 0, :] = False
    return mask


def float_mask(draw, b: int, t: int, s: int) -> torch.Tensor:
    """(b, 1, t, s) additive: finite values and -inf, possibly whole rows of -inf."""
    value = st.one_of(st.floats(-5.0, 5.0), st.just(float("-inf")))
    vals = draw(st.lists(value, min_size=b * t * s, max_size=b * t * s))
    mask = torch.tensor(vals, dtype=torch.float32).reshape(b, 1, t, s)
    if draw(st.booleans()):
        mask[-1, 0, -1, :] = float("-inf")
    return mask


@st.composite
def decode_specs(draw) -> zoo.AttentionSpec:
    """A spec every decode lowering can take: causal self-attention, head sizes a multiple of 8
    (GroupQueryAttention's CPU kernel refuses others), kv heads shared or not."""
    heads = draw(st.integers(1, 4))
    kv_heads = draw(st.sampled_from([g for g in range(1, heads + 1) if heads % g == 0]))
    d_k = draw(st.sampled_from([8, 16]))
    return zoo.AttentionSpec(
        d_model=draw(st.sampled_from([16, 24, 32])),
        heads=heads,
        kv_heads=None if kv_heads == heads else kv_heads,
        d_k=d_k,
        d_v=d_k,
        layout=draw(st.sampled_from(["separate", "combined"])),
        bias=draw(st.booleans()),
        causal=True,
        **draw(st.sampled_from([{}, {"window": 3}, {"window": 6}, {"chunk": 2}, {"chunk": 5}])),
        clip_qkv=draw(st.one_of(st.none(), st.floats(0.05, 3.0))),
        **draw(qk_norms()),
        output_gate=draw(st.booleans()),
        qk_l2=draw(st.sampled_from([None, 1e-5])),
        temperature_floor=draw(st.one_of(st.none(), st.integers(1, 4))),
        **draw(rel_buckets(True)),
        **draw(rotary(d_k, long=False)),
        sinks=draw(st.booleans()),
    )


@st.composite
def decode_runs(draw) -> tuple[int, list[int], list[int]]:
    """(b, cuts, pads): b rows (2 and 3 drawn often: the batched case) decoded in the splits
    x[:, 0:cuts[0]], x[:, cuts[0]:cuts[1]], ... (chunks of several positions after a past among
    them), each row left-padded by pads[r] positions (key_mask False there)."""
    b = draw(st.one_of(st.integers(2, 3), st.integers(1, 3)))
    n = draw(st.integers(3, 12))
    inner = draw(st.lists(st.integers(1, n - 1), min_size=1, max_size=3, unique=True))
    cuts = [*sorted(inner), n]
    pads = [0] + [draw(st.integers(0, n - 1)) for _ in range(b - 1)]
    return b, cuts, pads


# A config.json's size fields as a careful user breaks them: zero, negative, huge, not integers.
CONFIG_SIZE_FIELDS = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "num_hidden_layers")
BAD_SIZES = [0, -1, -4, 2**31, 2**62, 2**64, 10**30, 1.5, 64.0, True, "64", None, [], {}]


@st.composite
def config_sizes(draw) -> dict:
    """1 to 3 size fields of a LLaMA config.json, each zero, negative, huge or of the wrong type."""
    fields = draw(st.lists(st.sampled_from(CONFIG_SIZE_FIELDS), min_size=1, max_size=3, unique=True))
    return {f: draw(st.sampled_from(BAD_SIZES) | st.integers(-(2**70), 2**70)) for f in fields}


@st.composite
def shard_names(draw) -> str:
    """A shard name in model.safetensors.index.json that leaves the checkpoint folder: `..` steps (with
    folders in between) or an absolute path."""
    part = st.sampled_from(["x.safetensors", "model.safetensors", "sub", ".", "passwd", "blobs"])
    inside = draw(st.lists(part, max_size=2))
    ups = draw(st.integers(1, 3))
    rel = "/".join([*inside, *([".."] * (ups + len([p for p in inside if p != "."]))), "x.safetensors"])
    return draw(st.sampled_from([rel, "/etc/passwd", "/" + rel, "//x.safetensors", "../" * ups + "model.safetensors"]))


@st.composite
def row_scales(draw) -> tuple[float, ...]:
    """Per-row input scales for one batch (2 to 4 rows): one row at scale 1 somewhere, the others
    from 0.1x to 20x, so quantized exports meet batch mates much larger and much smaller."""
    others = draw(st.lists(st.sampled_from([0.1, 1.0, 4.0, 20.0]), min_size=1, max_size=3))
    at = draw(st.integers(0, len(others)))
    return (*others[:at], 1.0, *others[at:])


@st.composite
def latent_specs(draw) -> zoo.AttentionSpec:
    """A valid latent-attention spec (zoo/modifiers/latent.py): causal self-attention, every head reading the
    latent, a rotary part narrower than d_k, optionally the query's low rank and a window."""
    heads = draw(st.integers(1, 4))
    rope_dim = draw(st.sampled_from([2, 4, 8]))
    d_k = rope_dim + draw(st.integers(1, 8))
    return zoo.AttentionSpec(
        d_model=draw(st.integers(4, 32)),
        heads=heads,
        d_k=d_k,
        d_v=draw(st.integers(1, 12)),
        bias=False,
        causal=True,
        rope_theta=1e4,
        rope_dim=rope_dim,
        rope_interleaved=draw(st.booleans()),
        kv_lora_rank=draw(st.integers(1, 16)),
        q_lora_rank=draw(st.one_of(st.none(), st.integers(1, 16))),
        window=draw(st.one_of(st.none(), st.integers(1, 6))),
        scale=draw(st.one_of(st.none(), st.floats(0.05, 2.0))),
    )
