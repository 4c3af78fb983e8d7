"""Untraced figures: the step time users see without nsys, measured or estimated.

nsys inflates the host side of a step: every CUDA call pays for its trace record, so an eager
step's launch-bound time is longer under nsys than without it. `step_time_ns` keeps its one
definition (DEFINITIONS.md); beside it every step gets `untraced_step_time_ns` and where it came
from (`untraced_source`: "measured" or "estimated", render/sentences.py's untraced_source
gives the words):

* **measured**: `stepscope trace` timed the same step shape outside nsys's capture range and
  wrote it into the export's sidecar (ingest/sidecar.py). A vLLM step (its window runs from
  execute_context to the next iteration: forward and sampling) takes the sidecar's
  `engine_step_gpu_ns` (CUDA events from execute_model's entry to sample_tokens' exit); any
  other step the sidecar's `step_time_ns`.
* **estimated** (always computed; the figure when there is no sidecar): the step replayed with
  the tracing taken out of the host. Every interval between consecutive launch calls of the
  step (and the time before the first one) loses OVERHEAD_PER_LAUNCH_NS, down to
  MIN_INTERVAL_NS; a launch call lasts at most UNTRACED_CALL_NS (a cudaGraphLaunch
  UNTRACED_GRAPH_CALL_NS, whose node-level tracing makes it last a millisecond under nsys).
  The GPU then runs the step's activities in their recorded order and durations, each as early
  as its deflated launch (plus its recorded launch latency, at most 5 µs) and the previous
  activity allow: end_i = max(ready_i, end_{i-1}) + duration_i, computed as a cumulative max.
  estimate = max(GPU end, host's last launch end) + the host's own tail (the window's end after
  the step's last CUDA work, which no tracing inflates) - step begin.
  A vLLM step is estimated in steady state instead: vLLM's async scheduling prepares step n+1
  on the host while step n runs on the GPU, so the step takes max(host time, device work +
  node gaps), the host time deflated as above.

OVERHEAD_PER_LAUNCH_NS is the median, over the committed traced/untraced pairs (torch engine
and vLLM, eager and graph, batch 1 and 8; fixtures/round5 and fixtures/vllm), of (traced step −
untraced step) / launch calls of the eager steps; the error of the estimate on each pair is in
the README and recomputed by tests/test_untraced.py.

The untraced verdict uses the same Equation 1.3 with the untraced host cost per launch: measured,
the sidecar's host time of the step / the step's launch calls; estimated, max(median
inter-launch interval − OVERHEAD_PER_LAUNCH_NS, MIN_INTERVAL_NS).
"""

from __future__ import annotations

import polars as pl

from stepscope.analysis.arrays import cummax_within, cumsum_within, group_bounds, last_at_or_before
from stepscope.analysis.inventory import Inventory
from stepscope.analysis.lazy_numpy import np
from stepscope.analysis.steps import VLLM_STEP_RE as _VLLM
from stepscope.analysis.verdict import verdict_expr
from stepscope.analysis.whatif import point_of, prologue

OVERHEAD_PER_LAUNCH_NS = 20_000
MIN_INTERVAL_NS = 2_000
UNTRACED_CALL_NS = 3_000
UNTRACED_GRAPH_CALL_NS = 20_000
LATENCY_CAP_NS = 5_000

SCHEMA = {"step": pl.Int64, "untraced_step_time_ns": pl.Int64, "untraced_source": pl.String,
          "untraced_measured_ns": pl.Int64, "untraced_estimated_ns": pl.Int64,
          "untraced_t_launch_ns": pl.Int64, "untraced_cpu_floor_ns": pl.Int64,
          "untraced_verdict": pl.String, "untraced_predicted_graph_step_time_ns": pl.Int64}


def is_vllm_step() -> pl.Expr:
    return pl.col("name").fill_null("").str.contains(_VLLM.pattern)


def estimate(inv: Inventory, work: pl.DataFrame | None = None, calibration=None,
             pro: pl.DataFrame | None = None, ends: pl.DataFrame | None = None) -> pl.DataFrame:
    """Per step: (step, estimated_ns) — see the module docstring. `work`: (step,
    device_floor_ns), the device work the steady-state (vLLM) estimate uses; `calibration`: the
    what-if's (whatif.point_of), whose node gap that estimate adds; `ends`: replay_ends(inv),
    when already known."""
    steps = inv.steps.select("step", "step_begin", "step_end", "last_end", "n_kernels", "gpu_busy_ns",
                             "name").sort("step")
    ends = replay_ends(inv) if ends is None else ends
    s = steps.with_columns(ends["host_end"], ends["gpu_end"], ends["_call_end"])  # both in step order
    if work is not None:
        s = s.join(work.select("step", "device_floor_ns"), on="step", how="left")
    else:
        s = s.with_columns(pl.col("gpu_busy_ns").alias("device_floor_ns"))
    # what the host did after the step's last CUDA work inside its window (Python, bookkeeping):
    # no CUDA call, so no tracing to take out; it follows the replayed step unchanged
    s = s.with_columns(
        (pl.col("step_end") - pl.max_horizontal("last_end", "_call_end")).clip(lower_bound=0)
        .fill_null(0).alias("_tail"))
    replay = (pl.max_horizontal("gpu_end", "host_end") + pl.col("_tail") - pl.col("step_begin"))
    steady = pl.max_horizontal(pl.col("host_end") + pl.col("_tail") - pl.col("step_begin"),
                               pl.col("device_floor_ns") + pl.col("n_kernels") * point_of(inv, calibration, pro).node_gap_ns)
    est = pl.when(is_vllm_step()).then(steady).otherwise(replay)
    return s.select("step", est.round(0).cast(pl.Int64).alias("estimated_ns")).sort("step")


def replay_ends(inv: Inventory) -> pl.DataFrame:
    """Per step in step order: (step, host_end, gpu_end, _call_end) — when the deflated host
    issues the step's last call, when the device finishes its replayed work, and the end of its
    last launch call (null where none): what estimate() needs of the activities, which no
    calibration changes.

    Linear in the number of activities and launch calls, in numpy over a handful of columns
    (a million-kernel trace is estimated without copying its activity frame)."""
    steps = inv.steps.select("step", "step_begin").sort("step")
    sid = steps["step"].to_numpy()
    begin = steps["step_begin"].to_numpy().astype(np.int64)
    n = sid.size
    host_end = np.full(n, np.iinfo(np.int64).min, dtype=np.int64)
    gpu_end = np.full(n, np.iinfo(np.int64).min, dtype=np.int64)
    # the arrays of a million rows are built one at a time and dropped as soon as they are used:
    # the estimate must not hold a second copy of the activity frame's columns
    calls = inv.launch_calls  # sorted by (step, start)
    c_step = _positions(sid, calls["step"])
    ct = calls["start"].to_numpy()
    t2 = d2 = None
    if ct.size:
        cs = group_bounds(c_step)
        x = np.empty(ct.size, dtype=np.int64)  # the gap before each call, then its deflated form
        x[1:] = ct[1:] - ct[:-1]
        x[cs] = ct[cs] - begin[c_step[cs]]
        np.maximum(x, 0, out=x)
        # the tracing taken out, down to MIN_INTERVAL_NS; an interval already shorter stays
        np.maximum(x - OVERHEAD_PER_LAUNCH_NS, np.minimum(x, MIN_INTERVAL_NS), out=x)
        t2 = cumsum_within(x, cs)
        t2 += begin[c_step]
        del x
        # the few distinct API names tested, not a million rows' text
        names = calls["api_name"].unique().drop_nulls().cast(pl.String)
        graph_names = names.filter(names.str.starts_with("cudaGraphLaunch") | names.str.starts_with("cuGraphLaunch"))
        graph_call = (calls["api_name"].is_in(graph_names.cast(calls.schema["api_name"]).implode()).to_numpy()
                      if graph_names.len() else np.zeros(ct.size, dtype=bool))
        d2 = calls["end"].to_numpy() - ct
        np.minimum(d2, UNTRACED_CALL_NS, out=d2)
        d2[graph_call] = UNTRACED_GRAPH_CALL_NS
        host_end[c_step[cs]] = np.maximum.reduceat(t2 + d2, cs)
    a = inv.in_steps("step", "start", "end", "launch_start", "graph_node_id")
    a_step = _positions(sid, a["step"])
    st = a["start"].to_numpy()
    ready = st.copy()
    has_call = a["launch_start"].is_not_null().to_numpy()
    if t2 is not None and has_call.any():
        # each activity moves with the launch call that issued it, or (a copy or memset, issued
        # by a call that is not a launch) with the last launch call before it in its step
        # (an activity without a call searches from a time among the others': its answer is unused)
        ls = a["launch_start"].fill_null(a["launch_start"].min()).to_numpy()
        j = last_at_or_before(c_step, ct, a_step, ls)
        if j is not None:
            np.maximum(j, 0, out=j)
            ok = has_call & (c_step[j] == a_step)
            node = a["graph_node_id"].is_not_null().to_numpy()
            # a graph node is ready when the (deflated) graph launch returns; any other activity
            # at its call's new time plus its own launch latency (at most LATENCY_CAP_NS)
            lat = np.clip(st - ls, 0, LATENCY_CAP_NS)
            lat += t2[j] - ct[j] + ls
            lat[node] = (t2[j] + d2[j])[node]
            ready[ok] = lat[ok]
            del j, ok, lat, node, ls
    del t2, d2, ct, c_step
    if st.size:
        a_starts = group_bounds(a_step)
        dur = a["end"].to_numpy() - st
        del st
        S = cumsum_within(dur, a_starts)
        ready -= S
        ready += dur  # ready - (S - dur): the recurrence end_i = max(ready_i, end_{i-1}) + dur_i
        del dur
        cummax_within(ready, a_step, a_starts)
        ready += S
        gpu_end[a_step[a_starts]] = np.maximum.reduceat(ready, a_starts)
        del S, ready
    last_call = calls.group_by("step").agg(pl.col("end").max().alias("_call_end"))
    return steps.select("step", pl.Series("host_end", host_end).replace(np.iinfo(np.int64).min, None),
                        pl.Series("gpu_end", gpu_end).replace(np.iinfo(np.int64).min, None)).join(
        last_call, on="step", how="left", maintain_order="left")


def _positions(sid: np.ndarray, steps: pl.Series) -> np.ndarray:
    """Each value's index in the sorted step ids `sid` (int32): the value itself when the ids
    are 0 … n-1, as a trace's steps are numbered (no binary search over a million rows)."""
    v = steps.to_numpy()
    n = sid.size
    if n and sid[0] == 0 and sid[-1] == n - 1 and (not v.size or (v.min() >= 0 and v.max() < n)):
        return v.astype(np.int32)
    return np.searchsorted(sid, v).astype(np.int32)


SERVING_KEY = ("prompt_reqs", "prompt_tokens", "decode_reqs", "decode_tokens")


def serving_measured(inv: Inventory, per_step: list) -> pl.DataFrame:
    """Per step of a serving run: the untraced step time of the same step in the sidecar's run of
    the same workload (DEFINITIONS.md, "Serving runs"). The k-th vLLM step of a process (by
    begin) is the sidecar's k-th step when their compositions agree; otherwise the median of the
    sidecar's steps of that composition; otherwise null (the estimate stands)."""
    rows = [r for r in per_step if isinstance(r, dict) and (r.get("tokens") or 0) > 0]
    side = pl.DataFrame(
        {"_k": list(range(len(rows))),
         **{k: [r.get(c) for r in rows] for k, c in zip(SERVING_KEY, ("ctx_reqs", "ctx_tokens", "gen_reqs",
                                                                      "gen_tokens"))},
         # the CUDA-event span from execute_model's entry to sample_tokens' exit: like the traced
         # step, it starts when the stream reaches the step (after the previous step's work)
         "_v": [r.get("step_time_ns") if isinstance(r.get("step_time_ns"), int) and r.get("step_time_ns") > 0
                else None for r in rows]},
        schema={"_k": pl.Int64, **{k: pl.Int64 for k in SERVING_KEY}, "_v": pl.Int64})
    s = inv.steps.filter(is_vllm_step()).select("step", "pid", "step_begin", *SERVING_KEY).sort("pid", "step_begin")
    s = s.with_columns(_k=pl.int_range(pl.len(), dtype=pl.Int64).over("pid"))
    by_order = s.join(side, on=["_k", *SERVING_KEY], how="inner").select("step", "_v")
    by_shape = side.group_by(SERVING_KEY).agg(pl.col("_v").median().round(0).cast(pl.Int64).alias("_m"))
    out = (s.join(by_order, on="step", how="left").join(by_shape, on=SERVING_KEY, how="left")
           .select("step", pl.coalesce("_v", "_m").alias("measured_ns")))
    return inv.steps.select("step").join(out, on="step", how="left")


def measured(inv: Inventory) -> pl.DataFrame:
    """Per step: the sidecar's untraced step time for it (null without a sidecar)."""
    sc = inv.trace.sidecar
    u = (sc or {}).get("untraced") or {}
    if u.get("kind") == "serving" and isinstance(u.get("per_step"), list):
        return serving_measured(inv, u["per_step"])

    def med(key: str) -> int | None:
        v = (u.get(key) or {}).get("median") if isinstance(u.get(key), dict) else None
        return v if isinstance(v, int) and v > 0 else None

    vllm, other = med("engine_step_gpu_ns") or med("step_time_ns"), med("step_time_ns")
    return inv.steps.select(
        "step", pl.when(is_vllm_step()).then(pl.lit(vllm, pl.Int64)).otherwise(pl.lit(other, pl.Int64))
        .alias("measured_ns"))


def untraced(inv: Inventory, launch: pl.DataFrame, floors: pl.DataFrame,
             pro: pl.DataFrame | None = None, calibration=None, ends: pl.DataFrame | None = None) -> pl.DataFrame:
    """Per step, the SCHEMA columns: the untraced step time and its source, the estimate, and
    the untraced Equation 1.3 (verdict, CPU floor) and graph what-if. `ends`: replay_ends(inv)."""
    work = floors.select("step", "device_floor_ns")
    pro = prologue(inv) if pro is None else pro
    est = estimate(inv, work, calibration, pro, ends)
    # the traced CPU floor bounds the untraced one (tracing only slows the host) and the host
    # pauses stay (analysis/pauses.py: no tracing and no graph replay removes a JIT compilation)
    traced = floors.select("step", pl.col("cpu_floor_ns").alias("_traced_cpu"),
                           *([pl.col("host_pause_ns").alias("_pause")] if "host_pause_ns" in floors.columns
                             else [pl.lit(0, pl.Int64).alias("_pause")]))
    gc = point_of(inv, calibration, pro)
    meas = measured(inv)
    sc = inv.trace.sidecar
    t_launch = (pl.col("interval_median_ns") - OVERHEAD_PER_LAUNCH_NS).clip(lower_bound=MIN_INTERVAL_NS)
    # measured: the host time the engine took to issue the step outside the capture range, per
    # launch call of the step (estimated: the traced interval less the tracing)
    host = ((sc or {}).get("untraced") or {}).get("host_ns") or {}
    host_ns = host.get("median") if isinstance(host.get("median"), int) else None
    if ((sc or {}).get("untraced") or {}).get("kind") == "serving":
        host_ns = None  # a median over steps of every composition stands for none of them
    if host_ns:
        t_launch = pl.when(pl.col("measured_ns").is_not_null() & (pl.col("n_launch_calls") > 0)).then(
            pl.lit(host_ns, pl.Int64) // pl.col("n_launch_calls")).otherwise(t_launch)
    s = (inv.steps.select("step", "n_launch_calls", "n_kernels", "name")
         .join(est, on="step", how="left").join(meas, on="step", how="left")
         .join(launch.select("step", "interval_median_ns", "call_median_ns"), on="step", how="left")
         .join(work, on="step", how="left").join(pro, on="step", how="left")
         .join(traced, on="step", how="left")
         .with_columns(pl.coalesce(t_launch, pl.col("call_median_ns").clip(upper_bound=UNTRACED_CALL_NS),
                                   pl.lit(0)).cast(pl.Int64).alias("untraced_t_launch_ns")))
    cpu = pl.min_horizontal(pl.col("n_launch_calls") * pl.col("untraced_t_launch_ns"),
                            pl.col("_traced_cpu")).cast(pl.Int64)
    pro_u = pl.max_horizontal(pl.col("prologue_host_ns") - pl.col("prologue_launches") * OVERHEAD_PER_LAUNCH_NS,
                              pl.col("prologue_launches") * MIN_INTERVAL_NS)
    dev = ((pl.col("device_floor_ns") - pl.col("prologue_busy_ns")).clip(lower_bound=0)
           + pl.col("forward_kernels") * gc.node_gap_ns + pl.col("forward_memops") * gc.memop_gap_ns)
    # untraced, a graph replay's launch costs microseconds; vLLM hides its prologue behind the
    # previous step's GPU work (async scheduling), a synchronous engine does not
    graph = (pl.when(is_vllm_step()).then(pl.max_horizontal(dev, pro_u)).otherwise(pro_u + dev)
             + pl.col("_pause").fill_null(0))
    # a vLLM step's untraced estimate never exceeds its traced step: taking nsys out of the host
    # shortens a step, never lengthens it (DEFINITIONS.md, "Serving runs"); a measurement stands
    # as measured
    s = s.join(inv.steps.select("step", "step_time_ns"), on="step", how="left")
    cap = pl.when(is_vllm_step()).then(pl.col("step_time_ns"))
    s = s.with_columns(pl.when(pl.col("estimated_ns").is_not_null()).then(pl.min_horizontal("estimated_ns", cap))
                       .alias("estimated_ns"))
    return s.select(
        "step",
        pl.coalesce("measured_ns", "estimated_ns").alias("untraced_step_time_ns"),
        # "measured" or "estimated"; render/sentences.py's untraced_source says it in words
        pl.when(pl.col("measured_ns").is_not_null()).then(pl.lit("measured"))
        .otherwise(pl.lit("estimated")).alias("untraced_source"),
        pl.col("measured_ns").alias("untraced_measured_ns"),
        pl.col("estimated_ns").alias("untraced_estimated_ns"),
        "untraced_t_launch_ns", cpu.alias("untraced_cpu_floor_ns"),
        verdict_expr(cpu, pause="_pause", step=pl.coalesce("measured_ns", "estimated_ns")).alias("untraced_verdict"),
        graph.round(0).cast(pl.Int64).alias("untraced_predicted_graph_step_time_ns"),
    ).cast(SCHEMA).sort("step")
