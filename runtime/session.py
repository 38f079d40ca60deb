"""OnnxSession: an ONNX Runtime session over an exported model, with everything it can do.

    sess = OnnxSession("model.onnx")              # provider "auto": CUDA where it really works
    y = sess.run(x)                               # a full-sequence model
    y, key, value = sess.decode(x, key, value)    # a token-by-token one (export_onnx(..., decode=True))
    tokens = sess.generate(input_ids, 64)         # a whole model (export_onnx(decoder_lm, ...))

The session itself (open, metadata, run, I/O binding) is runtime/core.py, where it runs
runtime/providers.py, its input checks runtime/feeds.py; the token-by-token calls are
runtime/decoding.py (a growing cache) and runtime/static_decoding.py (buffers written in place),
generation runtime/generation.py, and node placement runtime/placement.py. This class stands above them all.
"""

from __future__ import annotations

import zoo

from . import decoding, generation, placement, static_decoding
from .core import RuntimeSession
from .feeds import RunInputError
from .placement import NodePlacement
from .providers import SessionError, cuda_status


class OnnxSession(RuntimeSession):
    """An ONNX Runtime session over an attnzoo model (or any model with x/context/mask inputs).

    provider: "auto" (CUDA when it really works, else CPU, with one line saying why),
    "cpu", or "cuda" (raises SessionError when CUDA does not really work).
    """

    # -- token by token (models exported with decode=True) -------------------------------------

    def decode(self, x, past_key=None, past_value=None, key_mask=None):
        """One call: x (b t c) at positions p..p+t-1 -> (y, present_key, present_value)."""
        run = static_decoding.decode if self.cache == "static" else decoding.decode
        return run(self, x, past_key, past_value, key_mask)

    def generate_steps(self, x_steps, past_key=None, past_value=None, key_mask=None):
        """x_steps (b k c) fed one position at a time, the cache kept by the runtime -> (y (b k c), cache)."""
        run = static_decoding.generate_steps if self.cache == "static" else decoding.generate_steps
        return run(self, x_steps, past_key, past_value, key_mask)

    def static_cache(self, batch: int, past_key=None, past_value=None, key_mask=None, *, max_len=None):
        """A static-cache model's buffers, bound once: `.step(x)` writes in place (runtime/static_decoding.py)."""
        if self.cache != "static":
            raise zoo.ArgumentError(
                f"{self.path} keeps a {self.cache or 'no'} cache; export with --decode --cache static for a static one"
            )
        return static_decoding.static_cache(self, batch, past_key, past_value, key_mask, max_len=max_len)

    # -- whole models (export_onnx of a zoo.lm.DecoderLM) --------------------------------------

    def generate(
        self,
        input_ids,
        max_new_tokens: int | None = None,
        attention_mask=None,
        eos_token_id=None,
        pad_token_id=None,
        **options,
    ):
        """(b, t + N) int64, the prompt then the new tokens, as transformers' generate returns them: greedy,
        or sampled with do_sample / temperature / top_k / top_p / min_p / repetition_penalty / seed; stopped
        at eos ids (the checkpoint's by default), stop strings (with tokenizer=) or max_time
        (runtime/generation.py's Generation); the buffers bound once and written in place. Beam search with
        num_beams > 1 (the call's or the checkpoint's), length_penalty, early_stopping, num_return_sequences
        (runtime/beam_generation.py; return_dict_in_generate=True adds sequences_scores)."""
        return generation.generate(
            self, input_ids, max_new_tokens, attention_mask, eos_token_id, pad_token_id, **options
        )

    def stream(self, input_ids, max_new_tokens: int, attention_mask=None, **options):
        """generate's tokens as they are made: each step's (b,) ids, or with tokenizer= its text pieces (a
        str prompt yields str pieces, never a split character; text ends before a stop string)."""
        return generation.stream(self, input_ids, max_new_tokens, attention_mask, **options)

    # -- where did it run ------------------------------------------------------------------

    def node_placements(self, x, context=None, mask=None, head_mask=None) -> list[NodePlacement]:
        """Run once with profiling and report the provider each node actually ran on."""
        return placement.node_placements(self, x, context, mask, head_mask)

    @staticmethod
    def summarize_placements(placements: list[NodePlacement]) -> dict[str, dict[str, int]]:
        """{op_type: {provider: count}}."""
        return placement.summarize(placements)


__all__ = ["OnnxSession", "SessionError", "RunInputError", "NodePlacement", "cuda_status"]
