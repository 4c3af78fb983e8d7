"""An nsys report (`.nsys-rep`) given where an export is expected: exported with the user's nsys.

The export goes to a cache folder (`$STEPSCOPE_CACHE_DIR`, default `~/.cache/stepscope/traces`,
under `reports/`), never beside the report, which may sit in a read-only folder or belong to
someone else; it is keyed by the report's resolved path, size and modification time, so a
second analysis of the same report reuses it and a report written again is exported again.
Without an nsys (`$NSYS`, PATH, the usual install folders) the one-line hint says what to run.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

from stepscope.errors import InputError
from stepscope.paths import shown


def cache_root() -> Path:
    return Path(os.environ.get("STEPSCOPE_CACHE_DIR") or Path.home() / ".cache" / "stepscope" / "traces") / "reports"


def hint(path: Path) -> str:
    return f"{path} is an nsys report, not its SQLite export; run: nsys export --type sqlite {path}"


def find_nsys() -> Path | None:
    from stepscope.capture.nsys import candidates

    found = candidates()
    return found[0].path if found else None


def exported(path: Path, timeout: float = 1800) -> Path:
    """The SQLite export of the report `path`: from the cache, or written there now by nsys."""
    nsys = find_nsys()
    if nsys is None:
        raise InputError(hint(path) + " (no nsys found on PATH or in $NSYS to do it for you)")
    st = path.stat()
    key = hashlib.sha256(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
    folder = cache_root() / key
    out = folder / (path.name[: -len(".nsys-rep")] + ".sqlite")
    if out.is_file() and out.stat().st_size > 0:
        return out
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".export-", dir=folder))
    except OSError as e:
        raise InputError(f"{hint(path)} (the cache folder {shown(folder)} cannot be written: "
                         f"{e.strerror or e}; set STEPSCOPE_CACHE_DIR)") from None
    from stepscope.capture.nsys import export_command

    part = tmp / out.name
    try:
        try:
            cp = subprocess.run(export_command(nsys, path, part, "sqlite"), capture_output=True, text=True,
                                timeout=timeout, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.SubprocessError) as e:
            raise InputError(f"{hint(path)} ({nsys} export did not run: {e})") from None
        if cp.returncode != 0 or not part.is_file():
            why = ((cp.stderr or cp.stdout).strip().splitlines() or [""])[-1]
            raise InputError(f"{shown(nsys)} export of {shown(path)} failed (exit {cp.returncode}"
                             f"{': ' + why if why else ''}); export it yourself: nsys export --type sqlite {path}")
        os.replace(part, out)  # whole or not at all: a second run never sees a half-written export
    finally:
        for p in tmp.iterdir() if tmp.exists() else ():
            p.unlink(missing_ok=True)
        tmp.rmdir() if tmp.exists() else None
    return out
