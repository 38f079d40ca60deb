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

from .accounting import (
    FLOP_CONVENTION,
    bytes_moved,
    count_parameters,
    flops,
    parameter_breakdown,
    score_entries,
    stage_shapes,
)
from .attend import explicit_attention, fused_attention
from .attention import MultiHeadAttention
from .cache import StaticCache
from .errors import (
    ArgumentError,
    AttnzooError,
    CacheFullError,
    CheckpointError,
    InputError,
    InputTypeError,
    MissingFileError,
    OutputExistsError,
    OutputPathError,
    ResourceError,
)
from .errors import HFConversionError as HFConversionError
from .errors import HFTypeError as HFTypeError
from .lm import DecoderLM, LMSpec
from .heads import get_projections, permute_heads, prune_heads, to_combined, to_separate
from .registry import (
    DuplicateNameError,
    Entry,
    PresetFileError,
    UnknownNameError,
    add_presets,
    create,
    entry,
    load_presets,
    names,
    read_preset,
    register,
    spec,
    unregister,
)
from .spec import AttentionSpec, SpecError, parse_overrides

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
    "DecoderLM",
    "LMSpec",
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
    "spec_from_config": "peers.config",
    "preset_toml": "peers.preset",
    "from_torch_mha": "peers.torch_mha",
    "to_torch_mha": "peers.torch_mha",
}


def __getattr__(name: str) -> Any:
    if name in _PEERS:
        return getattr(importlib.import_module(_PEERS[name]), name)
    raise AttributeError(f"module 'zoo' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_PEERS})
