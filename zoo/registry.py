"""The zoo's registry: attention blocks by name, with fnmatch wildcards.

Presets are data: one TOML file per name in the repository's `models/` folder, loaded the
first time the registry is read. `register()` adds more from code. A user's own presets (same
format, same checks) come from the folders in the `ATTNZOO_PRESETS` environment variable (a path
list, read when the registry loads) or `add_presets(folder)` at run time; a name that clashes
with another preset is refused naming both files. The shipped presets' names are reserved: no
user preset, `register()` or `preset_toml` may take one, and `unregister()` does not remove one.
A folder named twice (or added again) is one folder: a file already registered from the same path
is not a clash with itself.
"""

from __future__ import annotations

import difflib
import fnmatch
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .attention import MultiHeadAttention
from .attention_spec import AttentionSpec, SpecError, field_names
from .errors import ArgumentError, DuplicateNameError, InputTypeError, PresetFileError, UnknownNameError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

# A wheel carries the presets as zoo/presets; a checkout (or editable install) reads
# <repo>/models. The installed copy goes first: site-packages/models could be anyone's.
_PRESET_DIRS = (
    Path(__file__).resolve().parent / "presets",
    Path(__file__).resolve().parent.parent / "models",
)
_TOP_LEVEL_KEYS = {"description", "reference", "spec"}
ENV = "ATTNZOO_PRESETS"  # os.pathsep-separated folders of user presets


@dataclass(frozen=True)
class Entry:
    name: str
    spec: AttentionSpec
    description: str = ""
    reference: str = ""
    source: str = "code"  # the TOML file it came from, or "code"


_REGISTRY: dict[str, Entry] = {}
_loaded = False


def register(
    name: str,
    spec: AttentionSpec | None = None,
    *,
    description: str = "",
    reference: str = "",
    source: str = "code",
    **fields: Any,
) -> Entry:
    """Register `spec` (or `AttentionSpec(**fields)`) under `name`. Duplicate names raise."""
    _ensure_loaded()
    return _add(name, spec, description=description, reference=reference, source=source, **fields)


def unregister(name: str) -> None:
    """Remove a name added with `register` or a user's preset (tests and notebooks use this).
    A shipped preset is refused: its name is reserved, and a variant takes a name of its own."""
    _ensure_loaded()
    _lookup(name)  # an unknown name is refused as unknown first
    if is_shipped(name):
        raise ArgumentError(reserved(name, "it stays registered"))
    del _REGISTRY[name]


def is_shipped(name: str) -> bool:
    """Whether `name` is one of the presets attnzoo ships (models/*.toml): a reserved name."""
    _ensure_loaded()
    e = _REGISTRY.get(name) if isinstance(name, str) else None
    return e is not None and e.source != "code" and Path(e.source).parent in _PRESET_DIRS


def names(pattern: str = "*") -> list[str]:
    """Sorted registered names matching an fnmatch pattern, e.g. names('mha-*')."""
    if not isinstance(pattern, str):
        raise InputTypeError(f"pattern must be a string such as 'mha-*', got {type(pattern).__name__}")
    _ensure_loaded()
    return sorted(n for n in _REGISTRY if fnmatch.fnmatchcase(n, pattern))


def entry(name: str) -> Entry:
    _ensure_loaded()
    return _lookup(name)


def spec(name: str, **overrides: Any) -> AttentionSpec:
    """The registered spec for `name`, with `overrides` (spec fields) applied and checked."""
    base = entry(name).spec
    return base.replace(**overrides) if overrides else base


def create(name: str, *, fused: bool = True, **overrides: Any) -> MultiHeadAttention:
    """A freshly initialised module for `name`; `overrides` are spec fields."""
    return MultiHeadAttention(spec(name, **overrides), fused=fused)


def add_presets(folder: str | os.PathLike) -> list[str]:
    """Register every `*.toml` preset in `folder` (the shipped presets' format and checks); returns
    the folder's names, all registered. All or nothing: a malformed file or a clashing name adds none
    of the folder's. Adding a folder again is no clash: a file registered before from the same path
    is kept (if it has changed since, it is refused: unregister its name first)."""
    if not isinstance(folder, (str, os.PathLike)) or str(folder) == "":
        raise InputTypeError(f"folder must be a path to a folder of *.toml presets, got {folder!r}")
    _ensure_loaded()
    return _load_dir(Path(folder))


load_presets = add_presets  # the older name


# -- internals ---------------------------------------------------------------------------


def _add(name: str, spec: AttentionSpec | None, **kw: Any) -> Entry:
    fields = {k: kw.pop(k) for k in list(kw) if k not in ("description", "reference", "source")}
    if _bad_name(name):
        raise ArgumentError(f"name={name!r} must be a non-empty string without spaces or wildcards")
    if spec is None:
        spec = AttentionSpec(**fields)
    elif fields:
        raise InputTypeError(f"give either a spec or spec fields for {name!r}, not both ({sorted(fields)})")
    if not isinstance(spec, AttentionSpec):
        raise InputTypeError(f"spec must be an AttentionSpec, got {type(spec).__name__}")
    if name in _REGISTRY:
        where = f" by {kw['source']}" if kw.get("source", "code") != "code" else ""
        if is_shipped(name):
            by = kw.get("source", "code")
            raise DuplicateNameError(reserved(name, f"{'register()' if by == 'code' else by} cannot take its name"))
        raise DuplicateNameError(
            f"{name!r} is registered twice{where} and by {_REGISTRY[name].source}; rename one of them"
        )
    e = Entry(name=name, spec=spec, **kw)
    _REGISTRY[name] = e
    return e


def reserved(name: str, what: str) -> str:
    """The one refusal of a shipped preset's name (a user's preset, `register`, `unregister`, `preset_toml`
    taking or dropping it); `what` says what became of the asking, e.g. "it stays registered"."""
    _ensure_loaded()
    return (
        f"{name!r} is a shipped preset ({_REGISTRY[name].source}): {what}; shipped names are reserved: "
        f"give your variant a name of its own, e.g. {'my-' + name!r}"
    )


def _bad_name(name: object) -> bool:
    return not isinstance(name, str) or not name or any(ch in name for ch in "*?[] \t")


def _lookup(name: str) -> Entry:
    if not isinstance(name, str):
        raise InputTypeError(f"name must be a string, got {type(name).__name__}")
    try:
        return _REGISTRY[name]
    except KeyError:
        close = difflib.get_close_matches(name, list(_REGISTRY), n=5, cutoff=0.4)
        hint = f"closest: {', '.join(close)}" if close else "see zoo.names() or `attnzoo list`"
        raise UnknownNameError(f"no attention block named {name!r}; {hint}") from None


def _ensure_loaded() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True  # set first: a malformed file must not make every later call re-read
    for d in _PRESET_DIRS:
        if d.is_dir():
            _load_dir(d)
            break
    for folder in user_folders():
        _load_dir(folder)


def user_folders() -> list[Path]:
    """The folders named by ATTNZOO_PRESETS (empty entries skipped, a folder named twice taken once);
    a missing one is refused."""
    folders, seen = [], set()
    for part in os.environ.get(ENV, "").split(os.pathsep):
        if not part.strip():
            continue
        folder = Path(part).expanduser()
        if not folder.is_dir():
            raise PresetFileError(
                f"{ENV}: {part} is not a folder; name folders of *.toml presets ({os.pathsep}-separated)"
            )
        if folder.resolve() not in seen:  # P:P, P:P/ or a link to P: one folder
            seen.add(folder.resolve())
            folders.append(folder)
    return folders


def _load_dir(directory: Path) -> list[str]:
    if not directory.is_dir():
        if directory.exists():
            raise PresetFileError(
                f"preset folder {directory} is not a folder; name the folder that holds the *.toml presets"
                + (f" ({directory.parent})" if directory.suffix == ".toml" else "")
            )
        raise PresetFileError(f"preset folder {directory} does not exist")
    read = [(read_preset(path), path) for path in sorted(directory.glob("*.toml"))]
    new = []
    for (name, spec, meta), path in read:  # every clash is found before anything is added
        if name not in _REGISTRY:
            new.append((name, spec, meta, path))
            continue
        old = _REGISTRY[name]
        if old.source != "code" and Path(old.source).resolve() == path.resolve():  # the same file again
            if (old.spec, old.description, old.reference) != (spec, meta["description"], meta["reference"]):
                raise DuplicateNameError(
                    f"{path} has changed since it was registered as {name!r}; "
                    f"zoo.unregister({name!r}) first to register the new version"
                )
            continue
        if is_shipped(name):
            raise DuplicateNameError(reserved(name, f"{path} cannot take its name"))
        raise DuplicateNameError(f"{name!r} is registered twice: by {path} and by {old.source}; rename one of them")
    for name, spec, meta, path in new:
        _add(name, spec, source=str(path), **meta)
    return [name for (name, _, _), _ in read]


def read_preset(path: str | Path) -> tuple[str, AttentionSpec, dict[str, str]]:
    """Parse one preset file: (name, spec, {description, reference}). Name = file stem."""
    path = Path(path)
    if _bad_name(path.stem):
        fixed = "".join("-" if ch in "*?[] \t" else ch for ch in path.stem) or "my-preset"
        raise PresetFileError(
            f"{path}: a preset's name is its file's stem, and {path.stem!r} has spaces or wildcards; "
            f"rename the file, e.g. to {fixed}.toml"
        )
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise PresetFileError(f"{path}: not valid TOML ({str(e).splitlines()[0]})") from None
    except UnicodeDecodeError as e:
        raise PresetFileError(f"{path}: not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start})") from None
    unknown = sorted(set(data) - _TOP_LEVEL_KEYS)
    if unknown:
        raise PresetFileError(f"{path}: unknown key(s) {unknown}; allowed: {sorted(_TOP_LEVEL_KEYS)}")
    meta = {}
    for key in ("description", "reference"):
        value = data.get(key, "")
        if not isinstance(value, str):
            raise PresetFileError(f"{path}: field {key!r} must be a string, got {value!r}")
        meta[key] = value
    fields = data.get("spec")
    if not isinstance(fields, dict):
        raise PresetFileError(f"{path}: missing [spec] table (fields: {field_names()})")
    bad = sorted(set(fields) - set(field_names()))
    if bad:
        raise PresetFileError(f"{path}: unknown field(s) [spec].{bad}; valid: {field_names()}")
    try:
        spec = AttentionSpec(**fields)
    except SpecError as e:
        raise PresetFileError(f"{path}: [spec] {e}") from None
    return path.stem, spec, meta
