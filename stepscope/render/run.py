"""The run view in words and tables (analysis/run.py computes it): the first screen of a trace of
many steps, on the terminal and at the top of the HTML and Markdown reports.

`run_rows(view)` gives plain rows and sentences every renderer shares; `render_run(view,
console)` prints them. Units follow render/units.py: whole-step figures in ms.
"""

from __future__ import annotations

from stepscope.render.units import ms, ms_num, seconds, tick


def pct(part: int, whole: int) -> str:
    """`3.2%`, one decimal; a share that rounds to zero is `0.0%` whatever its sign."""
    v = round(100 * part / max(whole, 1), 1)
    return f"{0.0 if v == 0 else v:.1f}%"


def composition_text(r: dict) -> str:
    """`2 prompts (2,025 tok) + 23 decodes` / `27 decodes` / `1,593 tokens`."""
    pr, dr = r.get("prompt_reqs"), r.get("decode_reqs")
    if pr is None or dr is None:
        t = r.get("step_tokens")
        return f"{t:,} tokens" if t else "no composition in its name"
    parts = []
    if pr:
        parts.append(f"{pr} prompt{'s' if pr != 1 else ''} ({r.get('prompt_tokens') or 0:,} tok)")
    if dr:
        parts.append(f"{dr} decode{'s' if dr != 1 else ''}")
    return " + ".join(parts) or "empty"


def why(r: dict) -> str:
    """One line on why a step took its time (its verdict and the floor that binds)."""
    v = r.get("verdict")
    step = max(r.get("step_time_ns") or 1, 1)
    if v == "launch-bound":
        return (f"launch-bound: {r['n_launch_calls']:,} launches, CPU floor {ms(r['cpu_floor_ns'])} "
                f"> GPU {ms(r['device_floor_ns'])}")
    if v == "host-bound" and r.get("host_bound_on") == "a host pause":
        from stepscope.render.sentences import pause_phrase

        p = pause_phrase(r, r.get("step_time_ns"))
        if p:
            return f"host-bound: {p}"
    if v == "host-bound":
        return (f"host-bound: the GPU waits on the host {100 * (r.get('host_wait_ns') or 0) / step:.0f}% of it, "
                f"most in {r.get('host_bound_on')}")
    top = r.get("top_class")
    share = f"; {top} {100 * (r.get('top_class_time_ns') or 0) / max(r.get('gpu_busy_ns') or 1, 1):.0f}% of GPU time" \
        if top else ""
    from stepscope.render.sentences import queued_idle_phrase

    return (f"device-bound: GPU busy {100 * (r.get('gpu_busy_ns') or 0) / step:.0f}%{share}"
            + queued_idle_phrase(r.get("idle_device_side_ns"), step))


def headline(view: dict) -> str:
    """`132 steps in 2.445 s: 41 mixed steps hold 66% of the steps' time; 2 verdicts …`."""
    kinds = view["kinds"]
    by_phase: dict[str, list[int]] = {}
    for k in kinds:
        n, t = by_phase.setdefault(k["phase"] or "phase unknown", [0, 0])
        by_phase[k["phase"] or "phase unknown"] = [n + k["count"], t + k["time_ns"]]
    total = max(view["steps_time_ns"], 1)
    parts = [f"{n:,} {p} ({100 * t / total:.0f}% of step time)"
             for p, (n, t) in sorted(by_phase.items(), key=lambda x: -x[1][1])]
    verdicts = ", ".join(f"{n:,} {v}" for v, n in sorted(view["verdicts"].items(), key=lambda x: -x[1]))
    from stepscope.render.console import plural

    return (f"{plural(view['steps'], 'step')} in {seconds(view['wall_ns'])}: " + ", ".join(parts)
            + f"; verdicts: {verdicts}.")


def throughput_text(view: dict, tracer: str = "nsys") -> str | None:
    """Tokens and tokens/s of the run, traced and untraced (`tracer`: what traced it)."""
    t = view["throughput"]
    if not t.get("tokens"):
        return None
    out = f"{t['tokens']:,} tokens through the model, {t['tokens_per_s']:,.0f} tokens/s traced"
    if t.get("untraced_tokens_per_s"):
        n, m = view["steps"], t.get("untraced_measured_steps") or 0
        src = "measured" if m == n else ("estimated" if m == 0 else f"{m} of {n} steps measured, the rest estimated")
        out += f", ≈ {t['untraced_tokens_per_s']:,.0f} tokens/s without {tracer} ({src})"
    return out


def time_rows(view: dict) -> list[tuple[str, int]]:
    """Where the run's wall time went: (what, ns), the rows summing to the wall time."""
    t = view["time"]
    rows = [("GPU busy", t["gpu_busy_ns"]),
            ("GPU idle: host-bound gaps (launching)", t["idle_host_bound_ns"]),
            ("GPU idle: sync gaps", t["idle_sync_ns"]),
            ("GPU idle: device-side gaps", t["idle_device_side_ns"]),
            ("GPU idle: host pauses (JIT compilation, GC, Python; no launch)", t.get("idle_host_pause_ns", 0)),
            ("host before the GPU work (input preparation)", t["host_prep_ns"]),
            ("host after the GPU work (sampling, output)", t["host_after_ns"]),
            ("between steps", t["between_steps_ns"])]
    if t.get("overlap_ns"):
        rows.append(("GPU work beside the previous step's (counted twice above)", -t["overlap_ns"]))
    return rows


def render_run(view: dict, console, width: int | None = None, tracer: str = "nsys") -> None:
    """The run view on the terminal (fits 80 columns)."""
    from rich.table import Table

    from stepscope.render.names import term

    console.rule("[bold]the run")
    console.print(f"[bold]{headline(view)}[/]")
    tp = throughput_text(view, tracer)
    if tp:
        console.print(tp)
    kinds = Table(title="steps by kind (phase · graph mode · requests)", show_edge=False, header_style="bold")
    kinds.add_column("kind", justify="left", ratio=1)  # wraps before a figure is cut
    for col in ("n", "share", "p50 ms", "p90 ms", "max ms", "tokens"):
        kinds.add_column(col, justify="right", no_wrap=True, min_width=len(col))
    for k in view["kinds"]:
        kinds.add_row(term(k["kind"]), f"{k['count']:,}", f"{100 * k['share']:.0f}%", ms_num(k['p50_ns']),
                      ms_num(k['p90_ns']), ms_num(k['max_ns']),
                      "–" if k["tokens"] is None else f"{k['tokens']:,}")
    console.print(kinds)
    wall = max(view["wall_ns"], 1)
    tt = Table(title=f"where the run's {ms(view['wall_ns'])} went", show_edge=False, header_style="bold")
    tt.add_column("time", justify="left", ratio=1)
    tt.add_column("ms", justify="right", no_wrap=True, min_width=9)
    tt.add_column("share", justify="right", no_wrap=True, min_width=6)
    for what, ns in time_rows(view):
        tt.add_row(what, ms_num(ns), pct(ns, wall))
    console.print(tt)
    classes = view["time"]["gpu_busy_by_class"][:6]
    if classes:
        total = sum(c["time_ns"] for c in view["time"]["gpu_busy_by_class"]) or 1
        console.print("GPU time by class: " + " · ".join(
            f"{c['class']} {100 * c['time_ns'] / total:.0f}%" for c in classes))
    console.print("[bold]slowest steps[/]")
    for r in view["slowest"]:
        console.print(f"  step {r['index']} · {ms(r['step_time_ns'])} · {term(r['kind'])} · "
                      f"{composition_text(r)} · {why(r)}")


PHASE_COLORS = {"decode": "#4e79a7", "mixed": "#f28e2b", "prefill": "#e15759"}


def run_html(view: dict, steps: list[dict] | None = None, tracer: str = "nsys") -> str:
    """The run view as HTML: the headline, the kinds, where the time went, the slowest steps and,
    given `steps` (index, begin_ns, step_time_ns, phase per step), step time over the run as an
    inline SVG chart."""
    from html import escape

    out = [f'<p><b>{escape(headline(view))}</b></p>']
    tp = throughput_text(view, tracer)
    if tp:
        out.append(f"<p>{escape(tp)}</p>")
    if steps:
        out.append(step_time_chart(steps))
    head = "".join(f"<th>{h}</th>" for h in ("kind", "steps", "share", "p50 ms", "p90 ms", "max ms", "tokens"))
    rows = "".join(
        f"<tr><td>{escape(k['kind'])}</td><td>{k['count']:,}</td><td>{100 * k['share']:.0f}%</td>"
        f"<td>{ms_num(k['p50_ns'])}</td><td>{ms_num(k['p90_ns'])}</td><td>{ms_num(k['max_ns'])}</td>"
        f"<td>{'–' if k['tokens'] is None else format(k['tokens'], ',')}</td></tr>" for k in view["kinds"])
    out.append(f'<table id="run-kinds"><tr>{head}</tr>{rows}</table>')
    wall = max(view["wall_ns"], 1)
    rows = "".join(f"<tr><td>{escape(w)}</td><td>{ms_num(ns)}</td><td>{pct(ns, wall)}</td></tr>"
                   for w, ns in time_rows(view))
    out.append(f'<table id="run-time"><tr><th>where the run\'s {escape(ms(view["wall_ns"]))} went</th>'
               f"<th>ms</th><th>share</th></tr>{rows}</table>")
    rows = "".join(
        f"<tr><td>{r['index']}</td><td>{ms_num(r['step_time_ns'])}</td><td>{escape(r['kind'])}</td>"
        f"<td>{escape(composition_text(r))}</td><td>{escape(why(r))}</td></tr>" for r in view["slowest"])
    out.append('<table id="run-slowest"><tr><th>slowest step</th><th>ms</th><th>kind</th><th>composition</th>'
               f"<th>why</th></tr>{rows}</table>")
    return "".join(out)


def step_time_chart(steps: list[dict], width: int = 900, height: int = 220) -> str:
    """Step time over the run: one dot per step at its begin, coloured by phase."""
    from html import escape

    t0 = min(s["begin_ns"] for s in steps)
    span = max(max(s["begin_ns"] for s in steps) - t0, 1)
    top = max(max(s["step_time_ns"] for s in steps), 1)
    # the longest step, in seconds from 1 s (`1043 ms` was drawn left of the chart's edge); the
    # left margin fits the label at about 7 px a character of the report's 11 px labels
    top_label = seconds(top) if top >= 1e9 else tick(top)
    left, bottom = max(50, 8 + 7 * len(top_label)), 24
    pw, ph = width - left - 10, height - bottom - 10
    dots = []
    for s in steps:
        x = left + pw * (s["begin_ns"] - t0) / span
        y = 10 + ph * (1 - s["step_time_ns"] / top)
        col = PHASE_COLORS.get(s.get("phase") or "", "#999")
        dots.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{col}"><title>step {s["index"]}: '
                    f'{escape(str(s.get("phase") or "?"))}, {ms(s["step_time_ns"])} at '
                    f'{seconds(s["begin_ns"] - t0)}</title></circle>')
    axes = (f'<line x1="{left}" y1="{10 + ph}" x2="{left + pw}" y2="{10 + ph}" stroke="#999"/>'
            f'<line x1="{left}" y1="10" x2="{left}" y2="{10 + ph}" stroke="#999"/>'
            f'<text x="{left - 4}" y="14" text-anchor="end">{top_label}</text>'
            f'<text x="{left - 4}" y="{10 + ph}" text-anchor="end">0</text>'
            f'<text x="{left}" y="{height - 6}">0 s</text>'
            f'<text x="{left + pw}" y="{height - 6}" text-anchor="end">{seconds(span)}</text>')
    legend = "".join(f'<tspan fill="{c}">● {p}</tspan> ' for p, c in PHASE_COLORS.items())
    return (f'<svg class="chart" id="run-chart" width="{width}" height="{height}" role="img" '
            f'aria-label="step time over the run">{axes}{"".join(dots)}'
            f'<text x="{left + 8}" y="22">{legend}</text></svg>')


def run_markdown(view: dict, cell, tracer: str = "nsys") -> list[str]:
    """The run view as Markdown lines; `cell` escapes a table cell."""
    out = [f"**{cell(headline(view))}**", ""]
    tp = throughput_text(view, tracer)
    if tp:
        out += [tp, ""]
    out += ["| kind | steps | share | p50 ms | p90 ms | max ms | tokens |", "|---|---:|---:|---:|---:|---:|---:|"]
    out += [f"| {cell(k['kind'])} | {k['count']:,} | {100 * k['share']:.0f}% | {ms_num(k['p50_ns'])} | "
            f"{ms_num(k['p90_ns'])} | {ms_num(k['max_ns'])} | "
            f"{'–' if k['tokens'] is None else format(k['tokens'], ',')} |" for k in view["kinds"]]
    wall = max(view["wall_ns"], 1)
    out += ["", f"| where the run's {ms(view['wall_ns'])} went | ms | share |", "|---|---:|---:|"]
    out += [f"| {cell(w)} | {ms_num(ns)} | {pct(ns, wall)} |" for w, ns in time_rows(view)]
    out += ["", "| slowest step | ms | kind | composition | why |", "|---:|---:|---|---|---|"]
    out += [f"| {r['index']} | {ms_num(r['step_time_ns'])} | {cell(r['kind'])} | {cell(composition_text(r))} | "
            f"{cell(why(r))} |" for r in view["slowest"]]
    return out + [""]
