"""The diagnosis sections of a step in `analyze --json` (gaps, launch, floors, tp, untraced,
engine), written as JSON text by polars from the Diagnosis frames: a million-kernel trace's
2,400 steps are encoded column-wise and joined, never built as Python objects.
"""

from __future__ import annotations

import json

import polars as pl

from stepscope import jsontext
from stepscope.analysis.gaps import KINDS
from stepscope.analysis.step_view import ENGINE_FIELDS, FLOOR_FIELDS, TP_FIELDS, UNTRACED_FIELDS, has_untraced  # noqa: F401
from stepscope.render.sentences import with_tp_verdict, with_untraced_source

SECTIONS = ("gaps", "launch", "floors", "tp", "untraced", "engine")


def margin_as_written(margin: pl.Series) -> pl.Series:
    """margin rounded as Python rounds (the figure the document has always carried)."""
    return pl.Series("margin", [None if m is None else round(m, 3) for m in margin.to_list()], dtype=pl.Float64)


def sections_text(d, ids: list[int] | None = None) -> pl.DataFrame:
    """(step, gaps, launch, floors[, tp][, untraced, untraced_step_time_ns][, engine]): every step's
    sections of a Diagnosis `d` as JSON text; `ids`: those steps' only (a long run's document is
    written a few thousand steps at a time: its sections are ~40 % of its text). Which columns
    there are is the run's, whichever steps are asked for."""
    def of(f: pl.DataFrame) -> pl.DataFrame:
        return f if ids is None else f.filter(pl.col("step").is_in(ids))

    steps = of(d.verdicts).select("step")
    totals = of(d.gap_totals).sort("step", pl.col("kind").to_physical())
    kinds = jsontext.members(totals, "step", "kind", ["count", "time_ns"], "kinds", "", "")
    top = of(d.top_gaps())
    top = jsontext.arrays(top, "step", [c for c in top.columns if c != "step"], "top")
    hist = jsontext.arrays(of(d.histogram), "step", [c for c in d.histogram.columns if c != "step"], "hist")
    by_api = jsontext.arrays(of(d.launch_by_api), "step", [c for c in d.launch_by_api.columns if c != "step"], "by_api")
    launch = of(d.launch)
    launch = launch.select("step", jsontext.open_records(
        launch, [c for c in launch.columns if c != "step"]).alias("launch_head"))
    trace = d.inv.trace
    overhead = json.dumps({"count": trace.profiler_overhead_count, "time_ns": trace.profiler_overhead_ns},
                          separators=(",", ":"))
    v = of(d.verdicts)
    v = v.with_columns(margin_as_written(v["margin"]))
    floors = v.select("step", jsontext.records(v, list(FLOOR_FIELDS)).alias("floors"))
    empty = ",".join(f'"{k}":{{"count":0,"time_ns":0}}' for k in KINDS)
    t = (steps.join(kinds, on="step", how="left").join(top, on="step", how="left")
         .join(hist, on="step", how="left").join(launch, on="step", how="left")
         .join(by_api, on="step", how="left").join(floors, on="step", how="left"))
    lead = pl.col("launch_head").fill_null("{")
    extra = []
    if d.tp is not None and d.tp.height:
        # a group's sentence is read off its binding rank's row, which another step may carry:
        # the asked steps' groups whole, then the asked steps
        groups = d.tp if ids is None else d.tp.filter(pl.col("group").is_in(of(d.tp)["group"].implode()))
        x = of(with_tp_verdict(groups)).select("step", *[pl.col(c).alias(k) for k, c in TP_FIELDS.items()])
        t = t.join(x.select("step", jsontext.records(x, list(TP_FIELDS)).alias("tp")), on="step", how="left")
        extra.append("tp")
    if has_untraced(d):
        x = with_untraced_source(v.join(d.untraced.select("step"), on="step", how="semi"), trace.sidecar).select(
            "step", *[pl.col(c).alias(k) for k, c in UNTRACED_FIELDS.items()])
        t = t.join(x.select("step", jsontext.records(x, list(UNTRACED_FIELDS)).alias("untraced"),
                            pl.col("step_time_ns").alias("untraced_step_time_ns")), on="step", how="left")
        extra += ["untraced", "untraced_step_time_ns"]
    if d.engine is not None and d.engine.height:
        e = of(d.engine)
        t = t.join(e.select("step", jsontext.records(e, list(ENGINE_FIELDS)).alias("engine")), on="step", how="left")
        extra.append("engine")
    return t.select(
        "step",
        pl.concat_str(pl.lit("{"), pl.col("kinds").fill_null(empty), pl.lit(',"top":'),
                      pl.col("top").fill_null("[]"), pl.lit(',"histogram":'), pl.col("hist").fill_null("[]"),
                      pl.lit("}")).alias("gaps"),
        pl.concat_str(lead, pl.when(lead == "{").then(pl.lit("")).otherwise(pl.lit(",")),
                      pl.lit('"by_api":'), pl.col("by_api").fill_null("[]"),
                      pl.lit(f',"profiler_overhead":{overhead}}}')).alias("launch"),
        "floors", *extra,
    ).sort("step")


def step_sections(d, step: int) -> dict:
    """One step's sections as the document holds them (the JSON text read back)."""
    row = sections_text(d).filter(pl.col("step") == step).row(0, named=True)
    return {k: json.loads(row[k]) for k in SECTIONS if k in row and row[k] is not None}
