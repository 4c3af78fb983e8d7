"""Equation 1.3 of the seed (`t_step = max(N_k · t_launch, t_GPU)`), per step.

CPU floor = launch calls × typical host cost per launch (the median inter-launch interval;
with a single launch call, e.g. one cudaGraphLaunch, that call's duration); device floor =
gpu_busy_ns, less the time the step's collectives spent waiting for a slower rank (its device
work, analysis/collectives.py: a TP rank whose GPU sits in an all-reduce waiting for its peer's
host is not device-bound). The step is launch-bound when the CPU floor is the larger.
"""

from __future__ import annotations

import polars as pl

from stepscope.analysis.gaps import find_gaps, gap_totals
from stepscope.analysis.inventory import Inventory
from stepscope.analysis.launch import launch_summary
from stepscope.analysis.verdict import verdict_expr


def floors(inv: Inventory, launch: pl.DataFrame | None = None, gaps: pl.DataFrame | None = None,
           totals: pl.DataFrame | None = None, work: pl.DataFrame | None = None) -> pl.DataFrame:
    """`work`: (step, device_work_ns) of the steps whose collectives waited (collectives()'s
    `work`); every other step's device floor is its GPU busy time."""
    launch = launch_summary(inv)[0] if launch is None else launch
    if work is None:
        from stepscope.analysis.collectives import collectives

        work = collectives(inv).work
    if totals is None:
        totals = gap_totals(find_gaps(inv) if gaps is None else gaps, inv.step_ids())
    host = totals.filter(pl.col("kind") == "host_bound").select(
        "step", pl.col("time_ns").alias("host_bound_gap_ns"))
    s = inv.steps.select("step", "n_launch_calls", "gpu_busy_ns", "step_time_ns", "step_begin", "step_end",
                         "first_start", "last_end").join(
        launch.select("step", "interval_median_ns", "call_median_ns"), on="step", how="left"
    ).join(host, on="step", how="left").join(work.select("step", "device_work_ns"), on="step", how="left")
    t_launch = pl.coalesce("interval_median_ns", "call_median_ns", pl.lit(0))
    s = s.with_columns(
        t_launch_ns=t_launch,
        cpu_floor_ns=(pl.col("n_launch_calls") * t_launch).cast(pl.Int64),
        device_floor_ns=pl.coalesce("device_work_ns", "gpu_busy_ns"),
    ).with_columns(
        # the GPU waiting on the host's per-step work: before the step's first GPU activity (input
        # preparation), in host-bound gaps (launching), after its last (sampling, output)
        host_prep_ns=(pl.col("first_start") - pl.col("step_begin")).clip(lower_bound=0),
        host_after_ns=(pl.col("step_end") - pl.col("last_end")).clip(lower_bound=0),
        host_bound_gap_ns=pl.col("host_bound_gap_ns").fill_null(0),
    ).with_columns(
        host_wait_ns=pl.col("host_prep_ns") + pl.col("host_bound_gap_ns") + pl.col("host_after_ns"),
        host_bound_on=pl.when((pl.col("host_prep_ns") >= pl.col("host_after_ns"))
                              & (pl.col("host_prep_ns") >= pl.col("host_bound_gap_ns"))).then(pl.lit("input preparation"))
        .when(pl.col("host_after_ns") >= pl.col("host_bound_gap_ns")).then(pl.lit("sampling and output"))
        .otherwise(pl.lit("launches")),
    ).with_columns(
        verdict=verdict_expr(wait="host_wait_ns", step="step_time_ns"),
        # how many times the binding floor exceeds the other one
        margin=(pl.max_horizontal("cpu_floor_ns", "device_floor_ns")
                / pl.min_horizontal("cpu_floor_ns", "device_floor_ns").clip(lower_bound=1)),
    )
    return s.select("step", "t_launch_ns", "cpu_floor_ns", "device_floor_ns", "verdict", "margin",
                    "host_bound_gap_ns", "host_prep_ns", "host_after_ns", "host_wait_ns", "host_bound_on",
                    "step_time_ns")
