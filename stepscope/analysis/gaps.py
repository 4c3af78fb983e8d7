"""GPU gaps of each step and who caused them (DEFINITIONS.md, "Gaps").

A gap opens when an activity starts after everything before it (by start) on the device has
ended. It is attributed, in this order:
  sync        a synchronizing API call of the process returned inside the gap: the host
              waited for the GPU to drain and only then asked for more (a sync that spans the
              whole gap only shows the host waiting on work already queued)
  host_bound  the late activity's launching call started after the previous work ended
  device_side the launch was issued in time (or the trace lacks the launching call)
"""

from __future__ import annotations

import polars as pl

from stepscope.analysis.inventory import Inventory

KINDS = ("host_bound", "sync", "device_side")

GAP_SCHEMA = {
    "step": pl.Int64, "device": pl.Int64, "gap_start": pl.Int64, "gap_end": pl.Int64,
    "gap_ns": pl.Int64, "kind": pl.String, "prev_name": pl.String, "next_name": pl.String,
    "next_api": pl.String, "next_launch_start": pl.Int64,
}


def find_gaps(inv: Inventory) -> pl.DataFrame:
    # inv.acts is sorted by (step, start, end) and carries prev_end, the union's end before it
    a = inv.acts.filter(pl.col("step").is_not_null())
    a = a.with_columns(_cum_end=pl.col("end").cum_max().over("step"))
    # the activity whose end closes the union before the gap: the last one holding the max end
    a = a.with_columns(
        prev_name=pl.when(pl.col("end") == pl.col("_cum_end"))
        .then(pl.col("name")).otherwise(None).forward_fill().shift(1).over("step"),
    )
    g = a.filter(pl.col("start") > pl.col("prev_end")).select(
        "step", "device", "pid",
        pl.col("prev_end").alias("gap_start"), pl.col("start").alias("gap_end"),
        (pl.col("start") - pl.col("prev_end")).alias("gap_ns"),
        "prev_name", pl.col("name").alias("next_name"), "launch_name_id",
        pl.col("launch_start").alias("next_launch_start"),
    )
    if g.is_empty():
        return pl.DataFrame(schema=GAP_SCHEMA)
    names = inv.api.select("name_id", "api_name").unique("name_id")
    g = g.join(names, left_on="launch_name_id", right_on="name_id", how="left").rename({"api_name": "next_api"})
    sync = inv.api.filter(pl.col("is_sync")).select("pid", pl.col("end").alias("s_end")).sort("s_end")
    g = g.sort("gap_end")
    if sync.height:
        g = g.join_asof(sync, left_on="gap_end", right_on="s_end", by="pid", strategy="backward",
                        check_sortedness=False)
        in_sync = pl.col("s_end").is_not_null() & (pl.col("s_end") >= pl.col("gap_start"))
    else:
        in_sync = pl.lit(False)
    kind = (
        pl.when(in_sync).then(pl.lit("sync"))
        .when(pl.col("next_launch_start") > pl.col("gap_start")).then(pl.lit("host_bound"))
        .otherwise(pl.lit("device_side"))
    )
    return g.with_columns(kind=kind).select(list(GAP_SCHEMA)).sort("step", "gap_start")


def gap_totals(gaps: pl.DataFrame, step_ids: list[int]) -> pl.DataFrame:
    """step × kind → count, time_ns (zeros included, so every step has all three kinds)."""
    grid = pl.DataFrame({"step": step_ids}, schema={"step": pl.Int64}).join(
        pl.DataFrame({"kind": list(KINDS)}), how="cross")
    t = gaps.group_by("step", "kind").agg(count=pl.len().cast(pl.Int64), time_ns=pl.col("gap_ns").sum())
    return grid.join(t, on=["step", "kind"], how="left").fill_null(0)


def histogram(gaps: pl.DataFrame) -> pl.DataFrame:
    """Log-binned gap histogram: bin b holds gaps in [2^b, 2^(b+1)) ns, per kind."""
    if gaps.is_empty():
        return pl.DataFrame(schema={"step": pl.Int64, "bin_lo_ns": pl.Int64, "bin_hi_ns": pl.Int64,
                                    "kind": pl.String, "count": pl.Int64, "time_ns": pl.Int64})
    b = pl.col("gap_ns").cast(pl.Float64).log(2).floor().cast(pl.Int64)
    return (
        gaps.with_columns(bin=b).group_by("step", "bin", "kind")
        .agg(count=pl.len().cast(pl.Int64), time_ns=pl.col("gap_ns").sum())
        .with_columns(bin_lo_ns=(2 ** pl.col("bin")).cast(pl.Int64), bin_hi_ns=(2 ** (pl.col("bin") + 1)).cast(pl.Int64))
        .select("step", "bin_lo_ns", "bin_hi_ns", "kind", "count", "time_ns").sort("step", "bin_lo_ns", "kind")
    )
