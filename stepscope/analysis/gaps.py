"""GPU gaps of each step and who caused them (DEFINITIONS.md, "Gaps").

A gap opens when an activity starts after everything before it (by start) on the device has
ended. It is attributed, in this order:
  sync        a synchronizing API call of the process returned inside the gap and the late
              activity was launched after the gap opened: the host waited for the GPU to drain
              and only then asked for more (a sync that spans the whole gap only shows the host
              waiting on work already queued; an activity launched before the gap opened was
              queued in time, whatever the host did meanwhile: device-side)
  host_bound  the late activity's launching call started after the previous work ended
  device_side the launch was issued in time (or the trace lacks the launching call)
  host_pause  a host-bound gap that overlaps a host pause of its step (analysis/pauses.py): the
              launching thread stopped calling CUDA (a JIT compilation, a garbage collection)
"""

from __future__ import annotations

import polars as pl

from stepscope.analysis.frames import group_by_packed
from stepscope.analysis.inventory import Inventory
from stepscope.analysis.lazy_numpy import np

KINDS = ("host_bound", "sync", "device_side", "host_pause")

KIND_DTYPE = pl.Enum(KINDS)

GAP_SCHEMA = {
    "step": pl.Int64, "device": pl.Int64, "gap_start": pl.Int64, "gap_end": pl.Int64,
    "gap_ns": pl.Int64, "kind": KIND_DTYPE, "prev_name": pl.Categorical, "next_name": pl.Categorical,
    "next_api": pl.Categorical, "next_launch_start": pl.Int64,
}


def find_gaps(inv: Inventory, launch: pl.DataFrame | None = None) -> pl.DataFrame:
    """Every gap of every step, GAP_SCHEMA (`launch`: launch_summary's per-step figures, which
    the host pauses' threshold reads; computed when not given)."""
    return gaps_and_pauses(inv, launch)[0]


def gaps_and_pauses(inv: Inventory, launch: pl.DataFrame | None = None) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(the gaps, GAP_SCHEMA; the host pauses, pauses.PAUSE_SCHEMA)."""
    from stepscope.analysis.pauses import empty_pauses, host_pauses, with_pause_gaps

    # inv.acts is sorted by (step, start, end) and carries prev_end, the union's end before it;
    # only the columns a gap needs are carried (a million-row frame per extra column)
    a = inv.in_steps("step", "device", "pid", "start", "end", "prev_end", "name", "launch_api", "launch_start")
    # The activity whose end closes the union before the gap: the last one holding the running
    # max end. A gap row is never first in its step, so the fill never crosses a step boundary.
    closes = pl.col("prev_end").is_null() | (pl.col("end") >= pl.col("prev_end"))
    a = a.with_columns(prev_name=pl.when(closes).then(pl.col("name")).forward_fill().shift(1))
    g = a.filter(pl.col("start") > pl.col("prev_end")).select(
        "step", "device", "pid",
        pl.col("prev_end").alias("gap_start"), pl.col("start").alias("gap_end"),
        (pl.col("start") - pl.col("prev_end")).alias("gap_ns"),
        "prev_name", pl.col("name").alias("next_name"), pl.col("launch_api").alias("next_api"),
        pl.col("launch_start").alias("next_launch_start"),
    )
    if g.is_empty():
        return pl.DataFrame(schema=GAP_SCHEMA), empty_pauses()
    kind = (
        pl.when(pl.Series(_sync_in_gap(g, inv.api)) & (pl.col("next_launch_start") > pl.col("gap_start")))
        .then(pl.lit("sync", KIND_DTYPE))
        .when(pl.col("next_launch_start") > pl.col("gap_start")).then(pl.lit("host_bound", KIND_DTYPE))
        .otherwise(pl.lit("device_side", KIND_DTYPE))
    )
    g = g.with_columns(kind=kind)
    pauses = empty_pauses()
    if not inv.host_silences.is_empty():
        if launch is None:
            from stepscope.analysis.launch import launch_summary

            launch = launch_summary(inv)[0]
        pauses = host_pauses(inv.host_silences, inv.steps, inv.launch_calls, launch, g)
        g = with_pause_gaps(g, pauses)
    # g keeps acts' (step, start) order, which is (step, gap_start) order
    return g.select(list(GAP_SCHEMA)), pauses


def _sync_in_gap(g: pl.DataFrame, api: pl.DataFrame) -> np.ndarray:
    """Per gap: did a synchronizing call of its process return inside it? (one binary search
    per gap into the process's sorted sync end times)"""
    out = np.zeros(g.height, dtype=bool)
    sync = api.select("pid", "end", "is_sync").filter(pl.col("is_sync"))
    if sync.is_empty():
        return out
    pids = g["pid"].to_numpy()
    starts, ends = g["gap_start"].to_numpy(), g["gap_end"].to_numpy()
    for (pid,), calls in sync.group_by("pid"):
        s_end = np.sort(calls["end"].to_numpy())
        mine = pids == pid
        rows = None if mine.all() else np.flatnonzero(mine)
        # the last sync end at or before the gap's end, and whether it is inside the gap
        last = np.searchsorted(s_end, ends if rows is None else ends[rows], side="right") - 1
        inside = (last >= 0) & (s_end[np.maximum(last, 0)] >= (starts if rows is None else starts[rows]))
        if rows is None:
            out = inside
        else:
            out[rows] = inside
    return out


def _by_step_kind(gaps: pl.DataFrame, *extra: pl.Expr) -> pl.DataFrame:
    """count and time_ns per (step, kind, *extra)."""
    names = [e.meta.output_name() for e in extra]
    t = group_by_packed(gaps.with_columns(*extra) if extra else gaps, ["step", *names, "kind"],
                        pl.len().cast(pl.Int64).alias("count"), pl.col("gap_ns").sum().alias("time_ns"))
    return t.select("step", *names, "kind", "count", "time_ns")


def gap_totals(gaps: pl.DataFrame, step_ids: list[int], hist: pl.DataFrame | None = None) -> pl.DataFrame:
    """step × kind → count, time_ns (zeros included, so every step has all three kinds).
    Summed from the histogram when given (a few rows per step instead of one per gap)."""
    grid = pl.DataFrame({"step": step_ids}, schema={"step": pl.Int64}).join(
        pl.DataFrame({"kind": list(KINDS)}, schema={"kind": KIND_DTYPE}), how="cross")
    t = _by_step_kind(gaps) if hist is None else hist.group_by("step", "kind").agg(
        pl.col("count").sum(), pl.col("time_ns").sum())
    return grid.join(t, on=["step", "kind"], how="left").fill_null(0)


def histogram(gaps: pl.DataFrame) -> pl.DataFrame:
    """Log-binned gap histogram: bin b holds gaps in [2^b, 2^(b+1)) ns, per kind."""
    if gaps.is_empty():
        return pl.DataFrame(schema={"step": pl.Int64, "bin_lo_ns": pl.Int64, "bin_hi_ns": pl.Int64,
                                    "kind": KIND_DTYPE, "count": pl.Int64, "time_ns": pl.Int64})
    b = pl.col("gap_ns").cast(pl.Float64).log(2).floor().cast(pl.Int64).alias("bin")
    return (
        _by_step_kind(gaps, b)
        # 2 as a 64-bit literal: a 32-bit one overflows at 2^31 ns (a 2.15 s gap, a JIT pause's length)
        .with_columns(bin_lo_ns=(pl.lit(2, pl.Int64) ** pl.col("bin")).cast(pl.Int64),
                      bin_hi_ns=(pl.lit(2, pl.Int64) ** (pl.col("bin") + 1)).cast(pl.Int64))
        .select("step", "bin_lo_ns", "bin_hi_ns", "kind", "count", "time_ns")
        .sort("step", "bin_lo_ns", pl.col("kind").cast(pl.String))
    )
