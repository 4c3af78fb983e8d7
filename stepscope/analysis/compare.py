"""`stepscope compare A B`: two traces (eager vs graph, before vs after), side by side.

A trace's figures are medians over its steps (its step time is the median `step_time_ns`).
speedup = A's step time / B's step time. When A is eager, the graph-mode step time is also
predicted from A alone (whatif.py); when B is a graph trace the prediction is checked against
B's fastest step, the steady-state replay.
"""

from __future__ import annotations

import polars as pl

from stepscope.analysis.diagnosis import Diagnosis
from stepscope.analysis.gaps import KINDS
from stepscope.analysis.steps import step_shape
from stepscope.analysis.whatif import DEFAULT, GraphConstants, is_graph_trace, predict_graph_step
from stepscope.paths import shown

FIGURES = ("step_time_ns", "n_kernels", "gpu_busy_ns", "idle_ns", "n_launch_calls")


def summarize(d: Diagnosis) -> dict:
    inv = d.inv
    s = inv.steps.join(d.floors.select("step", "cpu_floor_ns", "device_floor_ns"), on="step")
    out = {k: _median_int(s[k]) for k in (*FIGURES, "cpu_floor_ns", "device_floor_ns")}
    out["steps"] = s.height
    out["path"] = shown(inv.trace.path)
    out["graph"] = is_graph_trace(inv)
    out["fastest_step_time_ns"] = int(s["step_time_ns"].min())
    idle = d.gap_totals.group_by("kind").agg(pl.col("time_ns").median())
    idle_by = dict(zip(idle["kind"].to_list(), idle["time_ns"].to_list()))
    out["idle_by_kind_ns"] = {k: int(idle_by.get(k, 0) or 0) for k in KINDS}
    out["verdict"] = "launch-bound" if out["cpu_floor_ns"] > out["device_floor_ns"] else "device-bound"
    c = inv.classes.group_by("class").agg(pl.col("time_ns").sum(), pl.col("count").sum())
    n = max(s.height, 1)
    out["classes"] = {r["class"]: {"count": r["count"] / n, "time_ns": int(r["time_ns"] / n)}
                      for r in c.iter_rows(named=True)}
    shapes = [step_shape(x) for x in s["name"].to_list()]
    out["model"] = next((sh.get("model") for sh in shapes if sh.get("model")), None)
    out["layers"] = _median_int(s["layers"]) if s["layers"].drop_nulls().len() else None
    out["kernel_names"] = _names_per_step(inv)
    return out


def _median_int(col: pl.Series):
    v = col.drop_nulls().median()
    return None if v is None else int(round(v))


def _names_per_step(inv) -> dict[str, float]:
    k = inv.kernels.group_by("name").agg(pl.col("count").sum())
    n = max(inv.steps.height, 1)
    return dict(zip(k["name"].to_list(), [c / n for c in k["count"].to_list()]))


def _name_overlap(a: dict[str, float], b: dict[str, float]) -> float:
    """Weighted Jaccard similarity of two kernel-name → launches-per-step maps."""
    names = set(a) | set(b)
    inter = sum(min(a.get(n, 0), b.get(n, 0)) for n in names)
    union = sum(max(a.get(n, 0), b.get(n, 0)) for n in names)
    return inter / union if union else 1.0


def compare(a: Diagnosis, b: Diagnosis, consts: GraphConstants = DEFAULT) -> dict:
    sa, sb = summarize(a), summarize(b)
    warnings = []
    if sa["model"] and sb["model"] and sa["model"] != sb["model"]:
        warnings.append(f"the traces are of different models ({sa['model']} vs {sb['model']}): "
                        "differences are not a before/after of one change")
    elif sa["layers"] and sb["layers"] and sa["layers"] != sb["layers"]:
        warnings.append(f"the traces have different layer counts ({sa['layers']} vs {sb['layers']}): "
                        "they may be of different models")
    else:
        shared = _name_overlap(sa["kernel_names"], sb["kernel_names"])
        if shared < 0.3:
            warnings.append(f"the traces share only {100 * shared:.0f}% of their kernel launches by name: "
                            "they may be of different models or workloads")
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
    if not sa["graph"]:
        pred = predict_graph_step(a.inv, consts)["predicted_graph_step_time_ns"].median()
        doc["predicted_graph_step_time_ns"] = int(round(pred))
        doc["graph_constants"] = {"node_gap_ns": consts.node_gap_ns,
                                  "graph_launch_lead_ns": consts.graph_launch_lead_ns, "source": consts.source}
        ref = sb["fastest_step_time_ns"]
        if sb["graph"] and ref:
            doc["prediction_error"] = round((doc["predicted_graph_step_time_ns"] - ref) / ref, 4)
    doc["verdict"] = verdict_sentence(doc)
    return doc


def verdict_sentence(doc: dict) -> str:
    a, b, sp = doc["a"], doc["b"], doc["speedup"]
    ms = lambda ns: f"{ns / 1e6:.2f} ms"  # noqa: E731
    if sp is None:
        return "B has no measurable step time."
    change = f"{sp:.2f}× faster" if sp >= 1 else f"{1 / sp:.2f}× slower"
    s = (f"B's step is {change} than A's ({ms(a['step_time_ns'])} → {ms(b['step_time_ns'])}); "
         f"A is {a['verdict']}, B is {b['verdict']}. ")
    host_a, host_b = a["idle_by_kind_ns"]["host_bound"], b["idle_by_kind_ns"]["host_bound"]
    if host_a - host_b > 0.1 * a["step_time_ns"]:
        s += f"Host-bound GPU idle fell from {ms(host_a)} to {ms(host_b)}: the launches stopped binding. "
    if a["n_kernels"] != b["n_kernels"]:
        s += f"Kernels per step: {a['n_kernels']} → {b['n_kernels']}. "
    if "predicted_graph_step_time_ns" in doc:
        s += f"With CUDA graphs A would take about {ms(doc['predicted_graph_step_time_ns'])}"
        s += (f" (prediction off by {100 * doc['prediction_error']:+.1f}% against B)."
              if "prediction_error" in doc else ".")
    return s.strip()
