"""attnzoo's zoo: multi-head attention variants as einops modules, by name.

import zoo
zoo.names("mha-*")
m = zoo.create("mha-combined-bias", d_model=256, heads=4)
y = m(x)                                   # x (b t c) -> y (b t c)
"""

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
from .checkpoint import CheckpointError, from_checkpoint
from .errors import (
    ArgumentError,
    AttnzooError,
    CacheFullError,
    InputError,
    InputTypeError,
    MissingFileError,
    OutputExistsError,
    OutputPathError,
    ResourceError,
)
from .heads import get_projections, permute_heads, prune_heads, to_combined, to_separate

# transformers is imported inside from_hf/to_hf only: `import zoo` works without it.
from .hf import HFConversionError as HFConversionError
from .hf import HFTypeError as HFTypeError
from .hf import from_hf as from_hf
from .hf import to_hf as to_hf
from .hf_config import preset_toml, spec_from_config
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
from .torch_peer import from_torch_mha, to_torch_mha

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
