"""What the request protocol is made of: media types, field names, size limits, the errors,
`ModelInfo` (what a request is checked against) and `Item` (one decoded request). Plain numpy."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from zoo import AttnzooError
from zoo.spec_fields import rope_switch_at

NPY = "application/x-npy"
NPZ = "application/x-npz"
JSON = "application/json"
FIELDS = ("x", "context", "mask", "head_mask", "past_key", "past_value", "key_mask")
DECODE_FIELDS = ("past_key", "past_value", "key_mask")
DEFAULT_MAX_TOKENS = 65_536  # b*t per request; 64 x 1024 is a large but sane single request
DEFAULT_MAX_BODY = 256 * 2**20
# A body must arrive within BODY_SECONDS plus a second per BODY_RATE bytes it declares (its limit when it
# declares none): a client that sends part of a body and stalls gives its slot back (408), so stalled
# uploads cannot hold every one of a replica's max_ongoing_requests.
BODY_SECONDS = 10.0
BODY_RATE = 2**20  # bytes a second: slower than any link a request is sent over


def generate_body_limit(vocab: int, max_tokens: int) -> int:
    """The largest body a valid POST /generate can need: at most max_tokens ids, each written in full with
    its attention_mask entry as `false`, each with a separator, a line break and 10 spaces of indentation
    (json.dumps(..., indent=2) writes 6), plus 64 KiB of brackets and field names. (65,536 positions of a
    32,000-token vocabulary: 2.2 MB; not the block server's DEFAULT_MAX_BODY, 256 MiB, which a JSON parser
    takes seconds and gigabytes to refuse.)"""
    per_position = len(str(max(vocab - 1, 0))) + len("false") + 2 * (2 + 10)
    return 64 * 2**10 + max_tokens * per_position


PAD_FACTOR = 2.0  # a request is padded to at most twice its length (see length_groups)


class ServeError(AttnzooError, ValueError):
    """A serving setup that cannot work (bad options, a model this server cannot serve)."""


class RequestError(AttnzooError, ValueError):
    """A bad request: answered with `status` (4xx) and this one-line message."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class ModelInfo:
    """What a request is checked against: widths, dtype and inputs of the served model."""

    d_model: int
    d_context: int | None  # None: self-attention
    heads: int
    dtype: np.dtype
    has_mask: bool
    has_head_mask: bool
    outputs: tuple[str, ...]
    max_tokens: int = DEFAULT_MAX_TOKENS
    max_rows: int = 1024
    max_body: int = DEFAULT_MAX_BODY  # bytes of a body, and of the arrays an .npz unpacks to
    # A decode (KV-cache) model: x, past_key (b g p dk), past_value (b g p dv) [, key_mask (b s)].
    decode: bool = False
    kv_heads: int = 0
    d_k: int = 0
    d_v: int = 0
    has_key_mask: bool = False
    max_len: int | None = None  # a static cache's capacity (attnzoo.max_len): p + t past it is refused
    # longrope: the frequency set follows a run's longest query sequence (long past rope_original_max), so
    # requests on either side of it never share a padded run (serve/batching.run_batch)
    switch_at: int | None = None

    @classmethod
    def of(
        cls, sess, *, max_tokens: int = DEFAULT_MAX_TOKENS, max_rows: int = 1024, max_body: int = DEFAULT_MAX_BODY
    ) -> ModelInfo:
        """From an `OnnxSession` over an attnzoo export (its spec metadata is required)."""
        spec = sess.spec
        if spec is None:
            raise ServeError(f"{sess.path} carries no attnzoo spec metadata; serve a model written by `attnzoo export`")
        decode = "past_key" in sess.input_names
        if decode and "past_value" not in sess.input_names:
            raise ServeError(f"{sess.path} has past_key but no past_value input; export it with attnzoo --decode")
        max_len = None
        if "past_len" in sess.input_names:  # a static cache: its buffers' capacity, fixed at export
            from runtime.static_decoding import capacity  # the one reader of attnzoo.max_len

            try:
                max_len = capacity(sess)
            except AttnzooError as e:
                raise ServeError(str(e)) from None
        return cls(
            d_model=spec.d_model,
            d_context=spec.d_context,
            heads=spec.heads,
            dtype=np.dtype(sess.dtype),
            has_mask="mask" in sess.input_names,
            has_head_mask="head_mask" in sess.input_names,
            outputs=tuple(sess.output_names),
            max_tokens=max_tokens,
            max_rows=max_rows,
            max_body=max_body,
            decode=decode,
            kv_heads=spec.cache_widths_[0],  # the cache's widths (a latent block's: 1, rope_dim, kv_lora_rank)
            d_k=spec.cache_widths_[1],
            d_v=spec.cache_widths_[2],
            has_key_mask="key_mask" in sess.input_names,
            max_len=max_len,
            switch_at=rope_switch_at(spec.rope_scaling, spec.rope_original_max),
        )


@dataclass
class Item:
    """One decoded request, every array batched: x (b t c), context (b s c_ctx), mask (b t s)."""

    x: np.ndarray
    context: np.ndarray | None = None
    mask: np.ndarray | None = None
    head_mask: np.ndarray | None = None
    past_key: np.ndarray | None = None  # decode models: (b g p dk), (b g p dv), key_mask (b p+t)
    past_value: np.ndarray | None = None
    key_mask: np.ndarray | None = None
    squeeze: bool = False  # x came as (t, c): answer (t, c)
    binary: bool = False  # answer as .npy/.npz
    enqueued: float = field(default_factory=time.perf_counter)

    @property
    def rows(self) -> int:
        return self.x.shape[0]

    @property
    def t(self) -> int:
        return self.x.shape[1]

    @property
    def s(self) -> int:
        return self.context.shape[1] if self.context is not None else self.x.shape[1]

    @property
    def p(self) -> int:
        """Cached positions a decode request brings (0 for a prompt, or any full-sequence model)."""
        return self.past_key.shape[2] if self.past_key is not None else 0
