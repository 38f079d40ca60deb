"""A sentence-transformers folder read as sentence-transformers reads it: `sentence_encoder(folder)`.

    modules.json                          the pipeline: Transformer, Pooling, optional Normalize (others refused)
    <pooling path>/config.json            pooling_mode ("cls", "mean", "max", "mean_sqrt_len_tokens" or a
                                          tuple), or the older pooling_mode_*_token(s) booleans
    sentence_bert_config.json             max_seq_length (else the tokenizer's model_max_length, else the
                                          config's max_position_embeddings): texts are truncated to it
    config_sentence_transformers.json     prompts and default_prompt_name

A plain transformers folder (no modules.json) is read as sentence-transformers does: mean pooling, no
normalization. JSON only, beside peers/encoder.py's safetensors reading: no sentence-transformers needed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from zoo.encoder import POOLING_MODES, Pooling, SentenceEncoder
from zoo.errors import CheckpointError, HFConversionError, InputTypeError

from .encoder import encoder_from_checkpoint

# legacy booleans of 1_Pooling/config.json -> the mode they switch on (sentence-transformers' own table)
LEGACY_POOLING = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
# the config files sentence-transformers tries for its Transformer module, in its order
TRANSFORMER_CONFIGS = (
    "sentence_bert_config.json",
    "sentence_roberta_config.json",
    "sentence_distilbert_config.json",
    "sentence_camembert_config.json",
    "sentence_xlm-roberta_config.json",
)
HUGE = 10**12  # transformers' "no limit" model_max_length is 1e30


def _json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: cannot be read as JSON ({e})") from None
    if not isinstance(data, (dict, list)):
        raise CheckpointError(f"{path}: holds a {type(data).__name__}, not a JSON object")
    return data


def _modules(folder: Path) -> tuple[Path, Path | None, bool]:
    """(the Transformer module's folder, the Pooling module's folder or None, Normalize present)."""
    entries = _json(folder / "modules.json")
    if not isinstance(entries, list):
        raise CheckpointError(f"{folder / 'modules.json'}: expected a list of modules")
    transformer = pooling = None
    normalize = False
    for i, m in enumerate(entries):
        kind = str(m.get("type", "")) if isinstance(m, dict) else ""
        name, path = kind.rsplit(".", 1)[-1], folder / str(m.get("path", "") if isinstance(m, dict) else "")
        order = ["Transformer", "Pooling", "Normalize"]
        if name not in order:
            raise CheckpointError(
                f"{folder / 'modules.json'}: module {i} is {kind!r}; the zoo reads Transformer, Pooling and "
                f"Normalize (a {name} module is not modelled)"
            )
        if (name == "Transformer" and i != 0) or (name == "Pooling" and transformer is None) or normalize:
            raise CheckpointError(
                f"{folder / 'modules.json'}: module {i} ({name}) out of order; the zoo reads Transformer, then "
                f"Pooling, then Normalize"
            )
        if name == "Transformer":
            transformer = path
        elif name == "Pooling":
            pooling = path
        else:
            normalize = True
    if transformer is None:
        raise CheckpointError(f"{folder / 'modules.json'}: no Transformer module; the zoo reads text encoders")
    return transformer, pooling, normalize


def _pooling_modes(path: Path) -> tuple[str, ...]:
    cfg = _json(path / "config.json")
    mode = cfg.get("pooling_mode")
    if mode is None:
        mode = [m for key, m in LEGACY_POOLING.items() if cfg.get(key)]
    modes = (mode,) if isinstance(mode, str) else tuple(mode)
    if not modes:
        raise CheckpointError(f"{path / 'config.json'}: no pooling mode is switched on")
    for m in modes:
        if m not in POOLING_MODES:
            raise CheckpointError(
                f"{path / 'config.json'}: pooling mode {m!r} is not modelled; the zoo pools with "
                f"{', '.join(POOLING_MODES)}"
            )
    if cfg.get("include_prompt", True) is False:
        raise CheckpointError(
            f"{path / 'config.json'}: include_prompt=false (the prompt's tokens left out of the pooling) is not "
            f"modelled; pool over the whole text"
        )
    return modes


def _max_seq_length(transformer: Path, positions: int) -> int:
    """sentence-transformers' max_seq_length: its config's, else the tokenizer's model_max_length, else the
    model's positions; never past the positions the model has."""
    for name in TRANSFORMER_CONFIGS:
        if (transformer / name).is_file():
            value = _json(transformer / name).get("max_seq_length")
            if value is not None:
                return min(int(value), positions)
            break
    tok = transformer / "tokenizer_config.json"
    if tok.is_file():
        value = _json(tok).get("model_max_length")
        if isinstance(value, (int, float)) and value < HUGE:
            return min(int(value), positions)
    return positions


def sentence_encoder(folder: str | os.PathLike, dtype: Any = None) -> SentenceEncoder:
    """The sentence-transformers model in `folder` (or a plain transformers encoder folder, mean-pooled as
    sentence-transformers pools one) as a zoo SentenceEncoder: model(input_ids, attention_mask,
    token_type_ids) -> (b e), equal to SentenceTransformer(folder).encode for the same token ids."""
    if not isinstance(folder, (str, os.PathLike)):
        raise InputTypeError(f"folder must be a path to a model folder, got {type(folder).__name__}")
    root = Path(folder)
    if (root / "modules.json").is_file():
        transformer, pooling_path, normalize = _modules(root)
        modes = _pooling_modes(pooling_path) if pooling_path is not None else ("mean",)
    else:
        transformer, modes, normalize = root, ("mean",), False
    encoder = encoder_from_checkpoint(transformer, dtype)
    config = _json(transformer / "config.json")
    positions = encoder.spec.max_positions or int(config.get("max_position_embeddings") or HUGE)
    st_config = root / "config_sentence_transformers.json"
    extra = _json(st_config) if st_config.is_file() else {}
    prompts = extra.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(isinstance(v, str) for v in prompts.values()):
        raise CheckpointError(f"{st_config}: prompts must map names to texts")
    return SentenceEncoder(
        encoder,
        Pooling(modes, normalize),
        max_seq_length=_max_seq_length(transformer, positions),
        prompts=prompts,
        default_prompt_name=extra.get("default_prompt_name"),
    )


def is_encoder_folder(folder: str | os.PathLike) -> bool:
    """A folder whose config.json names a whole-encoder family (or a sentence-transformers folder)."""
    from .config import config_dict, model_type
    from .encoder_rows import ENCODER_FAMILIES

    root = Path(folder)
    if (root / "modules.json").is_file():
        return True
    if not (root / "config.json").is_file():
        return False
    try:
        return model_type(config_dict(root / "config.json")) in ENCODER_FAMILIES
    except HFConversionError:
        return False


def tokenizer_facts(folder: str | os.PathLike) -> tuple[Path, int, bool]:
    """(the tokenizer.json, the id it pads with, lower-case the texts) of a model folder, as
    sentence-transformers' tokenizer reads them: pad_token from tokenizer_config.json (else the config's
    pad_token_id, else 0); do_lower_case from its sentence_bert_config.json."""
    root = Path(folder)
    transformer = _modules(root)[0] if (root / "modules.json").is_file() else root
    path = transformer / "tokenizer.json"
    if not path.is_file():
        raise CheckpointError(
            f"{transformer}: no tokenizer.json; save the model's fast tokenizer there (save_pretrained)"
        )
    pad = None
    tok_cfg = transformer / "tokenizer_config.json"
    token = _json(tok_cfg).get("pad_token") if tok_cfg.is_file() else None
    token = token.get("content") if isinstance(token, dict) else token
    if isinstance(token, str):
        vocab = _json(path).get("model", {}).get("vocab")
        added = {t.get("content"): t.get("id") for t in _json(path).get("added_tokens", []) if isinstance(t, dict)}
        pad = added.get(token, vocab.get(token) if isinstance(vocab, dict) else None)
    if pad is None:
        config = _json(transformer / "config.json") if (transformer / "config.json").is_file() else {}
        pad = config.get("pad_token_id") or 0
    lower = False
    for name in TRANSFORMER_CONFIGS:
        if (transformer / name).is_file():
            lower = bool(_json(transformer / name).get("do_lower_case", False))
            break
    return path, int(pad), lower


__all__ = ["LEGACY_POOLING", "is_encoder_folder", "sentence_encoder", "tokenizer_facts"]
