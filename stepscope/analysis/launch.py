"""Launch overhead of each step: launch calls by API, host inter-launch interval, latency, queue.

Definitions (DEFINITIONS.md): inter-launch interval = time between the starts of consecutive
launch calls on one thread; launch latency = kernel start − start of its launching call;
queue time = kernel start − end of its launching call, when positive.
"""

from __future__ import annotations

import polars as pl

from stepscope.analysis.inventory import Inventory


def step_launch_calls(inv: Inventory) -> pl.DataFrame:
    """Every launch call of every step: (step, pid, tid, start, end, api_name).

    Window-delimited steps own the launch calls inside their host window (on their thread);
    other steps own the calls that launched their activities.
    """
    launch_api = inv.api.filter(pl.col("is_launch")).select("pid", "tid", "corr", "start", "end", "api_name")
    steps = inv.steps
    parts = []
    windowed = steps.filter(pl.col("w_start").is_not_null())
    for by, w in (
        (["pid", "tid"], windowed.filter(pl.col("tid").is_not_null())),
        (["pid"], windowed.filter(pl.col("tid").is_null())),
    ):
        if w.is_empty():
            continue
        ws = w.select(*by, "w_start", "w_end", "step").sort("w_start")
        hit = launch_api.sort("start").join_asof(ws, left_on="start", right_on="w_start", by=by,
                                                 strategy="backward", check_sortedness=False)
        hit = hit.filter(pl.col("start") <= pl.col("w_end"))
        # a window over several devices shares its calls with each of its steps
        multi = ws.join(ws.select(*by, "w_start", pl.col("step").alias("step_all")), on=[*by, "w_start"])
        hit = hit.join(multi.select("step", "step_all"), on="step").drop("step").rename({"step_all": "step"})
        parts.append(hit.select("step", "pid", "tid", "corr", "start", "end", "api_name"))
    bare = steps.filter(pl.col("w_start").is_null()).select("step")
    if bare.height:
        calls = (
            inv.acts.join(bare, on="step", how="semi").filter(pl.col("launch_start").is_not_null())
            .select("step", "pid", "corr").unique()
            .join(launch_api, on=["pid", "corr"])
            .select("step", "pid", "tid", "corr", "start", "end", "api_name")
        )
        parts.append(calls)
    if not parts:
        return pl.DataFrame(schema={"step": pl.Int64, "pid": pl.Int64, "tid": pl.Int64, "corr": pl.Int64,
                                    "start": pl.Int64, "end": pl.Int64, "api_name": pl.String})
    return pl.concat(parts, how="vertical_relaxed").sort("step", "start")


def _stats(col: pl.Expr, prefix: str) -> list[pl.Expr]:
    return [
        col.median().round(0).cast(pl.Int64).alias(f"{prefix}_median_ns"),
        col.quantile(0.9, "nearest").cast(pl.Int64).alias(f"{prefix}_p90_ns"),
    ]


def launch_summary(inv: Inventory, calls: pl.DataFrame | None = None) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(per-step launch figures, per-step × API name table)."""
    calls = step_launch_calls(inv) if calls is None else calls
    dur = pl.col("end") - pl.col("start")
    by_api = (
        calls.group_by("step", "api_name")
        .agg(count=pl.len().cast(pl.Int64), total_ns=dur.sum(), mean_ns=dur.mean().round(0).cast(pl.Int64),
             median_ns=dur.median().round(0).cast(pl.Int64), max_ns=dur.max())
        .sort("step", "count", descending=[False, True])
    )
    interval = (
        calls.sort("step", "pid", "tid", "start")
        .with_columns(iv=(pl.col("start") - pl.col("start").shift(1)).over("step", "pid", "tid"))
        .group_by("step").agg(*_stats(pl.col("iv").drop_nulls(), "interval"),
                              call_median_ns=dur.median().round(0).cast(pl.Int64))
    )
    k = inv.acts.filter(pl.col("step").is_not_null() & pl.col("launch_start").is_not_null())
    lat = k.group_by("step").agg(
        *_stats(pl.col("start") - pl.col("launch_start"), "latency"),
        *_stats((pl.col("start") - pl.col("launch_end")).filter(pl.col("start") > pl.col("launch_end")), "queue"),
    )
    base = inv.steps.select("step")
    return base.join(interval, on="step", how="left").join(lat, on="step", how="left").sort("step"), by_api
