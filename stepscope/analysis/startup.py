"""An engine's start-up: what a process ran before its first engine step (DEFINITIONS.md,
"Start-up"), recognized so that it is named, and left out of every step."""

from __future__ import annotations

import polars as pl

from stepscope.analysis.lazy_numpy import np

STARTUP_SCHEMA = {"pid": pl.Int64, "begin_ns": pl.Int64, "end_ns": pl.Int64, "duration_ns": pl.Int64,
                  "graph_captures": pl.Int64, "kernels": pl.Int64, "memops": pl.Int64,
                  "compiled_kernels": pl.Int64, "gpu_busy_ns": pl.Int64, "longest_pause_ns": pl.Int64,
                  "evidence": pl.String}

# the delimiters of a serving run's engine steps: what ran before the first one is the start-up
SERVING_DELIMITERS = ("engine", "schedule")
# torch.compile's Inductor kernels (pointwise, reduction, persistent reduction, template)
COMPILED = r"^triton_(poi|red|per|tem)_"


def startup(steps: pl.DataFrame, acts: pl.DataFrame, api: pl.DataFrame) -> pl.DataFrame:
    """One row per process whose steps are a serving run's (or that captured CUDA graphs before
    its first step) and that recorded CUDA work before that step: STARTUP_SCHEMA.

    `acts`: activities with `step` (null outside every step), `name`, launch columns; `api`:
    the calls with their flags."""
    rows = []
    any_capture = bool(api["is_graph_capture"].any()) if "is_graph_capture" in api.columns else False
    for pid in steps["pid"].unique().sort().to_list():
        mine = steps.filter(pl.col("pid") == pid)
        first = mine["w_start"].min()
        if first is None or not (any_capture or mine["delimiter"].is_in(SERVING_DELIMITERS).any()):
            continue
        calls = api.filter(pl.col("pid") == pid)
        # the calls that do CUDA work (a launch, a copy, a graph capture), not queries of it
        before = calls.filter((pl.col("start") < first)
                              & (pl.col("is_launch") | pl.col("is_copy") | pl.col("is_graph_capture")))
        captures = int((before["is_graph_capture"] & before["api_name"].cast(pl.String).str.contains("EndCapture")).sum())
        if not captures:
            captures = int((before["is_graph_capture"] & before["api_name"].cast(pl.String).str.contains("Instantiate")).sum())
        if not mine["delimiter"].is_in(SERVING_DELIMITERS).any() and not captures:
            continue
        early = acts.filter((pl.col("pid") == pid) & pl.col("step").is_null()
                            & (pl.coalesce("launch_start", "start") < first))
        if before.is_empty() and early.is_empty():
            continue
        begin = min(x for x in (before["start"].min(), early["start"].min()) if x is not None)
        kern = early.filter(pl.col("is_kernel"))
        compiled = int(kern["name"].cast(pl.String).str.contains(COMPILED).sum()) if kern.height else 0
        pause = _longest_pause(pl.concat([before.select("start", "end"), early.select("start", "end")]), first)
        busy = _union(early.select("start", "end"))
        words = []
        if compiled:
            words.append(f"torch.compile ({compiled:,} Inductor kernels run)")
        if captures:
            words.append(f"CUDA-graph capture ({captures} graph{'s' if captures != 1 else ''})")
        if kern.height - compiled > 0 or early.height > kern.height:
            words.append(f"warm-up and profiling runs ({kern.height:,} kernels, {early.height - kern.height:,} memops)")
        rows.append((pid, int(begin), int(first), int(first - begin), captures, kern.height,
                     early.height - kern.height, compiled, busy, pause, ", ".join(words)))
    return pl.DataFrame(rows, schema=STARTUP_SCHEMA, orient="row")


def _longest_pause(spans: pl.DataFrame, until: int) -> int:
    """The longest time before `until` in which the process made no CUDA call and ran nothing."""
    if spans.is_empty():
        return 0
    s = spans.sort("start")
    start, end = s["start"].to_numpy(), np.maximum.accumulate(s["end"].to_numpy())
    gaps = np.concatenate((start[1:] - end[:-1], [until - end[-1]]))
    return int(max(gaps.max(), 0))


def _union(spans: pl.DataFrame) -> int:
    """Length of the union of the intervals."""
    if spans.is_empty():
        return 0
    s = spans.sort("start")
    start, end = s["start"].to_numpy(), s["end"].to_numpy()
    prev = np.concatenate(([start[0]], np.maximum.accumulate(end)[:-1]))
    return int(np.maximum(end - np.maximum(start, prev), 0).sum())
