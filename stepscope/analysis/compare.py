"""`stepscope compare A B`: two traces (eager vs graph, before vs after), side by side.

Each trace is told by one real step, its representative (analysis/representative.py): the
median by step time of the most common kind of steps of its summary rank (on a multi-rank
trace the rank that binds most TP steps, collectives.summary_rank, with every rank's medians
listed beside it). Every figure of `a` and `b` is that step's: the step time, the floors, the
classes, the kernels. speedup = A's step time / B's. When A is eager, the graph-mode step time
is also predicted from A's step alone (whatif.py: a point and a range, with the calibration's
captures named) and, when B is a graph trace, checked against B's step and predicted again with
the constants measured on B itself (what the prediction would have been, calibrated on B).
"""

from __future__ import annotations

import polars as pl

from stepscope.analysis.collectives import summary_rank
from stepscope.analysis.diagnosis import Diagnosis
from stepscope.analysis.gaps import KINDS
from stepscope.analysis.representative import representative
from stepscope.analysis.run_compare import compare_runs
from stepscope.analysis.steps import step_shape
from stepscope.analysis.whatif import (Calibration, GraphConstants, describe_for, engine_of, is_graph_trace,
                                       predict_graph_step)
from stepscope.paths import shown
from stepscope.analysis.notes import DIFFERENT_LAYERS, DIFFERENT_MODELS, FEW_SHARED_LAUNCHES, GRAPH_LEVEL_SIDE, note

CONSTANT_NAMES = ("graph_launch_prep_ns", "graph_launch_lead_ns", "node_gap_ns", "memop_gap_ns")
FIGURES = ("step_time_ns", "n_kernels", "gpu_busy_ns", "idle_ns", "n_launch_calls")


def summarize(d: Diagnosis) -> dict:
    inv = d.inv
    every = inv.steps.join(d.verdicts.select("step", "cpu_floor_ns", "device_floor_ns", "verdict"), on="step")
    rank = summary_rank(d.collectives.ranks, d.tp)
    s = every.filter((pl.col("pid") == rank["pid"]) & (pl.col("device") == rank["device"]))
    rep = representative(inv, d)
    row = every.filter(pl.col("step") == rep["step"]).row(0, named=True)
    mine = pl.DataFrame({"step": [rep["step"]]}, schema={"step": pl.Int64})
    out = {k: row[k] for k in (*FIGURES, "cpu_floor_ns", "device_floor_ns")}
    out["step"] = rep["step"]
    out["chosen"] = rep["why"]
    out["steps"] = s.height
    out["path"] = shown(inv.trace.path)
    out["graph"] = is_graph_trace(inv)
    # CUDA graphs recorded whole (--cuda-graph-trace=graph): the kernels inside them are no rows
    out["graph_level"] = bool((inv.capture["kind"] == "graph_level").any())
    out["fastest_step_time_ns"] = int(s["step_time_ns"].min())
    idle = d.gap_totals.join(mine, on="step", how="semi")
    idle_by = dict(zip(idle["kind"].to_list(), idle["time_ns"].to_list()))
    out["idle_by_kind_ns"] = {k: int(idle_by.get(k, 0) or 0) for k in KINDS}
    out["verdict"] = row["verdict"]  # analysis/verdict.py, as analyze reports it for this step
    c = inv.classes.filter(pl.col("step") == rep["step"])
    out["classes"] = {r["class"]: {"count": r["count"], "time_ns": int(r["time_ns"])} for r in c.iter_rows(named=True)}
    shapes = [step_shape(x) for x in s["name"].to_list()]
    out["model"] = next((sh.get("model") for sh in shapes if sh.get("model")), None)
    out["layers"] = row["layers"]
    out["kernel_names"] = _names_per_step(inv, mine)
    out["step_ids"] = [rep["step"]]
    if d.untraced is not None and d.untraced.height:
        # the representative step's untraced figures (the sidecar's apply to every step of its shape)
        u = d.untraced.filter(pl.col("step") == rep["step"])
        out["untraced_step_time_ns"] = u["untraced_step_time_ns"][0] if u.height else None
        out["untraced_measured"] = bool(u.height and u["untraced_measured_ns"][0] is not None)
        out["untraced_source"] = u["untraced_source"][0] if u.height else None
        out["untraced_predicted_graph_step_time_ns"] = u["untraced_predicted_graph_step_time_ns"][0] if u.height else None
    if rank["ranks"] > 1:
        out["rank"] = rank
        out["ranks"] = _per_rank(d, every)
    return out


def _per_rank(d: Diagnosis, steps: pl.DataFrame) -> list[dict]:
    """Every rank's medians, so that the one summarized is seen beside the others."""
    t = steps.join(d.tp.select("step", "rank", "collective_wait_ns"), on="step")
    figs = ("step_time_ns", "gpu_busy_ns", "cpu_floor_ns", "device_floor_ns", "collective_wait_ns")
    per = t.group_by("rank", "pid", "device").agg(pl.len().alias("steps"), *[pl.col(k).median() for k in figs])
    return [{**{k: r[k] for k in ("rank", "pid", "device", "steps")},
             **{k: None if r[k] is None else int(round(r[k])) for k in figs}}
            for r in per.sort("rank").iter_rows(named=True)]


def _median_int(col: pl.Series):
    v = col.drop_nulls().median()
    return None if v is None else int(round(v))


def _names_per_step(inv, steps: pl.DataFrame) -> dict[str, float]:
    k = inv.kernels.join(steps, on="step", how="semi").group_by("name").agg(pl.col("count").sum())
    n = max(steps.height, 1)
    return dict(zip(k["name"].to_list(), [c / n for c in k["count"].to_list()]))


def _name_overlap(a: dict[str, float], b: dict[str, float]) -> float:
    """Weighted Jaccard similarity of two kernel-name → launches-per-step maps."""
    names = set(a) | set(b)
    inter = sum(min(a.get(n, 0), b.get(n, 0)) for n in names)
    union = sum(max(a.get(n, 0), b.get(n, 0)) for n in names)
    return inter / union if union else 1.0


def compare(a: Diagnosis, b: Diagnosis, consts: Calibration | GraphConstants | None = None) -> dict:
    """The compare document's figures (render/sentences.py adds its verdict sentence). `consts`:
    the what-if's calibration, or constants given on the command line; None: the one `a`'s
    diagnosis used."""
    sa, sb = summarize(a), summarize(b)
    warnings = []
    if sa["model"] and sb["model"] and sa["model"] != sb["model"]:
        warnings.append(note(DIFFERENT_MODELS, a=sa["model"], b=sb["model"]))
    elif sa["layers"] and sb["layers"] and sa["layers"] != sb["layers"]:
        warnings.append(note(DIFFERENT_LAYERS, a=sa["layers"], b=sb["layers"]))
    elif sa["graph_level"] != sb["graph_level"]:
        # the names one side does not show are inside its graphs, not removed: not a sign of
        # another model
        warnings.append(note(GRAPH_LEVEL_SIDE, side="A" if sa["graph_level"] else "B"))
    else:
        shared = _name_overlap(sa["kernel_names"], sb["kernel_names"])
        if shared < 0.3:
            warnings.append(note(FEW_SHARED_LAUNCHES, share=shared))
    speedup = sa["step_time_ns"] / sb["step_time_ns"] if sb["step_time_ns"] else None
    classes = sorted(set(sa["classes"]) | set(sb["classes"]))
    deltas = {
        c: {
            "a_time_ns": sa["classes"].get(c, {}).get("time_ns", 0),
            "b_time_ns": sb["classes"].get(c, {}).get("time_ns", 0),
            "delta_time_ns": sb["classes"].get(c, {}).get("time_ns", 0) - sa["classes"].get(c, {}).get("time_ns", 0),
            "a_count": sa["classes"].get(c, {}).get("count", 0),
            "b_count": sb["classes"].get(c, {}).get("count", 0),
        }
        for c in classes
    }
    na, nb = sa.pop("kernel_names"), sb.pop("kernel_names")
    ids_a = sa.pop("step_ids")
    sb.pop("step_ids")
    added = {k: v for k, v in nb.items() if k not in na}
    removed = {k: v for k, v in na.items() if k not in nb}
    doc = {
        # four decimals, or four significant digits where those would round it to 0 (a B
        # thousands of times slower): a speedup of 0.0 reads as no step time, and divides by zero
        "a": sa, "b": sb, "speedup": (round(speedup, 4) or float(f"{speedup:.4g}")) if speedup else None,
        "classes": deltas,
        "kernels_added": [{"name": k, "count_per_step": v} for k, v in sorted(added.items())],
        "kernels_removed": [{"name": k, "count_per_step": v} for k, v in sorted(removed.items())],
        "warnings": warnings,
    }
    frame = None
    if not sa["graph"]:
        frame = (a.graph_prediction if consts is None or consts is a.calibration
                 else predict_graph_step(a.inv, consts, work=a.floors, pro=a.prologue))
        mine = frame.filter(pl.col("step").is_in(ids_a))
        for k in ("time", "low", "high"):
            doc[f"predicted_graph_step_{k}_ns"] = _median_int(mine[f"predicted_graph_step_{k}_ns"])
        cal = a.calibration if consts is None else consts
        eng = engine_of(a.inv)
        if isinstance(cal, GraphConstants):
            doc["graph_constants"] = {"origin": "given on the command line", "engine": eng,
                                      **{k: cal.__dict__[k] for k in CONSTANT_NAMES}, "source": cal.source,
                                      "captures": []}
        else:
            doc["graph_constants"] = describe_for(a.inv, cal, a.prologue)
        if sb["graph"] and sb["step_time_ns"]:
            ref = sb["step_time_ns"]
            doc["prediction_reference_ns"] = ref  # B's quoted step the error is computed against
            doc["prediction_error"] = round((doc["predicted_graph_step_time_ns"] - ref) / ref, 4)
            doc["prediction_in_range"] = doc["predicted_graph_step_low_ns"] <= ref <= doc["predicted_graph_step_high_ns"]
            if b.replay is not None:
                # what A's prediction would have been with the constants measured on B itself
                own = predict_graph_step(a.inv, b.replay.constants(a.calibration.point(eng)),
                                         work=a.floors, pro=a.prologue)
                pb = _median_int(own.filter(pl.col("step").is_in(ids_a))["predicted_graph_step_time_ns"])
                doc["with_b_constants"] = {
                    "predicted_graph_step_time_ns": pb, "prediction_error": round((pb - ref) / ref, 4),
                    "capture": {k: v for k, v in b.replay.__dict__.items()}}
    if sa.get("untraced_measured") and sb.get("untraced_measured"):
        # both sides were timed outside nsys: the speedup and the what-if in the time users see
        ua, ub = sa["untraced_step_time_ns"], sb["untraced_step_time_ns"]
        u = {"a_step_time_ns": ua, "b_step_time_ns": ub,
             "speedup": round(ua / ub, 4) if ub else None}
        if not sa["graph"] and sa.get("untraced_predicted_graph_step_time_ns") is not None:
            u["predicted_graph_step_time_ns"] = sa["untraced_predicted_graph_step_time_ns"]
            if sb["graph"] and ub:
                u["prediction_reference_ns"] = ub
                u["prediction_error"] = round((u["predicted_graph_step_time_ns"] - ub) / ub, 4)
        doc["untraced"] = u
    runs = compare_runs(a, b, sa["graph"], sb["graph"], frame)
    if runs is not None:
        doc["runs"] = runs
    return doc
