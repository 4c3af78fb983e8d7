"""Grid and block of a few kernels, read from an nsys export after the analysis asked for them.

`stepscope analyze` reads kernels without their launch configuration (half the kernel read on
a million kernels). Phase evidence (analysis/phase.py) needs the grid of only a handful of
kernel names, and only for steps whose name records no phase: this reads those rows alone,
from the same read-only export, when the analysis calls for them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import polars as pl

LAUNCH_CONFIG_SCHEMA = {"pid": pl.Int64, "corr": pl.Int64, "start": pl.Int64, "grid_x": pl.Int64,
                        "grid_y": pl.Int64, "grid_z": pl.Int64, "block_x": pl.Int64, "block_y": pl.Int64,
                        "block_z": pl.Int64}
LaunchConfigReader = Callable[[list[int]], pl.DataFrame]


def nsys_reader(path: str | Path) -> LaunchConfigReader:
    """A reader of (pid, corr, start, grid_*, block_*) for the kernels with the given shortName
    string ids, from the nsys SQLite export at `path` (read-only; through ADBC's Arrow stream
    when the driver is installed, as the reader does: ~4x faster than sqlite3's row tuples)."""
    from stepscope.ingest.nsys_sqlite import KERNEL_TABLE, connect_readonly

    pid_sql = "((globalPid >> 24) & 16777215)"  # globalPid packs <hw:8><vm:8><pid:24><tid:24>

    def read(short_ids: list[int]) -> pl.DataFrame:
        if not short_ids:
            return pl.DataFrame(schema=LAUNCH_CONFIG_SCHEMA)
        sql = (f"SELECT {pid_sql} AS pid, correlationId, start, gridX, gridY, gridZ, "
               f"blockX, blockY, blockZ FROM {KERNEL_TABLE} "
               f"WHERE shortName IN ({','.join(str(int(i)) for i in short_ids)})")
        frame = _adbc(Path(path), sql)
        if frame is None:
            con = connect_readonly(Path(path))
            try:
                rows = con.execute(sql).fetchall()
            finally:
                con.close()
            frame = pl.DataFrame(rows, schema=list(LAUNCH_CONFIG_SCHEMA), orient="row", strict=False)
        if frame.is_empty():
            return pl.DataFrame(schema=LAUNCH_CONFIG_SCHEMA)
        # evidence, not figures: a value of the wrong type (a damaged export) leaves its row out
        return frame.select([pl.col(c).cast(t, strict=False).alias(n)
                             for c, (n, t) in zip(frame.columns, LAUNCH_CONFIG_SCHEMA.items())]).drop_nulls(
            ["pid", "corr", "start", "grid_x"])

    return read


def _adbc(path: Path, sql: str) -> pl.DataFrame | None:
    """One query through ADBC's low-level API (its DB-API layer would import pyarrow and pandas),
    or None without the driver."""
    try:
        import adbc_driver_manager
        import adbc_driver_sqlite
    except ImportError:
        return None
    db = adbc_driver_sqlite.connect(path.resolve().as_uri() + "?mode=ro")
    try:
        conn = adbc_driver_manager.AdbcConnection(db)
        try:
            stmt = adbc_driver_manager.AdbcStatement(conn)
            try:
                stmt.set_sql_query(sql)
                stream, _ = stmt.execute_query()
                return pl.DataFrame(stream)
            finally:
                stmt.close()
        finally:
            conn.close()
    finally:
        db.close()
