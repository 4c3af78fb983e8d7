"""Writing a rendered file: all or nothing (temp file in the same folder, then rename)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable

from stepscope.errors import StepscopeError
from stepscope.paths import shown


class OutputError(StepscopeError):
    """The output path cannot be written."""


def write_atomic(path: str | Path, text: str | bytes) -> Path:
    """Write `text` (or bytes) to `path` so that readers see either the old file or the whole new one.

    A failure (missing folder, no permission, full disk) raises OutputError with one line and
    leaves nothing behind: the temp file is removed.
    """
    def write(tmp: Path) -> None:
        if isinstance(text, bytes):  # e.g. a gzipped export
            tmp.write_bytes(text)
            return
        # errors="replace": a name that is not UTF-8 (a file name's raw bytes) cannot fail the write
        with open(tmp, "w", encoding="utf-8", errors="replace") as f:
            f.write(text)

    return write_atomic_with(path, write)


def write_atomic_with(path: str | Path, write: Callable[[Path], None]) -> Path:
    """`write(tmp)` fills a temp file beside `path`, which then replaces `path` in one rename
    (Parquet and CSV writers take a path, not text)."""
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    try:
        if path.is_dir():
            raise OutputError(f"cannot write {shown(path)}: it is a directory; give a file name")
        if not parent.exists():
            raise OutputError(f"cannot write {shown(path)}: folder {shown(parent)} does not exist")
        if not parent.is_dir():
            raise OutputError(f"cannot write {shown(path)}: {shown(parent)} is not a folder")
    except OSError as e:  # a name too long for the file system, a folder that cannot be searched
        raise OutputError(f"cannot write {shown(path)}: {e.strerror or e}") from None
    tmp = None
    try:
        # the temp name is short: a long output name plus a prefix and suffix could pass the
        # file system's 255-byte limit that the output name itself meets
        fd, tmp = tempfile.mkstemp(prefix=".stepscope-", suffix=".tmp", dir=parent)
        os.close(fd)
        write(Path(tmp))
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the usual permissions
        os.replace(tmp, path)
        tmp = None
    except OSError as e:
        raise OutputError(f"cannot write {shown(path)}: {e.strerror or e}") from None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    return path
