"""Whole encoder-decoder models: `seq2seq_from_checkpoint(folder, dtype=None)` -> zoo.seq2seq.Seq2SeqLM, and
`generation_settings(folder)`, the token ids greedy generation honours (generation_config.json first,
config.json after, as transformers' generate resolves them).

The family's row (peers/seq2seq_rows.py) gives the spec and the name of every tensor; each tensor is found,
typed and shaped against the parameter it fills, and a checkpoint tensor the row does not read is refused
(a part the zoo does not model). safetensors is read directly; no transformers needed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from zoo.errors import AttnzooError, CheckpointError, HFConversionError
from zoo.seq2seq import Seq2SeqLM, Seq2SeqSpec

from .checkpoint import FLOATS, _dtype, _Names, check_folder
from .config import config_dict, model_type
from .config_keys import with_defaults
from .seq2seq_rows import SEQ2SEQ_FAMILIES, Seq2SeqRow

# the token ids generation reads, with transformers' fallbacks (decoder start: bos when unset)
GENERATION_KEYS = (
    "decoder_start_token_id",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "forced_bos_token_id",
    "forced_eos_token_id",
)


def seq2seq_row(data: dict) -> tuple[str, Seq2SeqRow]:
    """The whole-model row of an encoder-decoder config dict, or one line naming the families that have one."""
    kind = model_type(data)
    if kind not in SEQ2SEQ_FAMILIES:
        raise HFConversionError(
            f"model_type={kind!r}: whole encoder-decoder models are read for {', '.join(SEQ2SEQ_FAMILIES)}"
        )
    return kind, SEQ2SEQ_FAMILIES[kind]


def is_seq2seq(data: dict) -> bool:
    """Whether a config dict is of a family whose whole encoder-decoder model the zoo reads."""
    return model_type(data) in SEQ2SEQ_FAMILIES


def seq2seq_spec(data: dict, *, untied: bool = False) -> Seq2SeqSpec:
    """The Seq2SeqSpec of a config dict (untied: the checkpoint holds a head of its own)."""
    kind, row = seq2seq_row(data)
    data = with_defaults(kind, data)
    try:
        enc, dec = row.layers(data)
        a_enc, a_dec, a_cross = row.attention(data)
        return Seq2SeqSpec(
            vocab=int(data["vocab_size"]),
            d_model=int(data["d_model"]),
            encoder=(a_enc,) * enc,
            decoder=(a_dec,) * dec,
            cross=(a_cross,) * dec,
            tied=not untied,
            **row.fields(data),
        )
    except AttnzooError as e:
        raise HFConversionError(f"{kind} config: {e}") from None
    except (KeyError, TypeError, ValueError) as e:
        raise HFConversionError(f"{kind} config: cannot read the whole model ({e!r}); is it a {kind} config?") from None


def _untied(names: _Names, row: Seq2SeqRow, data: dict) -> bool:
    """A head of its own: lm_head.weight saved and not a copy of the shared table (older T5 v1.1 / Flan,
    mT5 files), or a config that says the head is not tied."""
    if "lm_head.weight" not in names.map:
        return False
    shared = "shared.weight" if "shared.weight" in names.map else "model.shared.weight"
    if shared not in names.map:
        return True
    return not torch.equal(names.tensor("lm_head.weight"), names.tensor(shared))


def seq2seq_from_checkpoint(folder: str | os.PathLike, dtype: Any = None) -> Seq2SeqLM:
    """The whole encoder-decoder model in a transformers checkpoint folder (config.json + safetensors) as a
    zoo Seq2SeqLM of zoo blocks; `dtype` None keeps the checkpoint's float dtype. Refusals: CheckpointError
    (files, tensors, shapes) and HFConversionError (a model_type without a row)."""
    want = _dtype(dtype)
    path = check_folder(folder)
    data = config_dict(path / "config.json")
    data = with_defaults(model_type(data), data)
    kind, row = seq2seq_row(data)
    seq2seq_spec(data)  # refusals before any tensor is read
    names = _Names(path)
    model = Seq2SeqLM(seq2seq_spec(data, untied=_untied(names, row, data)))
    plan = row.names(data, model)
    params = dict(model.named_parameters(remove_duplicate=False))
    target = want
    with torch.no_grad():
        for param, name in plan.items():
            if name not in names.map:
                raise CheckpointError(
                    f"{kind}: tensor {name!r} is missing (looked in {names.where}); the model needs it"
                )
            t = names.tensor(name)
            where = f"{names.where}: {name!r}"
            if t.dtype not in FLOATS:
                raise CheckpointError(
                    f"{where} is {str(t.dtype).removeprefix('torch.')}; the model holds float weights"
                )
            target = target or t.dtype
            p = params[param]
            if param == "logits_bias" and t.dim() == 2 and t.shape[0] == 1:  # BART saves it (1 vocab)
                t = t[0]
            if param.endswith("positions.weight") and t.shape[0] < p.shape[0]:
                raise CheckpointError(f"{where} has {t.shape[0]} rows, the config implies {p.shape[0]}")
            if tuple(t.shape) != tuple(p.shape):
                raise CheckpointError(f"{where} has shape {tuple(t.shape)}, the config implies {tuple(p.shape)}")
            if not bool(torch.isfinite(t).all()):
                raise CheckpointError(f"{where} holds NaN or inf; the model needs finite weights")
            p.copy_(t)
    used = set(plan.values()) | set(row.ignored)
    for name in names.map:
        if name not in used:
            raise CheckpointError(
                f"{kind}: {names.where} holds {name!r}, which the zoo's {kind} model does not read: a part it does "
                f"not model (or a config of another model)"
            )
    return model.to(target).eval()


# the ids that may be a list: every listed eos id ends a row; of several forced eos ids transformers' argmax
# takes the lowest (they tie)
LISTS = ("eos_token_id", "forced_eos_token_id")


def _token(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


# Settings greedy generation here does not apply, with the value that makes each one a no-op: a checkpoint
# that sets one (BART-CNN's generation_config asks min_length 56 and no_repeat_ngram_size 3) gets tokens that
# differ from its own generate(num_beams=1), and the session says so in its `note`.
UNHONOURED = {
    "min_length": 0,
    "min_new_tokens": None,
    "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0,
    "repetition_penalty": 1.0,
    "encoder_repetition_penalty": 1.0,
    "begin_suppress_tokens": None,
    "sequence_bias": None,
}


def _beam_keys(path: Path, gen: dict, data: dict) -> dict:
    """length_penalty, early_stopping and num_return_sequences where the checkpoint sets them (beam search's,
    runtime/beam_search.py), checked; None where it does not."""
    out = {}
    for key, ok, rule in (
        ("length_penalty", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "a number"),
        ("early_stopping", lambda v: v is True or v is False or v == "never", 'true, false or "never"'),
        ("num_return_sequences", _token, "an int >= 1"),
    ):
        v = gen.get(key, data.get(key))
        if v is not None and not ok(v):
            raise CheckpointError(f"{path}: {key}={v!r} must be {rule}")
        out[key] = v
    return out


def generation_settings(folder: str | os.PathLike) -> dict:
    """The token ids generation honours, and the beam keys (num_beams, length_penalty, early_stopping,
    num_return_sequences: runtime/seq2seq_beam.py). generation_config.json wins over config.json, as in transformers.
    eos_token_id and forced_eos_token_id keep a list where the checkpoint gives one; `suppress_tokens` (never
    generated) joins the single-token `bad_words_ids` (Marian bans its pad id so) and `suppress_tokens`;
    `bad_words_ids` longer than one token are kept as `bad_sequences`, and the UNHONOURED settings a checkpoint
    sets as `unhonoured` (neither is applied: the caller says so)."""
    path = Path(folder)
    data = config_dict(path / "config.json")
    gen_path = path / "generation_config.json"
    gen = {}
    if gen_path.is_file():
        try:
            gen = json.loads(gen_path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{gen_path}: not JSON ({e})") from None
    out = {}
    for key in (*GENERATION_KEYS, "num_beams"):
        v = gen.get(key, data.get(key))
        if key in LISTS and isinstance(v, list):
            if not all(_token(x) for x in v):
                raise CheckpointError(f"{path}: {key}={v!r} must be a token id or a list of them")
            out[key] = [int(x) for x in v] if v else None
            continue
        out[key] = v if _token(v) else None
    out.update(_beam_keys(path, gen, data))
    bad = gen.get("bad_words_ids", data.get("bad_words_ids")) or []
    suppress = gen.get("suppress_tokens", data.get("suppress_tokens")) or []
    if not isinstance(bad, list) or not all(isinstance(w, list) and w and all(map(_token, w)) for w in bad):
        raise CheckpointError(f"{path}: bad_words_ids={bad!r} must be a list of lists of token ids")
    if not isinstance(suppress, list) or not all(map(_token, suppress)):
        raise CheckpointError(f"{path}: suppress_tokens={suppress!r} must be a list of token ids")
    out["suppress_tokens"] = sorted({*suppress, *(w[0] for w in bad if len(w) == 1)}) or None
    out["bad_sequences"] = [w for w in bad if len(w) > 1] or None
    out["unhonoured"] = {
        k: v for k, neutral in UNHONOURED.items() if (v := gen.get(k, data.get(k))) is not None and v != neutral
    } or None
    if out["decoder_start_token_id"] is None:
        out["decoder_start_token_id"] = out["bos_token_id"]
    if out["decoder_start_token_id"] is None:
        raise CheckpointError(f"{path}: neither decoder_start_token_id nor bos_token_id is set; generation needs one")
    return out


__all__ = ["generation_settings", "is_seq2seq", "seq2seq_from_checkpoint", "seq2seq_row", "seq2seq_spec"]
