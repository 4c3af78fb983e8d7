"""compare of two serving runs (issue 33, item 7; DEFINITIONS.md, "Serving runs: selection and
run compare").

Two traces are runs when each has at least run.MIN_STEPS steps on its summary rank and every one
of them has a vLLM composition (prompt/decode requests and tokens from the step's range name).
Their steps are matched by composition, never by position alone:
- `step by step` when the workloads are the same: the two sequences of compositions are equal,
  and the i-th step of A is matched with the i-th of B;
- else `by composition`: the k-th step of A of a composition with the k-th step of B of the
  same composition (in step order); steps whose composition has no partner left are unmatched
  and counted, never quoted.
Per kind (the matched pair's phase × batch bucket; graph mode is what the runs differ in) and
over the run: speedup = Σ A step time / Σ B step time over the matched pairs; when A is eager,
the what-if = Σ of diagnosis' graph prediction of A's matched steps, against Σ B when B is a
graph run (prediction_error = (what-if − Σ B) / Σ B).
"""

from __future__ import annotations

import polars as pl

from stepscope.analysis.composition import COMPOSITION, bucket_expr
from stepscope.analysis.run import MIN_STEPS, _summary_steps


def run_steps(d) -> pl.DataFrame | None:
    """The summary rank's steps with their composition, or None when the trace is not a run."""
    s = _summary_steps(d)
    if s.height < MIN_STEPS or any(c not in s.columns for c in COMPOSITION):
        return None
    if s.select(pl.any_horizontal(pl.col(c).is_null() for c in COMPOSITION).any()).item():
        return None
    return s.select("step", "step_time_ns", "phase", *COMPOSITION, "requests").sort("step")


def _ordinal(s: pl.DataFrame) -> pl.DataFrame:
    return s.with_columns(nth=pl.int_range(pl.len()).over(list(COMPOSITION)))


def matched_pairs(sa: pl.DataFrame, sb: pl.DataFrame) -> tuple[pl.DataFrame, str]:
    """(pairs: step_a, step_b, the composition, phase, step_time_a_ns, step_time_b_ns; how)."""
    comp = list(COMPOSITION)
    same = sa.height == sb.height and sa.select(comp).equals(sb.select(comp))
    if same:
        pairs = pl.concat([sa.rename({"step": "step_a", "step_time_ns": "step_time_a_ns"}),
                           sb.select(pl.col("step").alias("step_b"), pl.col("step_time_ns").alias("step_time_b_ns"))],
                          how="horizontal")
        return pairs, "step by step"
    a = _ordinal(sa).rename({"step": "step_a", "step_time_ns": "step_time_a_ns"})
    b = _ordinal(sb).select(pl.col("step").alias("step_b"), pl.col("step_time_ns").alias("step_time_b_ns"),
                            *comp, "nth")
    return a.join(b, on=[*comp, "nth"], how="inner").drop("nth").sort("step_a"), "by composition"


def _sums(g: pl.DataFrame, predicted: bool, b_graph: bool) -> dict:
    ta, tb = int(g["step_time_a_ns"].sum()), int(g["step_time_b_ns"].sum())
    out = {"pairs": g.height, "a_time_ns": ta, "b_time_ns": tb,
           "speedup": round(ta / tb, 4) if tb else None}
    if predicted:
        w = g["predicted_graph_step_time_ns"]
        if w.null_count() == 0:
            out["predicted_graph_time_ns"] = int(w.sum())
            if b_graph and tb:
                out["prediction_error"] = round((out["predicted_graph_time_ns"] - tb) / tb, 4)
    return out


def compare_runs(a, b, a_graph: bool, b_graph: bool, prediction: pl.DataFrame | None) -> dict | None:
    """The `runs` section of compare: matched pairs per kind and over the run (None unless both
    traces are runs). `prediction`: A's per-step graph prediction (step,
    predicted_graph_step_time_ns) from the diagnosis, when A is eager."""
    sa, sb = run_steps(a), run_steps(b)
    if sa is None or sb is None:
        return None
    pairs, how = matched_pairs(sa, sb)
    predicted = prediction is not None and not a_graph
    if predicted:
        pairs = pairs.join(prediction.select(pl.col("step").alias("step_a"), "predicted_graph_step_time_ns"),
                           on="step_a", how="left")
    pairs = pairs.with_columns(kind=pl.concat_str([pl.col("phase").fill_null("phase?"), bucket_expr()],
                                                  separator=" · ") + pl.when(pl.col("requests") == 1)
                               .then(pl.lit(" req")).otherwise(pl.lit(" reqs")))
    kinds = []
    for (kind,), g in pairs.group_by("kind", maintain_order=True):
        kinds.append({"kind": kind, "phase": g["phase"][0], **_sums(g, predicted, b_graph)})
    kinds.sort(key=lambda k: (-k["a_time_ns"], k["kind"]))
    return {
        "matched": how, "a_steps": sa.height, "b_steps": sb.height, "pairs": pairs.height,
        "unmatched_a": sa.height - pairs.height, "unmatched_b": sb.height - pairs.height,
        "run": _sums(pairs, predicted, b_graph), "kinds": kinds,
        "pairs_list": pairs.select("step_a", "step_b", *COMPOSITION, "step_time_a_ns", "step_time_b_ns").to_dicts(),
    }
