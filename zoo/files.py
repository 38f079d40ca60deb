"""Output files: written whole or not at all, never replacing what is not a regular file.

Every writer of the package (ONNX exports, JSON reports, pictures) goes through here:

- a regular file (or a new name) is written into a temp file beside it and renamed into place,
  so a reader never sees half a file; the result gets the mode `open()` would give it: the
  mode of the file it replaces, or 0o666 less the umask for a new one;
- a symlink named as the output is itself the output, never a way to its target: like a file it is
  refused without overwrite (CLI: --force) and replaced by the new file with it, and the file it
  points at (or would point at) is left as it was. `mv`, `ln -sf` and the atomic-save of editors
  do the same; writing through it would let one stray link turn `--force` against an unrelated file.
  A folder on the way may be a link (it is followed); a dangling one is refused: it names no folder;
- a character device or a FIFO (`/dev/null`, `/dev/stdout`, a named pipe), named or linked to, is
  written through, as `cat > path` would: replacing it would, as root, replace the system's /dev/null;
- anything else that exists (a folder, a link to one, a socket, a block device) is refused with one line.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from .errors import OutputPathError

TEMP_PREFIX = ".attnzoo-"  # temp files and folders beside an output; stale ones are swept
STALE_SECONDS = 3600


def resolve_output(path: str | os.PathLike) -> Path:
    """The path a write really goes to: the named path in its real folder (a symlink there is replaced,
    never followed), or the device or FIFO it names; refuses what cannot be written. Returns an absolute path."""
    if str(path) == "":
        raise OutputPathError("the output path is empty; name a file")
    _refuse_dangling(path)
    here = Path(os.path.abspath(path))
    target = Path(os.path.realpath(here.parent)) / here.name
    try:
        st = target.stat()  # what a link there points at
    except (FileNotFoundError, NotADirectoryError):  # a new file, or a link to none (replaced as a file is)
        return target
    except OSError as e:
        raise OutputPathError(f"cannot write {path}: {e.strerror or e}") from None
    if stat.S_ISREG(st.st_mode) or stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode):
        return target  # a regular file or a link is replaced; a device or FIFO, or a link to one, written through
    kind = "a folder" if stat.S_ISDIR(st.st_mode) else _kind(st.st_mode)
    if target.is_symlink():
        kind = f"a symlink to {kind} ({os.readlink(target)})"
    raise OutputPathError(f"cannot write {path}: it is {kind}; name a file")


def _refuse_dangling(path: str | os.PathLike) -> None:
    """A symlink among the folders on the way to `path` whose target is missing."""
    here = Path(os.path.abspath(path))
    for p in here.parents:
        if p.is_symlink() and not p.exists():
            raise OutputPathError(
                f"cannot write {path}: its folder {p} is a dangling symlink (to {os.readlink(p)}, which does not "
                "exist); point the link at an existing folder, or name another path"
            )


def _kind(mode: int) -> str:
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISBLK(mode):
        return "a block device"
    return "not a regular file"


def weights_file(path: str | os.PathLike) -> Path:
    """The file beside an export that holds its weights (external data): PATH.data."""
    path = Path(path)
    return path.with_name(path.name + ".data")


def is_special(path: Path) -> bool:
    """A character device or FIFO, or a link to one: written through, never replaced."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return False
    return stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)


def new_file_mode(existing: Path | None = None) -> int:
    """The mode `open()` would leave: the replaced file's own, or 0o666 less the umask (a replaced
    link's too: the file it pointed at is not the one replaced)."""
    if existing is not None:
        try:
            st = existing.lstat()
            if stat.S_ISREG(st.st_mode):
                return stat.S_IMODE(st.st_mode)
        except OSError:
            pass
    return 0o666 & ~current_umask()


def current_umask() -> int:
    try:  # Linux says it without changing it (os.umask can only be read by setting it)
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


def ensure_writable_parent(path: str | os.PathLike) -> None:
    """Create `path`'s folder if needed and check it can be written, before any long work.

    The check writes (and removes) a probe file: os.access says yes to root on a read-only
    mount, and the rename at the end must not be the first thing to find out. A path that
    exists and cannot be written (a folder, a socket) is refused here too, naming it."""
    target = resolve_output(path)
    if is_special(target):
        return  # written through: nothing is created beside it
    for folder in (target.parent, *target.parent.parents):
        if folder.exists():
            if not folder.is_dir():
                raise OutputPathError(f"cannot write {path}: {folder} is not a folder")
            break
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputPathError(f"cannot create the folder for {path}: {e.strerror or e}") from None
    try:
        fd, probe = tempfile.mkstemp(prefix=TEMP_PREFIX + "probe-", dir=target.parent)
    except OSError as e:
        raise OutputPathError(f"cannot write {path}: {e.strerror or e} ({target.parent})") from None
    os.close(fd)
    os.unlink(probe)
    sweep_stale(target.parent)


def sweep_stale(folder: Path, prefix: str = TEMP_PREFIX, age: float = STALE_SECONDS) -> None:
    """Remove temp files/folders an earlier run left when it was killed (SIGKILL skips cleanup);
    younger ones may be another process's work in progress and are kept."""
    now = time.time()
    try:
        entries = list(Path(folder).glob(prefix + "*"))
    except OSError:
        return
    for p in entries:
        try:
            if now - p.lstat().st_mtime < age:
                continue
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
        except OSError:
            pass


def _exists_error(path: Path) -> FileExistsError:
    return FileExistsError(f"{path} exists; pass overwrite=True (CLI: --force) to replace it")


def publish(tmp: Path, path: Path, *, overwrite: bool, through: bool = True) -> None:
    """Move the finished file `tmp` to `path`, atomically. Without `overwrite` the final step is
    exclusive (a hard link, or an O_EXCL claim where links are unsupported): of two writers
    racing for one name exactly one wins and the other gets FileExistsError.

    `path` is what `resolve_output` returned. A character device or FIFO there gets `tmp`'s
    bytes written through (it is not replaced, so `overwrite` does not apply); with `through=False` (a file
    that must be a file, such as an export's weights) a link to one is replaced like any link."""
    if through and is_special(path):
        with open(tmp, "rb") as src, open(path, "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.unlink(tmp)
        return
    os.chmod(tmp, new_file_mode(path if overwrite else None))
    if overwrite:
        os.replace(tmp, path)
        return
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise _exists_error(path) from None
    except OSError:  # no hard links here (some network and FAT filesystems)
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            raise _exists_error(path) from None
        os.close(fd)
        os.replace(tmp, path)  # over our own empty claim
        return
    os.unlink(tmp)


def write_atomic(path: str | os.PathLike, write: Callable[[Path], None], *, overwrite: bool = True) -> Path:
    """write(tmp) into a temp file beside `path` (in its real folder), then publish it there
    (see the module docstring for links and special files). Returns the path written."""
    target = resolve_output(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.gettempdir()) if is_special(target) else target.parent
    try:
        fd, tmp = tempfile.mkstemp(prefix=f"{TEMP_PREFIX}{target.name}.", suffix=target.suffix, dir=folder)
    except OSError as e:
        raise OutputPathError(f"cannot write {path}: {e.strerror or e}") from None
    os.close(fd)
    try:
        write(Path(tmp))
        publish(Path(tmp), target, overwrite=overwrite)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target
