"""Gaps, launch overhead and floors of every step, computed once and shared by all renderers."""

from __future__ import annotations

import json
from dataclasses import dataclass

import polars as pl

from stepscope import jsontext
from stepscope.analysis.collectives import Collectives, collectives, group_verdicts
from stepscope.analysis.floors import floors
from stepscope.analysis.gaps import KINDS, find_gaps, gap_totals, histogram
from stepscope.analysis.inventory import Inventory
from stepscope.analysis.launch import launch_summary
from stepscope.analysis.whatif import predict_graph_step

TOP_GAPS = 5
SECTIONS = ("gaps", "launch", "floors", "tp", "untraced", "engine")
ENGINE_FIELDS = ("forward_ns", "sample_ns", "gpu_tail_ns", "schedule_ns", "schedule_ranges", "get_output_ns",
                 "process_outputs_ns", "engine_ranges", "note")
# the untraced section of a step (analysis/untraced.py); its step_time_ns is also the step's
# top-level untraced_step_time_ns, beside the traced step_time_ns
UNTRACED_FIELDS = {"step_time_ns": "untraced_step_time_ns", "source": "untraced_source",
                   "measured_ns": "untraced_measured_ns", "estimated_ns": "untraced_estimated_ns",
                   "t_launch_ns": "untraced_t_launch_ns", "cpu_floor_ns": "untraced_cpu_floor_ns",
                   "verdict": "untraced_verdict",
                   "predicted_graph_step_time_ns": "untraced_predicted_graph_step_time_ns"}
# the tp section of a step (its JSON field: the frame's column)
TP_FIELDS = {"rank": "rank", "ranks": "ranks", "group": "group", "collectives": "collectives",
             "collective_ns": "collective_ns", "collective_transfer_ns": "collective_transfer_ns",
             "collective_wait_ns": "collective_wait_ns", "split": "split", "split_note": "split_note",
             "rank_skew_ns": "rank_skew_ns", "binding_rank": "binding_rank", "verdict": "tp_verdict"}


@dataclass
class Diagnosis:
    inv: Inventory
    gaps: pl.DataFrame         # one row per gap
    gap_totals: pl.DataFrame   # step × kind
    histogram: pl.DataFrame    # step × log2 bin × kind
    launch: pl.DataFrame       # one row per step
    launch_by_api: pl.DataFrame
    floors: pl.DataFrame       # one row per step
    graph_prediction: pl.DataFrame  # step, predicted_graph_step_time_ns (null for graph replays)
    collectives: Collectives | None = None  # transfer vs wait per collective and step (multi-rank)
    tp: pl.DataFrame | None = None  # per step of a multi-rank trace: the collectives.STEP_SCHEMA
                                    # figures, rank_skew_ns, binding_rank, tp_verdict (else empty)
    untraced: pl.DataFrame | None = None  # per step: untraced.SCHEMA (measured or estimated)
    engine: pl.DataFrame | None = None  # per vLLM step: anatomy.SCHEMA (empty for other traces)
    prologue: pl.DataFrame | None = None  # per step: whatif.prologue (the host work before the forward)
    _sections: pl.DataFrame | None = None

    def drop_event_frames(self) -> None:
        """Build the per-step sections, then empty the per-gap frame and the inventory's
        per-event frames (see Inventory.drop_event_frames)."""
        self.sections_text()
        self.gaps = self.gaps.clear()
        self.inv.drop_event_frames()

    def self_check(self) -> None:
        """What must hold on any trace: the inventory's checks (busy + idle = span, class times
        and counts = the kernels'), the gap kinds adding up to the idle time, busy within the
        span, the device floor within the busy time, a positive untraced estimate."""
        self.inv.self_check()
        s = self.inv.steps
        idle = self.gap_totals.group_by("step").agg(pl.col("time_ns").sum().alias("_g"))
        chk = s.select("step", "idle_ns", "gpu_busy_ns", "gpu_span_ns").join(idle, on="step", how="left").fill_null(0)
        assert (chk["_g"] == chk["idle_ns"]).all(), "gap kinds do not add up to idle_ns"
        assert ((chk["gpu_busy_ns"] >= 0) & (chk["gpu_busy_ns"] <= chk["gpu_span_ns"])).all()
        f = self.floors.join(s.select("step", "gpu_busy_ns"), on="step")
        assert (f["device_floor_ns"] <= f["gpu_busy_ns"]).all()
        if self.untraced is not None and self.untraced.height:
            assert (self.untraced["untraced_estimated_ns"] > 0).all()

    def step_sections(self, step: int) -> dict:
        """The JSON sections a step of `analyze --json` gains: gaps, launch, floors, and tp for
        the steps of a multi-rank trace (or of one with collectives)."""
        row = self.sections_text().filter(pl.col("step") == step).row(0, named=True)
        return {k: json.loads(row[k]) for k in SECTIONS if k in row and row[k] is not None}

    def top_gaps(self) -> pl.DataFrame:
        """The TOP_GAPS longest gaps of each step, longest first (ties: earliest first)."""
        g = self.gaps.select(pl.col("step").set_sorted(), "gap_start", "gap_ns", "kind", "prev_name", "next_name",
                             "next_api")
        # a per-step threshold first, so only a handful of rows sort
        return (g.filter(pl.col("gap_ns") >= pl.col("gap_ns").top_k(TOP_GAPS).min().over("step"))
                .sort("step", "gap_ns", "gap_start", descending=[False, True, False])
                .group_by("step", maintain_order=True).head(TOP_GAPS))

    def sections_text(self) -> pl.DataFrame:
        """(step, gaps, launch, floors): every step's sections as JSON text, built in polars."""
        if self._sections is None:
            self._sections = self._build_sections()
        return self._sections

    def _build_sections(self) -> pl.DataFrame:
        steps = self.floors.select("step")
        totals = self.gap_totals.sort("step", pl.col("kind").to_physical())
        kinds = jsontext.members(totals, "step", "kind", ["count", "time_ns"], "kinds", "", "")
        top = self.top_gaps()
        top = jsontext.arrays(top, "step", [c for c in top.columns if c != "step"], "top")
        hist = jsontext.arrays(self.histogram, "step", [c for c in self.histogram.columns if c != "step"], "hist")
        by_api = jsontext.arrays(self.launch_by_api, "step",
                                 [c for c in self.launch_by_api.columns if c != "step"], "by_api")
        launch = self.launch.select("step", jsontext.open_records(
            self.launch, [c for c in self.launch.columns if c != "step"]).alias("launch_head"))
        overhead = json.dumps({"count": self.inv.trace.profiler_overhead_count,
                               "time_ns": self.inv.trace.profiler_overhead_ns}, separators=(",", ":"))
        # margin is rounded as Python rounds (the figure the document has always carried)
        f = self.floors.with_columns(
            pl.Series("margin", [None if m is None else round(m, 3) for m in self.floors["margin"].to_list()],
                      dtype=pl.Float64)).join(self.graph_prediction, on="step", how="left")
        floors = f.select("step", jsontext.records(f, [
            "cpu_floor_ns", "device_floor_ns", "verdict", "t_launch_ns", "margin", "host_bound_gap_ns",
            "predicted_graph_step_time_ns"]).alias("floors"))
        empty = ",".join(f'"{k}":{{"count":0,"time_ns":0}}' for k in KINDS)
        t = (steps.join(kinds, on="step", how="left").join(top, on="step", how="left")
             .join(hist, on="step", how="left").join(launch, on="step", how="left")
             .join(by_api, on="step", how="left").join(floors, on="step", how="left"))
        lead = pl.col("launch_head").fill_null("{")
        tp = []
        if self.tp is not None and self.tp.height:
            x = self.tp.select("step", *[pl.col(c).alias(k) for k, c in TP_FIELDS.items()])
            t = t.join(x.select("step", jsontext.records(x, list(TP_FIELDS)).alias("tp")), on="step", how="left")
            tp = ["tp"]
        if self.untraced is not None and self.untraced.height:
            u = self.untraced.with_columns(pl.col("untraced_predicted_graph_step_time_ns").alias("_pg")).join(
                self.graph_prediction.select("step", pl.col("predicted_graph_step_time_ns").is_null().alias("_replay")),
                on="step", how="left").with_columns(
                pl.when(pl.col("_replay")).then(None).otherwise(pl.col("_pg"))
                .alias("untraced_predicted_graph_step_time_ns"))
            x = u.select("step", *[pl.col(c).alias(k) for k, c in UNTRACED_FIELDS.items()])
            t = t.join(x.select("step", jsontext.records(x, list(UNTRACED_FIELDS)).alias("untraced"),
                                pl.col("step_time_ns").alias("untraced_step_time_ns")), on="step", how="left")
            tp.append("untraced")
            tp.append("untraced_step_time_ns")
        if self.engine is not None and self.engine.height:
            e = self.engine
            t = t.join(e.select("step", jsontext.records(e, list(ENGINE_FIELDS)).alias("engine")), on="step",
                       how="left")
            tp.append("engine")
        return t.select(
            "step",
            pl.concat_str(pl.lit("{"), pl.col("kinds").fill_null(empty), pl.lit(',"top":'),
                          pl.col("top").fill_null("[]"), pl.lit(',"histogram":'), pl.col("hist").fill_null("[]"),
                          pl.lit("}")).alias("gaps"),
            pl.concat_str(lead, pl.when(lead == "{").then(pl.lit("")).otherwise(pl.lit(",")),
                          pl.lit('"by_api":'), pl.col("by_api").fill_null("[]"),
                          pl.lit(f',"profiler_overhead":{overhead}}}')).alias("launch"),
            "floors", *tp,
        ).sort("step")


def diagnose(inv: Inventory) -> Diagnosis:
    gaps = find_gaps(inv)
    hist = histogram(gaps)
    totals = gap_totals(gaps, inv.step_ids(), hist)
    launch, by_api = launch_summary(inv)
    coll = collectives(inv)
    f = floors(inv, launch, totals=totals, work=coll.work)
    tp = coll.steps.join(group_verdicts(coll, inv.steps, f), on="step", how="left")
    from stepscope.analysis.anatomy import anatomy
    from stepscope.analysis.untraced import untraced
    from stepscope.analysis.whatif import prologue

    pro = prologue(inv)
    return Diagnosis(
        inv=inv, gaps=gaps, gap_totals=totals, histogram=hist,
        launch=launch, launch_by_api=by_api, floors=f,
        graph_prediction=predict_graph_step(inv, work=f, pro=pro), collectives=coll, tp=tp,
        untraced=untraced(inv, launch, f, pro), engine=anatomy(inv), prologue=pro,
    )
