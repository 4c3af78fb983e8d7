"""Equation 1.3 of the seed (`t_step = max(N_k · t_launch, t_GPU)`), per step.

CPU floor = launch calls × typical host cost per launch (the median inter-launch interval, an
interval that holds other host work — a silence as long as a host pause, analysis/pauses.py, or a
synchronizing call — taken for its launch call's own duration; with a single launch call, e.g.
one cudaGraphLaunch, that call's duration), and never more than the host's launching inside the
step (launch_host_ns): each launch call counts until the next launch of its thread, or the
typical cost t_launch where that interval holds other host work or it is the thread's last,
clipped to the step's begin and end. The
host cannot need more time for the step's launches than it spent on them inside the step: an
asynchronously scheduled step's launches issued while the previous step ran, or a burst of fast
launches beside slow ones, made N × median exceed the step itself. Device floor =
gpu_busy_ns, less the time the step's collectives spent waiting for a slower rank (its device
work, analysis/collectives.py: a TP rank whose GPU sits in an all-reduce waiting for its peer's
host is not device-bound). The step is launch-bound when the CPU floor is the larger.
"""

from __future__ import annotations

import polars as pl

from stepscope.analysis.frames import lookup, sorted_by
from stepscope.analysis.gaps import gap_totals, gaps_and_pauses
from stepscope.analysis.inventory import Inventory
from stepscope.analysis.launch import launch_summary
from stepscope.analysis.pauses import empty_pauses
from stepscope.analysis.verdict import verdict_expr


def other_work(inv: Inventory, launch: pl.DataFrame) -> pl.DataFrame:
    """(pid, tid, at): where the launching threads did host work that is no launching: the
    start of each silence long enough to be a host pause (pauses.candidates, the GPU idle or
    not) and of each synchronizing call (the host waiting for the GPU)."""
    from stepscope.analysis.pauses import candidates

    sil = candidates(inv.host_silences, inv.steps, inv.launch_calls, launch).select(
        "pid", "tid", pl.col("pause_start").alias("at"))
    sync = inv.api.filter(pl.col("is_sync")).select(pl.col("pid").cast(pl.Int64), pl.col("tid").cast(pl.Int64),
                                                    pl.col("start").cast(pl.Int64).alias("at"))
    return pl.concat([sil, sync])


def launch_host(inv: Inventory, other: pl.DataFrame, t_launch: pl.DataFrame) -> pl.DataFrame:
    """(step, launch_host_ns, launches_ahead, t_launch_own_ns): the host's launching inside each
    step (the module's docstring), on its busiest launching thread; how many of its launch calls
    started before the step began (queued while earlier GPU work ran); and its typical cost per launch
    where an interval holds other host work (`other`: other_work), else null. `t_launch`:
    (step, t_launch_ns)."""
    calls = inv.launch_calls
    if calls.is_empty():
        return pl.DataFrame(schema={"step": pl.Int64, "launch_host_ns": pl.Int64, "launches_ahead": pl.Int64,
                                    "t_launch_own_ns": pl.Int64})
    # consecutive calls of one (step, pid, tid), as launch_summary pairs them: with one host
    # thread (step, start) order is the whole order
    one_thread = calls["pid"].n_unique() == 1 and calls["tid"].n_unique() == 1
    keys = ["step"] if one_thread else ["step", "pid", "tid"]
    c = sorted_by(calls.select(pl.col("step").cast(pl.Int64), pl.col("pid").cast(pl.Int64),
                               pl.col("tid").cast(pl.Int64), "start", "end"), *keys, "start")
    same = pl.all_horizontal([pl.col(k) == pl.col(k).shift(-1) for k in keys])
    c = c.with_columns(next_start=pl.when(same).then(pl.col("start").shift(-1)))
    if not other.is_empty():
        # the launch before each piece of other host work: its interval holds it
        held = (other.sort("at")
                .join_asof(c.select("step", "pid", "tid", "start", "next_start").sort("start"), left_on="at",
                           right_on="start", by=["pid", "tid"], strategy="backward", check_sortedness=False)
                .filter(pl.col("next_start").is_not_null() & (pl.col("at") < pl.col("next_start")))
                .select("step", "pid", "tid", "start").unique().with_columns(_held=pl.lit(True)))
        c = c.join(held, on=["step", "pid", "tid", "start"], how="left", maintain_order="left")
    else:
        c = c.with_columns(_held=pl.lit(None, pl.Boolean))
    # the step's window and typical cost per call: one gather by step id (frames.lookup)
    win = inv.steps.select("step", "step_begin", "step_end").join(t_launch, on="step", how="left")
    held_steps = c.filter(pl.col("_held").fill_null(False)).select("step").unique()
    if held_steps.height:
        # the typical cost is the median over the step's launches with each interval that holds
        # other host work taken for its call's own duration (that work is no launch cost)
        cost = (c.join(held_steps, on="step", how="semi").filter(pl.col("next_start").is_not_null())
                .group_by("step").agg(t_launch_own_ns=pl.when(pl.col("_held").fill_null(False))
                                      .then(pl.col("end") - pl.col("start"))
                                      .otherwise(pl.col("next_start") - pl.col("start")).median().round(0)
                                      .cast(pl.Int64)))
        win = win.join(cost, on="step", how="left").with_columns(
            t_launch_ns=pl.coalesce("t_launch_own_ns", "t_launch_ns"))
    else:
        win = win.with_columns(t_launch_own_ns=pl.lit(None, pl.Int64))
    ids = win["step"]
    c = c.with_columns(_b=lookup("step", ids, win["step_begin"]), _e=lookup("step", ids, win["step_end"]),
                       _t=lookup("step", ids, win["t_launch_ns"].fill_null(0).clip(lower_bound=0)))
    typical = pl.col("start") + pl.col("_t")
    until = pl.when(pl.col("next_start").is_null()).then(pl.max_horizontal(typical, "end")).when(
        pl.col("_held").fill_null(False)).then(pl.min_horizontal(typical, "next_start")).otherwise(
        pl.max_horizontal("next_start", "end"))
    inside = (pl.min_horizontal(until, "_e") - pl.max_horizontal("start", "_b")).clip(lower_bound=0)
    c = c.select(*keys, inside.alias("_in"), (pl.col("start") < pl.col("_b")).alias("_ahead")).with_columns(
        pl.col("step").set_sorted())
    per = c.group_by(keys).agg(pl.col("_in").sum(), pl.col("_ahead").sum())
    if not one_thread:
        per = per.group_by("step").agg(pl.col("_in").max(), pl.col("_ahead").sum())
    return per.select("step", pl.col("_in").cast(pl.Int64).alias("launch_host_ns"),
                      pl.col("_ahead").cast(pl.Int64).alias("launches_ahead")).join(
        win.select("step", "t_launch_own_ns"), on="step", how="left")


def floors(inv: Inventory, launch: pl.DataFrame | None = None, gaps: pl.DataFrame | None = None,
           totals: pl.DataFrame | None = None, work: pl.DataFrame | None = None,
           pauses: pl.DataFrame | None = None) -> pl.DataFrame:
    """`work`: (step, device_work_ns) of the steps whose collectives waited (collectives()'s
    `work`); every other step's device floor is its GPU busy time. `pauses`: the host pauses
    (gaps_and_pauses), found with the gaps when not given."""
    launch = launch_summary(inv)[0] if launch is None else launch
    if work is None:
        from stepscope.analysis.collectives import collectives

        work = collectives(inv).work
    if totals is None or pauses is None:
        found, found_pauses = gaps_and_pauses(inv, launch) if gaps is None or pauses is None else (gaps, pauses)
        pauses = found_pauses if pauses is None else pauses
        if totals is None:
            totals = gap_totals(found if gaps is None else gaps, inv.step_ids())
    pauses = empty_pauses() if pauses is None else pauses
    host = totals.filter(pl.col("kind").is_in(["host_bound", "host_pause"])).group_by("step").agg(
        host_bound_gap_ns=pl.col("time_ns").filter(pl.col("kind") == "host_bound").sum(),
        host_pause_ns=pl.col("time_ns").filter(pl.col("kind") == "host_pause").sum())
    longest = pauses.group_by("step", maintain_order=True).agg(
        host_pauses=pl.len().cast(pl.Int64), longest_pause_ns=pl.col("pause_ns").first(),
        longest_pause_after_launch=pl.col("after_launch").first(),
        longest_pause_next_call=pl.col("after_api").first(),
        longest_pause_next_kernel=pl.col("next_kernel").first(),
        host_pause_total_ns=pl.col("pause_ns").sum())
    s = inv.steps.select("step", "n_launch_calls", "gpu_busy_ns", "step_time_ns", "step_begin", "step_end",
                         "first_start", "last_end").join(
        launch.select("step", "interval_median_ns", "call_median_ns"), on="step", how="left"
    ).join(host, on="step", how="left").join(work.select("step", "device_work_ns"), on="step", how="left")
    t_launch = pl.coalesce("interval_median_ns", "call_median_ns", pl.lit(0))
    s = s.join(launch_host(inv, other_work(inv, launch), s.select("step", t_launch.alias("t_launch_ns"))), on="step",
               how="left").join(longest, on="step", how="left")
    # a step whose launch intervals hold other host work: t_launch without it (launch_host)
    t_launch = pl.coalesce("t_launch_own_ns", t_launch)
    s = s.with_columns(
        t_launch_ns=t_launch,
        # (a step without launch calls in the frame has no launch_host_ns: N × t_launch alone)
        cpu_floor_ns=pl.min_horizontal((pl.col("n_launch_calls") * t_launch), "launch_host_ns").cast(pl.Int64),
        device_floor_ns=pl.coalesce("device_work_ns", "gpu_busy_ns"),
        host_pause_ns=pl.col("host_pause_ns").fill_null(0),
        host_pauses=pl.col("host_pauses").fill_null(0),
    ).with_columns(
        # the GPU waiting on the host's per-step work: before the step's first GPU activity (input
        # preparation), in host-bound gaps (launching), after its last (sampling, output)
        host_prep_ns=(pl.col("first_start") - pl.col("step_begin")).clip(lower_bound=0),
        host_after_ns=(pl.col("step_end") - pl.col("last_end")).clip(lower_bound=0),
        host_bound_gap_ns=pl.col("host_bound_gap_ns").fill_null(0),
    ).with_columns(
        host_wait_ns=(pl.col("host_prep_ns") + pl.col("host_bound_gap_ns") + pl.col("host_after_ns")
                      + pl.col("host_pause_ns")),
        host_bound_on=pl.when(pl.col("host_pause_ns") > pl.max_horizontal("host_prep_ns", "host_after_ns",
                                                                           "host_bound_gap_ns"))
        .then(pl.lit("a host pause"))
        .when((pl.col("host_prep_ns") >= pl.col("host_after_ns"))
                              & (pl.col("host_prep_ns") >= pl.col("host_bound_gap_ns"))).then(pl.lit("input preparation"))
        .when(pl.col("host_after_ns") >= pl.col("host_bound_gap_ns")).then(pl.lit("sampling and output"))
        .otherwise(pl.lit("launches")),
    ).with_columns(
        verdict=verdict_expr(wait="host_wait_ns", step="step_time_ns", pause="host_pause_ns"),
        # how many times the binding floor exceeds the other one (null when the other is 0: a
        # step whose launches were all issued before it began has no CPU floor inside it)
        margin=pl.when(pl.min_horizontal("cpu_floor_ns", "device_floor_ns") > 0).then(
            pl.max_horizontal("cpu_floor_ns", "device_floor_ns")
            / pl.min_horizontal("cpu_floor_ns", "device_floor_ns")),
    )
    return s.select("step", "t_launch_ns", "cpu_floor_ns", "device_floor_ns", "verdict", "margin",
                    "host_bound_gap_ns", "host_prep_ns", "host_after_ns", "host_wait_ns", "host_bound_on",
                    "step_time_ns", "launch_host_ns", "launches_ahead", "host_pause_ns", "host_pauses", "host_pause_total_ns",
                    "longest_pause_ns", "longest_pause_after_launch", "longest_pause_next_call",
                    "longest_pause_next_kernel")
