"""Frozen views of plain values that the renderers read: one step's diagnosis and its kind's
figures, taken from the Inventory and Diagnosis frames (never from the JSON text), under the
names the JSON document gives them. Built here, below the renderers, so that a renderer only
formats what a view holds (pipeline.result_of builds them once per kind of step); the words
(a TP step's verdict, where the untraced figures come from) are render/sentences.py's, from the
raw fields kept here.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from stepscope.analysis.classify import CLASSES
from stepscope.analysis.gaps import KINDS

FLOOR_FIELDS = ("cpu_floor_ns", "device_floor_ns", "verdict", "t_launch_ns", "margin", "host_bound_gap_ns",
                "host_wait_ns", "host_bound_on", "predicted_graph_step_time_ns", "predicted_graph_step_low_ns",
                "predicted_graph_step_high_ns", "predicted_graph_queued", "launch_host_ns", "launches_ahead", "host_pause_ns",
                "host_pauses", "host_pause_total_ns", "longest_pause_ns", "longest_pause_after_launch",
                "longest_pause_next_call", "longest_pause_next_kernel")
ENGINE_FIELDS = ("forward_ns", "sample_ns", "gpu_tail_ns", "schedule_ns", "schedule_ranges", "get_output_ns",
                 "process_outputs_ns", "engine_ranges", "note")
# the untraced section of a step (its JSON field: the verdict frame's column); its step_time_ns
# is also the step's top-level untraced_step_time_ns, beside the traced step_time_ns
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
# what a TP step's verdict is made of (collectives.group_verdicts), worded by sentences.tp_sentence
TP_VERDICT_FIELDS = ("binding_rank", "bound", "binding_cpu_floor_ns", "binding_device_floor_ns", "waits")


def has_untraced(d) -> bool:
    return d.untraced is not None and d.untraced.height > 0


def tracer_name(fmt: str) -> str:
    """What wrote a trace of format `fmt`, as sentences name it: "under nsys", "without
    torch.profiler" (an engine's word only for that engine's traces): the reader registry's."""
    from stepscope.ingest.readers import tracer_of

    return tracer_of(fmt)


@dataclass(frozen=True)
class HeadFigures:
    """The trace's head line: its kernels and steps."""

    n_kernels: int
    n_steps: int


def head_figures(inv) -> HeadFigures:
    return HeadFigures(inv.kernel_total(), len(inv.step_ids()))


@dataclass(frozen=True)
class KindFigures:
    """The class breakdown of a kind's representative step: its classes (longest first, ties in
    CLASSES order), their total GPU time (1 when none), its kernel rows with what classed them
    by evidence, its framework rows, and its unclassified kernels."""

    step: int
    classes: tuple          # {"class", "count", "time_ns"}, longest first
    class_time_ns: int      # Σ time_ns of `classes`, or 1
    kernels: tuple          # the step's kernel rows with `class_by` (the inventory's kernels frame)
    framework: tuple        # inv.framework's rows of the step: {"family", "count", "time_ns"}
    framework_ops: tuple    # inv.framework_ops's rows of the step: {"op", "family", "count", "time_ns"}
    other: tuple            # the step's kernels of class "other", in the kernel frame's order
    other_time_ns: int


def _plain(frame: pl.DataFrame) -> tuple:
    """Rows as dicts, Enum and Categorical values as their strings."""
    cats = [c for c, t in frame.schema.items() if isinstance(t, (pl.Categorical, pl.Enum))]
    return tuple(frame.with_columns(pl.col(cats).cast(pl.String)).to_dicts() if cats else frame.to_dicts())


def kind_figures(inv, step: int) -> KindFigures:
    """The KindFigures of step `step` of Inventory `inv`."""
    c = inv.classes.filter(pl.col("step") == step)
    order = {k: i for i, k in enumerate(CLASSES)}
    rows = sorted(_plain(c), key=lambda r: (-r["time_ns"], order.get(r["class"], 99)))
    k = inv.kernels.filter(pl.col("step") == step)
    other = k.filter(pl.col("class") == "other")
    return KindFigures(
        step=step, classes=tuple(rows), class_time_ns=c["time_ns"].sum() or 1,
        kernels=_plain(k),
        framework=tuple(inv.framework.filter(pl.col("step") == step).to_dicts()),
        framework_ops=tuple(inv.framework_ops.filter(pl.col("step") == step).to_dicts()),
        other=_plain(other), other_time_ns=other["time_ns"].sum())


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
    tp: dict | None = None  # TP_FIELDS, for a step of a multi-rank trace; its "verdict": the
                            # TP_VERDICT_FIELDS of the step's row (None without a binding rank)
    untraced: dict | None = None  # UNTRACED_FIELDS; its "source": "measured" or "estimated"
    engine: dict | None = None    # ENGINE_FIELDS, for a vLLM step
    prologue: dict | None = None  # whatif.prologue's row: the host work before the forward
    whatif: dict | None = None    # the what-if's calibration (whatif.Calibration.describe) for this trace
    top_class: str | None = None  # the class holding most of the step's GPU time, and that time
    top_class_time_ns: int = 0
    class_time_ns: int = 0        # the step's GPU time over every class
    tracer: str = "nsys"          # what traced the step, as the sentences name it ("under nsys")
    n_launch_calls: int = 0       # the step's launch calls (what its CPU floor is made of)
    sidecar: dict | None = None   # the trace's untraced sidecar (its engine names a measured source)


def _row(frame: pl.DataFrame | None, step: int) -> dict | None:
    if frame is None or not frame.height:
        return None
    r = frame.filter(pl.col("step") == step)
    return r.row(0, named=True) if r.height else None


def _tp(row: dict | None) -> dict | None:
    if row is None:
        return None
    out = {k: row[c] for k, c in TP_FIELDS.items() if k != "verdict"}
    out["verdict"] = None if row.get("binding_rank") is None else {k: row[k] for k in TP_VERDICT_FIELDS}
    return out


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
        tp=_tp(_row(d.tp, step)),
        untraced=({k: v[c] for k, c in UNTRACED_FIELDS.items()} if has_untraced(d) and _row(d.untraced, step) else None),
        engine=(lambda e: None if e is None else {k: e[k] for k in ENGINE_FIELDS})(_row(d.engine, step)),
        prologue=_row(d.prologue, step),
        whatif=whatif,
        top_class=top["class"] if top else None, top_class_time_ns=top["time_ns"] if top else 0,
        class_time_ns=c["time_ns"].sum() or 1,
        tracer=tracer_name(trace.format), n_launch_calls=fig["n_launch_calls"] or 0,
        sidecar=trace.sidecar,
    )
