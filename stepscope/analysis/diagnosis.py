"""Gaps, launch overhead and floors of every step, computed once and shared by all renderers."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from stepscope.analysis.floors import floors
from stepscope.analysis.gaps import KINDS, find_gaps, gap_totals, histogram
from stepscope.analysis.inventory import Inventory
from stepscope.analysis.launch import launch_summary

TOP_GAPS = 5


@dataclass
class Diagnosis:
    inv: Inventory
    gaps: pl.DataFrame         # one row per gap
    gap_totals: pl.DataFrame   # step × kind
    histogram: pl.DataFrame    # step × log2 bin × kind
    launch: pl.DataFrame       # one row per step
    launch_by_api: pl.DataFrame
    floors: pl.DataFrame       # one row per step

    def step_sections(self, step: int) -> dict:
        """The JSON sections a step of `analyze --json` gains: gaps, launch, floors."""
        t = self.gap_totals.filter(pl.col("step") == step)
        gaps = {r["kind"]: {"count": r["count"], "time_ns": r["time_ns"]} for r in t.iter_rows(named=True)}
        gaps = {k: gaps.get(k, {"count": 0, "time_ns": 0}) for k in KINDS}
        top = (self.gaps.filter(pl.col("step") == step).sort("gap_ns", descending=True).head(TOP_GAPS)
               .select("gap_start", "gap_ns", "kind", "prev_name", "next_name", "next_api"))
        gaps["top"] = top.to_dicts()
        gaps["histogram"] = (self.histogram.filter(pl.col("step") == step).drop("step").to_dicts())
        launch = self.launch.filter(pl.col("step") == step).drop("step").to_dicts()
        launch = launch[0] if launch else {}
        launch["by_api"] = self.launch_by_api.filter(pl.col("step") == step).drop("step").to_dicts()
        launch["profiler_overhead"] = {
            "count": self.inv.trace.profiler_overhead_count, "time_ns": self.inv.trace.profiler_overhead_ns}
        f = self.floors.filter(pl.col("step") == step).row(0, named=True)
        return {
            "gaps": gaps,
            "launch": launch,
            "floors": {
                "cpu_floor_ns": f["cpu_floor_ns"], "device_floor_ns": f["device_floor_ns"],
                "verdict": f["verdict"], "t_launch_ns": f["t_launch_ns"],
                "margin": round(f["margin"], 3) if f["margin"] is not None else None,
                "host_bound_gap_ns": f["host_bound_gap_ns"],
            },
        }


def diagnose(inv: Inventory) -> Diagnosis:
    gaps = find_gaps(inv)
    launch, by_api = launch_summary(inv)
    return Diagnosis(
        inv=inv, gaps=gaps, gap_totals=gap_totals(gaps, inv.step_ids()), histogram=histogram(gaps),
        launch=launch, launch_by_api=by_api, floors=floors(inv, launch, gaps),
    )
