"""One run of several reports (analysis/reports_run.py's RunView): the `analyze --json R1 R2 …` document
and its terminal report. The rank rows and TP steps carry the fields and words of `tp --json`'s
`ranks` and `tp_steps` (render/sentences.py's tp_sentence), plus the reports they come from."""

from __future__ import annotations

from rich.console import Console

from stepscope.analysis.reports_run import RunView
from stepscope.render.console import Col, fitted, page, plural
from stepscope.render.names import term
from stepscope.render.sentences import tp_sentence, warning_texts
from stepscope.render.units import ms, ms_num

RUN_STEP_FIELDS = ("step", "group", "delimiter", "name", "phase", "step_time_ns", "n_kernels", "kernel_time_sum_ns",
                   "gpu_busy_ns", "gpu_span_ns", "idle_ns", "n_launch_calls", "launch_call_ns", "layers",
                   "collectives", "collective_ns", "collective_transfer_ns", "collective_wait_ns", "split",
                   "split_note", "cpu_floor_ns", "device_floor_ns", "verdict", "predicted_graph_step_time_ns")
RANK_FIELDS = ("rank", "report", "host", "pid", "device", "n_steps", "step_time_ns", "collectives", "collective_ns",
               "collective_transfer_ns", "collective_wait_ns", "binding_steps", "binding_time_ns", "binding_share")
MAX_TP_LINES = 12


def _reports(view: RunView) -> list[dict]:
    ranks = view.report_ranks
    out = []
    for r in view.reports:
        out.append({"report": r["report"], "path": r["path"], "host": r["host"],
                    "session_start_utc_ns": r["start_utc_ns"], "clock_offset_ns": r["clock_offset_ns"],
                    "nsys_version": r["nsys_version"], "schema_version": r["schema_version"], "gpus": r["gpus"],
                    "ranks": ranks.get(r["report"], []), "steps": r["steps"], "kernels": r["kernels"],
                    "warnings": r["warnings"]})
    return out


def run_dict(view: RunView) -> dict:
    """The run's document: reports, run_ranks (each rank's totals and its steps), tp_steps,
    rank_skew_ns, binding_rank (README's "analyze --json of several reports"), from a RunView
    with its summaries (analysis/reports_run.py's combine computes them)."""
    totals = view.totals.rename({"steps": "n_steps"})
    steps = view.steps.sort("rank", "group", "step")
    per_rank = {rank: grp.select(RUN_STEP_FIELDS).to_dicts()
                for (rank,), grp in steps.partition_by("rank", as_dict=True, maintain_order=True).items()}
    ranks = []
    for t in totals.select(RANK_FIELDS).to_dicts():
        ranks.append({**t, "steps": per_rank.get(t["rank"], [])})
    groups = [{k: g[k] for k in ("group", "ranks", "step_time_ns", "rank_skew_ns", "binding_rank")}
              | {"verdict": tp_sentence(g)} for g in view.tp.to_dicts()]
    skews = [g["rank_skew_ns"] for g in groups if g["rank_skew_ns"] is not None]
    hosts = sorted({h for h in view.ranks["host"].to_list() if h is not None})
    return {"run": {"reports": len(view.reports), "ranks": view.n_ranks, "hosts": hosts, "tp_steps": len(groups)},
            "reports": _reports(view), "warnings": warning_texts(view.warnings), "run_ranks": ranks, "tp_steps": groups,
            "rank_skew_ns": max(skews) if skews else None, "binding_rank": view.binding}


def render_run(view: RunView, console: Console | None = None) -> None:
    """The run on the terminal: its reports, one row per rank (medians over its steps, the
    RunView's `medians`; pids in --json), the binding rank and its share, each TP step's skew and
    verdict (the first MAX_TP_LINES)."""
    console = console or page()
    doc = run_dict(view)
    medians = {r["rank"]: r for r in view.medians.to_dicts()}
    run = doc["run"]
    console.rule(f"[bold]run: {plural(run['reports'], 'report')} · {plural(run['ranks'], 'rank')} on "
                 f"{plural(len(run['hosts']), 'host') if run['hosts'] else '? hosts'} · {plural(run['tp_steps'], 'TP step')}")
    for r in doc["reports"]:
        ranks = ", ".join(str(x) for x in r["ranks"])
        console.print(f"report {r['report']}: [bold]{term(r['path'], 1000)}[/] · host {term(r['host'] or '?')} · "
                      f"nsys {term(r['nsys_version'] or '?')} · {plural(r['kernels'], 'kernel')} · {plural(r['steps'], 'step')} · "
                      f"{'rank' if len(r['ranks']) == 1 else 'ranks'} {ranks} · clock +{ms(r['clock_offset_ns'])}")
        for w in r["warnings"]:
            console.print(f"  [yellow]warning:[/] {term(w, 2000)}")
    for w in doc["warnings"]:
        console.print(f"[yellow]warning:[/] {term(w, 2000)}")
    b = doc["binding_rank"]
    if b is not None:
        first = next((g for g in doc["tp_steps"] if g["binding_rank"] == b["rank"] and g["verdict"]), None)
        console.print(f"[bold]Verdict:[/] rank {b['rank']} binds {b['tp_steps']} of {plural(b['of'], 'TP step')}, "
                      f"{100 * (b['share'] or 0):.0f}% of the run's time ({ms(b['time_ns'])})"
                      + (f"; e.g. TP step {first['group']}: {term(first['verdict'], 2000)}" if first else ""))
    else:
        console.print("[bold]Verdict:[/] no TP step has a binding rank (no step's collectives are split across "
                      "every rank)")
    # a rank is told by its number, never cut; under a width the least needed figures go
    cols = [Col("rank"), Col("host", "left", flex=True, min=8), Col("GPU", drop=4), Col("steps", drop=4),
            Col("step ms"), Col("comm ms", drop=3), Col("transfer ms", drop=2), Col("wait ms"),
            Col("device floor ms", drop=1), Col("CPU floor ms", drop=1), Col("verdict", "left"), Col("binds")]
    rows, notes = [], set()
    for x in doc["run_ranks"]:
        m = medians.get(x["rank"], {})
        med = m.get  # None: no step, or none with the figure
        rows.append([str(x["rank"]), term(x["host"] or "?"), str(x["device"]),
                     str(x["n_steps"] or 0), ms_num(med("step_time_ns")), ms_num(med("collective_ns")),
                     ms_num(med("collective_transfer_ns")), ms_num(med("collective_wait_ns")),
                     ms_num(med("device_floor_ns")), ms_num(med("cpu_floor_ns")), med("verdict") or "",
                     f"{x['binding_steps']} ({100 * (x['binding_share'] or 0):.0f}%)"])
        notes |= {s["split_note"] for s in x["steps"] if s["split_note"]}
    t = fitted(console.width, cols, rows, title="ranks (medians over each rank's steps)")
    console.print(t)
    for n in sorted(notes):
        console.print(f"[yellow]not split into transfer and wait:[/] {term(n, 2000)}")
    for g in doc["tp_steps"][:MAX_TP_LINES]:
        console.print(f"TP step {g['group']} ({g['ranks']} ranks, slowest {ms(g['step_time_ns'])}, rank skew "
                      f"{ms(g['rank_skew_ns'])})" + (f": {term(g['verdict'], 2000)}" if g["verdict"] else ""))
    if len(doc["tp_steps"]) > MAX_TP_LINES:
        console.print(f"… and {len(doc['tp_steps']) - MAX_TP_LINES} more TP steps (see --json)")
    if doc.get("rank_skew_ns") is not None:
        console.print(f"rank skew: {ms(doc['rank_skew_ns'])} (largest spread of one TP step's rank step times)")
    console.print("[dim]each report's own steps in full: stepscope analyze REPORT[/]")
