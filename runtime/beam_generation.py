"""Beam search from a whole decoder export (OnnxSession.generate(..., num_beams=k)), as transformers'
`generate(num_beams=k, do_sample=False)`: runtime/beam_search.py keeps the hypotheses, the drivers of
runtime/device_decode.py run the model over b x k rows, and the cache is reordered where it lives after
each step (runtime/beam_cache.py: numpy in place on the host buffers; a Gather graph on the session's
device for a device-resident PackedRows cache), so no step sends the cache through the host.

    out = sess.generate(ids, 16, attention_mask=mask, num_beams=4, return_dict_in_generate=True)
    out.sequences          # (b * num_return_sequences, t + made) int64, each row's best first
    out.sequences_scores   # (b * num_return_sequences,) float32: sum of log-probs / length ** length_penalty

The prompt's b rows become b x k (each repeated k times, as transformers expands them), so the call's
buffers are k times a greedy call's and are checked as such before anything is allocated. The processors
(a callable (ids, scores) -> scores over the log-softmax, runtime/beam_search.py) default to the generation's
own: every generation_config key of the call and the checkpoint (runtime/processors.py); given, they replace
them. Sampling, stop strings and streaming are refused with beams (transformers has beam sampling; it is not done here).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

import zoo

from .beam_cache import GraphReorder, HostReorder, position_axes
from .beam_search import Beams, BeamSearch, beam_settings, split_beam_options, without_beams
from .device_decode import PREFIX, LeftRows, PackedRows, is_packed
from .generation import Generation, _as_ids, generation_defaults, prefill_chunk, recompute_at
from .generation import generate as greedy_generate
from .kv_buffers import buffer_types
from .tensors import from_numpy, is_tensor

if TYPE_CHECKING:
    from .core import RuntimeSession


@dataclass
class BeamOutput:
    """transformers' GenerateBeamDecoderOnlyOutput's two fields (numpy, or torch when the prompt was torch)."""

    sequences: object
    sequences_scores: object


class BeamGeneration:
    """One beam-search call (the module docstring). `reorder`: "auto" (host arrays where the cache is on the
    host, else the Gather graph), or "graph" to run the device path on a CPU PackedRows (how it is tested)."""

    def __init__(
        self,
        sess: RuntimeSession,
        input_ids,
        max_new_tokens: int,
        attention_mask=None,
        eos_token_id=None,
        pad_token_id=None,
        *,
        beams: Beams,
        processors=None,
        max_time: float | None = None,
        generation_config: dict | None = None,
        reorder: str = "auto",
        **knobs,
    ) -> None:
        if knobs.pop("stop", None) is not None:
            raise zoo.ArgumentError(f"stop= with num_beams={beams.num_beams}: stop strings are not done in beam search")
        knobs.pop("tokenizer", None)  # no text is made per step here
        self.as_torch = is_tensor(input_ids)
        ids = _as_ids(sess, input_ids)
        k = beams.num_beams
        mask = attention_mask
        if mask is not None:
            mask = np.repeat(mask.detach().cpu().numpy() if is_tensor(mask) else np.asarray(mask), k, axis=0)
        # the b x k rows as transformers expands them: Generation checks the ids, eos, pad, knobs and the room
        self.gen = gen = Generation(
            sess,
            np.repeat(ids, k, axis=0),
            max_new_tokens,
            mask,
            eos_token_id,
            pad_token_id,
            max_time=max_time,
            generation_config={
                **(generation_config or generation_defaults(sess)),
                "num_beams": 1,
            },  # the beams are ours
            **knobs,
        )
        if gen.params.do_sample:
            raise zoo.ArgumentError(
                f"num_beams={k} with sampling (do_sample / temperature > 0): beam sampling is not done here; "
                "give num_beams=1 to sample, or leave the sampling knobs out for beam search"
            )
        if reorder not in ("auto", "graph"):
            raise zoo.ArgumentError(f"reorder={reorder!r} must be 'auto' or 'graph'")
        if processors is None:  # every generation_config key's processor, as transformers' beam search applies them
            processors = gen.sampler.processors
        self.beams, self.reorder_mode = beams, reorder
        self.search = BeamSearch(ids, beams, ids.shape[1] + gen.max_new_tokens, gen.eos, gen.pad, processors)
        self.timings: dict = {}
        self.reorders = 0

    def _reorderer(self, driver):
        sess = self.gen.sess
        if isinstance(driver, LeftRows):
            arrays = driver.cache_arrays
        else:  # a CPU buffer's (array, OrtValue); none on a device
            arrays = {name: arr for name, (arr, _) in driver.buf.cache_arrays.items()}
        if self.reorder_mode == "graph" or not arrays:
            if isinstance(driver, LeftRows):
                raise zoo.ArgumentError("reorder='graph' is the device path of a packed-rows export (padding='packed')")
            types = buffer_types(sess._sess.get_inputs(), PREFIX)
            return GraphReorder(sess, driver.buf.caches, types)
        return HostReorder(arrays, position_axes(sess._sess.get_inputs(), arrays))

    def run(self):
        """Every step; returns the sequences (the module docstring)."""
        gen, search = self.gen, self.search
        sess, rows, t = gen.sess, gen.ids.shape[0], gen.ids.shape[1]
        started = time.perf_counter()
        pending = {}

        def choose(logits: np.ndarray) -> np.ndarray:
            over = gen.max_time is not None and time.perf_counter() - started > gen.max_time
            pending["rows"] = search.advance(logits, stop=over)
            return search.tokens

        mask = gen._prompt_mask()
        if is_packed(sess):
            driver = PackedRows(sess, rows, gen.n, mask, False, choose)
        else:
            driver = LeftRows(sess, rows, t, gen.n, mask, False, choose)
        reorder = self._reorderer(driver)
        token = driver.prefill(gen.ids, prefill_chunk(sess, rows, t))
        prefill = time.perf_counter() - started
        again = recompute_at(sess)
        i = 0
        while not search.done:
            if t + i == again:  # the running rows as one call from slot 0 (its cache is theirs: nothing to reorder)
                token = driver.recompute(search.ids())
            else:
                reorder(pending["rows"], t + i)  # the rows' written slots < t + i, where the cache lives
                token = driver.step(token, i)
            i += 1
        self.reorders = reorder.copies
        decode = time.perf_counter() - started - prefill
        self.timings.update(prefill_s=prefill, decode_s=decode, steps=i, capacity=gen.n, beam_reorders=reorder.copies)
        sequences, scores = search.result()
        self.output = BeamOutput(
            from_numpy(sequences) if self.as_torch else sequences, from_numpy(scores) if self.as_torch else scores
        )
        return self.output.sequences


def generate(
    sess: RuntimeSession,
    input_ids,
    max_new_tokens: int | None = None,
    attention_mask=None,
    eos_token_id=None,
    pad_token_id=None,
    *,
    timings: dict | None = None,
    **options,
):
    """(b, t + N) int64: the prompt then the new tokens (fewer than N when every row ended at an eos id or a
    stop string), greedy unless the options sample (runtime/generation.py's generate, Generation for every
    option); what OnnxSession.generate calls.

    Beam search (BeamGeneration) when num_beams > 1, given or in the checkpoint's generation_config,
    as transformers' generate: with length_penalty, early_stopping, num_return_sequences and processors;
    return_dict_in_generate=True returns its BeamOutput (sequences, sequences_scores). max_new_tokens None:
    max_length (the option, else the generation_config's, else transformers' 20) less the prompt.

    torch in -> torch out; numpy (or lists) in -> numpy out. `timings`, a dict, receives
    prefill_s, decode_s, steps and capacity (and the seed of a sampling call)."""
    call, options = split_beam_options(options)
    config = options.get("generation_config")
    config = generation_defaults(sess) if config is None else config
    beams = beam_settings(call, config if isinstance(config, dict) else None)
    max_new_tokens = _new_tokens(input_ids, max_new_tokens, options.pop("max_length", None), config)
    processors, as_dict = options.pop("processors", None), options.pop("return_dict_in_generate", False)
    if beams.on and any(options.get(k) is not None for k in ("json_schema", "response_format")):
        raise zoo.ArgumentError(
            f"json_schema / response_format with beam search (num_beams={beams.num_beams}): not done here; "
            "give num_beams=1 (greedy or sampled decoding is constrained)"
        )
    if beams.on:
        beam = BeamGeneration(
            sess, input_ids, max_new_tokens, attention_mask, eos_token_id, pad_token_id, beams=beams,
            processors=processors, **options,
        )  # fmt: skip
        tokens = beam.run()
        if timings is not None:
            timings.update(beam.timings)
        return beam.output if as_dict else tokens
    for name, given in (("processors", processors is not None), ("return_dict_in_generate", as_dict)):
        if given:
            raise zoo.ArgumentError(f"{name}= is taken with beam search here (num_beams > 1); leave it out for greedy")
    options = without_beams(call, options, config)
    return greedy_generate(
        sess, input_ids, max_new_tokens, attention_mask, eos_token_id, pad_token_id, timings=timings, **options
    )


def _new_tokens(input_ids, max_new_tokens, max_length, config) -> int:
    """max_new_tokens, or transformers' max_length (prompt included: the call's, the config's, else 20) less the
    prompt's length."""
    if max_new_tokens is not None:
        return max_new_tokens
    if max_length is None:
        max_length = config.get("max_length") if isinstance(config, dict) else None
    max_length = 20 if max_length is None else max_length
    t = input_ids.shape[-1] if is_tensor(input_ids) else np.shape(input_ids)[-1]
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length <= t:
        raise zoo.ArgumentError(
            f"max_length={max_length!r} (the prompt's {t} tokens included) leaves no new token: give max_new_tokens"
        )
    return max_length - t


__all__ = ["BeamGeneration", "BeamOutput", "generate"]
