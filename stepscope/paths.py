"""What a path given to stepscope may be: an input is a regular file (never a FIFO, socket or
device, which would block or stream forever once opened), and an output never names an input.

Checked with stat() before anything opens the file, so a bad path costs one line, not a hang.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from stepscope.errors import InputError

_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def shown(path: str | Path) -> str:
    """The path as it can be printed: bytes that are not UTF-8 in a name become U+FFFD, so
    the one line on stderr can always be written."""
    text = os.fspath(path)
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _stat(path: Path, what: str) -> os.stat_result:
    try:
        return path.stat()
    except FileNotFoundError:
        raise InputError(f"{shown(path)}: no such file; give the path of {what}") from None
    except OSError as e:  # a name too long, a folder that cannot be searched, a symlink loop
        raise InputError(f"{shown(path)}: cannot be opened ({e.strerror or e}); give the path of {what}") from None


def input_file(path: str | Path, what: str) -> Path:
    """`path` when it is a regular file (symlinks followed); otherwise InputError saying what
    it is instead. `what` names what was expected ("an nsys SQLite export")."""
    path = Path(path)
    st = _stat(path, what)
    if stat.S_ISDIR(st.st_mode):
        raise InputError(f"{shown(path)} is a directory; give the path of {what}")
    if not stat.S_ISREG(st.st_mode):
        kind = next((k for test, k in _KINDS if test(st.st_mode)), "not a regular file")
        raise InputError(f"{shown(path)} is {kind}, not a file: stepscope reads {what} from a regular "
                         "file (copy it to one first)")
    return path


def _same(a: Path, b: Path) -> bool:
    try:
        if a.resolve() == b.resolve():
            return True
        sa, sb = a.stat(), b.stat()
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)  # hard links, bind mounts


def refuse_overwrite(output: str | Path, inputs: list[str | Path | None], option: str = "-o") -> None:
    """InputError when writing `output` would replace one of `inputs` (the same path once
    symlinks are resolved, or the same file under another name)."""
    out = Path(output)
    for given in inputs:
        if given is not None and _same(out, Path(given)):
            raise InputError(f"{option} {shown(out)} would overwrite the input {shown(given)}; "
                             "stepscope never overwrites its input: give another output name")
