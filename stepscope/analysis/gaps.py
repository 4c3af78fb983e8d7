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

import numpy as np
import polars as pl

from stepscope.analysis.inventory import Inventory

KINDS = ("host_bound", "sync", "device_side")

GAP_SCHEMA = {
    "step": pl.Int64, "device": pl.Int64, "gap_start": pl.Int64, "gap_end": pl.Int64,
    "gap_ns": pl.Int64, "kind": pl.String, "prev_name": pl.String, "next_name": pl.String,
    "next_api": pl.String, "next_launch_start": pl.Int64,
}


def find_gaps(inv: Inventory) -> pl.DataFrame:
    # inv.acts is sorted by (step, start, end) and carries prev_end, the union's end before it;
    # only the columns a gap needs are carried (a million-row frame per extra column)
    a = inv.acts.select("step", "device", "pid", "start", "end", "prev_end", "name", "launch_name_id",
                        "launch_start").filter(pl.col("step").is_not_null())
    # The activity whose end closes the union before the gap: the last one holding the running
    # max end. A gap row is never first in its step, so the fill never crosses a step boundary.
    closes = pl.col("prev_end").is_null() | (pl.col("end") >= pl.col("prev_end"))
    a = a.with_columns(prev_name=pl.when(closes).then(pl.col("name")).forward_fill().shift(1))
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
    g = g.join(names, left_on="launch_name_id", right_on="name_id", how="left", maintain_order="left"
               ).rename({"api_name": "next_api"})
    kind = (
        pl.when(pl.Series(_sync_in_gap(g, inv.api))).then(pl.lit("sync"))
        .when(pl.col("next_launch_start") > pl.col("gap_start")).then(pl.lit("host_bound"))
        .otherwise(pl.lit("device_side"))
    )
    # g keeps acts' (step, start) order, which is (step, gap_start) order
    return g.with_columns(kind=kind).select(list(GAP_SCHEMA))


def _sync_in_gap(g: pl.DataFrame, api: pl.DataFrame) -> np.ndarray:
    """Per gap: did a synchronizing call of its process return inside it? (one binary search
    per gap into the process's sorted sync end times)"""
    out = np.zeros(g.height, dtype=bool)
    sync = api.filter(pl.col("is_sync")).select("pid", "end")
    if sync.is_empty():
        return out
    pids = g["pid"].to_numpy()
    starts, ends = g["gap_start"].to_numpy(), g["gap_end"].to_numpy()
    for (pid,), calls in sync.group_by("pid"):
        s_end = np.sort(calls["end"].to_numpy())
        rows = np.flatnonzero(pids == pid)
        last = np.searchsorted(s_end, ends[rows], side="right") - 1  # last sync end <= gap end
        ok = last >= 0
        out[rows[ok]] = s_end[last[ok]] >= starts[rows[ok]]
    return out


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
