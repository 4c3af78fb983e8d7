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
    string ids, from the nsys SQLite export at `path`."""
    from stepscope.ingest.nsys_sqlite import KERNEL_TABLE, PID_SQL, connect_readonly

    def read(short_ids: list[int]) -> pl.DataFrame:
        if not short_ids:
            return pl.DataFrame(schema=LAUNCH_CONFIG_SCHEMA)
        con = connect_readonly(Path(path))
        try:
            rows = con.execute(
                f"SELECT {PID_SQL.format(col='globalPid')}, correlationId, start, gridX, gridY, gridZ, "
                f"blockX, blockY, blockZ FROM {KERNEL_TABLE} "
                f"WHERE shortName IN ({','.join(str(int(i)) for i in short_ids)})").fetchall()
        finally:
            con.close()
        return pl.DataFrame(rows, schema=list(LAUNCH_CONFIG_SCHEMA.items()), orient="row")

    return read
