"""attnzoo's peers: zoo blocks to and from the attention modules of other libraries and their files.

    transformers.py  from_hf / to_hf (a transformers attention module <-> a block), family_table
    rows.py          the Row type, and the one reader / writer of a module's weights by its row
    fused_qkv.py     the fused Q|K|V row layouts that reader and writer split and fuse
    classes.py       the rows, one per transformers attention class (the family table)
    checks.py        the readers and refusal checks the rows share
    model_types.py   per config model_type: what its attention module computes from the config
    config.py        spec_from_config: a config (object, dict, config.json) -> a layer's spec
    preset.py        preset_toml: a preset file from a config, each field citing its source
    checkpoint.py    from_checkpoint: a layer's block straight from safetensors files
    torch_mha.py     from_torch_mha / to_torch_mha: torch.nn.MultiheadAttention
    measured.json    the parity cases' measured errors (scripts/measure_hf.py)

Depends on `zoo`; `zoo` re-exports these names on first use, so `import zoo` imports neither
this package nor transformers nor safetensors. transformers and safetensors are imported inside
the functions that read their objects and files.
"""

from zoo.errors import CheckpointError, HFConversionError, HFTypeError

from .checkpoint import from_checkpoint
from .config import spec_from_config
from .preset import preset_toml
from .torch_mha import from_torch_mha, to_torch_mha
from .transformers import family_table, from_hf, measured_errors, spec_from_hf, supported_classes, to_hf

__all__ = [
    "CheckpointError",
    "HFConversionError",
    "HFTypeError",
    "family_table",
    "from_checkpoint",
    "from_hf",
    "from_torch_mha",
    "measured_errors",
    "preset_toml",
    "spec_from_config",
    "spec_from_hf",
    "supported_classes",
    "to_hf",
    "to_torch_mha",
]
