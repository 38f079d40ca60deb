"""Every key of transformers' `GenerationConfig` and its fate here, one table (docs/generation.md prints it):

    APPLIED     changes tokens and is applied with transformers' semantics (runtime/processors.py, warpers.py,
                sampling.py, generation.py, seq2seq_generation.py, beam_search.py)
    REFUSED     changes tokens and is not done here: a call that asks for it is refused by name; a checkpoint's
                generation_config.json that sets it gets one line saying so (`unapplied`), and greedy or sampled
                tokens without it
    IRRELEVANT  changes no token (output flags, caches, compilation, speed-only assistants, bookkeeping)

A key's value equal to its NEUTRAL one (transformers' default, which does nothing) is not a request.
tests/runtime/test_generation_keys.py reads the installed transformers' `GenerationConfig()` and fails on a key
missing here.
"""

from __future__ import annotations

import zoo

# transformers' defaults (GenerationConfig._get_default_generation_params) of the keys applied here
DEFAULTS = {
    "do_sample": False,
    "temperature": 1.0,
    "top_k": 50,
    "top_p": 1.0,
    "min_p": None,
    "top_h": None,
    "typical_p": 1.0,
    "epsilon_cutoff": 0.0,
    "eta_cutoff": 0.0,
    "repetition_penalty": 1.0,
    "encoder_repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0,
    "bad_words_ids": None,
    "sequence_bias": None,
    "min_length": 0,
    "min_new_tokens": None,
    "forced_bos_token_id": None,
    "forced_eos_token_id": None,
    "remove_invalid_values": False,
    "exponential_decay_length_penalty": None,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
    "renormalize_logits": False,
    "num_return_sequences": 1,
}

APPLIED = {
    **{k: "a logits processor or warper (runtime/processors.py, warpers.py)" for k in DEFAULTS},
    "do_sample": "greedy or one draw per row (runtime/sampling.py)",
    "num_return_sequences": "sampling: each prompt row repeated, each copy drawing its own stream",
    "max_new_tokens": "the length: the call's max_new_tokens (generate and the CLI always give one) wins",
    "max_length": "the length: a call's max_new_tokens wins over it, as in transformers",
    "max_time": "runtime/stopping.py: every row ends at its length after max_time seconds",
    "stop_strings": "runtime/stopping.py: a row ends at a stop string (needs the tokenizer)",
    "eos_token_id": "each listed id ends a row",
    "pad_token_id": "what an ended row is padded with (default: the first eos id)",
    "decoder_start_token_id": "an encoder-decoder's first decoder token",
}

BEAM = ("num_beams", "length_penalty", "early_stopping")  # beam search (runtime/beam_search.py)
APPLIED.update(
    num_beams="beam search as transformers' (runtime/beam_search.py; decoders and encoder-decoders), with the "
    "processors over its log-softmax; a checkpoint's num_beams > 1 gives beams by default",
    length_penalty="beam search: a finished hypothesis' score is its sum of logprobs / length ** length_penalty",
    early_stopping="beam search: True, False (transformers' heuristic) or 'never'",
)

REFUSED = {
    "num_beam_groups": (1, "group beam search (moved to the Hub in transformers 5) is not done here"),
    "diversity_penalty": (0.0, "group beam search (moved to the Hub in transformers 5) is not done here"),
    "constraints": (None, "constrained beam search is not done here"),
    "force_words_ids": (None, "constrained beam search is not done here"),
    "penalty_alpha": (None, "contrastive search (moved to the Hub in transformers 5) is not done here"),
    "dola_layers": (None, "DoLa decoding reads hidden layers an export does not return"),
    "guidance_scale": (1.0, "classifier-free guidance runs the model twice per step; not done here"),
    "watermarking_config": (None, "watermarking is not done here"),
    "token_healing": (None, "token healing re-tokenizes the prompt's end; not done here"),
    "use_mtp": (None, "multi-token prediction heads are not exported"),
    "assistant_ensemble_weight": (None, "accepts an assistant's tokens against a mixture of both models; no assistant"),
}

IRRELEVANT = {
    **dict.fromkeys(
        ("output_attentions", "output_hidden_states", "output_scores", "output_logits", "return_dict_in_generate"),
        "what transformers' generate returns besides the tokens",
    ),
    **dict.fromkeys(
        ("use_cache", "cache_implementation", "cache_config", "max_cache_len", "low_memory", "prefill_chunk_size"),
        "how the cache is kept: an export's own (the tokens are the same)",
    ),
    **dict.fromkeys(
        ("compile_config", "disable_compile", "continuous_batching_config"),
        "how transformers runs the model (torch.compile, its own batching)",
    ),
    **dict.fromkeys(
        (
            "prompt_lookup_num_tokens",
            "max_matching_ngram_size",
            "num_assistant_tokens",
            "num_assistant_tokens_schedule",
            "assistant_confidence_threshold",
            "assistant_lookbehind",
            "target_lookbehind",
            "assistant_early_exit",
            "is_assistant",
            "speculation_type",
        ),
        "assisted (speculative) decoding: speed only; the tokens are the model's own",
    ),
    "bos_token_id": "starts a generation without a prompt; a prompt is always given here",
    "transformers_version": "bookkeeping",
    "_from_model_config": "bookkeeping",
}


def fate(key: str) -> str:
    """'applied', 'refused' or 'irrelevant' ('unknown' for a key transformers' GenerationConfig lacks)."""
    if key in APPLIED:
        return "applied"
    if key in REFUSED:
        return "refused"
    return "irrelevant" if key in IRRELEVANT else "unknown"


def _asks(key: str, value) -> bool:
    return value is not None and value != REFUSED[key][0]


def refuse_call(call: dict) -> None:
    """A call asking for a REFUSED key (beyond its neutral value) is refused by name."""
    for key, value in call.items():
        if key in REFUSED and _asks(key, value):
            raise zoo.ArgumentError(f"{key}={value!r}: {REFUSED[key][1]}; leave it out")


def unapplied(config: dict | None, call: dict | None = None, *, beams: bool = False) -> list[str]:
    """What a checkpoint's generation_config.json sets that is not applied here (its REFUSED keys away from their
    neutral value, unless the call sets them), one phrase each: said where generation runs, never dropped. A path
    that makes greedy or sampled tokens only (beams False: a stream, the server's /v1 routes) says a num_beams > 1
    too; generate() runs the beams."""
    call = call or {}
    out = [
        f"{key}={value!r} ({REFUSED[key][1]})"
        for key, value in (config or {}).items()
        if key in REFUSED and key not in call and _asks(key, value)
    ]
    k = (config or {}).get("num_beams")
    if not beams and "num_beams" not in call and isinstance(k, int) and not isinstance(k, bool) and k > 1:
        out.append(f"num_beams={k} (beam search runs in generate(); this path makes greedy or sampled tokens)")
    return out


def table_markdown() -> str:
    """The table of docs/generation.md: each key, its fate, and how."""
    rows = [(k, "applied", why) for k, why in APPLIED.items()]
    rows += [(k, "refused", f"{why} (refused unless {neutral!r})") for k, (neutral, why) in REFUSED.items()]
    rows += [(k, "irrelevant", why) for k, why in IRRELEVANT.items()]
    lines = ["| key | fate | how |", "|---|---|---|"]
    lines += [f"| `{k}` | {f} | {why} |" for k, f, why in sorted(rows, key=lambda r: (r[1], r[0]))]
    return "\n".join(lines)


__all__ = ["APPLIED", "BEAM", "DEFAULTS", "IRRELEVANT", "REFUSED", "fate", "refuse_call", "table_markdown", "unapplied"]
