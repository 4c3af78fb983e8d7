"""The reader registry: which reader reads a file, told from its first bytes (and, for a folder
or an nsys report, its kind), never from its name alone.

Each entry names a format (the `Trace.format` its reader gives, or what it refuses), a test of
the file's first 16 bytes, and the function that reads it into the one `stepscope.model.Trace`
(imported when used, so that `stepscope --help` imports no reader). A new input format is one
module with its reader function and one entry here (pipit's habit); ingest.read_trace tries the
entries in order and the first that recognises the file reads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from pathlib import Path
from typing import Callable

from stepscope.errors import InputError
from stepscope.paths import shown

SQLITE_HEAD = b"SQLite format 3"


@dataclass(frozen=True)
class Reader:
    """One input format. `recognises(path, head)`: whether it reads this file (`head`: its first
    16 bytes; None for a folder). `read`: "module:function", called as
    function(path, launch_config, cache, events) -> Trace. `redirect`: the function returns the
    path of another file to read instead (an .nsys-rep exported to SQLite). `tracer`: what
    wrote such a trace, as sentences name it ("under nsys"). `launch_config`: "module:function"
    of function(path) -> the reader of chosen kernels' grid/block when the trace was read
    without them (stepscope.launch_config; None: the format has none to read)."""

    format: str
    recognises: Callable[[Path, bytes | None], bool]
    read: str
    redirect: bool = False
    tracer: str = "nsys"
    launch_config: str | None = None

    def function(self) -> Callable:
        return _named(self.read)


def _named(spec: str) -> Callable:
    module, _, name = spec.partition(":")
    return getattr(import_module(module), name)


def _is_parquetdir(path: Path, head: bytes | None) -> bool:
    from stepscope.ingest.nsys_columnar import kind_of

    return head is None and kind_of(path, b"") == "parquetdir"


def _is_report(path: Path, head: bytes | None) -> bool:
    return head is not None and path.suffix == ".nsys-rep" and not head.startswith(SQLITE_HEAD)


def _is_sqlite(path: Path, head: bytes | None) -> bool:
    return head is not None and head.startswith(SQLITE_HEAD)


def _is_gzipped_sqlite(path: Path, head: bytes | None) -> bool:
    """A gzip file holding a SQLite database (its first 16 bytes decompressed)."""
    import gzip
    import zlib

    if head is None or head[:2] != b"\x1f\x8b":
        return False
    try:
        with gzip.open(path, "rb") as f:
            return f.read(16).startswith(SQLITE_HEAD)
    except (OSError, EOFError, zlib.error):
        return False


def _is_arrow(path: Path, head: bytes | None) -> bool:
    return head is not None and head.startswith((b"\xff\xff\xff\xff", b"ARROW1"))  # nsys export --type=arrow


def _is_json(path: Path, head: bytes | None) -> bool:
    return head is not None and (head[:2] == b"\x1f\x8b" or head.lstrip()[:1] in (b"{", b"["))


# tried in this order: the first that recognises a file reads it
READERS: tuple[Reader, ...] = (
    Reader("nsys-parquet", _is_parquetdir, "stepscope.ingest.readers:read_parquetdir",  # a folder of .parquet
           launch_config="stepscope.launch_config:parquetdir_reader"),
    Reader("nsys-rep", _is_report, "stepscope.ingest.readers:export_report", redirect=True),
    Reader("nsys-sqlite", _is_sqlite, "stepscope.ingest.readers:read_sqlite",
           launch_config="stepscope.launch_config:nsys_reader"),
    Reader("gzip-sqlite", _is_gzipped_sqlite, "stepscope.ingest.readers:refuse_gzipped"),
    Reader("nsys-arrow", _is_arrow, "stepscope.ingest.readers:read_arrow",
           launch_config="stepscope.launch_config:arrow_reader"),
    Reader("kineto-json", _is_json, "stepscope.ingest.readers:read_kineto", tracer="torch.profiler"),
)


def reader_for(path: Path, head: bytes | None) -> Reader | None:
    """The first entry of READERS that recognises the file (None: none does)."""
    return next((r for r in READERS if r.recognises(path, head)), None)


def reader_of(fmt: str) -> Reader | None:
    """The entry whose reader gives traces of format `fmt` (Trace.format)."""
    return next((r for r in READERS if r.format == fmt), None)


def tracer_of(fmt: str) -> str:
    """What wrote a trace of format `fmt`, as sentences name it ("nsys", "torch.profiler")."""
    r = reader_of(fmt)
    return r.tracer if r is not None else "nsys"


def launch_config_reader(trace):
    """The reader of chosen kernels' grid/block from `trace`'s file (None: its format has none).
    Named by its entry, imported when asked (stepscope.launch_config reads the file again)."""
    r = reader_of(trace.format)
    return None if r is None or r.launch_config is None else _named(r.launch_config)(trace.path)



def read_parquetdir(path: Path, launch_config: bool, cache, events: bool):
    from stepscope.ingest.nsys_columnar import read_nsys_columnar

    return read_nsys_columnar(path, launch_config, "parquetdir")


def read_arrow(path: Path, launch_config: bool, cache, events: bool):
    from stepscope.ingest.nsys_columnar import read_nsys_columnar

    return read_nsys_columnar(path, launch_config, "arrow")


def export_report(path: Path, launch_config: bool, cache, events: bool) -> Path:
    """An .nsys-rep exported once with the user's nsys, into a cache folder (never beside the
    report): the SQLite export to read instead."""
    from stepscope.ingest.report import exported

    return exported(path)


def read_sqlite(path: Path, launch_config: bool, cache: bool | None, events: bool):
    """An nsys SQLite export, through its Parquet cache when on (`cache` None: unless
    STEPSCOPE_NO_CACHE is set): a hit is the cached frames, a miss is read and stored."""
    import stepscope.ingest.cache as trace_cache
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


def refuse_gzipped(path: Path, launch_config: bool, cache, events: bool):
    # not read transparently: SQLite reads a file, and a decompressed copy of a big export
    # would be written somewhere the user did not choose
    raise InputError(f"{shown(path)} is a gzip-compressed SQLite export: gunzip it first "
                     f"(gunzip -k {shown(path)})")


def read_kineto(path: Path, launch_config: bool, cache, events: bool):
    try:
        from stepscope.ingest.kineto import read_kineto as read
    except ImportError:
        raise InputError(f"{path}: PyTorch-profiler traces are not supported by this build") from None
    return read(path)
