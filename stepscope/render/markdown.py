"""Markdown report of one step (and optionally a second one): tables to paste into a PR or issue."""

from __future__ import annotations

import polars as pl

from stepscope.paths import shown
from stepscope.render.report_data import GAP_KINDS, StepView, class_rows

GAP_LABELS = {"host_bound": "host-bound", "sync": "sync", "device_side": "device-side"}


def _us(ns) -> str:
    return "–" if ns is None else f"{ns / 1e3:,.1f} µs"


def _cell(s) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def _table(head: list[str], rows: list[list], align: str | None = None) -> str:
    align = align or "l" + "r" * (len(head) - 1)
    sep = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join(sep) + " |"]
    lines += ["| " + " | ".join(_cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _tag(i: int, n: int) -> str:
    return ("A" if i == 0 else "B") if n > 1 else "this step"


def render_markdown(view: StepView, other: StepView | None = None, budget: pl.DataFrame | None = None,
                    budget_note: str | None = None) -> str:
    views = [view] + ([other] if other is not None else [])
    n = len(views)
    out = [f"## stepscope: {view.label}" + (f" vs {other.label}" if other else ""), ""]
    for i, v in enumerate(views):
        t = v.inv.trace
        gpu = f", {t.gpus['name'][0]}" if t.gpus.height and t.gpus["name"][0] else ""
        prefix = f"**{_tag(i, n)}**: " if n > 1 else ""
        out.append(f"- {prefix}`{shown(t.path.name)}` ({t.format}{gpu}), step {v.step} of {len(v.inv.step_ids())} "
                   f"({v.chosen}); delimited by {v.delimiter}")
    notes = sorted({x for v in views for x in v.notes})
    out += [f"- note: {x}" for x in notes]
    out.append("")

    fields = (("step time", "step_time_ns"), ("GPU busy", "gpu_busy_ns"), ("GPU span", "gpu_span_ns"),
              ("GPU idle", "idle_ns"), ("Σ kernel time", "kernel_time_sum_ns"), ("kernels", "n_kernels"),
              ("launch calls", "n_launch_calls"), ("time in launch calls", "launch_call_ns"))
    rows = [[lab] + [_us(v.figures[k]) if k.endswith("_ns") else f"{v.figures[k]:,}" for v in views] for lab, k in fields]
    out += ["### Summary", "", _table(["figure"] + [_tag(i, n) for i in range(n)], rows), ""]

    out += ["### Floors and verdict", ""]
    rows = []
    for i, v in enumerate(views):
        f = v.floors
        rows.append([_tag(i, n), f"**{f.get('verdict', '–')}**", _us(f.get("cpu_floor_ns")),
                     _us(f.get("device_floor_ns")), _us(f.get("t_launch_ns")), _us(v.figures["step_time_ns"])])
    out += [_table(["step", "verdict", "CPU floor", "device floor", "per launch", "step time"], rows, "llrrrr"),
            "", "CPU floor = launch calls × median inter-launch interval; device floor = GPU busy time.", ""]

    out += ["### Classes", ""]
    order = (pl.concat([v.classes.select("class", "time_ns") for v in views]).group_by("class")
             .agg(pl.col("time_ns").max()).sort("time_ns", descending=True)["class"].to_list())
    head = ["class"]
    for i in range(n):
        t = "" if n == 1 else f"{_tag(i, n)} "
        head += [f"{t}count", f"{t}time", f"{t}share"]
    if n == 2:
        head += ["Δ count", "Δ time"]
    rows = []
    for c, vals in class_rows(views, order):
        row: list = [c]
        for cnt, t, share in vals:
            row += [cnt, _us(t), f"{share:.1f}%"]
        if n == 2:
            row += [f"{vals[1][0] - vals[0][0]:+d}", f"{(vals[1][1] - vals[0][1]) / 1e3:+,.1f} µs"]
        rows.append(row)
    out += [_table(head, rows), ""]

    out += ["### Gaps", ""]
    rows = []
    for k in GAP_KINDS:
        row = [GAP_LABELS[k]]
        for v in views:
            g = v.gaps.filter(pl.col("kind") == k)
            row += [g.height, _us(g["gap_ns"].sum())]
        rows.append(row)
    head = ["kind"]
    for i in range(n):
        t = "" if n == 1 else f"{_tag(i, n)} "
        head += [f"{t}gaps", f"{t}idle time"]
    out += [_table(head, rows), ""]
    for i, v in enumerate(views):
        if v.gaps.is_empty():
            continue
        top = v.gaps.sort("gap_ns", descending=True).head(5)
        rows = [[GAP_LABELS.get(r["kind"], r["kind"]), _us(r["gap_ns"]),
                 f"`{_short(r['prev_name'])}` → `{_short(r['next_name'])}`", r.get("next_api") or ""]
                for r in top.iter_rows(named=True)]
        out += [f"Largest gaps ({_tag(i, n)}):", "", _table(["kind", "length", "between", "next launched by"], rows, "lrll"), ""]

    out += ["### Top kernels", ""]
    for i, v in enumerate(views):
        total = v.kernels["time_ns"].sum() or 1
        rows = [[f"`{_short(r['name'], 80)}`", r["class"], r["count"], _us(r["time_ns"]), f"{100 * r['time_ns'] / total:.1f}%"]
                for r in v.kernels.head(10).iter_rows(named=True)]
        if n > 1:
            out += [f"{_tag(i, n)}:", ""]
        out += [_table(["kernel", "class", "count", "time", "share"], rows, "llrrr"), ""]

    if budget is not None:
        rows = [[r["class"], f"{int(r['measured_bytes'] or 0) / 1e6:,.1f} MB", f"{int(r['min_bytes'] or 0) / 1e6:,.1f} MB",
                 f"×{r['measured_bytes'] / r['min_bytes']:.2f}" if r["min_bytes"] else "–"]
                for r in budget.sort("measured_bytes", descending=True).iter_rows(named=True)]
        out += ["### Byte budget", "", _table(["class", "measured", "minimum", "amplification"], rows), ""]
        if budget_note:
            out += [budget_note, ""]
    elif budget_note:
        out += ["### Byte budget", "", budget_note, ""]
    out.append("<sub>made with `stepscope report`; every figure is defined in stepscope's DEFINITIONS.md</sub>")
    return "\n".join(out) + "\n"


def _short(name, n: int = 50) -> str:
    s = str(name or "?")
    return (s if len(s) <= n else s[: n - 1] + "…").replace("`", "'")
