"""The run view: what a trace of many engine steps was, and where its time went (DEFINITIONS.md,
"Serving runs").

Over the steps of the summary rank (collectives.summary_rank; every step of a one-GPU trace):
- kinds: the steps by serving kind (composition.kind_expr: phase × graph mode × batch bucket)
  with their count, total and share of the steps' time, p50/p90/max step time and tokens;
- time: the run's wall time (first step begin → last step end) split into GPU busy (by class:
  Σ kernel and memop time), GPU idle inside the steps by cause (host-bound, sync, device-side
  gaps, host pauses; the host's input preparation before and its sampling/output after each step's GPU work)
  and the time between steps (wall − Σ step time);
- slowest: the N slowest steps, each with its kind, composition, verdict and binding figures;
- throughput: tokens (prompt + decode tokens scheduled) per second of wall time, traced and,
  when every step has one, untraced (Σ tokens / Σ untraced step time).
Plain values only: the renderers build the sentences.
"""

from __future__ import annotations

import polars as pl

from stepscope.analysis.composition import bucket_expr, kind_expr

TOP_SLOWEST = 5
MIN_STEPS = 2  # a run view needs at least this many steps on the summary rank


def _summary_steps(d) -> pl.DataFrame:
    s = d.inv.steps
    if s.select("pid", "device").unique().height > 1 and d.collectives is not None:
        from stepscope.analysis.collectives import summary_rank

        r = summary_rank(d.collectives.ranks, d.tp)
        s = s.filter((pl.col("pid") == r["pid"]) & (pl.col("device") == r["device"]))
    return s


def _longest_pauses(d, ids: list[int], top: int = 3) -> list[dict]:
    p = getattr(d, "pauses", None)
    if p is None or p.is_empty():
        return []
    return (p.filter(pl.col("step").is_in(ids)).sort("pause_ns", "step", descending=[True, False]).head(top)
            .select(pl.col("step").alias("index"), "pause_ns", "after_launch", "n_launches",
                    pl.col("after_api").alias("next_call"), "next_kernel", "gpu_idle_ns").to_dicts())


def run_view(d, top: int = TOP_SLOWEST) -> dict | None:
    """The run view of a Diagnosis, or None for a trace of fewer than MIN_STEPS steps."""
    s = _summary_steps(d)
    if s.height < MIN_STEPS:
        return None
    v = d.verdicts.select("step", "verdict", "cpu_floor_ns", "device_floor_ns", "host_wait_ns", "host_bound_on",
                          "host_prep_ns", "host_after_ns", "predicted_graph_step_time_ns",
                          "untraced_step_time_ns", "untraced_source", "host_pause_ns", "host_pauses",
                          "longest_pause_ns", "longest_pause_after_launch", "longest_pause_next_call",
                          "longest_pause_next_kernel")
    s = (s.join(v, on="step", how="left")
         .with_columns(kind=kind_expr(), batch=bucket_expr(),
                       step_tokens=pl.coalesce(pl.col("prompt_tokens") + pl.col("decode_tokens"), pl.col("tokens"))))
    ids = s["step"].to_list()
    total = int(s["step_time_ns"].sum())
    wall = int(s["step_end"].max() - s["step_begin"].min())

    kinds = (s.group_by("kind", maintain_order=True).agg(
        pl.col("phase").first(), pl.col("graph_mode").first(), pl.col("batch").first(),
        count=pl.len().cast(pl.Int64), time_ns=pl.col("step_time_ns").sum(),
        p50_ns=pl.col("step_time_ns").quantile(0.5, "nearest").cast(pl.Int64),
        p90_ns=pl.col("step_time_ns").quantile(0.9, "nearest").cast(pl.Int64), max_ns=pl.col("step_time_ns").max(),
        tokens=pl.when(pl.col("step_tokens").is_not_null().any()).then(pl.col("step_tokens").sum()), tokens_p50=pl.col("step_tokens").quantile(0.5, "nearest").cast(pl.Int64),
        first_step=pl.col("step").min())
        .with_columns(share=pl.col("time_ns") / max(total, 1))
        .sort("time_ns", "first_step", descending=[True, False]))

    by_class = (d.inv.classes.filter(pl.col("step").is_in(ids)).group_by("class")
                .agg(pl.col("time_ns").sum(), pl.col("count").sum()).sort("time_ns", descending=True)
                .with_columns(pl.col("class").cast(pl.String)))
    gaps = (d.gap_totals.filter(pl.col("step").is_in(ids)).group_by("kind").agg(pl.col("time_ns").sum(),
                                                                                pl.col("count").sum())
            .with_columns(pl.col("kind").cast(pl.String)))
    gap = {r["kind"]: int(r["time_ns"]) for r in gaps.iter_rows(named=True)}
    slow = s.sort("step_time_ns", "step", descending=[True, False]).head(top)
    side = d.gap_totals.filter(pl.col("kind") == "device_side").select(
        "step", pl.col("time_ns").alias("idle_device_side_ns"))
    slow = slow.join(side, on="step", how="left", maintain_order="left")
    slowest = slow.select(
        pl.col("step").alias("index"), "kind", "name", "phase", "graph_mode", "requests", "prompt_reqs",
        "prompt_tokens", "decode_reqs", "decode_tokens", "step_tokens", "step_time_ns", "gpu_busy_ns",
        "n_kernels", "n_launch_calls", "verdict", "cpu_floor_ns", "device_floor_ns", "host_wait_ns",
        "host_bound_on", "untraced_step_time_ns", "host_pause_ns", "host_pauses", "longest_pause_ns",
        "longest_pause_after_launch", "longest_pause_next_call", "longest_pause_next_kernel",
        "idle_device_side_ns").to_dicts()
    top_class = (d.inv.classes.filter(pl.col("step").is_in(slow["step"].to_list())).sort("time_ns", descending=True)
                 .group_by("step", maintain_order=True).first().select("step", pl.col("class").cast(pl.String),
                                                                      "time_ns"))
    tc = {r["step"]: r for r in top_class.iter_rows(named=True)}
    for r in slowest:
        c = tc.get(r["index"])
        r["top_class"], r["top_class_time_ns"] = (c["class"], c["time_ns"]) if c else (None, None)

    tokens = s["step_tokens"].sum() if s["step_tokens"].null_count() < s.height else None
    untraced_total = (int(s["untraced_step_time_ns"].sum())
                      if s["untraced_step_time_ns"].null_count() == 0 else None)
    measured = int((s["untraced_source"] == "measured").sum())
    busy = int(s["gpu_busy_ns"].sum())
    inside = (busy + sum(gap.values()) + int(s["host_prep_ns"].sum()) + int(s["host_after_ns"].sum()))
    return {
        "steps": s.height,
        "wall_ns": wall,
        "steps_time_ns": total,
        "kinds": kinds.drop("first_step").to_dicts(),
        "time": {
            "gpu_busy_ns": busy,
            "gpu_busy_by_class": by_class.to_dicts(),
            "idle_host_bound_ns": gap.get("host_bound", 0),
            "idle_sync_ns": gap.get("sync", 0),
            "idle_device_side_ns": gap.get("device_side", 0),
            # the GPU idle while the launching thread paused (analysis/pauses.py), not launching
            "idle_host_pause_ns": gap.get("host_pause", 0),
            "host_prep_ns": int(s["host_prep_ns"].sum()),
            "host_after_ns": int(s["host_after_ns"].sum()),
            "between_steps_ns": wall - total,
            # a step's GPU work that started before its begin (on another stream, beside the
            # previous step's): counted in both steps' parts, taken out once here
            "overlap_ns": inside - total,
        },
        # the most frequent first, ties by name: value_counts' own order follows its threads
        "verdicts": {k: int(n) for k, n in s["verdict"].value_counts(name="n").sort(
            ["n", "verdict"], descending=[True, False]).iter_rows()},
        "slowest": slowest,
        # the longest host pauses of the run's steps, longest first (analysis/pauses.py)
        "host_pauses": _longest_pauses(d, ids),
        "throughput": {
            "tokens": None if tokens is None else int(tokens),
            "tokens_per_s": None if not tokens or wall <= 0 else round(tokens * 1e9 / wall, 1),
            "untraced_steps_time_ns": untraced_total,
            "untraced_tokens_per_s": (None if not tokens or not untraced_total
                                      else round(tokens * 1e9 / untraced_total, 1)),
            "untraced_measured_steps": measured,
        },
    }
