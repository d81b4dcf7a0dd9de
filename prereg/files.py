"""Atomic file writes: a file is complete or absent, never half-written, and a record is never replaced.

Standard library only (it serves :mod:`prereg.formats.record`, which the torch-free analysis imports).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from prereg.errors import RefusedError, WriteError  # standard library only, like this module


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _free(directory: Path) -> str:
    try:
        return f"{shutil.disk_usage(directory).free} bytes free"
    except OSError:
        return "free space unknown"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _umask()


def atomic_write(path: Path, data: bytes, *, overwrite: bool, sync: bool = True) -> None:
    """Write via a temporary file, fsync (unless ``sync`` is false: a hint file, not a result)
    and rename. With ``overwrite=False`` an existing file is
    never replaced (the final step is a hard link, which fails if the name exists). Any write error
    (a full disk, a read-only or failing filesystem) raises :class:`WriteError` naming the file and
    the free space, and leaves nothing behind: the file is either complete or absent."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.fchmod(fd, 0o666 & ~_UMASK)  # as open() would make it (mkstemp's 0600 would hide a hosted page)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if sync:
                os.fsync(f.fileno())
        if overwrite:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)
            except FileExistsError as e:
                raise RefusedError(f"refusing to overwrite existing record {path}") from e
            os.unlink(tmp)
        if sync:
            _fsync_dir(path.parent)
    except OSError as e:
        raise WriteError(
            f"cannot write {path}: {e.strerror or e} ({_free(path.parent)} on its filesystem); "
            "nothing was half-written: free space (or fix the folder) and run the same command "
            "again to resume"
        ) from e
    finally:
        if tmp is not None and os.path.exists(tmp):
            try:
                os.unlink(tmp)
            except OSError:
                pass
