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
    until one is asked for (then the trace is read again): for a caller that may find what it
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


def _gzipped_sqlite(path: Path) -> bool:
    """Whether a gzip file holds a SQLite database (its first 16 bytes decompressed)."""
    import gzip
    import zlib

    try:
        with gzip.open(path, "rb") as f:
            return f.read(16).startswith(b"SQLite format 3")
    except (OSError, EOFError, zlib.error):
        return False


def _read_trace(path: str | Path, launch_config: bool = True, cache: bool | None = None,
                events: bool = True) -> Trace:
    """Read any supported trace file, dispatching on its content rather than trusting its name.

    `launch_config=False` lets the nsys reader skip kernels' grid/block (only the byte budget
    and the exports need them). `cache` (default: on unless STEPSCOPE_NO_CACHE is set) reads a
    big export's frames from its Parquet cache when one matches, and writes one when not."""
    given = Path(path)
    try:
        is_dir = given.is_dir()
    except OSError:  # a name too long, say: input_file below says what is wrong
        is_dir = False
    if is_dir:  # nsys export --type=parquetdir: a folder of one .parquet per table
        from stepscope.ingest.nsys_columnar import kind_of, read_nsys_columnar

        if kind_of(given, b"") == "parquetdir":
            return read_nsys_columnar(given, launch_config, "parquetdir")
    path = input_file(path, "an nsys SQLite export")  # a FIFO or device is refused unopened
    try:
        with open(path, "rb") as f:
            head = f.read(16)
    except OSError as e:
        raise InputError(f"{shown(path)}: cannot be read ({e.strerror or e})") from None
    if path.suffix == ".nsys-rep" and not head.startswith(b"SQLite format 3"):
        from stepscope.ingest.report import exported

        # exported once with the user's nsys, into a cache folder (never beside the report)
        return _read_trace(exported(path), launch_config, cache, events)
    if head.startswith(b"SQLite format 3"):
        from stepscope.ingest import cache as trace_cache
        from stepscope.ingest.nsys_sqlite import read_nsys_sqlite, schema_version_of

        use_cache = trace_cache.enabled() if cache is None else cache
        distrust: list[str] = []  # why an entry was not used: said once, never stored in the new entry
        if use_cache:
            # taken before the read: store() compares it after, and skips a file written meanwhile
            fp = trace_cache.fingerprint(path)
            hit = trace_cache.load(path, launch_config, schema_version_of(path), fp, distrust, events)
            if hit is not None:
                return hit
        trace = read_nsys_sqlite(path, launch_config)
        if use_cache:
            trace.cache_entry = trace.cache_dir = trace_cache.store(trace, path, launch_config, fp)
        trace.warnings = trace.warnings + distrust
        return trace
    if head[:2] == b"\x1f\x8b" and _gzipped_sqlite(path):
        # not read transparently: SQLite reads a file, and a decompressed copy of a big export
        # would be written somewhere the user did not choose
        raise InputError(f"{shown(path)} is a gzip-compressed SQLite export: gunzip it first "
                         f"(gunzip -k {shown(path)})")
    if head.startswith((b"\xff\xff\xff\xff", b"ARROW1")):  # nsys export --type=arrow: Arrow IPC streams
        from stepscope.ingest.nsys_columnar import read_nsys_columnar

        return read_nsys_columnar(path, launch_config, "arrow")
    if head[:2] == b"\x1f\x8b" or head.lstrip()[:1] in (b"{", b"["):
        try:
            from stepscope.ingest.kineto import read_kineto
        except ImportError:
            raise InputError(f"{path}: PyTorch-profiler traces are not supported by this build") from None
        return read_kineto(path)
    from stepscope.ingest.nsys_sqlite import read_nsys_sqlite

    return read_nsys_sqlite(path)  # gives the precise "not a SQLite file" message
