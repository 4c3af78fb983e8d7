"""Gaps, launch overhead and floors of every step, computed once and shared by all renderers."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from stepscope.analysis.floors import floors
from stepscope.analysis.gaps import KINDS, find_gaps, gap_totals, histogram
from stepscope.analysis.inventory import Inventory
from stepscope.analysis.launch import launch_summary
from stepscope.analysis.whatif import predict_graph_step

TOP_GAPS = 5


def by_step(frame: pl.DataFrame) -> dict[int, list[dict]]:
    """step → the step's rows as dicts (without `step`), in frame order; built by polars."""
    if frame.is_empty():
        return {}
    cols = [c for c in frame.columns if c != "step"]
    agg = frame.group_by("step", maintain_order=True).agg(pl.struct(cols).alias("_rows"))
    return dict(zip(agg["step"].to_list(), agg["_rows"].to_list()))


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
    _sections: dict | None = None

    def drop_event_frames(self) -> None:
        """Build the per-step sections, then empty the per-gap frame and the inventory's
        per-event frames (see Inventory.drop_event_frames)."""
        if self._sections is None:
            self._sections = self._build_sections()
        self.gaps = self.gaps.clear()
        self.inv.drop_event_frames()

    def step_sections(self, step: int) -> dict:
        """The JSON sections a step of `analyze --json` gains: gaps, launch, floors."""
        if self._sections is None:
            self._sections = self._build_sections()
        return self._sections[step]

    def _build_sections(self) -> dict[int, dict]:
        """Every step's sections in one pass over each frame (no per-step filtering)."""
        totals = by_step(self.gap_totals)
        g = self.gaps.select("step", "gap_start", "gap_ns", "kind", "prev_name", "next_name", "next_api")
        # the top gaps of each step: a per-step threshold first, so only a handful of rows sort
        top = by_step(
            g.filter(pl.col("gap_ns") >= pl.col("gap_ns").top_k(TOP_GAPS).min().over("step"))
            .sort("step", "gap_ns", "gap_start", descending=[False, True, False])
            .group_by("step", maintain_order=True).head(TOP_GAPS))
        hist = by_step(self.histogram)
        launch = {r.pop("step"): r for r in self.launch.iter_rows(named=True)}
        by_api = by_step(self.launch_by_api)
        overhead = {"count": self.inv.trace.profiler_overhead_count, "time_ns": self.inv.trace.profiler_overhead_ns}
        predicted = dict(self.graph_prediction.iter_rows())
        out = {}
        for f in self.floors.iter_rows(named=True):
            step = f["step"]
            kinds = {r["kind"]: {"count": r["count"], "time_ns": r["time_ns"]} for r in totals.get(step, [])}
            gaps = {k: kinds.get(k, {"count": 0, "time_ns": 0}) for k in KINDS}
            gaps["top"] = top.get(step, [])
            gaps["histogram"] = hist.get(step, [])
            lau = dict(launch.get(step, {}))
            lau["by_api"] = by_api.get(step, [])
            lau["profiler_overhead"] = overhead
            out[step] = {
                "gaps": gaps,
                "launch": lau,
                "floors": {
                    "cpu_floor_ns": f["cpu_floor_ns"], "device_floor_ns": f["device_floor_ns"],
                    "verdict": f["verdict"], "t_launch_ns": f["t_launch_ns"],
                    "margin": round(f["margin"], 3) if f["margin"] is not None else None,
                    "host_bound_gap_ns": f["host_bound_gap_ns"],
                    "predicted_graph_step_time_ns": predicted.get(step),
                },
            }
        return out


def diagnose(inv: Inventory) -> Diagnosis:
    gaps = find_gaps(inv)
    totals = gap_totals(gaps, inv.step_ids())
    launch, by_api = launch_summary(inv)
    return Diagnosis(
        inv=inv, gaps=gaps, gap_totals=totals, histogram=histogram(gaps),
        launch=launch, launch_by_api=by_api, floors=floors(inv, launch, totals=totals),
        graph_prediction=predict_graph_step(inv),
    )
