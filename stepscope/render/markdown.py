"""Markdown report of one step (and optionally a second one): tables to paste into a PR or issue."""

from __future__ import annotations

from stepscope.analysis.classify import FAMILY_LABELS
from stepscope.render.names import controls, md_code, md_text
from stepscope.render.report_data import (GAP_KINDS, ReportView, StepView, by_measured_bytes, class_by_lines, class_order,
                                          class_rows, footer, phase_line)
from stepscope.render.units import ms, nbytes, plural, us

GAP_LABELS = {"host_bound": "host-bound", "sync": "sync", "device_side": "device-side", "host_pause": "host-pause"}


def _cell(s) -> str:
    return controls(s).replace("|", "\\|")


def _table(head: list[str], rows: list[list], align: str | None = None) -> str:
    align = align or "l" + "r" * (len(head) - 1)
    sep = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join(sep) + " |"]
    lines += ["| " + " | ".join(_cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _tag(i: int, n: int) -> str:
    return ("A" if i == 0 else "B") if n > 1 else "this step"


def capture_lines(views) -> list[str]:
    """The capture's own defects (StepView.capture) as Markdown lines, before the verdict."""
    lines = list(dict.fromkeys(line for v in views for line in v.capture))
    return [f"- **capture**: {md_text(line)}" for line in lines] + ([""] if lines else [])


def verdict_block(blocks) -> list[str]:
    """The verdict block (ReportView.verdict_block: render/headline.py's rows) as Markdown lines."""
    out = []
    for whose, rows in blocks:
        for label, text in rows:
            out.append(f"- **{_cell(label if whose is None else f'{whose}: {label}')}**: {_cell(text)}")
    return out + ([""] if out else [])


def render_markdown(view: StepView, other: StepView | None = None, budget: tuple | None = None,
                    budget_note: str | None = None, run: dict | None = None, blocks=(),
                    runs: dict | None = None) -> str:
    views = [view] + ([other] if other is not None else [])
    n = len(views)
    # every string from a trace (names of files, GPUs, steps, kernels, APIs, ops) goes through
    # md_text or md_code: a report rendered with raw HTML allowed must not run what a name holds
    out = [f"## stepscope: {md_text(view.label)}" + (f" vs {md_text(other.label)}" if other else ""), ""]
    out += capture_lines(views)
    out += verdict_block(blocks)
    if run is not None:
        from stepscope.render.run import run_markdown

        out += ["### The run", ""] + run_markdown(run, _cell, view.tracer)
    if runs:
        from stepscope.render.run_compare import runs_compare_markdown

        out += ["### The two runs, by matched steps", ""] + runs_compare_markdown(runs, _table)
    for i, v in enumerate(views):
        gpu = f", {md_text(v.gpu_name)}" if v.gpu_name else ""
        prefix = f"**{_tag(i, n)}**: " if n > 1 else ""
        out.append(f"- {prefix}{md_code(v.trace_name)} ({md_text(v.trace_format)}{gpu}), step {v.step} · {plural(v.n_steps, 'step')} "
                   f"in the trace ({md_text(v.chosen)}); delimited by {md_text(v.delimiter)}")
    for i, v in enumerate(views):
        for line in [phase_line(v.figures)] + class_by_lines(v.kernels):
            if line:
                out.append(f"- {f'**{_tag(i, n)}**: ' if n > 1 else ''}{md_text(line)}")
    notes = sorted({x for v in views for x in v.notes})
    out += [f"- note: {md_text(x)}" for x in notes]
    out.append("")

    fields = (("step time", "step_time_ns"), ("GPU busy", "gpu_busy_ns"), ("GPU span", "gpu_span_ns"),
              ("GPU idle", "idle_ns"), ("Σ kernel time", "kernel_time_sum_ns"), ("kernels", "n_kernels"),
              ("launch calls", "n_launch_calls"), ("time in launch calls", "launch_call_ns"))
    rows = [[lab] + [ms(v.figures[k]) if k.endswith("_ns") else f"{v.figures[k]:,}" for v in views] for lab, k in fields]
    out += ["### Summary", "", _table(["figure"] + [_tag(i, n) for i in range(n)], rows), ""]

    out += ["### Floors and verdict", ""]
    rows = []
    for i, v in enumerate(views):
        f = v.floors
        rows.append([_tag(i, n), f"**{f.get('verdict', '–')}**", ms(f.get("cpu_floor_ns")),
                     ms(f.get("device_floor_ns")), us(f.get("t_launch_ns")), ms(v.figures["step_time_ns"])])
    out += [_table(["step", "verdict", "CPU floor", "device floor", "per launch", "step time"], rows, "llrrrr"),
            "", "CPU floor = launch calls × median inter-launch interval, at most the host's launching inside the "
            "step; device floor = GPU busy time "
            "less the time collectives spent waiting for the slowest rank.", ""]
    for i, v in enumerate(views):
        u = v.untraced
        if not u:
            continue
        tag = f" ({_tag(i, n)})" if n > 1 else ""
        how = u["source"].split(":")[0]
        out += [f"**Untraced{tag}** ({how}): step {ms(u['step_time_ns'])} against {ms(v.figures['step_time_ns'])} "
                f"under {v.tracer}; {u['verdict']} (CPU floor {ms(u['cpu_floor_ns'])} at {us(u['t_launch_ns'])} per "
                f"launch). {md_text(u['source'])}.", ""]
        if v.engine:
            e = v.engine
            from stepscope.render.headline import engine_sentence

            out += [f"**vLLM engine step{tag}:** {md_text(engine_sentence(v))}"
                    + (f" ({md_text(e['note'])})" if e.get("note") else "") + ".", ""]
    for i, v in enumerate(views):
        if v.tp is None:
            continue
        tag = f" ({_tag(i, n)})" if n > 1 else ""
        if v.tp.get("tp_verdict"):
            out += [f"**TP step{tag}:** {md_text(v.tp['tp_verdict'])}", ""]
        rows, notes = [], []
        for rv in v.ranks:
            t, f = rv.tp or {}, rv.floors
            rows.append([t.get("rank", "–"), rv.figures["pid"], rv.figures["device"], rv.step,
                         ms(rv.figures["step_time_ns"]), ms(t.get("collective_ns")),
                         ms(t.get("collective_transfer_ns")), ms(t.get("collective_wait_ns")),
                         ms(f["device_floor_ns"]), ms(f["cpu_floor_ns"]), f["verdict"]])
            if t.get("split_note"):
                notes.append(t["split_note"])
        out += [f"Ranks of this TP step{tag}:", "",
                _table(["rank", "pid", "GPU", "step", "step time", "collectives", "transfer", "waiting",
                        "device floor", "CPU floor", "verdict"], rows, "rrrrrrrrrrl"), ""]
        out += [f"Not split into transfer and wait: {md_text(x)}" for x in sorted(set(notes))] + ([""] if notes else [])
        if v.tp.get("rank_skew_ns") is not None:
            out += [f"Rank skew of this TP step: {ms(v.tp['rank_skew_ns'])}.", ""]

    out += ["### Classes", ""]
    order = class_order(views)
    head = ["class"]
    for i in range(n):
        t = "" if n == 1 else f"{_tag(i, n)} "
        head += [f"{t}count", f"{t}time", f"{t}share"]
    if n == 2:
        head += ["Δ count", "Δ time"]
    rows = []
    for c, vals in class_rows(views, order):
        row: list = [md_text(c)]
        for cnt, t, share in vals:
            row += [cnt, us(t), f"{share:.1f}%"]
        if n == 2:
            row += [f"{vals[1][0] - vals[0][0]:+d}", us(vals[1][1] - vals[0][1], sign=True)]
        rows.append(row)
    out += [_table(head, rows), ""]

    for i, v in enumerate(views):
        fam = v.framework
        if not fam:
            continue
        total = sum(r["time_ns"] for r in fam) or 1
        rows = [[FAMILY_LABELS.get(r["family"], r["family"]), r["count"], us(r["time_ns"]), f"{100 * r['time_ns'] / total:.1f}%"]
                for r in fam]
        tag = f" ({_tag(i, n)})" if n > 1 else ""
        out += [f"### Framework glue by op family{tag}", "", _table(["op family", "count", "time", "share"], rows), ""]
        ops = v.framework_ops
        if ops:
            rows = [[md_code(r['op']), FAMILY_LABELS.get(r["family"], r["family"]), r["count"], us(r["time_ns"])]
                    for r in ops[:10]]
            out += ["By the op that launched them (NVTX ranges):", "",
                    _table(["op", "op family", "launches", "time"], rows, "llrr"), ""]
            out += [md_text(v.framework_advice) + ".", ""]
    out += ["### Gaps", ""]
    rows = []
    for k in GAP_KINDS:
        row = [GAP_LABELS[k]]
        for v in views:
            g = [r["gap_ns"] for r in v.gaps if r["kind"] == k]
            row += [len(g), us(sum(g))]
        rows.append(row)
    head = ["kind"]
    for i in range(n):
        t = "" if n == 1 else f"{_tag(i, n)} "
        head += [f"{t}gaps", f"{t}idle time"]
    out += [_table(head, rows), ""]
    for i, v in enumerate(views):
        if not v.gaps:
            continue
        top = sorted(v.gaps, key=lambda r: -r["gap_ns"])[:5]
        rows = [[GAP_LABELS.get(r["kind"], r["kind"]), us(r["gap_ns"]),
                 f"{md_code(_short(r['prev_name']))} → {md_code(_short(r['next_name']))}", md_text(r.get("next_api") or "")]
                for r in top]
        out += [f"Largest gaps ({_tag(i, n)}):", "", _table(["kind", "length", "between", "next launched by"], rows, "lrll"), ""]

    out += ["### Top kernels", ""]
    for i, v in enumerate(views):
        total = sum(r["time_ns"] for r in v.kernels) or 1
        rows = [[md_code(_short(r['name'], 80)), md_text(r["class"]), r["count"], us(r["time_ns"]), f"{100 * r['time_ns'] / total:.1f}%"]
                for r in v.kernels[:10]]
        if n > 1:
            out += [f"{_tag(i, n)}:", ""]
        out += [_table(["kernel", "class", "count", "time", "share"], rows, "llrrr"), ""]

    if budget is not None:
        rows = [[md_text(r["class"]), nbytes(r["measured_bytes"]), nbytes(r["min_bytes"]),
                 f"×{r['measured_bytes'] / r['min_bytes']:.2f}" if r["min_bytes"] and r["measured_bytes"] is not None
                 else "–"]
                for r in by_measured_bytes(budget)]
        out += ["### Byte budget", "", _table(["class", "measured", "minimum", "amplification"], rows), ""]
        if budget_note:
            out += [md_text(budget_note), ""]
    elif budget_note:
        out += ["### Byte budget", "", md_text(budget_note), ""]
    out.append(f"<sub>{footer()}</sub>")
    return "\n".join(out) + "\n"


def _short(name, n: int = 50) -> str:
    s = str(name or "?")
    return s if len(s) <= n else s[: n - 1] + "…"


def render(view: ReportView) -> str:
    """The report renderer's protocol (render/report_data.RENDERERS)."""
    return render_markdown(view.step, view.other, budget=view.budget, budget_note=view.budget_note, run=view.run,
                           blocks=view.verdict_block(), runs=view.runs)


class MarkdownRenderer:
    """The Markdown report (the pipeline's Renderer): render(ReportView) as UTF-8."""

    def render(self, view: ReportView) -> bytes:
        return render(view).encode("utf-8")
