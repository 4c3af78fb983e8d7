"""One run from several reports: the ranks of every report on one timeline, their collectives
matched across the reports as collectives.py matches them inside one multi-rank export, and the
figures that depend on the other ranks (transfer and wait, the rank device floor, the verdict,
the what-if graph step, rank skew, the binding rank) computed for the whole run
(docs/DEFINITIONS.md, "Reports of one run").

Input: one stepscope.reports.ReportResult per report, in the order given. Everything here is a
pure function of those small frames: the result does not depend on where they were computed.

clock    a report's timestamps count from its session's start; start_utc_ns − the earliest
         start of the run shifts them onto the run's timeline (0 for a report that records none)
rank     one (report, pid, device); numbered by host, then device, then pid, then report: within
         one host the rule of a single export (device, then pid)
step     each report's steps keep their own index (`step`); `run_step` numbers them across the run
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from stepscope.analysis.collectives import (
    Collectives, declared_tp, group_verdicts, match_collectives, step_collectives, work_of,
)
from stepscope.analysis.verdict import verdict_expr
from stepscope.analysis.whatif import chosen, engine_of_names, predicted_expr
from stepscope.analysis.notes import REPORTS_WITHOUT_START, note

KEYS = ["report", "pid", "device"]


@dataclass
class RunView:
    reports: list[dict]     # report, path, host, start_utc_ns, clock_offset_ns, nsys_version, schema_version,
                            # gpus, warnings, steps, kernels
    ranks: pl.DataFrame     # rank, report, host, pid, device
    steps: pl.DataFrame     # one row per (report, step): run_step, report, step, rank, group, the report's
                            # figures, the run's collectives split, floors, verdict, what-if, TP figures
    warnings: list[str]
    # the run's summaries, computed with it (summarized): the renderers only format them
    totals: pl.DataFrame | None = None   # rank_totals
    tp: pl.DataFrame | None = None       # tp_groups
    binding: dict | None = None          # run_binding_rank
    medians: pl.DataFrame | None = None  # rank_medians: the terminal's row of each rank
    report_ranks: dict | None = None     # report -> its ranks, in order

    @property
    def n_ranks(self) -> int:
        return self.ranks.height


def summarized(view: RunView) -> RunView:
    """`view` with its per-rank totals, TP steps and binding rank computed."""
    return RunView(view.reports, view.ranks, view.steps, view.warnings, rank_totals(view), tp_groups(view),
                   run_binding_rank(view), rank_medians(view), report_ranks(view))


def _clock_offsets(results) -> tuple[list[int], list[str]]:
    starts = [r.start_utc_ns for r in results]
    known = [s for s in starts if s is not None]
    origin = min(known) if known else 0
    warnings = []
    missing = [r.path for r, s in zip(results, starts) if s is None]
    if known and missing:
        warnings.append(note(REPORTS_WITHOUT_START, count=len(missing), first=missing[0]))
    return [0 if s is None else s - origin for s in starts], warnings


def combine(results: list, calibration=None) -> RunView:
    """The run view of several reports' results (see the module doc); `calibration`: the
    what-if's (whatif.chosen: None is the default one)."""
    offsets, warnings = _clock_offsets(results)
    n = len(results)
    idx = pl.DataFrame({"report": list(range(n)), "_off": offsets, "host": [r.host for r in results]},
                       schema={"report": pl.Int64, "_off": pl.Int64, "host": pl.String})
    key_types = [pl.col("report").cast(pl.Int64), pl.col("pid").cast(pl.Int64), pl.col("device").cast(pl.Int64)]

    steps = pl.concat([r.steps.with_columns(report=pl.lit(i, pl.Int64)) for i, r in enumerate(results)],
                      how="vertical_relaxed")
    steps = (steps.with_columns(*key_types).join(idx, on="report", how="left")
             .with_columns(step_begin=pl.col("step_begin") + pl.col("_off"), step_end=pl.col("step_end") + pl.col("_off"))
             .sort("report", "step").with_columns(run_step=pl.int_range(pl.len(), dtype=pl.Int64)))
    ranks = (steps.select(*KEYS, "host").unique()
             .sort(pl.col("host").fill_null(""), "device", "pid", "report")
             .with_columns(rank=pl.int_range(pl.len(), dtype=pl.Int64)))
    step_map = steps.select("report", "step", "run_step")

    def on_run(frame_of, cols) -> pl.DataFrame:
        """A per-report frame with the run's step numbers (and times shifted onto its clock)."""
        parts = [frame_of(r).with_columns(report=pl.lit(i, pl.Int64)) for i, r in enumerate(results)]
        f = pl.concat(parts, how="vertical_relaxed") if parts else pl.DataFrame()
        f = f.with_columns(pl.col("step").cast(pl.Int64)).join(step_map, on=["report", "step"], how="left")
        f = f.join(idx.select("report", "_off"), on="report", how="left")
        shifted = [(pl.col(c) + pl.col("_off")).alias(c) for c in ("start", "end") if c in f.columns]
        return f.with_columns(*shifted).select(*cols)

    kernels = on_run(lambda r: r.collectives, ["run_step", "report", "pid", "device", "stream", "name", "start", "end"])
    kernels = kernels.with_columns(*key_types[1:], pl.col("stream").cast(pl.Int64)).rename({"run_step": "step"})
    touching = on_run(lambda r: r.touching, ["run_step"]).rename({"run_step": "step"})
    other = on_run(lambda r: r.other, ["run_step", "start", "end"]).rename({"run_step": "step"})

    rank_keys = ranks.select(*KEYS, "rank")
    matched = match_collectives(kernels, rank_keys)
    run = steps.rename({"step": "report_step", "run_step": "step"})
    tp = declared_tp(run)
    coll_steps = step_collectives(run.select("step", *KEYS, "step_begin"), rank_keys, matched, tp)
    waited = coll_steps.filter(pl.col("split") & (pl.col("collective_wait_ns") > 0)).select("step")
    work = work_of(run.select("step", "gpu_busy_ns"), matched, waited, touching, other)
    eng = engine_of_names(run["name"])
    # each report's scheduling as analyze reads it (engine, sidecar): queued replays only when all are async
    queued = all(r.scheduling == "async" for r in results)
    floors = (run.join(work, on="step", how="left")
              .with_columns(device_floor_ns=pl.coalesce("device_work_ns", "gpu_busy_ns"))
              .with_columns(
                  verdict=verdict_expr(pause="host_pause_ns", step="step_time_ns"),
                  margin=(pl.max_horizontal("cpu_floor_ns", "device_floor_ns")
                          / pl.min_horizontal("cpu_floor_ns", "device_floor_ns").clip(lower_bound=1)),
                  predicted_graph_step_time_ns=pl.when(pl.col("replayed").fill_null(False)).then(None)
                  .otherwise((predicted_expr(chosen(calibration), eng, queued=queued, by=("report", "pid", "device"))
                              # a graph does not remove a host pause (analysis/pauses.py), as in analyze
                              + pl.col("host_pause_ns").fill_null(0)).round(0)).cast(pl.Int64))
              .select("step", "cpu_floor_ns", "device_floor_ns", "verdict", "margin", "predicted_graph_step_time_ns"))
    coll = Collectives(ranks.select(*KEYS, "rank"), matched, coll_steps, work)
    groups = group_verdicts(coll, run.select("step", "step_time_ns"), floors)
    out = (run.drop("cpu_floor_ns", "_off")
           .join(coll_steps.drop("rank"), on="step", how="left")
           .join(ranks.select(*KEYS, "rank"), on=KEYS, how="left")
           .join(floors, on="step", how="left")
           .join(groups, on="step", how="left")
           .rename({"step": "run_step", "report_step": "step"})
           .sort("run_step"))
    reports = []
    for i, r in enumerate(results):
        reports.append({"report": i, "path": r.path, "host": r.host, "start_utc_ns": r.start_utc_ns,
                        "clock_offset_ns": offsets[i], "nsys_version": r.nsys_version,
                        "schema_version": r.schema_version, "gpus": r.gpus, "warnings": r.warnings,
                        "steps": r.steps.height, "kernels": r.kernels})
    return summarized(RunView(reports, ranks.select("rank", *KEYS, "host").sort("rank"), out, warnings))


def only_groups(view: RunView, groups: list[int]) -> RunView:
    """The run narrowed to the TP steps `groups` (every rank's step of each)."""
    return summarized(RunView(view.reports, view.ranks, view.steps.filter(pl.col("group").is_in(groups)), view.warnings))


def rank_totals(view: RunView) -> pl.DataFrame:
    """Per rank over its steps: steps, Σ step time, collective time, transfer and wait (null when
    a step of it is not split), and how many TP steps it binds, with their time and share of the
    run (Σ over the TP steps of the slowest rank's step time)."""
    s = view.steps
    tp = tp_groups(view)
    run_ns = int(tp["step_time_ns"].sum() or 0) if tp.height else 0
    bound = (tp.filter(pl.col("binding_rank").is_not_null())
             .group_by("binding_rank").agg(binding_steps=pl.len().cast(pl.Int64),
                                           binding_time_ns=pl.col("step_time_ns").sum())
             .rename({"binding_rank": "rank"}))
    split_all = pl.col("split").fill_null(False).all()
    t = s.group_by("rank").agg(
        steps=pl.len().cast(pl.Int64), step_time_ns=pl.col("step_time_ns").sum(),
        collectives=pl.col("collectives").sum(), collective_ns=pl.col("collective_ns").sum(),
        collective_transfer_ns=pl.when(split_all).then(pl.col("collective_transfer_ns").sum()),
        collective_wait_ns=pl.when(split_all).then(pl.col("collective_wait_ns").sum()),
    )
    t = (view.ranks.join(t, on="rank", how="left").join(bound, on="rank", how="left")
         .with_columns(pl.col("binding_steps", "binding_time_ns").fill_null(0))
         .with_columns(binding_share=pl.when(pl.lit(run_ns > 0))
                       .then((pl.col("binding_time_ns") / max(run_ns, 1)).round(4)))
         .sort("rank"))
    return t


MEDIAN_FIELDS = ("step_time_ns", "collective_ns", "collective_transfer_ns", "collective_wait_ns",
                 "device_floor_ns", "cpu_floor_ns")


def rank_medians(view: RunView) -> pl.DataFrame:
    """Per rank with steps: the median over its steps of its step time, collective time,
    transfer, wait and floors (null where every step's is), and its most frequent verdict (ties:
    the first in sort order)."""
    s = view.steps
    schema = {"rank": pl.Int64, **{c: pl.Float64 for c in MEDIAN_FIELDS}, "verdict": pl.String}
    if s.is_empty():
        return pl.DataFrame(schema=schema)
    return (s.group_by("rank").agg(*[pl.col(c).median().cast(pl.Float64) for c in MEDIAN_FIELDS],
                                   verdict=pl.col("verdict").cast(pl.String).mode().sort().first())
            .sort("rank"))


def report_ranks(view: RunView) -> dict:
    """Each report's ranks, in order."""
    by = view.ranks.group_by("report").agg(pl.col("rank").sort())
    return {r["report"]: r["rank"] for r in by.to_dicts()}


def tp_groups(view: RunView) -> pl.DataFrame:
    """One row per TP step of the run: its ranks, the slowest rank's step time, the rank skew,
    the binding rank and what binds it (as tp.tp_steps does for one export)."""
    s = view.steps
    if s.is_empty() or view.n_ranks < 2:
        return pl.DataFrame(schema={"group": pl.Int64, "ranks": pl.Int64, "step_time_ns": pl.Int64,
                                    "rank_skew_ns": pl.Int64, "binding_rank": pl.Int64})
    g = s.group_by("group").agg(
        ranks=pl.len().cast(pl.Int64), step_time_ns=pl.col("step_time_ns").max(),
        rank_skew_ns=pl.col("rank_skew_ns").first(), binding_rank=pl.col("binding_rank").first(),
        *[pl.col(c).first() for c in ("bound", "binding_cpu_floor_ns", "binding_device_floor_ns", "waits")])
    return g.sort("group")


def run_binding_rank(view: RunView) -> dict | None:
    """The rank that binds most TP steps of the run (ties: the lowest), with its count, its time
    and share of the run (rank_totals); None when no TP step has a binding rank."""
    t = rank_totals(view).filter(pl.col("binding_steps") > 0)
    if t.is_empty():
        return None
    row = t.sort(["binding_steps", "rank"], descending=[True, False]).row(0, named=True)
    n = int(tp_groups(view)["binding_rank"].drop_nulls().len())
    return {"rank": row["rank"], "tp_steps": row["binding_steps"], "of": n, "time_ns": row["binding_time_ns"],
            "share": row["binding_share"]}
