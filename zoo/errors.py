"""The one error root: every mistake a user can make with attnzoo raises a subclass of
`AttnzooError`, so callers (and the CLI) can catch the library's refusals without catching
its bugs. Each subclass keeps its builtin base too (ValueError, TypeError, RuntimeError),
so `except ValueError` keeps working."""

from __future__ import annotations


class AttnzooError(Exception):
    """Base of every error attnzoo raises for a user's mistake (a bad spec, input, path, flag)."""


class InputTypeError(AttnzooError, TypeError):
    """An argument of the wrong type (a tensor of the wrong dtype or device, a non-bool flag)."""


class ArgumentError(AttnzooError, ValueError):
    """An argument out of range, or inconsistent with the spec it goes with (a head index, a length)."""


class ResourceError(AttnzooError, ValueError):
    """A request that needs more memory than this machine has; the message gives both numbers."""


class SpecError(AttnzooError, ValueError):
    """An invalid `AttentionSpec` field or combination of fields."""


class UnknownNameError(AttnzooError, ValueError):
    """No registered attention block has this name."""


class DuplicateNameError(AttnzooError, ValueError):
    """A name is registered twice."""


class PresetFileError(AttnzooError, ValueError):
    """A preset file in models/ is malformed; the message names the file and the field."""


class InputError(AttnzooError, ValueError):
    """A tensor given to an attention module has the wrong rank, width or shape."""


class OutputPathError(AttnzooError, ValueError):
    """An output path that cannot be written as asked (a folder, a socket, an unwritable place)."""


class OutputExistsError(OutputPathError, FileExistsError):
    """An output that exists already, written without overwrite=True (CLI: --force); `except FileExistsError`
    catches it too."""


class MissingFileError(ArgumentError, FileNotFoundError):
    """A path argument that names no file (an .onnx model to load); the message says how to make one.
    `except FileNotFoundError` catches it too."""


# The interop's refusals (peers: transformers modules and configs, checkpoints). They live here, with the
# root, so `except zoo.CheckpointError` works without importing peers.
class HFConversionError(AttnzooError, ValueError):
    """A transformers module or config the zoo cannot express exactly, or a block that does not fit a module."""


class HFTypeError(AttnzooError, TypeError):
    """Not a transformers attention module of a supported class (or not a zoo block)."""


class CheckpointError(HFConversionError):
    """A checkpoint folder the zoo cannot read a block from: missing files or tensors, a wrong shape or
    dtype, a config that does not match the weights, a corrupt file. The message names the file."""


__all__ = [
    "ArgumentError",
    "AttnzooError",
    "CacheFullError",
    "CheckpointError",
    "DuplicateNameError",
    "HFConversionError",
    "HFTypeError",
    "InputError",
    "InputTypeError",
    "MissingFileError",
    "OutputExistsError",
    "OutputPathError",
    "PresetFileError",
    "ResourceError",
    "SpecError",
    "UnknownNameError",
]


class CacheFullError(InputError):
    """A decode step that would write past a static cache's capacity; nothing is written."""
