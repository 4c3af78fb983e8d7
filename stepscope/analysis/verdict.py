"""The verdict of every step, in one frame: what `analyze`, the reports, `compare` and the
Python API all quote.

First, a step whose GPU idles in host pauses (analysis/pauses.py: the launching thread stopped
calling CUDA — a JIT compilation, a garbage collection, a Python stall) for most of it (more
than PAUSE_BOUND_SHARE) is **host-bound** by that pause, whatever its floors say: no launch
overhead and no CUDA graph explains or removes it. Then Equation 1.3 of the seed
(`t_step = max(N_k · t_launch, t_GPU)`): a step is **launch-bound**
when its CPU floor exceeds its device floor (analysis/floors.py defines both); else
**host-bound** when its GPU waits on the host's other per-step work (input preparation,
sampling and output) for more than HOST_BOUND_SHARE of the step; else **device-bound**. Beside it: how many times the binding floor exceeds the other (`margin`), the
host-bound gap time, the what-if CUDA-graph step time (analysis/whatif.py; null for a step that
already is a graph replay) and the untraced figures (analysis/untraced.py), whose verdict is the
same comparison with the untraced CPU floor — and whose graph what-if is null, like the traced
one, for a replay.
"""

from __future__ import annotations

import polars as pl

LAUNCH_BOUND, DEVICE_BOUND, HOST_BOUND = "launch-bound", "device-bound", "host-bound"
# a step whose GPU waits on the host for more than this share of the step (before its first GPU
# work, in host-bound gaps, after its last) is host-bound unless its launches already bind it
HOST_BOUND_SHARE = 0.25
# a step whose GPU idles in host pauses for more than this share of it is host-bound by them: the
# pauses are most of the step, and neither its launches nor its GPU work tell its time
PAUSE_BOUND_SHARE = 0.5

SCHEMA = {
    "step": pl.Int64, "verdict": pl.String, "cpu_floor_ns": pl.Int64, "device_floor_ns": pl.Int64,
    "t_launch_ns": pl.Int64, "margin": pl.Float64, "host_bound_gap_ns": pl.Int64,
    "host_prep_ns": pl.Int64, "host_after_ns": pl.Int64, "host_wait_ns": pl.Int64, "host_bound_on": pl.String,
    "step_time_ns": pl.Int64, "launch_host_ns": pl.Int64, "launches_ahead": pl.Int64, "host_pause_ns": pl.Int64, "host_pauses": pl.Int64,
    "host_pause_total_ns": pl.Int64, "longest_pause_ns": pl.Int64, "longest_pause_after_launch": pl.Int64,
    "longest_pause_next_call": pl.String, "longest_pause_next_kernel": pl.String,
    "predicted_graph_step_time_ns": pl.Int64, "predicted_graph_step_low_ns": pl.Int64,
    "predicted_graph_step_high_ns": pl.Int64, "predicted_graph_queued": pl.Boolean,
    "untraced_step_time_ns": pl.Int64, "untraced_source": pl.String, "untraced_measured_ns": pl.Int64,
    "untraced_estimated_ns": pl.Int64, "untraced_t_launch_ns": pl.Int64, "untraced_cpu_floor_ns": pl.Int64,
    "untraced_verdict": pl.String, "untraced_predicted_graph_step_time_ns": pl.Int64,
}


def verdict_expr(cpu: str | pl.Expr = "cpu_floor_ns", dev: str | pl.Expr = "device_floor_ns",
                 wait: str | pl.Expr | None = None, step: str | pl.Expr | None = None,
                 pause: str | pl.Expr | None = None) -> pl.Expr:
    """The one definition of the verdict: given the GPU's idle time in host pauses and the step
    time, host-bound when the pauses hold more than PAUSE_BOUND_SHARE of the step; else
    launch-bound when the CPU floor is the larger; else, given the host wait, host-bound when the
    GPU waits on the host for more than HOST_BOUND_SHARE of the step; else device-bound."""
    cpu, dev = (pl.col(x) if isinstance(x, str) else x for x in (cpu, dev))
    if pause is not None and step is not None:
        p, t = (pl.col(x) if isinstance(x, str) else x for x in (pause, step))
        p = p.fill_null(0)
        out = pl.when((p > 0) & (p > PAUSE_BOUND_SHARE * t)).then(pl.lit(HOST_BOUND)).when(cpu > dev).then(
            pl.lit(LAUNCH_BOUND))
    else:
        out = pl.when(cpu > dev).then(pl.lit(LAUNCH_BOUND))
    if wait is not None and step is not None:
        wait, step = (pl.col(x) if isinstance(x, str) else x for x in (wait, step))
        out = out.when(wait.fill_null(0) > HOST_BOUND_SHARE * step).then(pl.lit(HOST_BOUND))
    return out.otherwise(pl.lit(DEVICE_BOUND))


def verdict_of(cpu_floor_ns: float, device_floor_ns: float) -> str:
    """verdict_expr for one pair of numbers (tp's projected widths)."""
    return LAUNCH_BOUND if cpu_floor_ns > device_floor_ns else DEVICE_BOUND


def verdicts(floors: pl.DataFrame, graph_prediction: pl.DataFrame,
             untraced: pl.DataFrame | None = None) -> pl.DataFrame:
    """One row per step, SCHEMA: the floors with their verdict, the what-if graph step and the
    untraced figures (null columns when there are none)."""
    v = floors.join(graph_prediction, on="step", how="left")
    if untraced is not None and untraced.height:
        v = v.join(untraced, on="step", how="left").with_columns(
            pl.when(pl.col("predicted_graph_step_time_ns").is_null()).then(None)
            .otherwise(pl.col("untraced_predicted_graph_step_time_ns"))
            .alias("untraced_predicted_graph_step_time_ns"))
    v = v.with_columns([pl.lit(None, t).alias(c) for c, t in SCHEMA.items() if c not in v.columns])
    return v.select([pl.col(c).cast(t) for c, t in SCHEMA.items()]).sort("step")
