"""Launch overhead of each step: launch calls by API, host inter-launch interval, latency, queue.

Definitions (DEFINITIONS.md): inter-launch interval = time between the starts of consecutive
launch calls on one thread; launch latency = kernel start − the later of the start of its
launching call and the end of the device's earlier work; queued behind = that earlier work's end −
the call's start, when positive; queue time = kernel start − end of its launching call, when
positive.
"""

from __future__ import annotations

import polars as pl

from stepscope.analysis.frames import group_by_packed, lookup, sorted_by
from stepscope.analysis.inventory import Inventory


def _stats(col: pl.Expr, prefix: str) -> list[pl.Expr]:
    return [
        col.median().round(0).cast(pl.Int64).alias(f"{prefix}_median_ns"),
        col.quantile(0.9, "nearest").cast(pl.Int64).alias(f"{prefix}_p90_ns"),
    ]


def launch_summary(inv: Inventory, calls: pl.DataFrame | None = None) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(per-step launch figures, per-step × API name table)."""
    calls = inv.launch_calls if calls is None else calls
    dur = pl.col("end") - pl.col("start")
    agg = dict(count=pl.len().cast(pl.Int64), total_ns=dur.sum(), mean_ns=dur.mean().round(0).cast(pl.Int64),
               median_ns=dur.median().round(0).cast(pl.Int64), max_ns=dur.max())
    grouped = group_by_packed(calls.with_columns(pl.col("api_name").cast(pl.Categorical)), ["step", "api_name"],
                              *[e.alias(k) for k, e in agg.items()])
    by_api = (
        grouped.select("step", pl.col("api_name").cast(pl.String), *agg)
        .sort("step", "count", "api_name", descending=[False, True, False])
    )
    # consecutive calls of one (step, pid, tid): a global shift, nulled where the group changes.
    # With one host thread (step, start) order is (step, pid, tid, start) order.
    one_thread = calls.height == 0 or (calls["pid"].n_unique() == 1 and calls["tid"].n_unique() == 1)
    ordered = sorted_by(calls, "step", "start") if one_thread else sorted_by(calls, "step", "pid", "tid", "start")
    same = pl.col("step") == pl.col("step").shift(1)
    if not one_thread:
        same = same & (pl.col("pid") == pl.col("pid").shift(1)) & (pl.col("tid") == pl.col("tid").shift(1))
    interval = (
        ordered.with_columns(iv=pl.when(same).then(pl.col("start") - pl.col("start").shift(1)))
        .with_columns(pl.col("step").set_sorted())
        .group_by("step").agg(*_stats(pl.col("iv").drop_nulls(), "interval"),
                              call_median_ns=dur.median().round(0).cast(pl.Int64))
    )
    # activities without a launching call have null latency and queue, which the statistics
    # skip: no filtered copy of a million rows
    # launch latency measures launching: from the later of the call's start and the moment the
    # device had finished the work ahead of the activity (the step's earlier activities, or the
    # previous step's on the device, behind which an asynchronously scheduled step queues). The
    # wait behind that earlier work is its own figure, queued_behind.
    k = inv.in_steps("step", "start", "launch_start", "launch_end", "prev_end")
    before = inv.steps.select("step", "device", "step_begin", "last_end").sort("device", "step_begin").with_columns(
        prev_step_end=pl.col("last_end").shift(1).over("device")).select("step", "prev_step_end")
    # one gather from a table by step id, not a join of a million rows (frames.lookup)
    k = k.with_columns(_busy=pl.max_horizontal("prev_end", lookup("step", before["step"], before["prev_step_end"])))
    ready = pl.max_horizontal("launch_start", "_busy")
    behind = pl.when(pl.col("launch_start").is_not_null()).then(
        (pl.col("_busy") - pl.col("launch_start")).clip(lower_bound=0).fill_null(0))
    lat = k.group_by("step").agg(
        *_stats(pl.when(pl.col("launch_start").is_not_null()).then(pl.col("start") - ready), "latency"),
        *_stats((pl.col("start") - pl.col("launch_end")).filter(pl.col("start") > pl.col("launch_end")), "queue"),
        *_stats(behind, "queued_behind"),
    )
    base = inv.steps.select("step")
    return base.join(interval, on="step", how="left").join(lat, on="step", how="left").sort("step"), by_api
