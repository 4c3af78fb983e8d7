"""Sentences that are part of a document: the verdict of `compare`, and of a TP step (`tp_verdict`
of analyze --json's tp section, the tp command's tp_steps, the reports)."""

from __future__ import annotations

from stepscope.render.units import ms2


def compare_sentence(doc: dict) -> str:
    """The verdict of a compare document, in one paragraph (its "verdict")."""
    a, b, sp = doc["a"], doc["b"], doc["speedup"]
    if sp is None:
        return "B has no measurable step time."
    change = f"{sp:.2f}× faster" if sp >= 1 else f"{1 / sp:.2f}× slower"
    s = (f"B's step is {change} than A's ({ms2(a['step_time_ns'])} → {ms2(b['step_time_ns'])}); "
         f"A is {a['verdict']}, B is {b['verdict']}. ")
    host_a, host_b = a["idle_by_kind_ns"]["host_bound"], b["idle_by_kind_ns"]["host_bound"]
    if host_a - host_b > 0.1 * a["step_time_ns"]:
        s += f"Host-bound GPU idle fell from {ms2(host_a)} to {ms2(host_b)}: the launches stopped binding. "
    if a["n_kernels"] != b["n_kernels"]:
        s += f"Kernels per step: {a['n_kernels']} → {b['n_kernels']}. "
    if "predicted_graph_step_time_ns" in doc:
        s += f"With CUDA graphs A would take about {ms2(doc['predicted_graph_step_time_ns'])}"
        s += (f" (prediction off by {100 * doc['prediction_error']:+.1f}% against B's "
              f"{ms2(doc['prediction_reference_ns'])})." if "prediction_error" in doc else ".")
    u = doc.get("untraced")
    if u and u.get("speedup"):
        s += (f" Untraced (both timed outside nsys's capture): {ms2(u['a_step_time_ns'])} → "
              f"{ms2(u['b_step_time_ns'])}, {u['speedup']:.2f}×")
        if "prediction_error" in u:
            s += (f"; predicted {ms2(u['predicted_graph_step_time_ns'])}, off by "
                  f"{100 * u['prediction_error']:+.1f}% against B's {ms2(u['prediction_reference_ns'])}")
        s += "."
    chosen = [f"{tag}'s rank {x['rank']['rank']} of {x['rank']['ranks']} (pid {x['rank']['pid']}, GPU "
              f"{x['rank']['device']}: {x['rank']['why']})" for tag, x in (("A", a), ("B", b)) if "rank" in x]
    if chosen:
        s += " Figures are per rank: " + "; ".join(chosen) + "."
    if a.get("steps", 1) > 1 or b.get("steps", 1) > 1:
        s += f" Quoted: A's step {a['step']}, B's step {b['step']} (each the median by step time of its kind)."
    return s.strip()


def tp_sentence(row: dict) -> str | None:
    """The verdict of a TP step, from its row of the Diagnosis' tp frame (collectives.group_verdicts:
    binding_rank, bound, binding_cpu_floor_ns, binding_device_floor_ns, waits), e.g.
    "launch-bound: rank 1's host (CPU floor 28.82 ms vs device floor 4.07 ms); rank 0 waits
    13.80 ms in all-reduce". None without a binding rank."""
    binding = row.get("binding_rank")
    if binding is None:
        return None
    cpu, dev = ms2(row["binding_cpu_floor_ns"]), ms2(row["binding_device_floor_ns"])
    if row["bound"] == "launch-bound":
        out = f"launch-bound: rank {binding}'s host (CPU floor {cpu} vs device floor {dev})"
    else:
        out = f"device-bound: rank {binding}'s GPU (device floor {dev} vs CPU floor {cpu})"
    waits = [f"rank {w['rank']} waits {ms2(w['collective_wait_ns'] or 0)} in {w['wait_op'] or 'collectives'}"
             for w in row.get("waits") or ()]
    return out + ("; " + ", ".join(waits) if waits else "")


def with_tp_verdict(tp):
    """The tp frame with its `tp_verdict` column (tp_sentence of each step's row): one sentence per
    TP step, each step of the group carrying it."""
    import polars as pl

    fields = ["group", "binding_rank", "bound", "binding_cpu_floor_ns", "binding_device_floor_ns", "waits"]
    groups = tp.filter(pl.col("binding_rank").is_not_null()).unique("group", keep="first").select(fields)
    rows = groups.to_dicts()
    text = pl.DataFrame({"group": [r["group"] for r in rows], "tp_verdict": [tp_sentence(r) for r in rows]},
                        schema={"group": pl.Int64, "tp_verdict": pl.String})
    return tp.join(text, on="group", how="left", maintain_order="left")
