"""Reader for Nsight Systems SQLite exports (`nsys export --type sqlite`, nsys 2022.2 → 2026.x).

The file is opened read-only (SQLite URI `mode=ro`): the user's export is never modified.
Only the columns stepscope uses are read, and `StringIds` is decoded only for ids that occur.
Tables exist only when events of that kind were recorded, so every table is optional except
the kernel table.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import polars as pl

from stepscope.errors import InputError
from stepscope.model import (
    API_SCHEMA, GPU_SCHEMA, KERNEL_SCHEMA, MEMOP_SCHEMA, NVTX_SCHEMA, PROCESS_SCHEMA,
    STRING_SCHEMA, Trace, empty,
)

SQLITE_MAGIC = b"SQLite format 3\x00"
KERNEL_TABLE = "CUPTI_ACTIVITY_KIND_KERNEL"
RUNTIME_TABLE = "CUPTI_ACTIVITY_KIND_RUNTIME"

# globalTid packs <hw:8><vm:8><pid:24><tid:24>; globalPid is the same with tid = 0.
PID_SQL = "((({col}) >> 24) & 16777215)"
TID_SQL = "(({col}) & 16777215)"


def is_sqlite(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(16) == SQLITE_MAGIC


def connect_readonly(path: Path) -> sqlite3.Connection:
    """Open an export read-only; `immutable` is not used so a file still being written is safe."""
    uri = Path(path).resolve().as_uri() + "?mode=ro"
    con = sqlite3.connect(uri, uri=True)
    con.execute("PRAGMA query_only = 1")
    return con


def _frame(con: sqlite3.Connection, sql: str, schema: dict) -> pl.DataFrame:
    rows = con.execute(sql).fetchall()
    if not rows:
        return empty(schema)
    return pl.DataFrame(rows, schema=list(schema.items()), orient="row")


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
        return col if col in self.cols(table) else default


def _metadata(con: sqlite3.Connection, schema: _Schema) -> dict[str, str]:
    for table in ("META_DATA_EXPORT", "EXPORT_META_DATA"):  # newer / older name
        if schema.has(table):
            return dict(con.execute(f"SELECT name, value FROM {table}").fetchall())
    return {}


def read_nsys_sqlite(path: str | Path) -> Trace:
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such file; give the path of an nsys SQLite export")
    if path.is_dir():
        raise InputError(f"{path} is a directory; give the path of an nsys SQLite export")
    if not is_sqlite(path):
        raise InputError(
            f"{path} is not a SQLite file; export the report first: "
            "nsys export --type sqlite report.nsys-rep"
        )
    try:
        con = connect_readonly(path)
        try:
            return _read(con, path)
        finally:
            con.close()
    except sqlite3.DatabaseError as e:
        raise InputError(
            f"{path} is not a readable SQLite export ({e}); it may be truncated: export it again "
            "with nsys export --type sqlite"
        ) from None


def _read(con: sqlite3.Connection, path: Path) -> Trace:
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
    kernels = _frame(con, f"""
        SELECT {PID_SQL.format(col='globalPid')}, deviceId, streamId, correlationId, start, end,
               shortName, demangledName,
               gridX, gridY, gridZ, blockX, blockY, blockZ, {schema.col_or(k, 'graphNodeId')}
        FROM {k}""", KERNEL_SCHEMA)

    memops = _read_memops(con, schema)

    api = empty(API_SCHEMA)
    if schema.has(RUNTIME_TABLE):
        name_col = "nameId" if "nameId" in schema.cols(RUNTIME_TABLE) else "name"
        # Runtime (0) and driver (1) calls only: old exports also hold CUDA backtrace rows (67)
        # that repeat a call's correlationId.
        where = "WHERE eventClass IN (0, 1)" if "eventClass" in schema.cols(RUNTIME_TABLE) else ""
        api = _frame(con, f"""
            SELECT {PID_SQL.format(col='globalTid')}, {TID_SQL.format(col='globalTid')},
                   correlationId, start, end, {name_col}
            FROM {RUNTIME_TABLE} {where}""", API_SCHEMA)

    nvtx = _read_nvtx(con, schema)
    strings = _read_strings(con, schema)
    gpus = _read_gpus(con, schema)
    processes = empty(PROCESS_SCHEMA)
    if schema.has("PROCESSES"):
        processes = _frame(con, "SELECT pid, name FROM PROCESSES", PROCESS_SCHEMA)

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
        strings=strings, gpus=gpus, processes=processes,
        nsys_version=meta.get("EXPORT_PRODUCT_VERSION"),
        schema_version=meta.get("EXPORT_SCHEMA_VERSION"),
        graph_level_launches=int(graph_level),
        profiler_overhead_count=int(overhead_n), profiler_overhead_ns=int(overhead_ns),
        warnings=warnings,
    )


def _count(con: sqlite3.Connection, schema: _Schema, table: str) -> int:
    return con.execute(f"SELECT count(*) FROM {table}").fetchone()[0] if schema.has(table) else 0


def _read_memops(con: sqlite3.Connection, schema: _Schema) -> pl.DataFrame:
    parts = []
    for table, kind in (("CUPTI_ACTIVITY_KIND_MEMCPY", "memcpy"), ("CUPTI_ACTIVITY_KIND_MEMSET", "memset")):
        if schema.has(table):
            parts.append(_frame(con, f"""
                SELECT {PID_SQL.format(col='globalPid')}, deviceId, streamId, correlationId,
                       start, end, '{kind}', bytes
                FROM {table}""", MEMOP_SCHEMA))
    return pl.concat(parts) if parts else empty(MEMOP_SCHEMA)


def _read_nvtx(con: sqlite3.Connection, schema: _Schema) -> pl.DataFrame:
    if not schema.has("NVTX_EVENTS"):
        return empty(NVTX_SCHEMA)
    cols = schema.cols("NVTX_EVENTS")
    text = "n.text"
    if "textId" in cols and schema.has("StringIds"):
        text = "coalesce(n.text, (SELECT value FROM StringIds s WHERE s.id = n.textId))"
    # 59 = push/pop range, 60 = start/end range; marks and domain events have no end.
    return _frame(con, f"""
        SELECT {PID_SQL.format(col='n.globalTid')}, {TID_SQL.format(col='n.globalTid')},
               n.start, n.end, {text}
        FROM NVTX_EVENTS n
        WHERE n.eventType IN (59, 60) AND n.end IS NOT NULL""", NVTX_SCHEMA)


def _read_strings(con: sqlite3.Connection, schema: _Schema) -> pl.DataFrame:
    if not schema.has("StringIds"):
        return empty(STRING_SCHEMA)
    used = [f"SELECT shortName FROM {KERNEL_TABLE}", f"SELECT demangledName FROM {KERNEL_TABLE}"]
    if schema.has(RUNTIME_TABLE) and "nameId" in schema.cols(RUNTIME_TABLE):
        used.append(f"SELECT nameId FROM {RUNTIME_TABLE}")
    return _frame(
        con, f"SELECT id, value FROM StringIds WHERE id IN ({' UNION '.join(used)})", STRING_SCHEMA
    )


def _read_gpus(con: sqlite3.Connection, schema: _Schema) -> pl.DataFrame:
    t = "TARGET_INFO_GPU"
    if not schema.has(t):
        return empty(GPU_SCHEMA)
    return _frame(con, f"""
        SELECT {schema.col_or(t, 'id', 'cuDevice')}, name, {schema.col_or(t, 'smCount')},
               {schema.col_or(t, 'memoryBandwidth')}, {schema.col_or(t, 'totalMemory')}
        FROM {t}""", GPU_SCHEMA).unique("device", keep="first").sort("device")
