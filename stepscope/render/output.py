"""Writing a rendered file: all or nothing (temp file in the same folder, then rename)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from stepscope.errors import StepscopeError


class OutputError(StepscopeError):
    """The output path cannot be written."""


def write_atomic(path: str | Path, text: str | bytes) -> Path:
    """Write `text` (or bytes) to `path` so that readers see either the old file or the whole new one.

    A failure (missing folder, no permission, full disk) raises OutputError with one line and
    leaves nothing behind: the temp file is removed.
    """
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise OutputError(f"cannot write {path}: it is a directory; give a file name")
    if not parent.exists():
        raise OutputError(f"cannot write {path}: folder {parent} does not exist")
    if not parent.is_dir():
        raise OutputError(f"cannot write {path}: {parent} is not a folder")
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=parent)
        with (os.fdopen(fd, "wb") if isinstance(text, bytes) else os.fdopen(fd, "w", encoding="utf-8")) as f:
            f.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the usual permissions
        os.replace(tmp, path)
        tmp = None
    except OSError as e:
        raise OutputError(f"cannot write {path}: {e.strerror or e}") from None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    return path
