"""Frozen views of plain values that the renderers read: one step's diagnosis, taken from the
Diagnosis frames (never from the JSON text), under the names the JSON document gives them.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from stepscope.analysis.gaps import KINDS
from stepscope.render.sentences import tp_sentence, untraced_source
from stepscope.render.sections import ENGINE_FIELDS, FLOOR_FIELDS, TP_FIELDS, UNTRACED_FIELDS, has_untraced


def tracer_name(fmt: str) -> str:
    """What wrote a trace of format `fmt`, as sentences name it: "under nsys", "without
    torch.profiler" (an engine's word only for that engine's traces): the reader registry's."""
    from stepscope.ingest.readers import tracer_of

    return tracer_of(fmt)


@dataclass(frozen=True)
class StepDiagnosis:
    """One step's gaps, launch overhead, verdict, and its tp, untraced and engine figures."""

    step: int
    phase: str | None
    step_time_ns: int
    gpu_busy_ns: int
    gaps: dict              # kind -> {"count", "time_ns"}
    top_gaps: tuple         # the longest gaps: {"gap_start", "gap_ns", "kind", "prev_name", "next_name", "next_api"}
    histogram: tuple        # {"bin_lo_ns", "bin_hi_ns", "kind", "count", "time_ns"}
    launch: dict            # the launch figures (interval, call, latency, queue medians and p90s)
    profiler_overhead: dict  # {"count", "time_ns"}
    floors: dict            # FLOOR_FIELDS of the verdict frame
    tp: dict | None = None  # TP_FIELDS, for a step of a multi-rank trace
    untraced: dict | None = None  # UNTRACED_FIELDS
    engine: dict | None = None    # ENGINE_FIELDS, for a vLLM step
    prologue: dict | None = None  # whatif.prologue's row: the host work before the forward
    whatif: dict | None = None    # the what-if's calibration (whatif.Calibration.describe) for this trace
    top_class: str | None = None  # the class holding most of the step's GPU time, and that time
    top_class_time_ns: int = 0
    class_time_ns: int = 0        # the step's GPU time over every class
    tracer: str = "nsys"          # what traced the step, as the sentences name it ("under nsys")
    n_launch_calls: int = 0       # the step's launch calls (what its CPU floor is made of)


def _row(frame: pl.DataFrame | None, step: int) -> dict | None:
    if frame is None or not frame.height:
        return None
    r = frame.filter(pl.col("step") == step)
    return r.row(0, named=True) if r.height else None


def _plain(frame: pl.DataFrame) -> tuple:
    """Rows as dicts, Enum and Categorical values as their strings."""
    cats = [c for c, t in frame.schema.items() if isinstance(t, (pl.Categorical, pl.Enum))]
    return tuple(frame.with_columns(pl.col(cats).cast(pl.String)).to_dicts() if cats else frame.to_dicts())


def step_diagnosis(d, step: int, *, whatif: dict | None) -> StepDiagnosis:
    """The view of step `step` of Diagnosis `d`; `whatif`: the what-if calibration's
    description (pipeline.whatif_of(d): computed by the caller, never here)."""
    fig = _row(d.inv.steps, step)
    v = _row(d.verdicts, step)
    totals = {r["kind"]: r for r in _plain(d.gap_totals.filter(pl.col("step") == step))}
    gaps = {k: {"count": (totals.get(k) or {}).get("count", 0), "time_ns": (totals.get(k) or {}).get("time_ns", 0)}
            for k in KINDS}
    launch = {k: val for k, val in (_row(d.launch, step) or {}).items() if k != "step"}
    trace = d.inv.trace
    tp = _row(d.tp, step)
    c = d.inv.classes.filter(pl.col("step") == step).sort("time_ns", descending=True)
    top = c.row(0, named=True) if c.height else None
    return StepDiagnosis(
        step=step, phase=fig["phase"], step_time_ns=fig["step_time_ns"], gpu_busy_ns=fig["gpu_busy_ns"],
        gaps=gaps,
        top_gaps=_plain(d.top_gaps().filter(pl.col("step") == step).drop("step")),
        histogram=_plain(d.histogram.filter(pl.col("step") == step).drop("step")),
        launch=launch,
        profiler_overhead={"count": trace.profiler_overhead_count, "time_ns": trace.profiler_overhead_ns},
        floors={k: v[k] for k in FLOOR_FIELDS},
        tp=None if tp is None else {k: tp_sentence(tp) if c == "tp_verdict" else tp[c] for k, c in TP_FIELDS.items()},
        untraced=({k: untraced_source(v[c], trace.sidecar) if c == "untraced_source" else v[c]
                   for k, c in UNTRACED_FIELDS.items()} if has_untraced(d) and _row(d.untraced, step) else None),
        engine=(lambda e: None if e is None else {k: e[k] for k in ENGINE_FIELDS})(_row(d.engine, step)),
        prologue=_row(d.prologue, step),
        whatif=whatif,
        top_class=top["class"] if top else None, top_class_time_ns=top["time_ns"] if top else 0,
        class_time_ns=c["time_ns"].sum() or 1,
        tracer=tracer_name(trace.format), n_launch_calls=fig["n_launch_calls"] or 0,
    )
