"""The cells table: one row per profiled launch of a sentinel cell (or per imported launch).

Columns (units in the names): gpu, model, sweep, cell, op, proj, tokens, batch, context,
launch (index of the launch inside its cell), id (ncu ID), pid, kernel, grid, block,
grid_x/y/z, block_x/y/z, dram_read_bytes, dram_write_bytes, duration_ns, l2_hit_pct,
matched (the op's regex matched the kernel), cell_min_bytes (theoretical minimum of the
whole cell, i.e. one op call), error, clock_control, ncu_version, source, plus any other
requested metric under its ncu name. A cell that failed has one row with `error` set and
null metrics.

Stored as Parquet (the canonical form) and CSV (same columns); `read_cells` takes either,
or raw ncu CSV output, which it imports on the fly.
"""

from __future__ import annotations

import math
from pathlib import Path

import polars as pl

from stepscope.bytes import ncu as ncu_csv
from stepscope.bytes.hbm import same_gpu
from stepscope.errors import InputError
from stepscope.paths import input_file

SCHEMA: dict[str, pl.DataType] = {
    "gpu": pl.String, "model": pl.String, "sweep": pl.String, "cell": pl.String,
    "op": pl.String, "proj": pl.String, "tokens": pl.Int64, "batch": pl.Int64,
    "context": pl.Int64, "launch": pl.Int64, "id": pl.Int64, "pid": pl.Int64,
    "kernel": pl.String, "grid": pl.String, "block": pl.String,
    "grid_x": pl.Int64, "grid_y": pl.Int64, "grid_z": pl.Int64,
    "block_x": pl.Int64, "block_y": pl.Int64, "block_z": pl.Int64,
    "dram_read_bytes": pl.Int64, "dram_write_bytes": pl.Int64, "duration_ns": pl.Int64,
    "l2_hit_pct": pl.Float64, "matched": pl.Boolean, "cell_min_bytes": pl.Int64,
    "error": pl.String, "clock_control": pl.String, "ncu_version": pl.String,
    "source": pl.String,
}
_DROP = {"process", "device", "cc", "stream"}


def frame(rows: list[dict]) -> pl.DataFrame:
    """Rows (dicts) -> the cells table with the canonical schema first, extras after."""
    extras: list[str] = []
    for r in rows:
        for k in r:
            if k not in SCHEMA and k not in _DROP and k not in extras:
                extras.append(k)
    data = {c: [_fit(r, c, t) for r in rows] for c, t in SCHEMA.items()}
    data["error"] = [r.get("error") for r in rows]  # _fit may have noted an unreadable value
    df = pl.DataFrame(data, schema=SCHEMA)
    for k in extras:
        vals = [r.get(k) for r in rows]
        # numbers stay numbers; anything else is text (a non-strict float cast would turn
        # text such as an engine name into null)
        if all(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) for v in vals):
            df = df.with_columns(pl.Series(k, vals, dtype=pl.Float64))
        else:
            df = df.with_columns(pl.Series(k, [None if v is None else str(v) for v in vals],
                                           dtype=pl.String))
    return df


_INT64 = 1 << 63


def _fit(row: dict, col: str, dtype) -> object:
    """row[col] as the column's type, or None; a value that is there but unreadable (text where
    a count belongs, a count beyond 64 bits) makes the row an error row saying so, instead of
    failing the whole table."""
    v = row.get(col)
    if v is None:
        return None
    if dtype == pl.Int64 and isinstance(v, int) and not isinstance(v, bool) and -_INT64 <= v < _INT64:
        return v
    if dtype == pl.Float64 and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
        return float(v)
    if dtype == pl.String and isinstance(v, str):
        return v
    if dtype == pl.Boolean and isinstance(v, bool):
        return v
    if col != "error" and row.get("error") is None:
        row["error"] = f"unreadable {col}: {str(v)[:40]!r}"
    return None


def import_ncu(paths: list[str | Path], gpu: str | None = None,
               model: str | None = None) -> pl.DataFrame:
    """Raw ncu CSV files -> cells table (one row per profiled launch; no cell metadata)."""
    parsed = ncu_csv.parse_files(list(paths))
    rows = []
    order = {src: i for i, src in enumerate(parsed.sources)}  # files in the order given
    seen: dict[str, int] = {}
    # files in the order given, each in its own order (a file of several ncu runs restarts ids)
    for d in sorted(parsed.launches, key=lambda x: order.get(x["source"], 0)):
        r = ncu_csv.launch_record(d)
        name = r.pop("device__attribute_display_name", None)
        # a cell is named after its file and ncu's launch id, so budget and cells show can say
        # which measured launch a kernel was joined to
        r.update({"gpu": gpu or (name if isinstance(name, str) else None), "model": model,
                  "cell": f"{Path(str(d['source'])).stem}#{seen.setdefault(d['source'], 0)}",
                  "launch": None, "matched": None, "error": None})
        seen[d["source"]] += 1
        rows.append(r)
    return frame(rows)


def write_cells(df: pl.DataFrame, out: str | Path, force: bool = False) -> list[Path]:
    """Write `<out>.parquet` and `<out>.csv` (out may carry either suffix, or none)."""
    from stepscope.render.output import OutputError, write_atomic_with

    pq, csv = outputs_of(out)
    try:
        pq.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputError(f"cannot write {pq}: {e.strerror or e}") from None
    for path, write in ((pq, df.write_parquet), (csv, df.write_csv)):
        try:  # each file appears whole or not at all
            write_atomic_with(path, write, force)
        except pl.exceptions.PolarsError as e:
            raise OutputError(f"cannot write {path}: {_first_line(e)}") from None
    return [pq, csv]


def outputs_of(out: str | Path) -> list[Path]:
    """The two files `write_cells(df, out)` writes."""
    out = Path(out)
    stem = out.with_suffix("") if out.suffix in (".parquet", ".csv") else out
    return [stem.with_suffix(".parquet"), stem.with_suffix(".csv")]


def read_cells(path: str | Path) -> pl.DataFrame:
    """A cells table from Parquet, a cells CSV, or raw ncu CSV output."""
    p = input_file(path, "a cells file (.parquet or .csv) or an ncu CSV")
    if p.suffix == ".parquet":
        try:
            df = pl.read_parquet(p)
        except Exception as e:
            raise InputError(f"{p}: not a readable Parquet cells file ({_first_line(e)})") from None
    else:
        try:
            with open(p, "rb") as f:
                head = f.read(4096).decode("utf-8", "replace")
        except OSError as e:
            raise InputError(f"{p}: cannot be read ({e.strerror or e})") from None
        if not head.strip():
            raise InputError(f"{p}: the file is empty")
        first = head.lstrip().splitlines()[0]
        if first.startswith("gpu,") or first.startswith('"gpu",'):
            try:
                df = pl.read_csv(p, schema_overrides=SCHEMA, infer_schema_length=10000)
            except pl.exceptions.PolarsError as e:
                raise InputError(f"{p}: not a readable cells CSV ({_first_line(e)}); write it again "
                                 "with stepscope cells import") from None
        else:
            return import_ncu([p])
    missing = [c for c in ("kernel", "dram_read_bytes", "dram_write_bytes") if c not in df.columns]
    if missing:
        raise InputError(f"{p}: not a cells table (lacks {', '.join(missing)})")
    # a column of the wrong kind (a cells file written by hand, or by another tool) would fail
    # deep inside the budget's joins: numbers must be numbers, names text, flags booleans
    for c, t in SCHEMA.items():
        have = df[c].dtype if c in df.columns else pl.Null
        if have != pl.Null and not (have == t or (t.is_numeric() and have.is_numeric())):
            raise InputError(f"{p}: column {c} is {have}, not {t}: not a cells table stepscope "
                             "wrote; write it again with stepscope cells import")
    return df


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def read_many(paths: list[str | Path]) -> pl.DataFrame:
    cells = [p for p in paths if Path(p).suffix == ".parquet" or _is_cells_csv(p)]
    raw = [p for p in paths if p not in cells]
    frames = [read_cells(p) for p in cells]
    if raw:
        frames.append(import_ncu(raw))
    return pl.concat(frames, how="diagonal_relaxed") if len(frames) > 1 else frames[0]


def _is_cells_csv(p) -> bool:
    p = Path(p)
    if p.suffix != ".csv":
        return False
    input_file(p, "a cells file (.parquet or .csv) or an ncu CSV")  # before open(): a FIFO blocks
    with open(p, errors="replace") as f:
        first = f.readline()
    return first.startswith("gpu,") or first.startswith('"gpu",')


def gpus_of(df: pl.DataFrame) -> list[str]:
    if "gpu" not in df.columns:
        return []
    return sorted({g for g in df["gpu"].to_list() if g})


def check_gpu(df: pl.DataFrame, gpu_name: str | None, where: str = "cells") -> None:
    """Raise when the cells were measured on another GPU model than `gpu_name`."""
    if not gpu_name:
        return
    other = [g for g in gpus_of(df) if not same_gpu(g, gpu_name)]
    if other:
        raise InputError(f"{where} were measured on {', '.join(other)}, not on {gpu_name}: "
                         "byte counts do not transfer between GPUs; measure this GPU with "
                         "`stepscope cells run`")


def ledger(df: pl.DataFrame, peak_bps: float | None = None) -> pl.DataFrame:
    """Per launch: total DRAM bytes, achieved bandwidth, and (per cell) amplification."""
    d = df.with_columns(
        (pl.col("dram_read_bytes").fill_null(0) + pl.col("dram_write_bytes").fill_null(0))
        .alias("dram_bytes"),
    ).with_columns(
        pl.when(pl.col("duration_ns") > 0)
        .then(pl.col("dram_bytes") / pl.col("duration_ns") * 1e9)
        .otherwise(None).alias("achieved_bps"),
    )
    if "cell" in d.columns and d["cell"].null_count() < d.height:
        per_cell = (d.filter(pl.col("error").is_null() & pl.col("cell").is_not_null()
                             & pl.col("matched").fill_null(True))
                    .group_by("cell").agg(pl.col("dram_bytes").sum().alias("cell_dram_bytes")))
        d = d.join(per_cell, on="cell", how="left").with_columns(
            pl.when(pl.col("cell_min_bytes") > 0)
            .then(pl.col("cell_dram_bytes") / pl.col("cell_min_bytes"))
            .otherwise(None).alias("amplification"))
    else:
        d = d.with_columns(pl.lit(None, pl.Int64).alias("cell_dram_bytes"),
                           pl.lit(None, pl.Float64).alias("amplification"))
    if peak_bps:
        d = d.with_columns((pl.col("achieved_bps") / peak_bps * 100).alias("pct_of_peak"))
    return d
