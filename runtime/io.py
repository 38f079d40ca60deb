"""The ONNX interface of an exported block, described once as data.

Every exported model has the inputs and outputs below (the optional ones when asked for),
with the axis vocabulary as dynamic-axis names. Tracing names every traced graph's inputs and outputs
from this table and checks each export against it (tracing.check_interface); parity and `attnzoo run`
build inputs from it; tracing's examples, the session, its feeds (feeds.py) and the decoders
(decoding.py, static_decoding.py) feed and bind the inputs by the names here. Four places spell
them themselves: the parameters of tracing's wrappers (torch.export matches inputs to them by
name), gqa.py's hand-built graph, parity's reading of the feeds it made, and the words of error
messages.
"""

from __future__ import annotations

from dataclasses import dataclass

import zoo


@dataclass(frozen=True)
class TensorIO:
    name: str
    axes: tuple[str | int, ...]  # "b", "t", "s", "p", "n" are dynamic; others are resolved from the spec
    kind: str  # "float" (the model's dtype), "bool", "int64" or "int32"
    doc: str

    def summary(self, spec: zoo.AttentionSpec, dtype: str) -> tuple[str, str, tuple[int | str, ...]]:
        """(name, type, shape) as an export's summary lists it: a float tensor shows the export's dtype."""
        return self.name, dtype if self.kind == "float" else self.kind, self.shape(spec)

    def shape(self, spec: zoo.AttentionSpec) -> tuple[int | str, ...]:
        """Dims as ONNX shows them: dynamic axes by name, the rest as integers."""
        g, dk, dv = spec.cache_widths_  # g, dk, dv name only the cache's axes (a latent's: 1, rope_dim, kv_lora_rank)
        fixed = {"c": spec.d_model, "c_ctx": spec.d_context or 0, "h": spec.heads, "g": g, "dk": dk, "dv": dv}
        return tuple(fixed.get(a, a) for a in self.axes)


X = TensorIO("x", ("b", "t", "c"), "float", "queries (and keys/values for self-attention)")
CONTEXT = TensorIO("context", ("b", "s", "c_ctx"), "float", "keys/values source for cross-attention")
MASK = TensorIO(
    "mask",
    ("b", "t", "s"),
    "bool",
    "True = may attend; the same for every head (a row with no True gives y = W_O's bias)",
)
HEAD_MASK = TensorIO("head_mask", ("b", "h"), "float", "scales each head's output Z^(r) before concat")
Y = TensorIO("y", ("b", "t", "c"), "float", "the block's output")
ATTN = TensorIO("attn", ("b", "h", "t", "s"), "float", "attention weights A, rows sum to 1")

# The block's named locations (zoo/hooks.py) as extra outputs: export_onnx(outputs=("y", "pattern", "z")).
LOCATION_OUTPUTS = {
    "q": TensorIO("q", ("b", "h", "t", "dk"), "float", "queries after QK-norm and rotary"),
    "k": TensorIO("k", ("b", "g", "s", "dk"), "float", "keys after QK-norm and rotary"),
    "v": TensorIO("v", ("b", "g", "s", "dv"), "float", "values"),
    "scores": TensorIO("scores", ("b", "h", "t", "s"), "float", "scaled, mapped, biased and masked scores (-inf)"),
    "pattern": TensorIO("pattern", ("b", "h", "t", "s"), "float", "attention weights A, rows sum to 1"),
    "z": TensorIO("z", ("b", "h", "t", "dv"), "float", "A V per head, after head_mask"),
    "result": TensorIO("result", ("b", "t", "h", "c"), "float", "head r's share z_r W_O^(r) of y"),
}


# Incremental decoding: the cache holds p earlier positions; this call adds t, so s = p + t keys.
PAST_KEY = TensorIO("past_key", ("b", "g", "p", "dk"), "float", "keys of the p earlier positions (after RoPE)")
PAST_VALUE = TensorIO("past_value", ("b", "g", "p", "dv"), "float", "values of the p earlier positions")
KEY_MASK = TensorIO("key_mask", ("b", "s"), "bool", "True = a real key (left padding), over all p + t positions")
PRESENT_KEY = TensorIO("present_key", ("b", "g", "s", "dk"), "float", "past_key followed by this call's keys")
PRESENT_VALUE = TensorIO("present_value", ("b", "g", "s", "dv"), "float", "past_value followed by this call's values")


def decode_interface(spec: zoo.AttentionSpec, *, with_key_mask: bool) -> tuple[list[TensorIO], list[TensorIO]]:
    """(inputs, outputs) of a token-by-token model: x, past_key, past_value [, key_mask] ->
    y, present_key, present_value. p may be 0 (an empty past tensor)."""
    ins = [X, PAST_KEY, PAST_VALUE] + ([KEY_MASK] if with_key_mask else [])
    return ins, [Y, PRESENT_KEY, PRESENT_VALUE]


# A static cache (cache="static"): buffers of capacity n, written in place at past_len. The
# session binds one buffer as both past_key and present_key, so no step copies the cache.
CACHE_KEY = TensorIO(
    "past_key", ("b", "g", "n", "dk"), "float", "key buffer of capacity n; positions < past_len hold the past"
)
CACHE_VALUE = TensorIO("past_value", ("b", "g", "n", "dv"), "float", "value buffer of capacity n")
PAST_LEN = TensorIO(
    "past_len", (), "int64", "how many positions of the buffers are written (this call writes at past_len)"
)
CACHE_KEY_MASK = TensorIO("key_mask", ("b", "n"), "bool", "True = a real key (left padding), over the whole capacity")
CACHE_PRESENT_KEY = TensorIO(
    "present_key", ("b", "g", "n", "dk"), "float", "the key buffer with this call's keys written"
)
CACHE_PRESENT_VALUE = TensorIO(
    "present_value", ("b", "g", "n", "dv"), "float", "the value buffer with this call's values written"
)


# Packed rows (a whole model's GroupQueryAttention graph, docs/generation.md "The padding rule"): each row's
# tokens sit from cache slot 0, so a row's slots are its positions; its length is all the graph needs, as
# GroupQueryAttention reads it (no attention_bias: the op's fast kernels, sinks and CUDA graphs take none).
POSITION_IDS = TensorIO(
    "position_ids",
    ("b", "t"),
    "int64",
    "each token's position, which is its cache slot (a pad's: past its row's length)",
)
SEQLENS_K = TensorIO(
    "seqlens_k", ("b",), "int32", "per row, its length after this call - 1 (its tokens fill slots 0..seqlens_k)"
)
TOTAL_SEQUENCE_LENGTH = TensorIO(
    "total_sequence_length",
    (),
    "int32",
    "the prompt's width t on a first call (rows right-padded to it), else the capacity n (constant: a CUDA graph)",
)


def static_interface(
    spec: zoo.AttentionSpec, *, with_key_mask: bool, packed: bool = False
) -> tuple[list[TensorIO], list[TensorIO]]:
    """(inputs, outputs) of a static-cache decode model: x, past_key, past_value, past_len
    [, key_mask] -> y, present_key, present_value, the presents being the buffers written in place.
    packed: a whole model's packed-rows layer, x, past_key, past_value, position_ids, seqlens_k,
    total_sequence_length."""
    if packed:
        ins = [X, CACHE_KEY, CACHE_VALUE, POSITION_IDS, SEQLENS_K, TOTAL_SEQUENCE_LENGTH]
    else:
        ins = [X, CACHE_KEY, CACHE_VALUE, PAST_LEN] + ([CACHE_KEY_MASK] if with_key_mask else [])
    return ins, [Y, CACHE_PRESENT_KEY, CACHE_PRESENT_VALUE]


# A whole decoder model (export/lm_export.py), named as transformers' ONNX exports and onnxruntime-genai
# name them; the per-layer buffers are static (capacity n), each bound as past_key_values.i.key and as
# present.i.key, so ONNX Runtime writes this call's keys in place.
INPUT_IDS = TensorIO("input_ids", ("b", "t"), "int64", "token ids at cache indices past_len..past_len+t-1")
ATTENTION_MASK = TensorIO(
    "attention_mask", ("b", "n"), "bool", "True = a real token, over the whole capacity (left padding False)"
)
LOGITS = TensorIO(
    "logits", ("b", 1, "v"), "float", "next-token logits, the call's last position (packed: each row's last)"
)
ALL_LOGITS = TensorIO("logits", ("b", "t", "v"), "float", "logits at every position of the call")
NEXT_TOKEN = TensorIO("next_token", ("b",), "int64", "argmax of the last position's logits (greedy; first of ties)")
LM_PAST = "past_key_values.{i}.{kv}"  # kv: "key" | "value"
# an encoder-decoder pair (export/seq2seq_export.py writes them, runtime/seq2seq_session.py binds them)
SELF_PAST, SELF_PRESENT = "past_key_values.{i}.decoder.{kv}", "present.{i}.decoder.{kv}"
CROSS_PAST, CROSS_PRESENT = "past_key_values.{i}.encoder.{kv}", "present.{i}.encoder.{kv}"
ENCODER_HIDDEN = "encoder_hidden_states"
ENCODER_MASK = "encoder_attention_mask"
LM_PRESENT = "present.{i}.{kv}"


def lm_interface(
    layers: list[zoo.AttentionSpec], vocab: int, *, all_logits: bool = False, argmax: bool = True, packed: bool = False
) -> tuple[list[TensorIO], list[TensorIO]]:
    """(inputs, outputs) of a whole-model static-cache graph: input_ids, attention_mask, past_len (packed rows:
    input_ids, position_ids, seqlens_k, total_sequence_length), then past_key_values.i.key / .value per layer -> logits
    [, next_token], then present.i.key / .value."""
    first = (
        [INPUT_IDS, POSITION_IDS, SEQLENS_K, TOTAL_SEQUENCE_LENGTH] if packed else [INPUT_IDS, ATTENTION_MASK, PAST_LEN]
    )
    ins, outs = first, [ALL_LOGITS if all_logits else LOGITS]
    outs = [TensorIO(o.name, tuple(vocab if a == "v" else a for a in o.axes), o.kind, o.doc) for o in outs]
    if argmax:
        outs.append(NEXT_TOKEN)
    for i, spec in enumerate(layers):
        for kv, d in (("key", spec.d_k_), ("value", spec.d_v_)):
            axes = ("b", spec.kv_heads_, "n", d)
            ins.append(TensorIO(LM_PAST.format(i=i, kv=kv), axes, "float", f"layer {i}'s {kv} buffer of capacity n"))
            outs.append(TensorIO(LM_PRESENT.format(i=i, kv=kv), axes, "float", f"layer {i}'s {kv} buffer, written"))
    return ins, outs


def interface(
    spec: zoo.AttentionSpec, *, need_weights: bool, with_mask: bool, with_head_mask: bool, locations=()
) -> tuple[list[TensorIO], list[TensorIO]]:
    """(inputs, outputs) in graph order for one export request; `locations` (named locations,
    LOCATION_OUTPUTS) follow y and attn.

    For self-attention the key axis *is* the query axis, so `s` is renamed `t`.
    """
    ins = [X]
    if spec.is_cross:
        ins.append(CONTEXT)
    if with_mask:
        ins.append(MASK)
    if with_head_mask:
        ins.append(HEAD_MASK)
    outs = [Y] + ([ATTN] if need_weights else []) + [LOCATION_OUTPUTS[loc] for loc in locations]
    if not spec.is_cross:
        ins = [_self_axes(io) for io in ins]
        outs = [_self_axes(io) for io in outs]
    return ins, outs


def _self_axes(io: TensorIO) -> TensorIO:
    return TensorIO(io.name, tuple("t" if a == "s" else a for a in io.axes), io.kind, io.doc)
