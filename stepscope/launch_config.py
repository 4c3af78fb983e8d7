"""Grid and block of a few kernels, read from an nsys export after the analysis asked for them.

Every command reads kernels without their launch configuration (half the kernel read on a
million kernels, and six 64-bit columns per kernel held through the analysis) except `export`,
which writes every kernel's. Phase evidence (analysis/phase.py) needs the grid of only a handful
of kernel names, and only for steps whose name records no phase; the byte budget needs those of
one step's kernels (Inventory.step_acts). This reads those rows alone, from the same read-only
export, when the analysis calls for them.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Callable

import polars as pl

LAUNCH_CONFIG_SCHEMA = {"pid": pl.Int64, "corr": pl.Int64, "start": pl.Int64, "grid_x": pl.Int64,
                        "grid_y": pl.Int64, "grid_z": pl.Int64, "block_x": pl.Int64, "block_y": pl.Int64,
                        "block_z": pl.Int64}
DIMS = tuple(c for c in LAUNCH_CONFIG_SCHEMA if c.startswith(("grid_", "block_")))
LaunchConfigReader = Callable[..., pl.DataFrame]  # (short_ids, dims=DIMS) -> pid, corr, start and those dims


class NsysLaunchConfig:
    """Reads (pid, corr, start, grid_*, block_*) of chosen kernels from the nsys SQLite export
    at `path` (read-only; through ADBC's Arrow stream when the driver is installed, as the
    reader does: ~4x faster than sqlite3's row tuples). Called with shortName string ids (a
    LaunchConfigReader): the kernels of those names; `window(devices, lo, hi)`: the kernels of
    those devices that started from lo to hi ns."""

    def __init__(self, path: str | Path) -> None:
        from stepscope.ingest import file_identity

        self.path = Path(path)
        self._identity = file_identity(self.path)  # rows read later must be this file's

    def __call__(self, short_ids: list[int], dims: tuple[str, ...] = DIMS) -> pl.DataFrame:
        """The kernels of those names, with the launch columns `dims` alone (fewer columns, less
        to take out of SQLite: phase evidence reads four of the six)."""
        return self._of_names(short_ids, dims)

    def within(self, first: int, last: int) -> LaunchConfigReader:
        """A LaunchConfigReader of the kernels among rowids first..last alone: a window of a long
        run (analysis/windows.py) asks for the grids of its own kernels, from the rows it read."""
        return lambda short_ids, dims=DIMS: self._of_names(short_ids, dims, (int(first), int(last)))

    def _of_names(self, short_ids: list[int], dims: tuple[str, ...], span: tuple[int, int] | None = None) -> pl.DataFrame:
        if not short_ids:
            return pl.DataFrame(schema=_schema(dims))
        return self._read(f"shortName IN ({','.join(str(int(i)) for i in short_ids)})", dims=dims, span=span)

    def window(self, devices: list[int], lo: int, hi: int, narrow: bool = True) -> pl.DataFrame:
        """The kernels of `devices` that started from lo to hi, in the table's row order (one
        query for every device: an export's rows are in start order across devices, so the
        rows come sorted as they are, with no copy to sort them). `narrow`: only among the rows
        whose place in the table says they may have (rows_near): an export's kernel rows are
        nearly in start order, and a bisection over the rowid finds a step's few thousand rows
        of millions with a few dozen lookups instead of a scan. Where the order does not hold,
        some are missed: the caller checks and reads again with narrow=False."""
        where = (f"deviceId IN ({','.join(str(int(d)) for d in devices)}) AND start >= {int(lo)} "
                 f"AND start <= {int(hi)}")
        return self._read(where, (lo, hi) if narrow else None)

    def _read(self, where: str, near: tuple[int, int] | None = None, dims: tuple[str, ...] = DIMS,
              span: tuple[int, int] | None = None) -> pl.DataFrame:
        from stepscope.errors import InputError
        from stepscope.ingest import file_identity
        from stepscope.ingest import nsys_sqlite as ns
        from stepscope.paths import shown

        if self._identity is None or file_identity(self.path) != self._identity:
            raise InputError(f"{shown(self.path)} changed since it was analyzed: analyze it again to read its "
                             "kernels' grid and block")
        table = ns.KERNEL_TABLE
        con = ns.connect_readonly(self.path)
        try:
            try:
                if span is None:
                    span = rows_near(con, table, *near) if near is not None else None
                if span is None:
                    first, last = rowid_span(con, table)
                    span = None if first is None else (first, last)
            except sqlite3.DatabaseError:  # a table without rowids (not nsys's): one plain read
                span = None
            have = {r[1] for r in con.execute(f"PRAGMA table_info({table})")}
            # an old export may lack a column
            schema = _schema(dims)
            cols = [c if c in have else "NULL" for c in (ns.LAUNCH_COLUMNS[d] for d in dims)]
            # globalPid packs <hw:8><vm:8><pid:24><tid:24>
            sql = (f"SELECT ((globalPid >> 24) & 16777215) AS pid, correlationId, start, {', '.join(cols)} "
                   f"FROM {table} WHERE {where}")
            frame = _adbc_slices(con, self.path, sql, span, schema)
            if frame is None:
                if span is not None:
                    sql += f" AND rowid BETWEEN {span[0]} AND {span[1]}"
                frame = _typed(pl.DataFrame(con.execute(sql).fetchall(), schema=list(schema),
                                            orient="row", strict=False), schema)
        finally:
            con.close()
        return frame


def _schema(dims: tuple[str, ...]) -> dict:
    return {c: t for c, t in LAUNCH_CONFIG_SCHEMA.items() if c in ("pid", "corr", "start") or c in dims}


def _typed(frame: pl.DataFrame, schema: dict = LAUNCH_CONFIG_SCHEMA) -> pl.DataFrame:
    if frame.is_empty():
        return pl.DataFrame(schema=schema)
    # evidence, not figures: a value of the wrong type (a damaged export) leaves its row out
    return frame.select([pl.col(c).cast(t, strict=False).alias(n)
                         for c, (n, t) in zip(frame.columns, schema.items())]).drop_nulls(
        ["pid", "corr", "start"])


def _adbc_slices(con, path: Path, sql: str, span: tuple[int, int] | None,
                 schema: dict = LAUNCH_CONFIG_SCHEMA) -> pl.DataFrame | None:
    """`sql` over the rows of `span` (rowids, inclusive), in rowid order, through the reader's
    ADBC path (ingest/nsys_sqlite.py: its batch size, its wait on a locked file, rowid slices on
    parallel threads for a big span); None without the driver, or where ADBC met a value of
    another type than its first (the caller reads through sqlite3 then, typed value by value)."""
    from concurrent.futures import ThreadPoolExecutor

    from stepscope.ingest import nsys_sqlite as ns

    ns._attach_adbc(con, path)
    db = con._stepscope_adbc
    if db is None:
        return None
    if span is None:
        sqls = [sql]
    else:
        first, last = span
        parts = ns.read_threads() if last - first + 1 > ns.SLICE_MIN_ROWS else 1
        cuts = [first - 1 + (last - first + 1) * i // parts for i in range(parts + 1)]
        sqls = [f"{sql} AND rowid > {cuts[i]} AND rowid <= {cuts[i + 1]}" for i in range(parts)]
    try:
        with ThreadPoolExecutor(len(sqls)) as pool:
            frames = list(pool.map(lambda q: ns._adbc_query(db, q), sqls))
    except ns._ReadError:
        return None
    return pl.concat([_typed(f, schema) for f in frames])


def rowid_span(con, table: str) -> tuple[int | None, int | None]:
    """(min, max) rowid of `table` by two lookups at the ends of its B-tree. One query asking for
    both is a scan of the whole table: SQLite answers min() or max() from the index only when it
    is the query's single aggregate (0.2 s on a million kernels, every time phase evidence read)."""
    return con.execute(f"SELECT (SELECT min(rowid) FROM {table}), (SELECT max(rowid) FROM {table})").fetchone()


NEAR_MARGIN = 4096  # rows either side of the bisection's bounds: kernels of other streams and devices interleave


def rows_near(con, table: str, lo: int, hi: int) -> tuple[int, int] | None:
    """The rowids from the first row whose start is at or after `lo` to the last at or before
    `hi`, by bisection over the rowid as if the table were sorted by start, widened by
    NEAR_MARGIN rows; None for a table without rows."""
    first, last = rowid_span(con, table)
    if first is None:
        return None

    def start_at(r: int):
        row = con.execute(f"SELECT start FROM {table} WHERE rowid >= ? ORDER BY rowid LIMIT 1", (r,)).fetchone()
        return None if row is None else row[0]

    def bisect(value: int, after: bool) -> int:
        a, b = first, last + 1  # the first rowid whose start is >= value (> value when after)
        while a < b:
            m = (a + b) // 2
            v = start_at(m)
            # a start of another type (text, a blob in a damaged row) is no position: skip it
            if isinstance(v, (int, float)) and not isinstance(v, bool) and (v > value if after else v >= value):
                b = m
            else:
                a = m + 1
        return a

    return max(first, bisect(lo, False) - NEAR_MARGIN), min(last, bisect(hi, True) - 1 + NEAR_MARGIN)


def nsys_reader(path: str | Path) -> NsysLaunchConfig:
    return NsysLaunchConfig(path)


def arrow_reader(path: str | Path) -> "ColumnarLaunchConfig":
    return ColumnarLaunchConfig(path, "arrow")


def parquetdir_reader(path: str | Path) -> "ColumnarLaunchConfig":
    return ColumnarLaunchConfig(path, "parquetdir")


class ColumnarLaunchConfig:
    """NsysLaunchConfig's reads from nsys's columnar export (`--type=arrow` or `parquetdir`):
    the kernel table's few columns taken again (Parquet reads only those; the Arrow file is
    memory-mapped), filtered in polars, in the table's row order."""

    def __init__(self, path: str | Path, kind: str) -> None:
        from stepscope.ingest import file_identity

        self.path, self.kind = Path(path), kind
        self._identity = file_identity(self.path)

    def __call__(self, short_ids: list[int], dims: tuple[str, ...] = DIMS) -> pl.DataFrame:
        if not short_ids:
            return pl.DataFrame(schema=_schema(dims))
        return self._read(pl.col("shortName").is_in([int(i) for i in short_ids]), dims)

    def window(self, devices: list[int], lo: int, hi: int, narrow: bool = True) -> pl.DataFrame:
        return self._read(pl.col("deviceId").is_in([int(d) for d in devices]) & (pl.col("start") >= int(lo))
                          & (pl.col("start") <= int(hi)), DIMS)

    def _read(self, where: pl.Expr, dims: tuple[str, ...]) -> pl.DataFrame:
        from stepscope.errors import InputError
        from stepscope.ingest import file_identity
        from stepscope.ingest import nsys_columnar as nc
        from stepscope.ingest import nsys_sqlite as ns
        from stepscope.paths import shown

        if self._identity is None or file_identity(self.path) != self._identity:
            raise InputError(f"{shown(self.path)} changed since it was analyzed: analyze it again to read its "
                             "kernels' grid and block")
        t = nc.Tables(self.path, self.kind)
        have = t.cols(ns.KERNEL_TABLE)
        schema = _schema(dims)
        cols = [c for c in ("globalPid", "correlationId", "start", "deviceId", "shortName",
                            *(ns.LAUNCH_COLUMNS[d] for d in dims)) if c in have]
        k = t.frame(ns.KERNEL_TABLE, cols).filter(where)
        frame = k.select(((pl.col("globalPid") // (1 << 24)) % (1 << 24)).alias("pid"), "correlationId", "start",
                         *[pl.col(ns.LAUNCH_COLUMNS[d]) if ns.LAUNCH_COLUMNS[d] in have else pl.lit(None)
                           for d in dims])
        return _typed(frame, schema)
