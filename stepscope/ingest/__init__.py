"""Readers: each file format → the one `stepscope.model.Trace`."""

from __future__ import annotations

from pathlib import Path

from stepscope.errors import InputError
from stepscope.model import Trace
from stepscope.paths import input_file, shown


def read_trace(path: str | Path, launch_config: bool = True, cache: bool | None = None,
               events: bool = True) -> Trace:
    """Read a trace (see _read_trace) and the untraced sidecar `stepscope trace` wrote beside it.
    The trace can read itself again (Trace.reread), as long as its file is unchanged.
    `events=False`: a hit of the Parquet cache leaves the kernel, memop and API frames unread
    (Trace.read_events reads them, when the caller decides): for a caller that may find what it
    would compute from them already kept (library.load)."""
    before = file_identity(Path(path))
    trace = _read_trace(path, launch_config, cache, events)
    trace.reread = _rereader(Path(path), before, launch_config, cache)
    from stepscope.ingest.sidecar import read_sidecar

    trace.sidecar, warning = read_sidecar(path)
    if warning:
        trace.warnings.append(warning)
    return trace


def file_identity(path: Path) -> tuple | None:
    """What says a file is still the one that was read: size, time and content fingerprint."""
    from stepscope.ingest.cache import fingerprint

    try:
        st = path.stat()
        return st.st_size, st.st_mtime_ns, fingerprint(path) if path.is_file() else None
    except OSError:
        return None


def _rereader(path: Path, before: tuple | None, launch_config: bool, cache: bool | None):
    def again() -> Trace:
        if before is None or file_identity(path) != before:
            raise InputError(f"{shown(path)} changed since it was analyzed: open it again to read its events")
        return _read_trace(path, launch_config, cache)

    return again


def _read_trace(path: str | Path, launch_config: bool = True, cache: bool | None = None,
                events: bool = True) -> Trace:
    """Read any supported trace file with the reader that recognises its content
    (ingest/readers.py's registry), rather than trusting its name.

    `launch_config=False` lets the nsys reader skip kernels' grid/block (only the byte budget
    and the exports need them). `cache` (default: on unless STEPSCOPE_NO_CACHE is set) reads a
    big export's frames from its Parquet cache when one matches, and writes one when not."""
    from stepscope.ingest.readers import reader_for

    given = Path(path)
    try:
        is_dir = given.is_dir()
    except OSError:  # a name too long, say: input_file below says what is wrong
        is_dir = False
    if is_dir:  # nsys export --type=parquetdir: a folder of one .parquet per table
        r = reader_for(given, None)
        if r is not None:
            return r.function()(given, launch_config, cache, events)
    path = input_file(path, "an nsys SQLite export")  # a FIFO or device is refused unopened
    try:
        with open(path, "rb") as f:
            head = f.read(16)
    except OSError as e:
        raise InputError(f"{shown(path)}: cannot be read ({e.strerror or e})") from None
    r = reader_for(path, head)
    if r is not None and r.redirect:
        return _read_trace(r.function()(path, launch_config, cache, events), launch_config, cache, events)
    if r is not None:
        return r.function()(path, launch_config, cache, events)
    from stepscope.ingest.nsys_sqlite import read_nsys_sqlite

    return read_nsys_sqlite(path)  # gives the precise "not a SQLite file" message
