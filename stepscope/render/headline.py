"""The verdict block: what every view of a step opens with — `analyze` on the terminal, the HTML
and Markdown reports, `budget` — as plain (label, sentence) rows, built here once and only laid
out by each renderer: the verdict, the what-if CUDA-graph time, the untraced figures, the vLLM
engine step's anatomy; for two traces, the speedup and the what-if's prediction error.

A row's text has no markup; a renderer escapes it for its format.
"""

from __future__ import annotations

from stepscope.render.sentences import pause_phrase, queued_idle_phrase, tp_sentence, untraced_source
from stepscope.render.units import MISSING, ms, node_gap, signed_percent, times, us  # noqa: F401


def host_clause(f: dict, s: dict) -> str:
    """What a host-bound step waits on: the share of the step the GPU idles for the host and
    the largest part of it (input preparation, launching, sampling and output, or a host pause,
    named with its length and place)."""
    wait = f.get("host_wait_ns") or 0
    if f.get("host_bound_on") == "a host pause" and pause_phrase(f):
        out = (f": {pause_phrase(f, s['step_time_ns'])} — the host stopped launching (a JIT compilation, "
               "a garbage collection, Python work between two launches): not launch overhead, and CUDA graphs "
               "do not remove it")
        if (f.get("cpu_floor_ns") or 0) > (f.get("device_floor_ns") or 0):
            out += (f"; besides it launch-bound (CPU floor {ms(f['cpu_floor_ns'])} > device floor "
                    f"{ms(f['device_floor_ns'])})")
        return out
    return (f"; the GPU waits on the host {100 * wait / max(s['step_time_ns'], 1):.0f}% of it"
            f" ({ms(wait)}), most of it in {f.get('host_bound_on')}")


def pause_note(f: dict, step_ns: int) -> str:
    """The host pauses of a step whose verdict is not theirs: a clause, or "" without one."""
    if f.get("host_bound_on") == "a host pause" and f.get("verdict") == "host-bound":
        return ""
    p = pause_phrase(f, step_ns)
    return f"; {p}" if p else ""


def verdict_line(v) -> str:
    """One sentence for the top of a step's report (a StepDiagnosis `v`, analysis/step_view.py): the
    bound, the fix, where GPU time goes; for a rank of a multi-rank trace, also which rank binds
    the TP step and why."""
    f, tp = v.floors, v.tp
    total = v.class_time_ns
    phase = v.phase or "this"
    u = v.untraced
    pred = f.get("predicted_graph_step_time_ns")
    if u and u.get("measured_ns"):
        # the time users see first, the traced one beside it (nsys inflates the host side)
        out = (f"{phase} step ≈ {ms(u['step_time_ns'])} untraced ({ms(v.step_time_ns)} under "
               f"{v.tracer}): {u['verdict']}")
        upred = u.get("predicted_graph_step_time_ns")
        if u["verdict"] == "launch-bound" and upred is not None and upred < u["step_time_ns"]:
            out += f"; CUDA graphs would cut it to about {ms(upred)}"
            if pred is not None:
                out += f" ({ms(pred)} under {v.tracer})"
        elif u["verdict"] == "device-bound":
            out += f"; the GPU is busy {min(100, 100 * v.gpu_busy_ns / max(u['step_time_ns'], 1)):.0f}% of it"
        elif f["verdict"] == "host-bound":
            out += host_clause(f, {"step_time_ns": v.step_time_ns})
        if u["verdict"] != f["verdict"]:
            out += f" (under {v.tracer}: {f['verdict']})"
        out += pause_note(f, v.step_time_ns)
    else:
        out = f"{phase} step is {f['verdict']} ({ms(v.step_time_ns)}"
        if u and u.get("estimated_ns"):
            out += f"; ≈ {ms(u['estimated_ns'])} untraced, estimated"
        out += ")"
        if f["verdict"] == "launch-bound" and pred is not None and pred < v.step_time_ns:
            out += f"; CUDA graphs would cut it to about {ms(pred)}"
            if f.get("host_pause_ns"):
                out += " (its host pauses kept: a graph does not remove them)"
        elif f["verdict"] == "device-bound":
            out += f"; the GPU is busy {100 * v.gpu_busy_ns / max(v.step_time_ns, 1):.0f}% of it"
            out += queued_idle_phrase((v.gaps.get("device_side") or {}).get("time_ns"), v.step_time_ns)
        elif f["verdict"] == "host-bound":
            out += host_clause(f, {"step_time_ns": v.step_time_ns})
        out += pause_note(f, v.step_time_ns)
    if v.top_class is not None:
        out += f"; {v.top_class} holds {100 * v.top_class_time_ns / total:.0f}% of GPU time"
        wait = (tp or {}).get("collective_wait_ns")
        if v.top_class == "comm" and wait:
            # most of a waiting rank's NCCL time is not device work: say so where the share is
            out += f" ({100 * wait / max(v.top_class_time_ns, 1):.0f}% of it waiting for the slowest rank)"
        elif v.top_class == "comm" and tp and not tp["split"]:
            out += " (how much of it is waiting for another rank cannot be told from this trace)"
    out += "."
    if tp and tp.get("verdict"):
        out += f" TP step (rank {tp['rank']} of {tp['ranks']}): {tp_sentence(tp['verdict'])}."
    return out


def whatif_sentence(v) -> str | None:
    """The what-if CUDA-graph time of an eager step, with its range and what it is made of (None
    when graphs would not shorten it)."""
    f = v.floors
    pred = f.get("predicted_graph_step_time_ns")
    if pred is None or pred >= v.step_time_ns:
        return None
    pro = v.prologue or {}
    w = v.whatif or {}
    host = (f"the host's {ms(pro['prologue_host_ns'])} of input preparation before the forward "
            f"({pro['prologue_launches']} launches, outside any graph) + " if pro.get("prologue_host_ns") else "")
    low, high = f.get("predicted_graph_step_low_ns"), f.get("predicted_graph_step_high_ns")
    rng = f", between {ms(low)} and {ms(high)}" if low is not None and high is not None else ""
    return (f"this step would take about {ms(pred)}{rng} instead of {ms(v.step_time_ns)} ({host}device work + "
            f"{node_gap(w.get('node_gap_ns', 0))} per graph node + "
            f"{ms(w.get('graph_launch_prep_ns', 0) + w.get('graph_launch_lead_ns', 0))} graph launch"
            + (f" + the GPU's {ms(f['host_pause_ns'])} idle in host pauses, which a graph does not remove"
               if f.get("host_pause_ns") else "") + ")")


def calibration_sentence(v) -> str | None:
    """Where the what-if's constants come from: the calibration's captures, named."""
    w = v.whatif or {}
    caps = w.get("captures") or []
    if not caps or v.floors.get("predicted_graph_step_time_ns") is None:
        return None
    named = "; ".join(f"{c['source']} ({c['gpu'] or 'GPU not named'}, {c['engine']}, {c['nodes']} nodes)"
                      for c in caps[:4]) + (f"; {len(caps) - 4} more" if len(caps) > 4 else "")
    return f"calibration ({w.get('origin')}, {w.get('source')}): {named}"


def untraced_sentence(v) -> tuple[str, str] | None:
    """(label, sentence) of the step's untraced figures (measured from the sidecar, or estimated)."""
    u = v.untraced
    if not u:
        return None
    how = u["source"].split(":")[0]
    pred = v.floors.get("predicted_graph_step_time_ns")
    line = (f"step {ms(u['step_time_ns'])} (under {v.tracer} {ms(v.step_time_ns)}); host per launch "
            f"{us(u['t_launch_ns'])}, CPU floor {ms(u['cpu_floor_ns'])}: {u['verdict']}")
    if u.get("predicted_graph_step_time_ns") is not None and pred is not None:
        line += f"; with CUDA graphs about {ms(u['predicted_graph_step_time_ns'])}"
    return f"untraced ({how})", line


def engine_sentence(v) -> str | None:
    """A vLLM step's anatomy (only a vLLM trace has one): forward, sampling, GPU tail, frontend."""
    e = v.engine
    if not e:
        return None
    parts = [f"forward {ms(e['forward_ns'])}", f"sampling {ms(e['sample_ns'])} (host, after the "
             "execute_context range)", f"GPU tail after the last launch {ms(e['gpu_tail_ns'])}"]
    if e.get("schedule_ns") is not None:
        parts.append(f"next iteration's scheduling {ms(e['schedule_ns'])} ({e['schedule_ranges']} ranges)")
    if e.get("get_output_ns") is not None:
        parts.append(f"frontend get_output {ms(e['get_output_ns'])}")
    if e.get("process_outputs_ns") is not None:
        parts.append(f"frontend process_outputs {ms(e['process_outputs_ns'])}")
    return " · ".join(parts)


def step_rows(v) -> list[tuple[str, str]]:
    """The verdict block of one step (a StepDiagnosis), as (label, sentence) rows."""
    rows = [("Verdict", verdict_line(v))]
    w = whatif_sentence(v)
    if w:
        rows.append(("what-if CUDA graph", w))
        c = calibration_sentence(v)
        if c:
            rows.append(("what-if CUDA graph, how", c))
    u = untraced_sentence(v)
    if u:
        rows.append(u)
        if u[0] == "untraced (estimated)":
            rows.append(("untraced, how", untraced_source(v.untraced["source"], v.sidecar)))
    e = engine_sentence(v)
    if e:
        rows.append(("vLLM engine step", e))
        if v.engine.get("note"):
            rows.append(("vLLM engine step, note", v.engine["note"]))
    return rows


def compare_rows(doc: dict) -> list[tuple[str, str]]:
    """The verdict block of two traces (a compare document): speedup, the what-if's prediction
    error, the compare verdict."""
    rows = [("speedup (A/B)", times(doc.get("speedup")))]
    if "prediction_error" in doc:
        rows.append(("what-if prediction error",
                     f"{signed_percent(doc['prediction_error'])} (A predicted with CUDA graphs at "
                     f"{ms(doc['predicted_graph_step_time_ns'])}, B measured {ms(doc['prediction_reference_ns'])})"))
    elif "predicted_graph_step_time_ns" in doc:
        rows.append(("what-if CUDA graph (A)", f"about {ms(doc['predicted_graph_step_time_ns'])}"))
    rows.append(("comparison", doc["verdict"]))
    return rows
