"""The anatomy of a vLLM engine step: what vLLM costs around the model.

With `VLLM_NVTX_SCOPES_FOR_PROFILING=1` (stepscope trace sets it) a vLLM trace holds, besides the
worker's `execute_context_…` range, the engine core's `schedule: …` ranges and the frontend's
`llm_engine step: get_output` / `process_outputs` ranges. Per vLLM step (its window runs from
the execute_context range to the next engine iteration, steps.py):

  forward_ns          the execute_context range: execute_model, input preparation included
  sample_ns           from the range's end to the window's end: sample_tokens (LM head,
                      sampling, the sampled tokens' copy to the host and the wait for it)
  gpu_tail_ns         GPU work still running after the step's last launch call returned
  schedule_ns         the next iteration's `schedule: …` ranges on the step's thread, just after
                      the window (the scheduling of the step itself precedes the capture range)
  get_output_ns       the frontend's `llm_engine step: get_output` range overlapping the step:
                      how long the frontend waited for this step's output
  process_outputs_ns  the frontend's `process_outputs` range overlapping the step (it processes
                      the previous step's output while this one runs)

A step that is not vLLM's has no anatomy; a vLLM trace without those ranges says so and gives
the forward and sampling split only.
"""

from __future__ import annotations

import polars as pl

from stepscope.analysis.frames import FAR_END
from stepscope.analysis.inventory import Inventory
from stepscope.analysis.steps import VLLM_SCHEDULE_PREFIX, VLLM_STEP_RE

GET_OUTPUT = "llm_engine step: get_output"
PROCESS_OUTPUTS = "llm_engine step: process_outputs"
SCHEMA = {"step": pl.Int64, "forward_ns": pl.Int64, "sample_ns": pl.Int64, "gpu_tail_ns": pl.Int64,
          "schedule_ns": pl.Int64, "schedule_ranges": pl.Int64, "get_output_ns": pl.Int64,
          "process_outputs_ns": pl.Int64, "engine_ranges": pl.Boolean, "note": pl.String}
NO_SCOPES = ("no vLLM engine ranges in this trace (capture with VLLM_NVTX_SCOPES_FOR_PROFILING=1): "
             "forward and sampling only")


def anatomy(inv: Inventory) -> pl.DataFrame:
    """One row per vLLM step (SCHEMA); empty when the trace has none."""
    steps = inv.steps.filter(pl.col("name").fill_null("").str.contains(VLLM_STEP_RE.pattern))
    if steps.is_empty():
        return pl.DataFrame(schema=SCHEMA)
    nvtx = inv.trace.nvtx.with_columns(pl.col("pid").cast(pl.Int64), pl.col("tid").cast(pl.Int64))
    ranges = nvtx.filter(pl.col("name").str.contains(VLLM_STEP_RE.pattern)).select(
        "pid", "tid", pl.col("start").alias("w_start"), pl.col("end").alias("r_end"))
    s = steps.select("step", pl.col("pid").cast(pl.Int64), pl.col("tid").cast(pl.Int64), "w_start", "w_end",
                     "last_end").join(ranges, on=["pid", "tid", "w_start"], how="left")
    last_call = inv.launch_calls.group_by("step").agg(pl.col("end").max().alias("_call_end"))
    s = s.join(last_call, on="step", how="left")
    # the next iteration's scheduling: schedule ranges on the thread from the window's end until
    # the next step range (or the end of the trace)
    sched = nvtx.filter(pl.col("name").str.starts_with(VLLM_SCHEDULE_PREFIX)).select(
        "pid", "tid", "start", "end")
    nxt = ranges.select("pid", "tid", pl.col("w_start").alias("_n")).sort("_n")
    s = s.sort("w_end").join_asof(nxt, left_on="w_end", right_on="_n", by=["pid", "tid"],
                                  strategy="forward", check_sortedness=False)
    # each schedule range to the step whose window ended last before it (a thread's steps do not
    # overlap, so that is the only step it can follow): linear, where a join on the thread was
    # steps x ranges (8.8 GB at 1M kernels of a serving run, benchmarks/serving_scale.py)
    sc = (sched.sort("start").join_asof(s.select("step", "pid", "tid", "w_end", "_n").sort("w_end"),
                                        left_on="start", right_on="w_end", by=["pid", "tid"],
                                        strategy="backward", check_sortedness=False)
          .filter(pl.col("step").is_not_null() & (pl.col("start") < pl.col("_n").fill_null(FAR_END)))
          .group_by("step").agg(pl.len().cast(pl.Int64).alias("schedule_ranges"),
                                (pl.col("end") - pl.col("start")).sum().alias("schedule_ns")))
    front = nvtx.filter(pl.col("name").is_in([GET_OUTPUT, PROCESS_OUTPUTS])).select(
        pl.col("pid").alias("_fpid"), "name", "start", "end")
    # the overlapping pairs only (an interval join), not steps x frontend ranges
    ov = (s.select("step", "pid", "w_start", "w_end").join_where(
              front, pl.col("start") < pl.col("w_end"), pl.col("end") > pl.col("w_start"))
          .filter(pl.col("_fpid") != pl.col("pid"))
          .with_columns((pl.min_horizontal("end", "w_end") - pl.max_horizontal("start", "w_start")).alias("_o"))
          .sort("step", "_o", descending=[False, True]).group_by("step", "name").first())
    fo = ov.group_by("step").agg(
        (pl.col("end") - pl.col("start")).filter(pl.col("name") == GET_OUTPUT).first().alias("get_output_ns"),
        (pl.col("end") - pl.col("start")).filter(pl.col("name") == PROCESS_OUTPUTS).first()
        .alias("process_outputs_ns"))
    has_scopes = not sched.is_empty() or not front.is_empty()
    out = s.join(sc, on="step", how="left").join(fo, on="step", how="left").select(
        "step",
        (pl.col("r_end") - pl.col("w_start")).alias("forward_ns"),
        (pl.col("w_end") - pl.col("r_end")).clip(lower_bound=0).alias("sample_ns"),
        (pl.col("last_end") - pl.col("_call_end")).clip(lower_bound=0).alias("gpu_tail_ns"),
        "schedule_ns", "schedule_ranges", "get_output_ns", "process_outputs_ns",
        pl.lit(has_scopes).alias("engine_ranges"),
        pl.lit(None if has_scopes else NO_SCOPES, pl.String).alias("note"),
    )
    return out.cast(SCHEMA).sort("step")
