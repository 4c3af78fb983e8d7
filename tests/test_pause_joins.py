"""Host pauses meet a step's gaps and launch calls by as-of joins, not by crossing them (a step
that holds a start-up or a compilation has thousands of pauses and of gaps: their product took
2.8 GB at 300k kernels). Each join is held here to its definition, written as the cross join in
the test: the GPU idle time in a pause and the gap it waited for longest, the launch calls before
a pause, the gaps a pause delayed."""

from __future__ import annotations

import polars as pl
from hypothesis import given, strategies as st

from stepscope.analysis.gaps import KIND_DTYPE
from stepscope.analysis.pauses import PAUSE_MIN_NS, PAUSE_TAKES, host_pauses, with_pause_gaps
from tests.conftest import examples

KINDS = ("host_bound", "sync", "device_side")
MS = PAUSE_MIN_NS


@st.composite
def _step_timeline(draw):
    """Steps of one or two processes: each (step, pid) the disjoint gaps of its activities' union
    (each a kind and the launch of the activity after it), its thread's silences (disjoint:
    one thread) and its launch calls, on a millisecond grid so that overlaps come in all sizes."""
    gaps, silences, calls, steps = [], [], [], []
    for step in range(draw(st.integers(1, 3))):
        pid = draw(st.sampled_from([7, 8]))
        t, first = step * 1000 * MS, None
        for i in range(draw(st.integers(0, 12))):
            t += draw(st.integers(0, 5)) * MS // 2
            end = t + draw(st.integers(1, 8)) * MS // 2
            first = t if first is None else first
            gaps.append({"step": step, "device": 0, "pid": pid, "gap_start": t, "gap_end": end, "gap_ns": end - t,
                         "kind": draw(st.sampled_from(KINDS)), "prev_name": "a", "next_name": f"k{step}_{i}",
                         "next_api": "cudaLaunchKernel",
                         "next_launch_start": draw(st.one_of(st.none(), st.integers(-4, 20).map(lambda k: t + k * MS // 2)))})
            t = end
        s = step * 1000 * MS
        for _ in range(draw(st.integers(0, 8))):
            s += draw(st.integers(0, 6)) * MS // 2
            e = s + draw(st.integers(2, 10)) * MS // 2
            silences.append({"pid": pid, "tid": pid * 10, "pause_start": s, "pause_end": e, "after_api": "cudaLaunchKernel"})
            s = e
        starts = draw(st.lists(st.integers(0, 80).map(lambda k: step * 1000 * MS + k * MS // 2), max_size=10))
        calls += [{"step": step, "pid": pid, "tid": pid * 10, "start": v} for v in starts]
        steps.append({"step": step, "pid": pid, "n_launch_calls": len(starts) or 1,
                      "first_start": step * 1000 * MS, "last_end": step * 1000 * MS + 60 * MS})
    gap_schema = {"step": pl.Int64, "device": pl.Int64, "pid": pl.Int64, "gap_start": pl.Int64, "gap_end": pl.Int64,
                  "gap_ns": pl.Int64, "kind": KIND_DTYPE, "prev_name": pl.Categorical, "next_name": pl.Categorical,
                  "next_api": pl.Categorical, "next_launch_start": pl.Int64}
    return (pl.DataFrame(gaps, schema=gap_schema),
            pl.DataFrame(silences, schema={"pid": pl.Int64, "tid": pl.Int64, "pause_start": pl.Int64,
                                           "pause_end": pl.Int64, "after_api": pl.String}),
            pl.DataFrame(calls, schema={"step": pl.Int64, "pid": pl.Int64, "tid": pl.Int64, "start": pl.Int64}),
            pl.DataFrame(steps, schema={"step": pl.Int64, "pid": pl.Int64, "n_launch_calls": pl.Int64,
                                        "first_start": pl.Int64, "last_end": pl.Int64}))


def _launch(steps: pl.DataFrame) -> pl.DataFrame:
    # a baseline of 10 µs a launch: every silence of a millisecond or more is long enough
    return steps.select("step", interval_median_ns=pl.lit(10_000, pl.Int64), call_median_ns=pl.lit(5_000, pl.Int64))


@examples(300, 60)
@given(_step_timeline())
def test_pauses_meet_gaps_and_calls_as_the_cross_join_says(timeline):
    """Each pause's GPU idle time, the gap it waited for longest and its place among the step's
    launches, and the gaps it delayed: the same as crossing every pause with every gap and every
    launch call of its step."""
    gaps, silences, calls, steps = timeline
    got = host_pauses(silences, steps, calls, _launch(steps), gaps)
    # the definition, by cross joins
    g = gaps.filter(pl.col("kind").cast(pl.String).is_in(list(PAUSE_TAKES)))
    p = silences.join(steps, on="pid").filter((pl.col("pause_end") > pl.col("first_start"))
                                              & (pl.col("pause_start") < pl.col("last_end")))
    p = p.join(calls.select("step", "pid", "tid").unique(), on=["step", "pid", "tid"], how="semi")
    want = []
    for r in p.iter_rows(named=True):
        over = [(min(r["pause_end"], x["gap_end"]) - max(r["pause_start"], x["gap_start"]), x["gap_start"],
                 x["next_name"]) for x in g.filter((pl.col("step") == r["step"]) & (pl.col("pid") == r["pid"]))
                .iter_rows(named=True)]
        over = [o for o in over if o[0] > 0]
        idle = sum(o[0] for o in over)
        if idle < PAUSE_MIN_NS:
            continue
        mine = calls.filter(pl.col("step") == r["step"])["start"]
        longest = sorted(over, key=lambda o: (-o[0], o[1]))[0]
        want.append((r["step"], r["pause_start"], r["pause_end"], idle, longest[2],
                     int((mine < r["pause_start"]).sum()), len(mine)))
    assert sorted(got.select("step", "pause_start", "pause_end", "gpu_idle_ns", "next_kernel", "after_launch",
                             "n_launches").rows()) == sorted(want)

    delayed = with_pause_gaps(gaps, got)
    hit = set()
    for i, x in enumerate(gaps.iter_rows(named=True)):
        if x["kind"] in PAUSE_TAKES and x["next_launch_start"] is not None and any(
                x["gap_start"] < q["pause_end"] <= x["next_launch_start"]
                for q in got.filter((pl.col("step") == x["step"]) & (pl.col("pid") == x["pid"])).iter_rows(named=True)):
            hit.add(i)
    assert delayed.drop("kind").equals(gaps.drop("kind"))
    assert delayed["kind"].cast(pl.String).to_list() == [
        "host_pause" if i in hit else k for i, k in enumerate(gaps["kind"].cast(pl.String).to_list())]
