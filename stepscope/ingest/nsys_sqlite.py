"""Reader for Nsight Systems SQLite exports (`nsys export --type sqlite`, nsys 2022.2 → 2026.x).

The file is opened read-only (SQLite URI `mode=ro`): the user's export is never modified.
Only the columns stepscope uses are read, and `StringIds` is decoded only for ids that occur.
Tables exist only when events of that kind were recorded, so every table is optional except
the kernel table.
"""

from __future__ import annotations

import os
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import polars as pl

from stepscope import apinames
from stepscope.errors import InputError
from stepscope.paths import input_file
from stepscope.model import (
    API_SCHEMA, GPU_SCHEMA, KERNEL_SCHEMA, MEMOP_SCHEMA, NVTX_SCHEMA, PROCESS_SCHEMA,
    STRING_SCHEMA, THREAD_SCHEMA, Trace, empty,
)

SQLITE_MAGIC = b"SQLite format 3\x00"
KERNEL_TABLE = "CUPTI_ACTIVITY_KIND_KERNEL"
RUNTIME_TABLE = "CUPTI_ACTIVITY_KIND_RUNTIME"

# globalTid packs <hw:8><vm:8><pid:24><tid:24>; globalPid is the same with tid = 0.
PID_SQL = "((({col}) >> 24) & 16777215)"
TID_SQL = "(({col}) & 16777215)"
SLICE_MIN_ROWS = 200_000  # below this a table is read in one query
ADBC_BATCH_ROWS = 65_536
API_NAME_FILTER = " OR ".join(f"value GLOB '{p}*'" for p in apinames.KEPT)


def _unpack_pid(col: str) -> pl.Expr:
    return ((pl.col(col) // (1 << 24)) % (1 << 24)).cast(pl.Int32).alias(col)


def _unpack_tid(col: str) -> pl.Expr:
    return (pl.col(col) % (1 << 24)).cast(pl.Int32).alias("tid")


def _packed(schema: dict, *cols: str) -> dict:
    """`schema` with the packed global ids (globalPid/globalTid, 64-bit) as they are read."""
    return {c: (pl.Int64 if c in cols else t) for c, t in schema.items()}


def is_sqlite(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(16) == SQLITE_MAGIC


def connect_readonly(path: Path) -> sqlite3.Connection:
    """Open an export read-only; `immutable` is not used so a file still being written is safe."""
    uri = Path(path).resolve().as_uri() + "?mode=ro"
    con = sqlite3.connect(uri, uri=True, factory=_Connection)
    con.execute("PRAGMA query_only = 1")
    return con


def _frame(con: sqlite3.Connection, sql: str, schema: dict) -> pl.DataFrame:
    """Run a query into a frame with `schema` (names and dtypes by position).

    Bulk tables go through ADBC's SQLite driver when it is installed: it hands rows over as
    Arrow columns, several times faster than Python's row-by-row fetch. It opens the same
    read-only URI. Without it, sqlite3 does the same work more slowly.
    """
    db = getattr(con, "_stepscope_adbc", None)
    if db is not None:
        return _typed(_adbc_query(db, sql), schema)
    rows = con.execute(sql).fetchall()
    if not rows:
        return empty(schema)
    return pl.DataFrame(rows, schema=list(schema.items()), orient="row")


def _typed(df: pl.DataFrame, schema: dict) -> pl.DataFrame:
    """An Arrow-read frame renamed and cast to `schema` (positional)."""
    if df.height == 0:
        return empty(schema)
    df.columns = list(schema)
    return df.cast(schema)


def _adbc_query(db, sql: str) -> pl.DataFrame:
    """One query through ADBC: the Arrow C stream goes straight into polars (no pyarrow)."""
    import adbc_driver_manager

    conn = adbc_driver_manager.AdbcConnection(db)  # one connection per thread
    try:
        stmt = adbc_driver_manager.AdbcStatement(conn)
        try:
            # the driver's default 1,024-row batches leave a million-row read in ~1,000 small
            # buffers per column, which the C heap keeps (as RSS) after polars copies them
            stmt.set_options(**{"adbc.sqlite.query.batch_rows": str(ADBC_BATCH_ROWS)})
            stmt.set_sql_query(sql)
            stream, _ = stmt.execute_query()
            return pl.DataFrame(stream)
        finally:
            stmt.close()
    finally:
        conn.close()


def _bulk_frames(con: sqlite3.Connection, jobs: list[tuple[str, str, list[str], dict]]) -> list[pl.DataFrame]:
    """Read big tables: jobs are (table, select, where clauses, schema).

    With ADBC each table is read in rowid slices on parallel threads: the driver releases the
    GIL while SQLite steps rows and fills Arrow columns, which is where the time goes. The
    slices are concatenated in rowid order, so the result is the same as one query's.
    """
    def where_sql(clauses: list[str]) -> str:
        return " WHERE " + " AND ".join(clauses) if clauses else ""

    db = getattr(con, "_stepscope_adbc", None)
    if db is None:
        return [_frame(con, sql + where_sql(w), schema) for _, sql, w, schema in jobs]
    threads = max(1, min(4, os.cpu_count() or 1))
    tasks = []
    for j, (table, sql, where, _) in enumerate(jobs):
        try:
            last = con.execute(f"SELECT max(rowid) FROM {table}").fetchone()[0] or 0
        except sqlite3.DatabaseError:  # a WITHOUT ROWID table: one slice
            last = 0
        parts = threads if last > SLICE_MIN_ROWS else 1
        cuts = [last * i // parts for i in range(parts + 1)]
        for i in range(parts):
            rows = [f"rowid > {cuts[i]} AND rowid <= {cuts[i + 1]}"] if parts > 1 else []
            tasks.append((j, sql + where_sql(list(where) + rows)))
    with ThreadPoolExecutor(threads) as pool:
        frames = list(pool.map(lambda t: _adbc_query(db, t[1]), tasks))
    out = []
    for j, (_, _, _, schema) in enumerate(jobs):
        parts = [f for (jj, _), f in zip(tasks, frames) if jj == j and f.height]
        # one contiguous buffer per column: every later pass (and numpy views) reads it whole
        out.append(_typed(pl.concat(parts, rechunk=True), schema) if parts else empty(schema))
    return out


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

    def col_or(self, table: str, col: str, default: str = "NULL") -> str:
        return col if col in self.cols(table) else f"{default} AS {col}"


def _metadata(con: sqlite3.Connection, schema: _Schema) -> dict[str, str]:
    for table in ("META_DATA_EXPORT", "EXPORT_META_DATA"):  # newer / older name
        if schema.has(table):
            return dict(con.execute(f"SELECT name, value FROM {table}").fetchall())
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
    except sqlite3.DatabaseError:
        return None


def _is_db_error(e: Exception) -> bool:
    return isinstance(e, sqlite3.DatabaseError) or type(e).__module__.startswith("adbc_driver")


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
        raise InputError(
            f"{path} is not a readable SQLite export ({e}); it may be truncated: export it again "
            "with nsys export --type sqlite"
        ) from None


def _read(con: sqlite3.Connection, path: Path, launch_config: bool = True) -> Trace:
    schema = _Schema(con)
    meta = _metadata(con, schema)
    warnings: list[str] = []
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
    dims = ["grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z"]
    cols = {c: t for c, t in KERNEL_SCHEMA.items() if launch_config or c not in dims}
    # globalPid is unpacked in polars (vectorized), not per row in SQLite; skipped columns are
    # added as nulls here rather than selected as NULL (which costs SQLite as much as data).
    # graphNodeId sits near the end of a wide row, where reading it costs as much as start and
    # end together: it is read only from exports that recorded CUDA graphs at all.
    graphs = _has_graphs(con, schema)
    if not graphs:
        del cols["graph_node_id"]
    select = ["globalPid", "deviceId", "streamId", "correlationId", "start", "end", "shortName", "demangledName"]
    select += ["gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ"] if launch_config else []
    select += ["graphNodeId"] if graphs else []
    jobs = [(k, f"SELECT {', '.join(select)} FROM {k}", [], _packed(cols, "pid"))]
    if schema.has(RUNTIME_TABLE):
        name_col = "nameId" if "nameId" in schema.cols(RUNTIME_TABLE) else "name"
        # Runtime (0) and driver (1) calls only: old exports also hold CUDA backtrace rows (67)
        # that repeat a call's correlationId.
        where = ["eventClass IN (0, 1)"] if "eventClass" in schema.cols(RUNTIME_TABLE) else []
        if name_col == "nameId" and schema.has("StringIds"):
            # Only the calls an analysis looks at: launches, copies/sets, syncs, profiler
            # start/stop. Attribute queries and the like are most of a big trace's API rows.
            # the ids inline: SQLite tests a literal list faster than a subquery's result
            kept = [r[0] for r in con.execute(f"SELECT id FROM StringIds WHERE {API_NAME_FILTER}")]
            where.append(f"nameId IN ({','.join(str(int(i)) for i in kept) or 'NULL'})")
        jobs.append((RUNTIME_TABLE, f"""
            SELECT globalTid, correlationId, start, end, {name_col}
            FROM {RUNTIME_TABLE}""", where, _packed({k: t for k, t in API_SCHEMA.items() if k != "tid"}, "pid")))
    frames = _bulk_frames(con, jobs)
    kernels = frames[0].with_columns(_unpack_pid("pid"))
    if not graphs:
        kernels = kernels.with_columns(pl.lit(None, pl.Int64).alias("graph_node_id"))
    api = empty(API_SCHEMA)
    if len(frames) > 1:
        # globalTid is read once: the pid and the tid are both unpacked from it
        api = frames[1].select(_unpack_pid("pid"), _unpack_tid("pid"),
                               pl.exclude("pid"))

    memops = _read_memops(con, schema)

    nvtx = _read_nvtx(con, schema)
    strings = _read_strings(con, schema, pl.concat([
        kernels["short_id"].unique(), kernels["demangled_id"].unique(), api["name_id"].unique()]).unique().drop_nulls())
    gpus = _read_gpus(con, schema)
    processes = empty(PROCESS_SCHEMA)
    if schema.has("PROCESSES"):
        processes = _frame(con, "SELECT pid, name FROM PROCESSES", PROCESS_SCHEMA)

    threads = empty(THREAD_SCHEMA)
    if schema.has("ThreadNames") and schema.has("StringIds"):
        threads = _frame(con, f"""
            SELECT {PID_SQL.format(col='t.globalTid')}, {TID_SQL.format(col='t.globalTid')}, s.value
            FROM ThreadNames t JOIN StringIds s ON s.id = t.nameId""", THREAD_SCHEMA)

    graph_level = _count(con, schema, "CUPTI_ACTIVITY_KIND_GRAPH_TRACE")
    if graph_level:
        warnings.append(
            f"per-kernel inventory unavailable for {graph_level} graph launches "
            "(traced with --cuda-graph-trace=graph; use --cuda-graph-trace=node)"
        )
    overhead_n, overhead_ns = 0, 0
    if schema.has("PROFILER_OVERHEAD"):
        overhead_n, overhead_ns = con.execute(
            "SELECT count(*), coalesce(sum(end - start), 0) FROM PROFILER_OVERHEAD"
        ).fetchone()

    return Trace(
        path=path, format="nsys-sqlite", kernels=kernels, memops=memops, api=api, nvtx=nvtx,
        strings=strings, gpus=gpus, processes=processes, threads=threads,
        nsys_version=meta.get("EXPORT_PRODUCT_VERSION"),
        schema_version=meta.get("EXPORT_SCHEMA_VERSION"),
        graph_level_launches=int(graph_level),
        profiler_overhead_count=int(overhead_n), profiler_overhead_ns=int(overhead_ns),
        warnings=warnings,
    )


def _has_graphs(con: sqlite3.Connection, schema: _Schema) -> bool:
    """Whether any kernel can carry a graphNodeId: the export has graph tables or a graph
    launch call's name. False only when both are certainly absent."""
    if "graphNodeId" not in schema.cols(KERNEL_TABLE):
        return False
    if any(t.startswith("CUDA_GRAPH") for t in schema.tables) or not schema.has("StringIds"):
        return True
    graph_names = " OR ".join(f"value GLOB '{p}*'" for p in apinames.GRAPH_LAUNCH)
    return con.execute(f"SELECT 1 FROM StringIds WHERE {graph_names} LIMIT 1").fetchone() is not None


def _count(con: sqlite3.Connection, schema: _Schema, table: str) -> int:
    return con.execute(f"SELECT count(*) FROM {table}").fetchone()[0] if schema.has(table) else 0


def _read_memops(con: sqlite3.Connection, schema: _Schema) -> pl.DataFrame:
    parts = []
    for table, kind in (("CUPTI_ACTIVITY_KIND_MEMCPY", "memcpy"), ("CUPTI_ACTIVITY_KIND_MEMSET", "memset")):
        if schema.has(table):
            parts.append(_frame(con, f"""
                SELECT globalPid, deviceId, streamId, correlationId, start, end, '{kind}' AS kind, bytes
                FROM {table}""", _packed(MEMOP_SCHEMA, "pid")).with_columns(_unpack_pid("pid")))
    return pl.concat(parts) if parts else empty(MEMOP_SCHEMA)


def _read_nvtx(con: sqlite3.Connection, schema: _Schema) -> pl.DataFrame:
    if not schema.has("NVTX_EVENTS"):
        return empty(NVTX_SCHEMA)
    cols = schema.cols("NVTX_EVENTS")
    ids = "textId" in cols and schema.has("StringIds")
    # The text id comes as an integer and is decoded once per distinct id: a StringIds lookup
    # per range in SQL cost ~1 us each (a TP=2 trace of 1M kernels has 146k ranges: 0.16 s).
    # 59 = push/pop range, 60 = start/end range; marks and domain events have no end.
    raw = _frame(con, f"""
        SELECT n.globalTid, n.start, n.end, n.text, {'n.textId' if ids else 'NULL'}
        FROM NVTX_EVENTS n
        WHERE n.eventType IN (59, 60) AND n.end IS NOT NULL""",
        {"gtid": pl.Int64, "start": pl.Int64, "end": pl.Int64, "text": pl.String, "text_id": pl.Int64})
    name = pl.col("text")
    if ids:
        need = raw.filter(pl.col("text").is_null())["text_id"].drop_nulls().unique()
        strings = _read_strings(con, schema, need)
        name = pl.coalesce(name, pl.col("text_id").replace_strict(
            strings["id"], strings["value"], default=None, return_dtype=pl.String))
    return raw.select(_unpack_pid("gtid").alias("pid"), _unpack_tid("gtid"), "start", "end",
                      name.alias("name")).cast(NVTX_SCHEMA)


def _read_strings(con: sqlite3.Connection, schema: _Schema, ids: pl.Series) -> pl.DataFrame:
    """Decode only the string ids that occur (an export's StringIds can hold 100k+ strings)."""
    if not schema.has("StringIds") or ids.len() == 0:
        return empty(STRING_SCHEMA)
    rows = []
    id_list = ids.to_list()
    for i in range(0, len(id_list), 30_000):  # stay under SQLite's bound-parameter limit
        chunk = id_list[i:i + 30_000]
        rows += con.execute(
            f"SELECT id, value FROM StringIds WHERE id IN ({','.join('?' * len(chunk))})", chunk).fetchall()
    return pl.DataFrame(rows, schema=list(STRING_SCHEMA.items()), orient="row") if rows else empty(STRING_SCHEMA)


def _read_gpus(con: sqlite3.Connection, schema: _Schema) -> pl.DataFrame:
    t = "TARGET_INFO_GPU"
    if not schema.has(t):
        return empty(GPU_SCHEMA)
    return _frame(con, f"""
        SELECT {schema.col_or(t, 'id', 'cuDevice')}, name, {schema.col_or(t, 'smCount')},
               {schema.col_or(t, 'memoryBandwidth')}, {schema.col_or(t, 'totalMemory')}
        FROM {t}""", GPU_SCHEMA).unique("device", keep="first").sort("device")
