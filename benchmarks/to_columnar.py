#!/usr/bin/env python3
"""Our own conversion of an (inflated) nsys SQLite export to nsys's two columnar layouts, for
benchmarks only: `X.arrow` (Arrow IPC streams back to back, one per table, the name in the
schema's `table_name`, as nsys 2025.3.1's --type=arrow writes them) and `X.parquetdir/` (one
`<TABLE>.parquet` each). NOT nsys's output: its column types are what ADBC reads from SQLite.

    python benchmarks/to_columnar.py bench-out/llama8b_decode_b1_bare_1M.sqlite
"""
from __future__ import annotations

import sys
from pathlib import Path


def convert(src: Path) -> tuple[Path, Path]:
    import adbc_driver_sqlite.dbapi as dbapi
    import pyarrow.ipc as ipc
    import pyarrow.parquet as pq

    arrow, pdir = src.with_suffix(".arrow"), src.with_suffix(".parquetdir")
    pdir.mkdir(exist_ok=True)
    with dbapi.connect(src.resolve().as_uri() + "?mode=ro") as con, open(arrow, "wb") as f:
        cur = con.cursor()
        cur.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        names = [r[0] for r in cur.fetchall()]
        for name in names:
            cur.execute(f"SELECT * FROM {name} ORDER BY rowid")
            t = cur.fetch_arrow_table().replace_schema_metadata({"table_name": name})
            with ipc.new_stream(f, t.schema) as w:
                w.write_table(t)
            pq.write_table(t, pdir / f"{name}.parquet")
        cur.close()
    return arrow, pdir


if __name__ == "__main__":
    for p in sys.argv[1:]:
        print(*convert(Path(p)))
