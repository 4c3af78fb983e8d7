"""Reader for Nsight Systems SQLite exports (`nsys export --type sqlite`, nsys 2022.2 → 2026.x).

The file is opened read-only (SQLite URI `mode=ro`): the user's export is never modified.
Only the columns stepscope uses are read, and `StringIds` is decoded only for ids that occur.
Tables exist only when events of that kind were recorded, so every table is optional except
the kernel table.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import polars as pl

from stepscope import apinames
from stepscope.errors import InputError
import stepscope.ingest.sanity as sanity  # the modules, not the package: no circle through ingest/__init__
import stepscope.ingest.typed as typed
import stepscope.ingest.graph_replays as graph_replays
from stepscope.ingest.typed import INT32 as I32, TEXT, Col as C
from stepscope.paths import input_file
from stepscope.model import (
    API_SCHEMA, GPU_SCHEMA, KERNEL_SCHEMA, MEMOP_SCHEMA, NVTX_SCHEMA, PROCESS_SCHEMA,
    STRING_SCHEMA, THREAD_SCHEMA, Trace, empty,
)

SQLITE_MAGIC = b"SQLite format 3\x00"
KERNEL_TABLE = "CUPTI_ACTIVITY_KIND_KERNEL"
RUNTIME_TABLE = "CUPTI_ACTIVITY_KIND_RUNTIME"

SLICE_MIN_ROWS = 200_000  # below this a table is read in one query
# the kernels' launch configuration: the model's column -> the export's
LAUNCH_COLUMNS = {"grid_x": "gridX", "grid_y": "gridY", "grid_z": "gridZ", "block_x": "blockX",
                  "block_y": "blockY", "block_z": "blockZ"}


def read_threads() -> int:
    """How many threads read a big table's rowid slices."""
    return max(1, min(4, os.cpu_count() or 1))
ADBC_BATCH_ROWS = 65_536


# globalTid packs <hw:8><vm:8><pid:24><tid:24>; globalPid is the same with tid = 0.
def _unpack_pid(col: str) -> pl.Expr:
    return ((pl.col(col) // (1 << 24)) % (1 << 24)).cast(pl.Int32).alias(col)


def _unpack_tid(col: str) -> pl.Expr:
    return (pl.col(col) % (1 << 24)).cast(pl.Int32).alias("tid")


BUSY_TIMEOUT_MS = 5_000  # sqlite3.connect's default timeout


def is_sqlite(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(16) == SQLITE_MAGIC


def connect_readonly(path: Path) -> sqlite3.Connection:
    """Open an export read-only; `immutable` is not used so a file still being written is safe."""
    uri = Path(path).resolve().as_uri() + "?mode=ro"
    con = sqlite3.connect(uri, uri=True, factory=_Connection)
    # the metadata and names sqlite3 hands back as text: bytes that are not UTF-8 (a damaged
    # or foreign export) read as U+FFFD instead of failing the whole read
    con.text_factory = lambda b: b.decode("utf-8", "replace")
    con.execute("PRAGMA query_only = 1")
    return con


class _ReadError(sqlite3.DatabaseError):
    """SQLite's error on a read through ADBC (polars reports it while importing the stream)."""


class _TypeMismatch(_ReadError):
    """ADBC typed a column from its first batch and met a value of another type later."""


def _frame(con: sqlite3.Connection, q: typed.Query) -> tuple[pl.DataFrame, typed.Reading]:
    """Run a query into a frame of the model's dtypes, leaving out the rows with wrong values.

    Through ADBC's SQLite driver when it is installed: it hands rows over as Arrow columns,
    several times faster than Python's row-by-row fetch; it opens the same read-only URI.
    Without it, sqlite3 runs the typed query directly: Python's rows do not say a value's
    SQLite type, and polars would take a REAL into an integer column by truncating it.
    """
    return _bulk_frames(con, [q])[0]


def _rows(con: sqlite3.Connection, q: typed.Query, extra: list[str] | None = None) -> pl.DataFrame:
    rows = con.execute(q.sql(True, extra)).fetchall()
    schema = q.raw_schema(True)
    return pl.DataFrame(rows, schema=list(schema.items()), orient="row") if rows else empty(schema)


def _adbc_query(db, sql: str) -> pl.DataFrame:
    """One query through ADBC: the Arrow C stream goes straight into polars (no pyarrow)."""
    import adbc_driver_manager

    conn = adbc_driver_manager.AdbcConnection(db)  # one connection per thread
    try:
        _wait_for_locks(conn)
        stmt = adbc_driver_manager.AdbcStatement(conn)
        try:
            # the driver's default 1,024-row batches leave a million-row read in ~1,000 small
            # buffers per column, which the C heap keeps (as RSS) after polars copies them
            stmt.set_options(**{"adbc.sqlite.query.batch_rows": str(ADBC_BATCH_ROWS)})
            stmt.set_sql_query(sql)
            stream, _ = stmt.execute_query()
            try:
                return pl.DataFrame(stream)
            # SQLite's own error, met while streaming: polars 2 raises it, 1.33 panics with it
            except (pl.exceptions.PolarsError, pl.exceptions.PanicException) as e:
                reason = _reason(e)
                raise (_TypeMismatch if "Type mismatch" in reason else _ReadError)(reason) from None
        finally:
            stmt.close()
    finally:
        conn.close()


def _wait_for_locks(conn) -> None:
    """Wait (up to BUSY_TIMEOUT_MS) for a lock instead of failing at once, as sqlite3's own
    connections do (their `timeout`): the reader threads open their connections together, and on
    an export in WAL mode they briefly contend for its -shm index ("database is locked")."""
    import adbc_driver_manager

    stmt = adbc_driver_manager.AdbcStatement(conn)
    try:
        stmt.set_sql_query(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        stream, _ = stmt.execute_query()
        pl.DataFrame(stream)
    finally:
        stmt.close()


def _reason(e: Exception) -> str:
    """An error's own words: its first line, without the query ADBC appends or polars' prefix."""
    if isinstance(e, UnicodeDecodeError) and isinstance(e.object, bytes):
        return e.object.decode("utf-8", "replace")
    text = (str(e).strip().splitlines() or [type(e).__name__])[0]
    text = text.split(". query: ")[0].split("; query: ")[0]
    return text.replace("got external error: ", "")


def _bulk_frames(con: sqlite3.Connection, queries: list[typed.Query]) -> list[tuple[pl.DataFrame, typed.Reading]]:
    """Read tables: each query's frame and what was left out of it (_bulk_raw, checked)."""
    out = []
    for q, (raw, is_typed) in zip(queries, _bulk_raw(con, queries)):
        out.append(typed.clean(raw, q, is_typed))
        del raw
    return out


def _bulk_raw(con: sqlite3.Connection, queries: list[typed.Query]):
    """Read tables as they come back, before typed.clean checks them: each query's raw frame
    (its columns named q.raw_names) and whether it was read typed; frames are yielded one at a
    time, each let go by the caller before the next is assembled.

    With ADBC each table is read in rowid slices on parallel threads: the driver releases the
    GIL while SQLite steps rows and fills Arrow columns, which is where the time goes. The
    slices are concatenated in rowid order, so the result is the same as one query's (the first
    slice has no lower bound: a damaged export's rowid of 0 or below is read as SQLite reads
    it). A table whose plain read came back with a column of another type is read again, typed.
    """
    db = getattr(con, "_stepscope_adbc", None)
    if db is None:
        for q in queries:
            yield _rows(con, q), True
        return
    threads = read_threads()
    slices = []
    for q in queries:
        last = 0
        if q.from_ is None:
            try:
                last = con.execute(f"SELECT max(rowid) FROM {q.table}").fetchone()[0] or 0
            except sqlite3.DatabaseError:  # a view or a WITHOUT ROWID table: one slice
                last = 0
        # two slices per thread: the thread done first takes the next one, rather than waiting
        # on the other's last (a kernel and an API slice do not take the same time)
        parts = 2 * threads if last > SLICE_MIN_ROWS else 1
        cuts = [last * i // parts for i in range(parts + 1)]
        slices.append([[f"rowid > {cuts[i]} AND rowid <= {cuts[i + 1]}" if i else f"rowid <= {cuts[1]}"]
                       if parts > 1 else [] for i in range(parts)])

    def read(job: tuple[typed.Query, list[str], bool]):
        q, extra, is_typed = job
        try:
            return _adbc_query(db, q.sql(is_typed, extra))
        except _TypeMismatch:
            if is_typed:
                raise
            return None  # the table is read again, typed

    with ThreadPoolExecutor(threads) as pool:
        frames = list(pool.map(read, [(q, extra, False) for q, parts in zip(queries, slices) for extra in parts]))
        out: list = []
        i = 0
        for q, parts in zip(queries, slices):
            got = frames[i:i + len(parts)]
            i += len(parts)
            is_typed = any(f is None or not typed.fits(f, q, False) for f in got)
            if is_typed:  # a value of another type somewhere: the whole table again, typed
                got = list(pool.map(read, [(q, extra, True) for extra in parts]))
            out.append((q, got, is_typed))
    del frames
    while out:  # each table's slices and raw frame are let go once its frame is made
        q, got, is_typed = out.pop(0)
        got = [f for f in got if f.height] or got[:1]
        try:
            # one contiguous buffer per column: every later pass (and numpy views) reads it whole
            raw = pl.concat(got, rechunk=True)
        except pl.exceptions.PolarsError:  # slices typed differently (one all NULL, say)
            raw = pl.concat([f.cast(dict(zip(f.columns, q.raw_schema(is_typed).values()))) for f in got],
                            rechunk=True)
        del got
        if not typed.fits(raw, q, is_typed):
            raise _ReadError(f"{q.table} came back with columns of unexpected types")
        raw.columns = q.raw_names(is_typed)
        yield raw, is_typed
        del raw


def _attach_adbc(con: sqlite3.Connection, path: Path) -> None:
    # the low-level ADBC API: its DB-API layer would import pyarrow and pandas (~0.6 s)
    try:
        import adbc_driver_sqlite
    except ImportError:
        return
    con._stepscope_adbc = adbc_driver_sqlite.connect(Path(path).resolve().as_uri() + "?mode=ro")


class _Connection(sqlite3.Connection):
    """sqlite3 connection that may carry an ADBC twin for bulk reads."""

    _stepscope_adbc = None

    def close(self) -> None:
        if self._stepscope_adbc is not None:
            self._stepscope_adbc.close()
        super().close()


class _Schema:
    """What this export has: its tables and each table's columns."""

    def __init__(self, con: sqlite3.Connection):
        self.tables = {
            r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type IN ('table','view')")
        }
        self._con = con
        self._cols: dict[str, set[str]] = {}

    def has(self, table: str) -> bool:
        return table in self.tables

    def cols(self, table: str) -> set[str]:
        if table not in self._cols:
            self._cols[table] = {r[1] for r in self._con.execute(f"PRAGMA table_info('{table}')")}
        return self._cols[table]

    def col_or_null(self, table: str, col: str) -> str:
        """`col` when `table` has it, else NULL: the expression to select for an optional column."""
        return col if col in self.cols(table) else "NULL"


def _metadata(con: sqlite3.Connection, schema: _Schema) -> dict[str, str]:
    for table in ("META_DATA_EXPORT", "EXPORT_META_DATA"):  # newer / older name
        if schema.has(table) and {"name", "value"} <= schema.cols(table):
            rows = con.execute(f"SELECT name, value FROM {table} WHERE typeof(name) = 'text'").fetchall()
            # a value that is not text (a damaged export) is its text, or nothing
            return {k: (v if isinstance(v, str) else None if v is None else str(v)[:200]) for k, v in rows}
    return {}


def schema_version_of(path: Path) -> str | None:
    """The export's schema version, read without loading anything else (None if unreadable)."""
    try:
        con = connect_readonly(path)
        try:
            schema = _Schema(con)
            return _metadata(con, schema).get("EXPORT_SCHEMA_VERSION")
        finally:
            con.close()
    except (sqlite3.DatabaseError, UnicodeDecodeError):
        return None


def _is_db_error(e: Exception) -> bool:
    # UnicodeDecodeError: sqlite3 could not decode SQLite's own message, which quotes the
    # damaged schema text of a corrupt file (names and text values are decoded leniently)
    return (isinstance(e, (sqlite3.DatabaseError, UnicodeDecodeError))
            or type(e).__module__.startswith("adbc_driver"))


def read_nsys_sqlite(path: str | Path, launch_config: bool = True) -> Trace:
    """Read an export. `launch_config=False` leaves out the grid/block columns, which the
    per-step analysis does not need: on a million kernels that halves the kernel read."""
    path = input_file(path, "an nsys SQLite export")
    if not is_sqlite(path):
        raise InputError(
            f"{path} is not a SQLite file; export the report first: "
            "nsys export --type sqlite report.nsys-rep"
        )
    try:
        con = connect_readonly(path)
        try:
            _Schema(con)  # fails fast, with sqlite3's message, on a corrupt file
            _attach_adbc(con, path)
            return _read(con, path, launch_config)
        finally:
            con.close()
    except Exception as e:
        if not _is_db_error(e):
            raise
        raise db_error(path, e) from None


def db_error(path: Path, e: Exception) -> InputError:
    """SQLite's error `e` on reading `path` as one line: what is wrong, what to do."""
    if _wal_unwritable(path):
        return InputError(
            f"{path} is a WAL-mode SQLite export in a folder stepscope cannot write: SQLite must make its "
            f"-wal and -shm files beside it to read it: copy it to a writable folder first")
    return InputError(f"{path} is not a readable SQLite export ({_reason(e)}); it may be truncated: export it "
                      "again with nsys export --type sqlite")


def _wal_unwritable(path: Path) -> bool:
    """A WAL-mode file (header bytes 18 and 19 are 2) without its -shm, in a folder where it
    cannot be made: SQLite cannot open it, even read-only."""
    try:
        with open(path, "rb") as f:
            head = f.read(20)
    except OSError:
        return False
    if head[18:20] != b"\x02\x02" or path.with_name(path.name + "-shm").exists():
        return False
    try:
        fd, probe = tempfile.mkstemp(prefix=".stepscope-probe-", dir=path.resolve().parent)
    except OSError:
        return True  # the header was read: the folder refused the file
    os.close(fd)
    os.unlink(probe)
    return False


def _need(path: Path, schema: _Schema, table: str, *cols: str) -> None:
    """InputError naming the first of `cols` that `table` lacks (not the SQL that would fail)."""
    missing = [c for c in cols if c not in schema.cols(table)]
    if missing:
        raise InputError(f"{path}: table {table} has no column {missing[0]}: not an nsys export stepscope "
                         "can read (damaged, or written by another tool); export it again with nsys export "
                         "--type sqlite")


def _lacks(schema: _Schema, table: str, *cols: str) -> str | None:
    return next((c for c in cols if c not in schema.cols(table)), None)


def _read(con: sqlite3.Connection, path: Path, launch_config: bool = True) -> Trace:
    schema = _Schema(con)
    meta = _metadata(con, schema)
    warnings: list[str] = []
    readings: list[typed.Reading] = []
    if not schema.has(KERNEL_TABLE):
        graph_rows = _count(con, schema, "CUPTI_ACTIVITY_KIND_GRAPH_TRACE")
        if graph_rows:
            raise InputError(
                f"{path} has no per-kernel rows: its {graph_rows} CUDA-graph launches were traced "
                "as whole graphs; capture again with nsys profile --cuda-graph-trace=node"
            )
        raise InputError(
            f"{path} has no kernel table ({KERNEL_TABLE}): it was captured without CUDA tracing; "
            "capture again with nsys profile --trace=cuda,nvtx"
        )

    k = KERNEL_TABLE
    string_ids = _StringIds(con, schema, path)
    if not schema.has("StringIds"):
        raise InputError(f"{path} has no StringIds table: its kernel names cannot be read (damaged, or "
                         "written by another tool); export it again with nsys export --type sqlite")
    _need(path, schema, k, "globalPid", "deviceId", "streamId", "correlationId", "start", "end",
          "shortName", "demangledName")
    # globalPid is unpacked in polars (vectorized), not per row in SQLite; skipped columns are
    # added as nulls here rather than selected as NULL (which costs SQLite as much as data).
    # graphNodeId sits near the end of a wide row, where reading it costs as much as start and
    # end together: it is read only from exports that recorded CUDA graphs at all.
    graphs = _has_graphs(con, schema, string_ids)
    cols = [C("pid", "globalPid"), C("device", "deviceId", I32), C("stream", "streamId", I32),
            C("corr", "correlationId", required=False), C("start", "start"), C("end", "end"),
            C("short_id", "shortName", I32), C("demangled_id", "demangledName", I32)]
    if launch_config:
        cols += [C(name, schema.col_or_null(k, col), required=False, source=col)
                 for name, col in LAUNCH_COLUMNS.items()]
    if graphs:
        cols.append(C("graph_node_id", "graphNodeId", required=False))
    queries = [typed.Query(k, cols)]
    if schema.has(RUNTIME_TABLE):
        rt = schema.cols(RUNTIME_TABLE)
        name_col = "nameId" if "nameId" in rt else "name"
        _need(path, schema, RUNTIME_TABLE, "globalTid", "correlationId", "start", "end", name_col)
        # Runtime (0) and driver (1) calls only: old exports also hold CUDA backtrace rows (67)
        # that repeat a call's correlationId.
        where = ["eventClass IN (0, 1)"] if "eventClass" in rt else []
        if name_col == "nameId" and schema.has("StringIds") and {"id", "value"} <= schema.cols("StringIds"):
            # Only the calls an analysis looks at: launches, copies/sets, syncs, profiler
            # start/stop. Attribute queries and the like are most of a big trace's API rows.
            # the ids inline: SQLite tests a literal list faster than a subquery's result
            kept = string_ids.api_ids()
            where.append(f"nameId IN ({','.join(str(int(i)) for i in kept) or 'NULL'})")
        queries.append(typed.Query(RUNTIME_TABLE, [
            C("pid", "globalTid"), C("corr", "correlationId", required=False), C("start", "start"),
            C("end", "end"), C("name_id", name_col, I32)], where))
    frames = _bulk_frames(con, queries)
    kernels, rep = frames[0]
    readings.append(rep)
    if kernels.is_empty():  # before the other tables: nothing to analyze
        if rep.rows:
            raise InputError(f"{path}: no usable kernels: {rep.warning()}")
        raise InputError(f"{path}: no kernels recorded — was `--trace=cuda` on? capture again with "
                         "nsys profile --trace=cuda,nvtx")
    kernels = kernels.with_columns(_unpack_pid("pid"))
    if not launch_config:
        kernels = kernels.with_columns(*(pl.lit(None, pl.Int64).alias(c) for c in
                                         ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z")))
    if not graphs:
        kernels = kernels.with_columns(pl.lit(None, pl.Int64).alias("graph_node_id"))
    wanted = [c for c in KERNEL_SCHEMA if launch_config or not c.startswith(("grid_", "block_"))]
    kernels = kernels.select(wanted)
    if _count(con, schema, graph_replays.TABLE):
        replays, rep = _frame(con, graph_replays.QUERY)
        readings.append(rep)
        kernels = graph_replays.with_replays(kernels, replays.with_columns(_unpack_pid("pid")))
    api = empty(API_SCHEMA)
    if len(frames) > 1:
        raw_api, rep = frames[1]
        readings.append(rep)
        # globalTid is read once: the pid and the tid are both unpacked from it
        api = raw_api.select(_unpack_pid("pid"), _unpack_tid("pid"), pl.exclude("pid"))

    memops = _read_memops(con, schema, path, readings)
    nvtx = _read_nvtx(con, schema, path, readings, warnings, string_ids)
    strings = graph_replays.with_replay_name(string_ids.decoded(pl.concat([
        kernels["short_id"].unique(), kernels["demangled_id"].unique(), api["name_id"].unique()]).unique().drop_nulls(),
        readings), kernels)
    gpus = _read_gpus(con, schema, readings, warnings)
    processes, threads = read_names(
        schema.has, lambda *a: _lacks(schema, *a), lambda: _frame(con, typed.Query("PROCESSES", PROCESS_COLUMNS)),
        lambda: _frame(con, typed.Query("ThreadNames", THREAD_COLUMNS,
                                        from_="ThreadNames t JOIN StringIds s ON s.id = t.nameId")),
        warnings, readings)

    graph_level, overhead_n, overhead_ns = graph_level_and_overhead(con, schema, warnings)

    warnings += [w for w in (r.warning() for r in _merged(readings)) if w]
    return sanity.checked(Trace(
        path=path, format="nsys-sqlite", kernels=kernels, memops=memops, api=api, nvtx=nvtx,
        strings=strings, gpus=gpus, processes=processes, threads=threads,
        nsys_version=meta.get("EXPORT_PRODUCT_VERSION"),
        schema_version=meta.get("EXPORT_SCHEMA_VERSION"),
        graph_level_launches=int(graph_level),
        profiler_overhead_count=int(overhead_n), profiler_overhead_ns=int(overhead_ns),
        warnings=warnings,
    ))


def graph_level_and_overhead(con: sqlite3.Connection, schema: "_Schema", warnings: list) -> tuple[int, int, int]:
    """The graph launches recorded whole (a warning when there are), and nsys's own cost
    (PROFILER_OVERHEAD: rows, summed duration)."""
    graph_level = _count(con, schema, "CUPTI_ACTIVITY_KIND_GRAPH_TRACE")
    if graph_level:
        warnings.append(
            f"per-kernel inventory unavailable for {graph_level} graph launches "
            "(traced with --cuda-graph-trace=graph; use --cuda-graph-trace=node)"
        )
    overhead_n, overhead_ns = 0, 0
    if schema.has("PROFILER_OVERHEAD") and not _lacks(schema, "PROFILER_OVERHEAD", "start", "end"):
        # total() sums in floating point: SQLite's integer sum() raises on overflow, which
        # absurd values in a damaged export reach; rows that are not two integers do not count
        good = "typeof(start) = 'integer' AND typeof(end) = 'integer' AND end >= start"
        overhead_n, overhead_ns = con.execute(
            f"SELECT count(*), total(end - start) FROM PROFILER_OVERHEAD WHERE {good}").fetchone()
        overhead_ns = int(min(overhead_ns, float(1 << 62)))
    return int(graph_level), int(overhead_n), overhead_ns


PROCESS_COLUMNS = [C("pid", "pid", I32), C("name", "name", TEXT, False)]
THREAD_COLUMNS = [C("gtid", "t.globalTid", source="globalTid"), C("name", "s.value", TEXT, False, "StringIds.value")]


def read_names(has, lacks, read_processes, read_threads, warnings: list, readings: list
               ) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The process and thread names, as both readers (this one and nsys_columnar) take them:
    PROCESSES, and ThreadNames joined with StringIds; a table without its columns is a warning.
    `has(table)` and `lacks(table, *cols)` ask the reader's schema; `read_processes()` and
    `read_threads()` read PROCESS_COLUMNS and THREAD_COLUMNS (the join is the reader's)."""
    processes, threads = empty(PROCESS_SCHEMA), empty(THREAD_SCHEMA)
    if has("PROCESSES"):
        missing = lacks("PROCESSES", "pid", "name")
        if missing:
            warnings.append(f"table PROCESSES has no column {missing}: process names are not shown")
        else:
            processes, rep = read_processes()
            readings.append(rep)
    if has("ThreadNames") and has("StringIds"):
        missing = lacks("ThreadNames", "globalTid", "nameId") or lacks("StringIds", "id", "value")
        if missing:
            warnings.append(f"table ThreadNames or StringIds has no column {missing}: thread names are not shown")
        else:
            raw, rep = read_threads()
            readings.append(rep)
            threads = raw.select(_unpack_pid("gtid").alias("pid"), _unpack_tid("gtid"), "name").cast(THREAD_SCHEMA)
    return processes, threads


def _merged(readings: list[typed.Reading]) -> list[typed.Reading]:
    """One account per table (StringIds is read in chunks, memops from two tables)."""
    by: dict[str, typed.Reading] = {}
    for r in readings:
        by.setdefault(r.table, typed.Reading(r.table)).add(r)
    return list(by.values())


def _has_graphs(con: sqlite3.Connection, schema: _Schema, string_ids: "_StringIds | None" = None) -> bool:
    """Whether any kernel can carry a graphNodeId: the export has graph tables or a graph
    launch call's name. False only when both are certainly absent."""
    if "graphNodeId" not in schema.cols(KERNEL_TABLE):
        return False
    if any(t.startswith("CUDA_GRAPH") for t in schema.tables) or not schema.has("StringIds"):
        return True
    if "value" not in schema.cols("StringIds"):
        return True
    if string_ids is not None and string_ids.readable():  # the strings' one read, not a scan of its own
        return bool(string_ids.beginning(apinames.GRAPH_LAUNCH, with_id=False))
    graph_names = " OR ".join(f"value GLOB '{p}*'" for p in apinames.GRAPH_LAUNCH)
    return con.execute(f"SELECT 1 FROM StringIds WHERE {graph_names} LIMIT 1").fetchone() is not None


def _count(con: sqlite3.Connection, schema: _Schema, table: str) -> int:
    return con.execute(f"SELECT count(*) FROM {table}").fetchone()[0] if schema.has(table) else 0


def memop_query(table: str, kind: str, col_or_null) -> typed.Query:
    """A memcpy or memset table's query (every reader's); `col_or_null(table, col)`: the column,
    or NULL where the table lacks it."""
    return typed.Query(table, [
        C("pid", "globalPid"), C("device", "deviceId", I32), C("stream", "streamId", I32),
        C("corr", "correlationId", required=False), C("start", "start"), C("end", "end"),
        C("bytes", col_or_null(table, "bytes"), required=False, source="bytes"),
        C("copy_kind", col_or_null(table, "copyKind") if kind == "memcpy" else "NULL", I32,
          required=False, source="copyKind")])


def _read_memops(con: sqlite3.Connection, schema: _Schema, path: Path, readings: list) -> pl.DataFrame:
    parts = []
    for table, kind in (("CUPTI_ACTIVITY_KIND_MEMCPY", "memcpy"), ("CUPTI_ACTIVITY_KIND_MEMSET", "memset")):
        if schema.has(table):
            _need(path, schema, table, "globalPid", "deviceId", "streamId", "correlationId", "start", "end")
            df, rep = _frame(con, memop_query(table, kind, schema.col_or_null))
            readings.append(rep)
            parts.append(df.with_columns(_unpack_pid("pid"), pl.lit(kind).alias("kind")).select(list(MEMOP_SCHEMA)))
    return pl.concat(parts) if parts else empty(MEMOP_SCHEMA)


def _read_nvtx(con: sqlite3.Connection, schema: _Schema, path: Path, readings: list,
               warnings: list, string_ids: "_StringIds") -> pl.DataFrame:
    if not schema.has("NVTX_EVENTS"):
        return empty(NVTX_SCHEMA)
    _need(path, schema, "NVTX_EVENTS", "start", "end", "eventType", "globalTid")
    cols = schema.cols("NVTX_EVENTS")
    ids = "textId" in cols and schema.has("StringIds")
    # The text id comes as an integer and is decoded once per distinct id: a StringIds lookup
    # per range in SQL cost ~1 us each (a TP=2 trace of 1M kernels has 146k ranges: 0.16 s).
    # 59 = push/pop range, 60 = start/end range; marks and domain events have no end.
    raw, rep = _frame(con, typed.Query("NVTX_EVENTS", [
        C("gtid", "globalTid"), C("start", "start"), C("end", "end"),
        C("text", "text" if "text" in cols else "NULL", TEXT, False, "text"),
        C("text_id", "textId" if ids else "NULL", I32, False, "textId")],
        ["eventType IN (59, 60)", "end IS NOT NULL"]))
    readings.append(rep)
    name = pl.col("text")
    if ids:
        need = raw.filter(pl.col("text").is_null())["text_id"].drop_nulls().unique()
        strings = string_ids.decoded(need, readings)
        name = pl.coalesce(name, pl.col("text_id").replace_strict(
            strings["id"], strings["value"], default=None, return_dtype=pl.String))
        nowhere = need.filter(~need.is_in(strings["id"].implode()))
        if nowhere.len():
            n = raw.filter(pl.col("text").is_null() & pl.col("text_id").is_in(nowhere.implode())).height
            warnings.append(f"NVTX_EVENTS: {n:,} ranges have no name (their textId is not in StringIds)")
    return raw.select(_unpack_pid("gtid").alias("pid"), _unpack_tid("gtid"), "start", "end",
                      name.alias("name")).cast(NVTX_SCHEMA)


class _StringIds:
    """The export's StringIds, decoded only for the ids that occur (it can hold 100k+ strings).

    The API calls' name filter visits every string, so it reads the whole table once, raw, in
    rowid slices on parallel threads (1 us a row; SQLite's GLOB scan of 200k names took 0.4 s),
    and the kernels' and NVTX ranges' names are then taken from that read. Without that scan
    the ids are read by a literal list, or by their id range when they fill much of it (200k
    distinct kernel names: 1.5 s as lists, 0.15 s as the range). Values are checked (typed.clean)
    only on the rows asked for, so a damaged string no one names is neither kept nor counted."""

    QUERY = typed.Query("StringIds", [C("id", "id", I32), C("value", "value", TEXT)])

    def __init__(self, con: sqlite3.Connection, schema: _Schema, path: Path):
        self.con, self.schema, self.path = con, schema, path
        self.raw: tuple[pl.DataFrame, bool] | None = None

    def readable(self) -> bool:
        return self.schema.has("StringIds") and {"id", "value"} <= self.schema.cols("StringIds")

    def api_ids(self) -> list[int]:
        """The integer ids of the names apinames.KEPT begins (the SQL was `typeof(id) =
        'integer' AND value GLOB 'p*'`)."""
        return self.beginning(apinames.KEPT)

    def beginning(self, prefixes: tuple[str, ...], with_id: bool = True) -> list[int | None]:
        """The ids of the strings that begin with one of `prefixes` (all of which begin with
        "cu"); `with_id`: only rows whose id is an integer. The raw value is the text's bytes,
        as SQLite's GLOB 'p*' reads them."""
        assert all(p.startswith("cu") for p in prefixes)
        if self.raw is None:
            (raw, is_typed), = list(_bulk_raw(self.con, [self.QUERY]))
            self.raw = raw, is_typed
        raw, _ = self.raw
        if not raw.height:
            return []
        value = pl.col("value").cast(pl.Binary)
        # that one test first: it settles most strings
        cu = raw.filter((pl.col("id").is_not_null() if with_id else pl.lit(True)) & value.bin.starts_with(b"cu"))
        begins = pl.any_horizontal([value.bin.starts_with(p.encode()) for p in prefixes])
        return cu.filter(begins)["id"].to_list()

    def decoded(self, ids: pl.Series, readings: list) -> pl.DataFrame:
        if not self.schema.has("StringIds") or ids.len() == 0:
            return empty(STRING_SCHEMA)
        _need(self.path, self.schema, "StringIds", "id", "value")
        q = self.QUERY
        if self.raw is not None:
            raw, is_typed = self.raw
            if raw.height:
                raw = raw.filter(pl.col("id").is_in(ids.cast(pl.Int64).implode()))
            parts = [typed.clean(raw, q, is_typed)]
        elif (hi := int(ids.max())) - (lo := int(ids.min())) < 8 * ids.len():
            raws = _bulk_raw(self.con, [typed.Query(q.table, q.cols, [f"id >= {lo} AND id <= {hi}"])])
            parts = [typed.clean(raw.filter(pl.col("id").is_in(ids.cast(pl.Int64).implode())) if raw.height else raw,
                                 q, is_typed) for raw, is_typed in raws]
        else:
            parts = []
            id_list = ids.to_list()
            for i in range(0, len(id_list), 30_000):  # a literal list per query stays well inside SQLite's limits
                chunk = id_list[i:i + 30_000]
                parts.append(_frame(self.con, typed.Query(q.table, q.cols,
                                                          [f"id IN ({','.join(str(int(v)) for v in chunk)})"])))
        readings += [rep for _, rep in parts]
        # a damaged StringIds (not a primary key) may repeat an id: the first value stands
        return pl.concat([df for df, _ in parts]).unique("id", keep="first", maintain_order=True)


GPU_TABLE = "TARGET_INFO_GPU"


def gpu_query(have, warnings: list) -> typed.Query | None:
    """The GPU table's query over the columns `have` (every reader's), or None, with a warning,
    when it has no device column."""
    device = "id" if "id" in have else "cuDevice" if "cuDevice" in have else None
    if device is None:
        warnings.append(f"table {GPU_TABLE} has no column id: the GPUs are not named")
        return None

    def opt(col: str) -> str:
        return col if col in have else "NULL"

    return typed.Query(GPU_TABLE, [
        C("device", device, I32), C("name", opt("name"), TEXT, False, "name"),
        C("sm_count", opt("smCount"), required=False, source="smCount"),
        C("memory_bandwidth_bps", opt("memoryBandwidth"), required=False, source="memoryBandwidth"),
        C("total_memory_bytes", opt("totalMemory"), required=False, source="totalMemory")])


def _read_gpus(con: sqlite3.Connection, schema: _Schema, readings: list, warnings: list) -> pl.DataFrame:
    q = gpu_query(schema.cols(GPU_TABLE), warnings) if schema.has(GPU_TABLE) else None
    if q is None:
        return empty(GPU_SCHEMA)
    df, rep = _frame(con, q)
    readings.append(rep)
    return df.unique("device", keep="first").sort("device")
