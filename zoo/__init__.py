"""attnzoo's zoo: multi-head attention variants as einops modules, by name.

import zoo
zoo.names("mha-*")
m = zoo.create("mha-combined-bias", d_model=256, heads=4)
y = m(x)                                   # x (b t c) -> y (b t c)

The interop (from_hf / to_hf, from_checkpoint, spec_from_config, preset_toml, from_torch_mha /
to_torch_mha) lives in the `peers` package, which imports zoo. zoo hands those names on, importing
peers on first use: `import zoo` imports neither peers nor transformers nor safetensors.
"""

import importlib
from typing import Any

from .errors import (
    ArgumentError,
    AttnzooError,
    CacheFullError,
    CheckpointError,
    DuplicateNameError,
    InputError,
    InputTypeError,
    MissingFileError,
    OutputExistsError,
    OutputPathError,
    PresetFileError,
    ResourceError,
    SpecError,
    UnknownNameError,
)
from .errors import HFConversionError as HFConversionError
from .errors import HFTypeError as HFTypeError

# name -> the zoo module that defines it, imported on first use: `import zoo` imports no torch, so a
# process that only runs an export (export.OnnxSession: onnxruntime and numpy) never loads it.
_LAZY = {
    "FLOP_CONVENTION": "zoo.accounting",
    "bytes_moved": "zoo.accounting",
    "count_parameters": "zoo.accounting",
    "flops": "zoo.accounting",
    "parameter_breakdown": "zoo.accounting",
    "score_entries": "zoo.accounting",
    "stage_shapes": "zoo.accounting",
    "explicit_attention": "zoo.attend",
    "fused_attention": "zoo.attend",
    "MultiHeadAttention": "zoo.attention",
    "StaticCache": "zoo.cache",
    "DecoderLM": "zoo.lm",
    "LMSpec": "zoo.lm",
    "Encoder": "zoo.encoder",
    "EncoderSpec": "zoo.encoder",
    "Pooling": "zoo.encoder",
    "SentenceEncoder": "zoo.encoder",
    "Seq2SeqLM": "zoo.seq2seq",
    "Seq2SeqSpec": "zoo.seq2seq",
    "get_projections": "zoo.heads",
    "permute_heads": "zoo.heads",
    "prune_heads": "zoo.heads",
    "to_combined": "zoo.heads",
    "to_separate": "zoo.heads",
    "Entry": "zoo.registry",
    "add_presets": "zoo.registry",
    "create": "zoo.registry",
    "entry": "zoo.registry",
    "load_presets": "zoo.registry",
    "names": "zoo.registry",
    "read_preset": "zoo.registry",
    "register": "zoo.registry",
    "spec": "zoo.registry",
    "unregister": "zoo.registry",
    "AttentionSpec": "zoo.attention_spec",
    "parse_overrides": "zoo.attention_spec",
}

__version__ = "0.1.0"

__all__ = [
    "MissingFileError",
    "OutputExistsError",
    "OutputPathError",
    "ArgumentError",
    "AttnzooError",
    "InputTypeError",
    "ResourceError",
    "add_presets",
    "FLOP_CONVENTION",
    "AttentionSpec",
    "CacheFullError",
    "CheckpointError",
    "StaticCache",
    "DuplicateNameError",
    "Entry",
    "InputError",
    "MultiHeadAttention",
    "PresetFileError",
    "SpecError",
    "UnknownNameError",
    "__version__",
    "bytes_moved",
    "count_parameters",
    "create",
    "entry",
    "explicit_attention",
    "flops",
    "from_checkpoint",
    "from_torch_mha",
    "lm_from_checkpoint",
    "lm_from_hf",
    "encoder_from_checkpoint",
    "sentence_encoder",
    "DecoderLM",
    "LMSpec",
    "Encoder",
    "EncoderSpec",
    "Pooling",
    "SentenceEncoder",
    "Seq2SeqLM",
    "Seq2SeqSpec",
    "seq2seq_from_checkpoint",
    "fused_attention",
    "get_projections",
    "load_presets",
    "names",
    "parameter_breakdown",
    "parse_overrides",
    "permute_heads",
    "preset_toml",
    "prune_heads",
    "read_preset",
    "register",
    "score_entries",
    "spec",
    "spec_from_config",
    "stage_shapes",
    "to_combined",
    "to_separate",
    "to_torch_mha",
    "unregister",
]

# name -> the module of peers that defines it (the one import of peers zoo makes, in __getattr__)
_PEERS = {
    "from_hf": "peers.transformers",
    "to_hf": "peers.transformers",
    "from_checkpoint": "peers.checkpoint",
    "lm_from_checkpoint": "peers.lm",
    "lm_from_hf": "peers.lm",
    "encoder_from_checkpoint": "peers.encoder",
    "sentence_encoder": "peers.sentence",
    "seq2seq_from_checkpoint": "peers.seq2seq",
    "spec_from_config": "peers.config",
    "preset_toml": "peers.preset",
    "from_torch_mha": "peers.torch_mha",
    "to_torch_mha": "peers.torch_mha",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # bound once imported: later lookups are plain attribute reads
        return value
    if name in _PEERS:
        return getattr(importlib.import_module(_PEERS[name]), name)
    raise AttributeError(f"module 'zoo' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY, *_PEERS})
