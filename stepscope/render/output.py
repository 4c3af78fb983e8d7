"""Writing a rendered file: all or nothing (temp file in the same folder, then rename).

What the rename may replace is checked first: `-` is stdout; an existing target must be a
regular file (a rename over a device, FIFO or socket would replace it with a file, which is how
`-o /dev/null` run as root used to delete the system's /dev/null); a symlink is followed and its
target written in place (the link kept); a read-only file is refused unless `force`.
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
import tempfile
from pathlib import Path
from typing import Callable

from stepscope.errors import StepscopeError
from stepscope.paths import shown


class OutputError(StepscopeError):
    """The output path cannot be written."""


STDOUT = "-"

_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISDIR, "a directory"))


def is_stdout(path) -> bool:
    """`-o -`: the output goes to stdout."""
    return path is not None and os.fspath(path) == STDOUT


def target(path: str | Path, force: bool = False) -> Path:
    """The file a write to `path` replaces: `path` itself, or the file its symlink(s) lead to.

    OutputError (one line) when that is not a regular file or not a new one: a device, FIFO,
    socket or directory (also behind a symlink), a dangling symlink, or a read-only file without
    `force`. Read-only is judged by the mode bits, not access(): root may write anything.
    """
    path = Path(path)
    try:
        link = path.is_symlink()
        st = path.stat() if (link or path.exists()) else None
    except FileNotFoundError:  # a dangling symlink: writing would create a file wherever it points
        raise OutputError(f"cannot write {shown(path)}: it is a symlink to {shown(os.readlink(path))}, "
                          "which does not exist; give a file name") from None
    except OSError as e:  # a name too long, a symlink loop, a folder that cannot be searched
        raise OutputError(f"cannot write {shown(path)}: {e.strerror or e}") from None
    if st is None:
        return path
    via = " (through its symlink)" if link else ""
    if not stat.S_ISREG(st.st_mode):
        if stat.S_ISDIR(st.st_mode):
            raise OutputError(f"cannot write {shown(path)}: it is a directory{via}; give a file name")
        kind = next((k for test, k in _KINDS if test(st.st_mode)), "not a regular file")
        raise OutputError(f"cannot write {shown(path)}: it is {kind}{via}, not a regular file; "
                          "stepscope writes only regular files (give a file name, or -o - for stdout)")
    if not force and not st.st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH):
        raise OutputError(f"cannot write {shown(path)}: it is read-only{via}; pass --force to replace it")
    return Path(os.path.realpath(path)) if link else path


def write_atomic(path: str | Path, text: str | bytes, force: bool = False) -> Path:
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

    return write_atomic_with(path, write, force)


def _to_stdout(write: Callable[[Path], None]) -> Path:
    """`write(tmp)` into a private temp folder, then its bytes copied to stdout."""
    with tempfile.TemporaryDirectory(prefix="stepscope-") as d:
        tmp = Path(d) / "out"
        try:
            write(tmp)
        except OSError as e:
            raise OutputError(f"cannot write to stdout: {e.strerror or e}") from None
        sys.stdout.flush()
        out = getattr(sys.stdout, "buffer", None)
        with open(tmp, "rb") as f:
            if out is None:  # a text stream (a test's capture): the text is UTF-8
                sys.stdout.write(f.read().decode("utf-8", "replace"))
            else:
                shutil.copyfileobj(f, out)
                out.flush()
        sys.stdout.flush()
    return Path(STDOUT)


def write_atomic_with(path: str | Path, write: Callable[[Path], None], force: bool = False) -> Path:
    """`write(tmp)` fills a temp file beside `path`, which then replaces `path` in one rename
    (Parquet and CSV writers take a path, not text); `-` writes to stdout. What `path` names
    is checked first (`target`); a symlink's target is replaced, not the link."""
    if is_stdout(path):
        return _to_stdout(write)
    given = Path(path)
    path = target(given, force)
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
        raise OutputError(f"cannot write {shown(given)}: {e.strerror or e}") from None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    return given
