"""Sentences that are part of a document: the verdict of `compare`, and of a TP step (`tp_verdict`
of analyze --json's tp section, the tp command's tp_steps, the reports); the notes of a TP
projection (the tp document's notes) and where a step's untraced time came from (the untraced
section's source). The analyses give the fields, these functions the words."""

from __future__ import annotations

from stepscope.render.units import ms, node_gap, plural, signed_percent, times, us


def runs_sentence(r: dict) -> str:
    """The verdict of two runs compared by matched steps (analysis/run_compare.py)."""
    run = r["run"]
    if not run["pairs"] or not run["speedup"]:
        return (f"No step of A ({r['a_steps']} steps) has a step of B ({r['b_steps']}) of the same composition: "
                "the runs are of different workloads and no step is compared.")
    sp = run["speedup"]
    change = f"{times(sp)} faster" if sp >= 1 else f"{times(1 / sp)} slower"
    left = (f"; {r['unmatched_a']} of A's and {r['unmatched_b']} of B's steps have no partner and are left out"
            if r["unmatched_a"] or r["unmatched_b"] else "")
    s = (f"Over the {run['pairs']} steps matched {r['matched']} (same prompt/decode requests and tokens{left}), "
         f"B's run is {change} than A's (Σ step time {ms(run['a_time_ns'])} → {ms(run['b_time_ns'])}).")
    if "predicted_graph_time_ns" in run:
        s += f" With CUDA graphs A's matched steps would take about {ms(run['predicted_graph_time_ns'])}"
        s += (f" (off by {signed_percent(run['prediction_error'])} against B's)." if "prediction_error" in run else ".")
    per = [f"{k['kind']} {times(k['speedup'])} ({k['pairs']})" for k in r["kinds"][:4] if k["speedup"]]
    if per:
        s += " By kind (pairs): " + ", ".join(per) + "."
    return s


def compare_sentence(doc: dict) -> str:
    """The verdict of a compare document, in one paragraph (its "verdict"); two runs are told by
    their matched steps (runs_sentence), never by two steps of different compositions."""
    if doc.get("runs"):
        return runs_sentence(doc["runs"])
    a, b, sp = doc["a"], doc["b"], doc["speedup"]
    if sp is None:
        return "B has no measurable step time."
    change = f"{times(sp)} faster" if sp >= 1 else f"{times(1 / sp)} slower"
    s = (f"B's step is {change} than A's ({ms(a['step_time_ns'])} → {ms(b['step_time_ns'])}); "
         f"A is {a['verdict']}, B is {b['verdict']}. ")
    host_a, host_b = a["idle_by_kind_ns"]["host_bound"], b["idle_by_kind_ns"]["host_bound"]
    if host_a - host_b > 0.1 * a["step_time_ns"]:
        s += f"Host-bound GPU idle fell from {ms(host_a)} to {ms(host_b)}: the launches stopped binding. "
    if a["n_kernels"] != b["n_kernels"]:
        whole = [tag for tag, x in (("A", a), ("B", b)) if x.get("graph_level")]
        s += f"Kernels per step: {a['n_kernels']} → {b['n_kernels']}"
        # a graph recorded whole is one row: the kernels inside it are not counted
        s += (f" ({' and '.join(whole)} {'counts' if len(whole) == 1 else 'count'} each CUDA graph as one row). "
              if whole else ". ")
    if "predicted_graph_step_time_ns" in doc:
        s += f"With CUDA graphs A would take about {ms(doc['predicted_graph_step_time_ns'])}"
        if doc.get("predicted_graph_step_low_ns") is not None:
            s += f" ({ms(doc['predicted_graph_step_low_ns'])} to {ms(doc['predicted_graph_step_high_ns'])})"
        s += (f", off by {signed_percent(doc['prediction_error'])} against B's "
              f"{ms(doc['prediction_reference_ns'])}"
              + ("" if doc.get("prediction_in_range") else ", outside the range") if "prediction_error" in doc else "")
        wb = doc.get("with_b_constants")
        s += (f"; with the constants measured on B itself, {ms(wb['predicted_graph_step_time_ns'])} "
              f"({signed_percent(wb['prediction_error'])})." if wb else ".")
    u = doc.get("untraced")
    if u and u.get("speedup"):
        s += (f" Untraced (both timed outside nsys's capture): {ms(u['a_step_time_ns'])} → "
              f"{ms(u['b_step_time_ns'])}, {times(u['speedup'])}")
        if "prediction_error" in u:
            s += (f"; predicted {ms(u['predicted_graph_step_time_ns'])}, off by "
                  f"{signed_percent(u['prediction_error'])} against B's {ms(u['prediction_reference_ns'])}")
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
    "launch-bound: rank 1's host (CPU floor 28.819 ms vs device floor 4.066 ms); rank 0 waits
    13.800 ms in all-reduce". None without a binding rank."""
    binding = row.get("binding_rank")
    if binding is None:
        return None
    cpu, dev = ms(row["binding_cpu_floor_ns"]), ms(row["binding_device_floor_ns"])
    if row["bound"] == "launch-bound":
        out = f"launch-bound: rank {binding}'s host (CPU floor {cpu} vs device floor {dev})"
    else:
        out = f"device-bound: rank {binding}'s GPU (device floor {dev} vs CPU floor {cpu})"
    waits = [f"rank {w['rank']} waits {ms(w['collective_wait_ns'] or 0)} in {w['wait_op'] or 'collectives'}"
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


def tp_note(note: tuple[str, dict]) -> str:
    """One note of a TP projection (analysis/tp.py's (kind, fields)), as the tp document gives it."""
    kind, f = note
    if kind == "projected_step":
        where = f" (pid {f['pid']}, GPU {f['device']})" if "pid" in f else ""
        return f"projected step: {f['step']}{where}, {f['why']}"
    if kind == "collective_given":
        return f"collective cost given: {f['allreduce_us']} µs per all-reduce"
    if kind == "collective_measured":
        return "collective cost measured from this TP trace (transfer time, waits removed)"
    if kind == "collective_default":
        s = (f"collective cost estimated: {f['allreduces_per_layer']} all-reduces per layer × "
             f"{us(f['allreduce_ns'])} (measured on the H200 TP=2 fixture)")
        if f["unsplit"]:
            return f"{s}; this trace's collectives cannot be split: {f['split_note']}"
        return s + "; give a TP trace or --collective-us to replace it"
    if kind == "collective_assumed":
        return (f"collective: {f['allreduces_per_layer']} all-reduces × {f['allreduce_us']} µs "
                f"per layer, {f['layers']} layers assumed")
    if kind == "eager_not_projected":
        return "eager mode not projected: a graph trace has no per-kernel launch cost"
    if kind == "graph_own" and f.get("queued"):
        return ("graph mode: the what-if graph step with this trace's own constants: this step's replay was "
                "launched while the GPU still ran the previous step (async scheduling), so its prologue and "
                f"graph launch overlap that step: device work + its measured {node_gap(f['node_gap_ns'])} per "
                "kernel between graph nodes, or the host's own work when longer")
    if kind == "graph_own":
        return ("graph mode: the what-if graph step with this trace's own constants: host before the replay "
                f"(prologue + {ms(f['lead_ns'])} graph launch) + device work + its measured "
                f"{node_gap(f['node_gap_ns'])} per kernel between graph nodes")
    if kind == "graph_whatif" and f.get("queued"):
        return (f"graph mode: the what-if graph step analyze reports: under async scheduling this step's "
                f"replay queues behind the previous step's, so its prologue and graph launch overlap that "
                f"step: device work + {f['node_gap_ns']:.0f} ns per kernel between graph nodes, or the "
                f"host's own work when longer ({f['source']})")
    if kind == "graph_whatif":
        return (f"graph mode: the what-if graph step analyze reports: host before the replay (prologue + "
                f"{ms(f['launch_ns'])} graph launch) + device work + {node_gap(f['node_gap_ns'])} per "
                f"kernel between graph nodes ({f['source']})")
    if kind == "moe_sharding":
        from stepscope.analysis.moe import EP_ASSUMPTION, TP_ASSUMPTION

        ep = f.get("expert_parallel")
        assumed = TP_ASSUMPTION if not ep else (
            f"{EP_ASSUMPTION}; {ep['experts']} experts, top-{ep['top_k']}, {ep['tokens']:,} token(s) in the step")
        return (f"MoE step: expert GEMMs {ms(f['moe_gemm_ns'])}, routing {ms(f['moe_routing_ns'])}; "
                f"assumed: {assumed}")
    if kind == "moe_none":
        return "--expert-parallel: the projected step has no expert GEMMs; projected as a dense step"
    if kind == "measured_width_missing":
        return f"the measured width TP={f['tp']} is not among the widths: no measured step beside the model"
    raise ValueError(f"unknown TP note {kind!r}")


def untraced_source(kind: str | None, sidecar: dict | None) -> str | None:
    """Where a step's untraced time came from (analysis/untraced.py's untraced_source: "measured"
    or "estimated"), in words: the sidecar's engine for a measured one, the tracing taken out
    for an estimated one."""
    from stepscope.analysis.untraced import OVERHEAD_PER_LAUNCH_NS

    if kind == "measured":
        return ("measured: " + ("sidecar " + str((sidecar or {}).get("engine", "")) + " engine, "
                                "same step shape outside nsys's capture range"))
    if kind == "estimated":
        return (f"estimated: the step replayed with {OVERHEAD_PER_LAUNCH_NS // 1000} µs of "
                "tracing taken out of every launch interval (calibrated on stepscope's own "
                "traced/untraced H200 pairs; see the README)")
    return kind


def with_untraced_source(frame, sidecar: dict | None):
    """`frame` (the verdict or untraced frame) with its untraced_source column in words."""
    import polars as pl

    col = pl.col("untraced_source")
    return frame.with_columns(
        pl.when(col == "measured").then(pl.lit(untraced_source("measured", sidecar)))
        .when(col == "estimated").then(pl.lit(untraced_source("estimated", sidecar)))
        .otherwise(col).alias("untraced_source"))


def calibration_lines(cal, out) -> list[str]:
    """`calibrate` on the terminal: each capture's constants, then the file written and its point."""
    lines = []
    for c in cal.captures:
        twin = f"; eager twin {c.eager_twin}: residual {signed_percent(c.residual)}" if c.eager_twin else ""
        lines.append(f"{c.named()}: graph launch lead {ms(c.graph_launch_lead_ns)} (+ {us(c.graph_launch_prep_ns)} "
                     f"before the call), {node_gap(c.node_gap_ns)} per kernel node"
                     + (f", {us(c.memop_gap_ns)} per memop" if c.memop_gap_ns is not None else "") + twin)
    p = cal.point()
    from stepscope.render.units import plural

    lines.append(f"wrote {out}: {plural(len(cal.captures), 'capture')}; point: lead {ms(p.lead_ns)}, "
                 f"{node_gap(p.node_gap_ns)} per kernel node")
    return lines


def pause_place(after: int | None, n: int | None) -> str:
    """Where a host pause fell, in the step's own launch numbering (1 = its first launch)."""
    if after is None:
        return "in the step"
    if after <= 0:
        return "before the step's first launch"
    if n is not None and after >= n:
        return f"after the step's last launch ({after})"
    return f"between launch {after} and {after + 1}"


def pause_phrase(f: dict, step_ns: int | None = None) -> str | None:
    """The host pauses of a step (its verdict row `f`: host_pauses, longest_pause_*,
    host_pause_ns), e.g. "a 484.322 ms host pause between launch 24 and 25 (the GPU waiting to
    run fused_moe_kernel) and 3 more; the GPU idles 962.766 ms in them (92% of the step)"; None
    without one."""
    n = f.get("host_pauses") or 0
    if not n or not f.get("longest_pause_ns"):
        return None
    out = (f"a {ms(f['longest_pause_ns'])} host pause "
           f"{pause_place(f.get('longest_pause_after_launch'), f.get('n_launch_calls'))}")
    if f.get("longest_pause_next_kernel"):
        out += f" (the GPU waiting to run {f['longest_pause_next_kernel']})"
    if n > 1:
        out += f" and {n - 1} more"
    idle = f.get("host_pause_ns") or 0
    if idle:
        out += f"; the GPU idles {ms(idle)} in {'them' if n > 1 else 'it'}"
        if step_ns:
            out += f" ({100 * idle / max(step_ns, 1):.0f}% of the step)"
    return out


def cpu_floor_how(f: dict, n_launch_calls: int | None) -> str:
    """What a step's CPU floor is made of: "420 launch calls × 68.2 µs", or, where that would
    be more than the host's launching inside the step (launches issued before the step began,
    or fast bursts beside slow launches), "the host's launching inside the step (less than …)"."""
    n, t = n_launch_calls or 0, f.get("t_launch_ns") or 0
    times_t = f"{plural(n, 'launch call')} × {us(t)}" if n else f"launch calls × {us(t)}"
    lh = f.get("launch_host_ns")
    if lh is not None and n and f.get("cpu_floor_ns") == lh and lh < n * t:
        ahead = f.get("launches_ahead") or 0
        why = (f"; {ahead} of its {n} launches were issued before it began, while earlier GPU work ran"
               if ahead else "")
        return f"the host's launching inside the step, less than {times_t}{why}"
    return times_t


def queued_idle_phrase(idle_device_side_ns: int | None, step_ns: int) -> str:
    """For a device-bound step whose GPU idled with its work already queued for a quarter of the
    step or more: that idle time and what it can be ("" otherwise). Such a step is device-bound
    (the host was not late), yet its GPU busy share is low: the device waited on something the
    trace does not show as work — another stream or event, or a CUDA graph recorded at graph
    level (its kernels are no rows of the trace)."""
    idle = idle_device_side_ns or 0
    if idle < 0.25 * max(step_ns, 1):
        return ""
    return (f"; {ms(idle)} ({100 * idle / max(step_ns, 1):.0f}%) idle with its work queued (device-side gaps: "
            "waits on another stream or event, or work the trace does not show, such as a CUDA graph "
            "recorded at graph level)")


# analysis/notes.py's codes in words: each a function of the note's fields
WARNING_WORDS = {
    "no_launching_call": lambda f: (f"{f['count']} GPU activities have no launching call in the trace (trimmed window?); "
                                    "they count only in steps delimited by the kernel sequence"),
    "empty_step_ranges": lambda f: f"{f['count']} step range(s) launched no GPU work and were skipped",
    "phase_from_names": lambda f: (f"{f['count']} step(s) have attention kernels but no recorded phase, and the trace "
                                   "does not show it either: prefill/decode was taken from the kernel names (name the "
                                   "step range with phase=..., or vLLM's names)"),
    "different_models": lambda f: (f"the traces are of different models ({f['a']} vs {f['b']}): "
                                   "differences are not a before/after of one change"),
    "different_layers": lambda f: (f"the traces have different layer counts ({f['a']} vs {f['b']}): "
                                   "they may be of different models"),
    "few_shared_launches": lambda f: (f"the traces share only {100 * f['share']:.0f}% of their kernel launches by "
                                      "name: they may be of different models or workloads"),
    "reports_without_start": lambda f: (f"{f['count']} report(s) record no session start ({f['first']}…): their "
                                        "timestamps are taken as already on the run's timeline"),
    "one_step_streams": lambda f: (f"{f['count']} process/device stream(s) had no step markers and no repeating kernel "
                                   "sequence: each is analyzed as one step (add an NVTX range per step, or --step-regex)"),
    "graph_level_side": lambda f: (f"{f['side']} records its CUDA graphs whole (--cuda-graph-trace=graph): the kernels inside "
                                   f"them are not rows of its trace, so its per-class figures and kernel names are not "
                                   f"comparable with the other's (capture both with --cuda-graph-trace=node)"),
    "step_regex_unmatched": lambda f: (f"--step-regex {f['regex']!r} matched no NVTX range with GPU work: the steps were "
                                       f"delimited by {', '.join(f['used'])} instead"),
    "bad_coverage": lambda f: (f"{f['count']} step(s) have a coverage outside 0-100 % ({f['low']:.1f}% to "
                               f"{f['high']:.1f}%; steps {_few(f['steps'], f['count'])}): the trace's durations cannot be right"),
    "bad_times": lambda f: (f"{f['count']} step(s) have {BAD_TIMES_WORDS[f['what']]} (steps {_few(f['steps'], f['count'])}): "
                            "the trace's times cannot be right"),
    "shared_device": lambda f: (f"processes {', '.join(map(str, f['pids']))} ran kernels at the same times on GPU {f['device']} "
                                f"(together for {100 * f['both'] / max(f['least'], 1):.0f}% of the least busy one's GPU time): "
                                "a process recorded twice or two exports merged? their per-process figures on that GPU are "
                                "not reliable"),
}
BAD_TIMES_WORDS = {"busy_over_span": "GPU busy above its span", "negative": "a negative time"}


def _few(first: tuple, count: int) -> str:
    """The first step ids of `count`, and how many more."""
    return ", ".join(str(i) for i in first) + (f" and {count - len(first)} more" if count > len(first) else "")


def warning_text(w) -> str:
    """One warning in words: a reader's sentence as it is, an analysis' Note (analysis/notes.py)
    by its code."""
    return w if isinstance(w, str) else WARNING_WORDS[w.code](dict(w.fields))


def warning_texts(warnings) -> list[str]:
    """Every warning of a trace or an inventory in words, in order."""
    return [warning_text(w) for w in warnings]
