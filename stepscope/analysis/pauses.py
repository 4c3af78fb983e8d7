"""Host pauses: the launching thread stopped calling CUDA while the GPU had nothing to run
(DEFINITIONS.md, "Host pauses").

A **silence** is the time between the end of one CUDA call of a thread and the start of its
next (over the calls stepscope reads: launches, copies and sets, synchronizations, graph capture,
the profiler's range calls; apinames.KEPT). A silence of a thread that launched a step's work is a
**host pause** of that step when
  - it is at least PAUSE_MIN_NS long and PAUSE_FACTOR times the step's median inter-launch
    interval (baseline(): a step of a few launches takes its process's, else its launch call's
    duration) — an eager step's host spends 20–100 µs per launch; a JIT compilation, a garbage
    collection or a Python stall stops it for milliseconds to seconds — and
  - the GPU idled for at least PAUSE_MIN_NS of it in the step's host-bound or sync gaps (a
    silence while queued work kept the GPU busy cost the step nothing).
Its place is the step's own launch numbering: "between launch k and k+1" where k of the step's
launch calls started before it. The GPU gaps it delayed are the gap kind `host_pause`.

The silences (PAUSE_MIN_NS and longer) are found while the inventory still holds every API call
(host_silences, a few rows per trace); the rest needs the steps' gaps and launch figures.
"""

from __future__ import annotations

import polars as pl

from stepscope.analysis.frames import sorted_by

# The thresholds, justified on the committed H200 fixtures (DEFINITIONS.md, "Host pauses"): the
# JIT compilations vLLM's JIT monitor logs (Qwen3-30B-A3B's and DeepSeek-V2-Lite's
# fused_moe_kernel, mask_empty_context_kernel) stop the host for 470–570 ms, 5,500–8,700 times the
# step's median launch interval; shorter host work between two launches of vLLM's eager steps
# (1–6 ms) is 20–175 times it; below 20 times a silence is one of the step's long launch
# intervals, and the longer silences of prefill steps (45–160 ms) keep the GPU busy.
PAUSE_MIN_NS = 1_000_000
PAUSE_FACTOR = 20
# a step of fewer launches takes its process's typical interval (baseline)
MIN_BASELINE_LAUNCHES = 9
# the gap kinds a pause takes: the GPU waiting for a launch (host-bound), or for the host that
# synchronized and then stopped before its next launch (sync)
PAUSE_TAKES = ("host_bound", "sync")

SILENCE_SCHEMA = {"pid": pl.Int64, "tid": pl.Int64, "pause_start": pl.Int64, "pause_end": pl.Int64,
                  "after_api": pl.String}
PAUSE_SCHEMA = {"step": pl.Int64, "pid": pl.Int64, "tid": pl.Int64, "pause_start": pl.Int64, "pause_end": pl.Int64,
                "pause_ns": pl.Int64, "after_launch": pl.Int64, "n_launches": pl.Int64, "after_api": pl.String,
                "gpu_idle_ns": pl.Int64, "next_kernel": pl.String}


def empty_silences() -> pl.DataFrame:
    return pl.DataFrame(schema=SILENCE_SCHEMA)


def empty_pauses() -> pl.DataFrame:
    return pl.DataFrame(schema=PAUSE_SCHEMA)


def host_silences(api: pl.DataFrame) -> pl.DataFrame:
    """The silences of at least PAUSE_MIN_NS of every thread (SILENCE_SCHEMA): from the end of
    its calls so far (their running max: a driver call may nest in a runtime call) to the start of
    its next call, and the name of that call. `api`: every call read, with api_name."""
    if api.is_empty():
        return empty_silences()
    cols = ["pid", "tid", "start", "end", "api_name"]
    one_thread = api["pid"].n_unique() == 1 and api["tid"].n_unique() == 1
    # no sort where the calls already are in order (one thread's calls in start order)
    a = api.select(cols)
    if one_thread:
        a = sorted_by(a, "start")
        before = pl.col("end").cum_max().shift(1)
    else:
        a = sorted_by(a, "pid", "tid", "start")
        before = pl.col("end").cum_max().shift(1).over("pid", "tid")
    a = a.with_columns(_before=before)
    s = a.filter((pl.col("start") - pl.col("_before")) >= PAUSE_MIN_NS)
    return s.select(pl.col("pid").cast(pl.Int64), pl.col("tid").cast(pl.Int64),
                    pl.col("_before").cast(pl.Int64).alias("pause_start"), pl.col("start").cast(pl.Int64).alias("pause_end"),
                    pl.col("api_name").cast(pl.String).alias("after_api"))


def baseline(steps: pl.DataFrame, launch: pl.DataFrame) -> pl.DataFrame:
    """(step, baseline_ns): the launch interval a pause is measured against. The step's median
    inter-launch interval; for a step of fewer than MIN_BASELINE_LAUNCHES launches, whose
    median may be the pause itself (a two-launch step has one interval), the median of its
    process's steps' medians over the steps that have that many, else (no such step) its median
    launch call: a pause is far longer than a launch."""
    s = steps.select("step", "pid", "n_launch_calls").join(
        launch.select("step", "interval_median_ns", "call_median_ns"), on="step", how="left")
    many = pl.col("n_launch_calls") >= MIN_BASELINE_LAUNCHES
    per_pid = s.filter(many).group_by("pid").agg(_pid_ns=pl.col("interval_median_ns").median())
    return s.join(per_pid, on="pid", how="left").select(
        "step", pl.when(many).then(pl.col("interval_median_ns"))
        .otherwise(pl.coalesce("_pid_ns", "call_median_ns", "interval_median_ns")).alias("baseline_ns"))


def candidates(silences: pl.DataFrame, steps: pl.DataFrame, calls: pl.DataFrame, launch: pl.DataFrame) -> pl.DataFrame:
    """The silences long enough to be a step's host pause (on a launching thread of the step,
    inside its GPU span, at least PAUSE_MIN_NS and PAUSE_FACTOR × its baseline), whether or not
    the GPU idled in them: step, pid, tid, pause_start, pause_end, pause_ns, after_api. The CPU
    floor takes every one for other host work; a host pause is one the GPU idled in."""
    if silences.is_empty() or calls.is_empty():
        return pl.DataFrame(schema={"step": pl.Int64, "pid": pl.Int64, "tid": pl.Int64, "pause_start": pl.Int64,
                                    "pause_end": pl.Int64, "pause_ns": pl.Int64, "after_api": pl.String})
    threads = calls.select(pl.col("step").cast(pl.Int64), pl.col("pid").cast(pl.Int64),
                           pl.col("tid").cast(pl.Int64)).unique()
    # the steps whose GPU span a silence overlaps: the process's last step to start before the
    # silence ends, and the one before its start (a silence across a step boundary), by two
    # as-of joins instead of a join of every step with every silence
    span = steps.select("step", pl.col("pid").cast(pl.Int64), "first_start", "last_end").sort("first_start")
    sil = silences.sort("pause_end")
    both = pl.concat([
        sil.join_asof(span, left_on="pause_end", right_on="first_start", by="pid", strategy="backward",
                      check_sortedness=False),
        sil.sort("pause_start").join_asof(span, left_on="pause_start", right_on="first_start", by="pid",
                                          strategy="backward", check_sortedness=False),
    ]).drop_nulls("step").unique(["pid", "tid", "pause_start", "step"])
    c = (both.join(threads, on=["step", "pid", "tid"], how="semi")
         .filter((pl.col("pause_end") > pl.col("first_start")) & (pl.col("pause_start") < pl.col("last_end")))
         .join(baseline(steps, launch), on="step", how="left")
         .with_columns(pause_ns=pl.col("pause_end") - pl.col("pause_start"))
         .filter(pl.col("pause_ns") >= pl.max_horizontal(pl.lit(PAUSE_MIN_NS),
                                                        PAUSE_FACTOR * pl.col("baseline_ns").fill_null(0))))
    return c.select("step", "pid", "tid", "pause_start", "pause_end", pl.col("pause_ns").cast(pl.Int64), "after_api")


def host_pauses(silences: pl.DataFrame, steps: pl.DataFrame, calls: pl.DataFrame, launch: pl.DataFrame,
                gaps: pl.DataFrame) -> pl.DataFrame:
    """The host pauses of every step (PAUSE_SCHEMA), longest first within a step. `steps`: the
    inventory's steps; `calls`: its launch calls; `launch`: launch_summary's per-step figures;
    `gaps`: find_gaps' gaps before the pauses take theirs (kinds host_bound and sync)."""
    if gaps.is_empty():
        return empty_pauses()
    c = candidates(silences, steps, calls, launch)
    if c.is_empty():
        return empty_pauses()
    # the GPU's idle time in the pause: its overlap with the step's host-bound and sync gaps (a
    # host that synchronized, then stopped, idles the GPU for the stop), and the activity the
    # GPU waited for in its longest such gap (after a JIT compilation: the kernel just compiled)
    g = gaps.filter(pl.col("kind").cast(pl.String).is_in(list(PAUSE_TAKES))).select(
        pl.col("step").cast(pl.Int64), pl.col("pid").cast(pl.Int64), "gap_start", "gap_end",
        pl.col("next_name").cast(pl.String))
    pairs = _overlapping(c.select("step", "pid", "pause_start", "pause_end"), g)
    idle = pairs.with_columns(
        o=pl.min_horizontal("pause_end", "gap_end") - pl.max_horizontal("pause_start", "gap_start")
    ).group_by("step", "pid", "pause_start").agg(
        gpu_idle_ns=pl.col("o").sum(),
        next_kernel=pl.col("next_name").sort_by("o", "gap_start", descending=[True, False]).first())
    c = c.join(idle, on=["step", "pid", "pause_start"], how="left").with_columns(
        pl.col("gpu_idle_ns").fill_null(0)).filter(pl.col("gpu_idle_ns") >= PAUSE_MIN_NS)
    if c.is_empty():
        return empty_pauses()
    # its place: how many of the step's launch calls started before it (the count of calls up to
    # the last one to start before it, by an as-of join: a pause meets only its own step's calls)
    mine = (calls.select(pl.col("step").cast(pl.Int64), pl.col("start").cast(pl.Int64))
            .join(c.select("step").unique(), on="step", how="semi").sort("step", "start")
            .with_columns(after_launch=pl.int_range(1, pl.len() + 1, dtype=pl.Int64).over("step")))
    at = c.select("step", "pause_start").unique().with_columns(_before=pl.col("pause_start") - 1).sort("_before")
    k = at.join_asof(mine.sort("start"), left_on="_before", right_on="start", by="step", strategy="backward",
                     check_sortedness=False).select("step", "pause_start", pl.col("after_launch").fill_null(0))
    n = mine.group_by("step").agg(n_launches=pl.len().cast(pl.Int64))
    c = c.join(k, on=["step", "pause_start"], how="left").join(n, on="step", how="left")
    return (c.select([pl.col(k).cast(t) for k, t in PAUSE_SCHEMA.items()])
            .sort("step", "pause_ns", "pause_start", descending=[False, True, False]))


def _overlapping(p: pl.DataFrame, g: pl.DataFrame) -> pl.DataFrame:
    """Each interval [pause_start, pause_end) of `p` beside each gap [gap_start, gap_end) of `g`
    of its (step, pid) that it overlaps, only those: a step's gaps are the holes of the union of
    its activities, so they are disjoint, and those a pause overlaps are consecutive in time
    order: from the first to end after its start to the last to start before its end, found by
    two as-of joins. The rows are as many as the overlaps (a pause and a gap of a long step
    crossed would be their product: a step holding a start-up has thousands of each)."""
    if p.is_empty() or g.is_empty():
        return p.join(g, on=["step", "pid"])
    g = g.sort("step", "pid", "gap_start").with_row_index("_gi")
    by = ["step", "pid"]
    p = (p.with_columns(_after=pl.col("pause_start") + 1).sort("_after")
         .join_asof(g.select(*by, "gap_end", _first="_gi").sort("gap_end"), left_on="_after", right_on="gap_end",
                    by=by, strategy="forward", check_sortedness=False)
         .with_columns(_before=pl.col("pause_end") - 1).sort("_before")
         .join_asof(g.select(*by, "gap_start", _last="_gi").sort("gap_start"), left_on="_before",
                    right_on="gap_start", by=by, strategy="backward", check_sortedness=False))
    p = (p.filter(pl.col("_first") <= pl.col("_last"))
         .select(*by, "pause_start", "pause_end", _gi=pl.int_ranges("_first", pl.col("_last") + 1, dtype=pl.UInt32))
         .explode("_gi"))
    return p.join(g.drop(by), on="_gi").drop("_gi")


def with_pause_gaps(gaps: pl.DataFrame, pauses: pl.DataFrame) -> pl.DataFrame:
    """`gaps` (with next_launch_start) with every host-bound or sync gap that a host pause of its
    step and process delayed taken for kind host_pause (its row order kept): the gap was open when
    the pause ended and its activity's launch came after it (a gap whose launch came before
    the pause began only touches it)."""
    if pauses.is_empty() or gaps.is_empty():
        return gaps
    kind_dtype = gaps.schema["kind"]  # the gaps frame's own Enum of kinds (no import of analysis/gaps: a cycle)
    # the first pause of the gap's step and process to end after the gap began (an as-of join;
    # a pause in every gap's row would be their product): it delayed the gap when its launch
    # came after the pause ended
    ends = pauses.select(pl.col("step").cast(pl.Int64), pl.col("pid").cast(pl.Int64), "pause_end").unique().sort("pause_end")
    g = (gaps.with_row_index("_i").filter(pl.col("kind").cast(pl.String).is_in(list(PAUSE_TAKES)))
         .select("_i", pl.col("step").cast(pl.Int64), pl.col("pid").cast(pl.Int64), "next_launch_start",
                 _after=pl.col("gap_start") + 1).sort("_after"))
    hit = (g.join_asof(ends, left_on="_after", right_on="pause_end", by=["step", "pid"], strategy="forward",
                       check_sortedness=False)
           .filter(pl.col("next_launch_start") >= pl.col("pause_end"))["_i"])
    return gaps.with_row_index("_i").with_columns(
        kind=pl.when(pl.col("_i").is_in(hit.implode())).then(pl.lit("host_pause", kind_dtype)).otherwise(pl.col("kind"))
    ).drop("_i")
