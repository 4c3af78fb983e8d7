"""Self-contained HTML report of one step (and optionally a second one beside it).

Every picture is inline SVG written here: no plotting library, no CDN, no JavaScript needed to
see the charts (a few lines of script only mark the page as rendered and record errors, for
the headless-browser test). Tooltips are SVG <title> elements. A ~400-kernel decode step makes
a file of ~150-300 KB; a plotly page would carry ~3.5 MB of plotly.js before any data.
"""

from __future__ import annotations

import math
from html import escape

import polars as pl

from stepscope.render.names import DOCUMENT, cut
from stepscope.render.report_data import GAP_KINDS, StepView, class_rows

CLASS_COLORS = {
    "gemm": "#4e79a7", "splitk_reduce": "#a0cbe8", "attention_prefill": "#f28e2b",
    "attention_decode": "#ffbe7d", "kv_cache_write": "#8cd17d", "norm": "#59a14f",
    "rope": "#b6992d", "activation": "#f1ce63", "embedding": "#499894", "sampling": "#86bcb6",
    "framework": "#bab0ac", "comm": "#e15759", "memops": "#79706e", "other": "#d37295",
}
GAP_COLORS = {"host_bound": "#e15759", "sync": "#9c4dcc", "device_side": "#9d9d9d"}
GAP_LABELS = {"host_bound": "host-bound", "sync": "sync", "device_side": "device-side"}
LAUNCH_COLOR, GRAPH_COLOR, RANGE_COLOR = "#6b6b6b", "#1b7837", "#cfd8e3"

WIDTH = 1320          # SVG width in px
LEFT = 150            # label column of the timeline
ROW = 18              # row height
FONT = "font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif"

CSS = """
body{%s;margin:24px;color:#222;max-width:1400px}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
.sub{color:#666;font-size:13px} .note{color:#8a6d00;font-size:13px}
table{border-collapse:collapse;font-size:13px;margin:6px 0} td,th{padding:3px 10px;border-bottom:1px solid #eee;text-align:right}
td:first-child,th:first-child{text-align:left} th{background:#f6f6f6}
.verdict{display:inline-block;padding:4px 10px;border-radius:4px;font-weight:600;margin:4px 12px 4px 0}
.launch-bound{background:#fde2e1;color:#a01818} .device-bound{background:#e1f0e1;color:#1d5e1d}
.row{display:flex;gap:24px;flex-wrap:wrap} .sw{display:inline-block;width:11px;height:11px;margin:0 4px 0 12px;vertical-align:-1px}
svg text{font-size:11px;fill:#333} rect.k:hover,rect.c:hover{stroke:#000;stroke-width:1}
code{font-size:12px}
""" % FONT


def _us(ns) -> str:
    return "–" if ns is None else f"{ns / 1e3:,.1f} µs"


def _num(x) -> str:
    return "–" if x is None else f"{x:,}"


def _nice(span_ns: float, target: int = 10) -> float:
    raw = max(span_ns / target, 1.0)
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if m * mag >= raw:
            return m * mag
    return 10 * mag


def _t(s: str) -> str:
    return f"<title>{escape(s)}</title>"


# ---------------------------------------------------------------- timeline


def _timeline(views: list[StepView]) -> str:
    span = max(max(v.t1 - v.t0, 1) for v in views)
    plot_w = WIDTH - LEFT - 10
    sx = plot_w / span
    out: list[str] = []
    y = 4

    def x(ns: int, t0: int) -> float:
        return LEFT + (ns - t0) * sx

    for vi, v in enumerate(views):
        t0 = v.t0
        out.append(f'<text x="0" y="{y + 12}" style="font-weight:600">{escape(_panel_name(v, vi, len(views)))}</text>')
        y += ROW + 2
        f = v.figures
        if f.get("w_start") is not None:
            x0, x1 = x(f["w_start"], t0), x(f["w_end"], t0)
            tip = f"{cut(f['name'], DOCUMENT)}: {_us(f['w_end'] - f['w_start'])}"
            out.append(f'<text x="4" y="{y + 12}">step range</text>'
                       f'<rect class="range" x="{x0:.1f}" y="{y + 3}" width="{max(x1 - x0, 0.6):.1f}" height="{ROW - 6}" '
                       f'fill="{RANGE_COLOR}">{_t(tip)}</rect>')
            y += ROW
        # host rows: the launch calls
        for (pid, tid), grp in v.launches.group_by(["pid", "tid"], maintain_order=True):
            out.append(f'<text x="4" y="{y + 12}">host {tid}</text>')
            for r in grp.iter_rows(named=True):
                graph = bool(r["is_graph_launch"])
                x0 = x(r["start"], t0)
                w = max((r["end"] - r["start"]) * sx, 0.6)
                color = GRAPH_COLOR if graph else LAUNCH_COLOR
                cls = "launch graph-launch" if graph else "launch"
                tip = f"{r['api_name']} {_us(r['end'] - r['start'])} (corr {r['corr']})"
                out.append(f'<rect class="{cls}" x="{x0:.1f}" y="{y + 3}" width="{w:.1f}" height="{ROW - 6}" '
                           f'fill="{color}">{_t(tip)}</rect>')
                if graph:
                    out.append(f'<path class="graph-mark" d="M{x0:.1f},{y + 1} l-4,-6 h8 z" fill="{GRAPH_COLOR}">'
                               f'{_t("graph replay: " + str(r["api_name"]))}</path>')
            y += ROW
        # device rows: one per stream, gaps shaded across the device's rows
        for dev in sorted(set(v.acts["device"].to_list())):
            a = v.acts.filter(pl.col("device") == dev)
            streams = sorted(set(a["stream"].to_list()))
            top = y
            height = ROW * len(streams)
            for g in v.gaps.filter(pl.col("device") == dev).iter_rows(named=True):
                x0 = x(g["gap_start"], t0)
                w = max(g["gap_ns"] * sx, 0.6)
                tip = f"{GAP_LABELS.get(g['kind'], g['kind'])} gap {_us(g['gap_ns'])}: {cut(g['prev_name'], DOCUMENT)} → {cut(g['next_name'], DOCUMENT)}"
                out.append(f'<rect class="gap gap-{g["kind"]}" x="{x0:.1f}" y="{top}" width="{w:.1f}" height="{height}" '
                           f'fill="{GAP_COLORS.get(g["kind"], "#ccc")}" fill-opacity="0.35">'
                           f'{_t(tip)}</rect>')
            for s in streams:
                out.append(f'<text x="4" y="{y + 12}">GPU {dev} · stream {s}</text>')
                for r in a.filter(pl.col("stream") == s).iter_rows(named=True):
                    x0 = x(r["start"], t0)
                    w = max((r["end"] - r["start"]) * sx, 0.6)
                    c = r["class"] or "other"
                    tip = f"{cut(r['name'], DOCUMENT)} [{c}] {_us(r['end'] - r['start'])}"
                    out.append(f'<rect class="k" data-class="{c}" x="{x0:.1f}" y="{y + 2}" width="{w:.1f}" height="{ROW - 4}" '
                               f'fill="{CLASS_COLORS.get(c, "#ccc")}">{_t(tip)}</rect>')
                y += ROW
            # graph replays: a bracket under the device rows per replay (kernels sharing the launch's corr)
            gk = a.filter(pl.col("graph_node_id").is_not_null())
            if gk.height:
                reps = gk.group_by("corr").agg(pl.col("start").min(), pl.col("end").max(), pl.len().alias("n"))
                for r in reps.iter_rows(named=True):
                    x0, x1 = x(r["start"], t0), x(r["end"], t0)
                    tip = f"graph replay: {r['n']} kernels, {_us(r['end'] - r['start'])}"
                    out.append(f'<path class="graph-replay" d="M{x0:.1f},{y + 1} v4 H{x1:.1f} v-4" stroke="{GRAPH_COLOR}" '
                               f'fill="none" stroke-width="1.5">{_t(tip)}</path>')
                y += 8
        y += 10
    # axis, shared by every panel
    tick = _nice(span)
    axis = [f'<line x1="{LEFT}" y1="{y}" x2="{LEFT + plot_w}" y2="{y}" stroke="#888"/>']
    k = 0
    while k * tick <= span:
        xx = LEFT + k * tick * sx
        axis.append(f'<line x1="{xx:.1f}" y1="{y}" x2="{xx:.1f}" y2="{y + 4}" stroke="#888"/>'
                    f'<text x="{xx:.1f}" y="{y + 16}" text-anchor="middle">{k * tick / 1e3:,.0f}</text>')
        axis.append(f'<line x1="{xx:.1f}" y1="0" x2="{xx:.1f}" y2="{y}" stroke="#000" stroke-opacity="0.06"/>')
        k += 1
    axis.append(f'<text x="{LEFT + plot_w}" y="{y + 30}" text-anchor="end">µs from the start of each step</text>')
    h = y + 36
    return (f'<svg id="timeline" class="chart" width="{WIDTH}" height="{h}" viewBox="0 0 {WIDTH} {h}" '
            f'xmlns="http://www.w3.org/2000/svg">{"".join(axis)}{"".join(out)}</svg>')


def _panel_name(v: StepView, i: int, n: int) -> str:
    tag = ("A: " if i == 0 else "B: ") if n > 1 else ""
    return f"{tag}{v.label}"


def _legend(gaps: bool) -> str:
    items = "".join(f'<span class="sw" style="background:{c}"></span>{k}' for k, c in CLASS_COLORS.items())
    items += f'<br><span class="sw" style="background:{LAUNCH_COLOR}"></span>launch call'
    items += f'<span class="sw" style="background:{GRAPH_COLOR}"></span>graph replay (cudaGraphLaunch ▼, bracket under its kernels)'
    items += f'<span class="sw" style="background:{RANGE_COLOR}"></span>step range'
    if gaps:
        items += "".join(f'<span class="sw" style="background:{GAP_COLORS[k]};opacity:.5"></span>{GAP_LABELS[k]} gap'
                         for k in GAP_KINDS)
    return f'<div class="sub" id="legend">{items}</div>'


# ---------------------------------------------------------------- class breakdown


def _classes(views: list[StepView]) -> str:
    frames = [v.classes for v in views]
    order = (pl.concat([f.select("class", "time_ns") for f in frames]).group_by("class")
             .agg(pl.col("time_ns").max()).sort("time_ns", descending=True)["class"].to_list())
    vmax = max((f["time_ns"].max() or 1) for f in frames)
    bar_w = 700
    rows = []
    y = 4
    for c in order:
        rows.append(f'<text x="0" y="{y + 12}">{escape(c)}</text>')
        for i, f in enumerate(frames):
            r = f.filter(pl.col("class") == c)
            t = int(r["time_ns"][0]) if r.height else 0
            n = int(r["count"][0]) if r.height else 0
            w = max(t / vmax * bar_w, 0.5 if t else 0)
            op = "1" if i == 0 else "0.55"
            tag = ("A " if i == 0 else "B ") if len(frames) > 1 else ""
            rows.append(f'<rect class="c" x="140" y="{y + 2}" width="{w:.1f}" height="{ROW - 6}" fill="{CLASS_COLORS.get(c, "#ccc")}" '
                        f'fill-opacity="{op}">{_t(f"{tag}{c}: {n} × , {_us(t)}")}</rect>'
                        f'<text x="{146 + w:.1f}" y="{y + 12}">{tag}{_us(t)} · {n}×</text>')
            y += ROW - 2
        y += 4
    svg = (f'<svg id="class-breakdown" class="chart" width="{WIDTH}" height="{y + 4}" '
           f'xmlns="http://www.w3.org/2000/svg">{"".join(rows)}</svg>')
    return svg + _class_table(views, order)


def _class_table(views: list[StepView], order: list[str]) -> str:
    head = "<tr><th>class</th>"
    for i, v in enumerate(views):
        tag = ("A " if i == 0 else "B ") if len(views) > 1 else ""
        head += f"<th>{tag}count</th><th>{tag}time</th><th>{tag}share</th>"
    if len(views) == 2:
        head += "<th>Δ count</th><th>Δ time</th>"
    head += "</tr>"
    body = []
    for c, vals in class_rows(views, order):
        cells = [f"<td>{escape(c)}</td>"]
        for n, t, share in vals:
            cells.append(f"<td>{n}</td><td>{_us(t)}</td><td>{share:.1f}%</td>")
        if len(views) == 2:
            cells.append(f"<td>{vals[1][0] - vals[0][0]:+d}</td><td>{(vals[1][1] - vals[0][1]) / 1e3:+,.1f} µs</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f'<table id="class-table">{head}{"".join(body)}</table>'


# ---------------------------------------------------------------- gaps


def _gap_histogram(v: StepView, idx: int, n: int) -> str:
    title = _panel_name(v, idx, n)
    g = v.gaps
    if g.is_empty():
        return f'<div><div class="sub">{escape(title)}</div><p>no gaps: the GPU was never idle inside this step</p></div>'
    g = g.with_columns(bin=pl.col("gap_ns").clip(lower_bound=1).cast(pl.Float64).log(2).floor().cast(pl.Int64))
    lo, hi = int(g["bin"].min()), int(g["bin"].max())
    counts = g.group_by("bin", "kind").agg(pl.len().alias("n"), pl.col("gap_ns").sum().alias("t"))
    cmap = {(b, k): (nn, t) for b, k, nn, t in counts.iter_rows()}
    tot = counts.group_by("bin").agg(pl.col("n").sum())
    nmax = int(tot["n"].max())
    bw, ph, pad = 44, 160, 30
    w = pad + (hi - lo + 1) * bw + 10
    parts = []
    for i, b in enumerate(range(lo, hi + 1)):
        x0 = pad + i * bw
        yb = ph
        for k in GAP_KINDS:
            nn, t = cmap.get((b, k), (0, 0))
            if not nn:
                continue
            hh = nn / nmax * (ph - 10)
            yb -= hh
            parts.append(f'<rect class="hist" x="{x0 + 2}" y="{yb:.1f}" width="{bw - 4}" height="{hh:.1f}" '
                         f'fill="{GAP_COLORS[k]}">{_t(f"{GAP_LABELS[k]}: {nn} gaps in [{_span(2 ** b)}, {_span(2 ** (b + 1))}), {_us(t)} in all")}</rect>')
        parts.append(f'<text x="{x0 + bw / 2:.1f}" y="{ph + 14}" text-anchor="middle">{_span(2 ** b)}</text>')
    parts.append(f'<line x1="{pad}" y1="{ph}" x2="{w - 10}" y2="{ph}" stroke="#888"/>')
    parts.append(f'<text x="{pad - 4}" y="14" text-anchor="end">{nmax}</text><text x="{pad - 4}" y="{ph}" text-anchor="end">0</text>')
    parts.append(f'<text x="{pad}" y="{ph + 30}">gap length (log₂ bins, lower edge); bar height = number of gaps</text>')
    totals = g.group_by("kind").agg(pl.len().alias("n"), pl.col("gap_ns").sum().alias("t"))
    tmap = {k: (nn, t) for k, nn, t in totals.iter_rows()}
    line = " · ".join(f"{GAP_LABELS[k]} {tmap.get(k, (0, 0))[0]} gaps, {_us(tmap.get(k, (0, 0))[1])}" for k in GAP_KINDS)
    return (f'<div><div class="sub">{escape(title)}</div>'
            f'<svg class="chart gap-histogram" width="{max(w, 480)}" height="{ph + 36}" xmlns="http://www.w3.org/2000/svg">'
            f'{"".join(parts)}</svg><div class="sub">{line}</div>{_top_gaps(g)}</div>')


def _span(ns: int) -> str:
    """Short axis label: 2 or 3 significant digits (512ns, 1.0µs, 16µs, 131µs, 1.0ms)."""
    for div, unit in ((1_000_000, "ms"), (1000, "µs"), (1, "ns")):
        if ns >= div:
            v = ns / div
            return f"{v:.1f}{unit}" if v < 10 and div > 1 else f"{v:.0f}{unit}"
    return f"{ns}ns"


def _top_gaps(g: pl.DataFrame) -> str:
    top = g.sort("gap_ns", descending=True).head(5)
    rows = "".join(
        f"<tr><td>{GAP_LABELS.get(r['kind'], r['kind'])}</td><td>{_us(r['gap_ns'])}</td>"
        f"<td style='text-align:left'><code>{escape(_short(r['prev_name']))}</code> → <code>{escape(_short(r['next_name']))}</code></td>"
        f"<td style='text-align:left'>{escape(str(r.get('next_api') or ''))}</td></tr>"
        for r in top.iter_rows(named=True))
    return f'<table class="top-gaps"><tr><th>largest gaps</th><th>length</th><th>between</th><th>next launched by</th></tr>{rows}</table>'


def _short(name, n: int = 60) -> str:
    s = str(name or "?")
    return s if len(s) <= n else s[: n - 1] + "…"


# ---------------------------------------------------------------- floors and verdict


def _floors(views: list[StepView]) -> str:
    blocks = []
    for i, v in enumerate(views):
        title = escape(_panel_name(v, i, len(views)))
        f = v.floors
        cpu, dev = int(f["cpu_floor_ns"] or 0), int(f["device_floor_ns"] or 0)
        step_t = int(v.figures["step_time_ns"] or 0)
        vmax = max(cpu, dev, step_t, 1)
        bw = 520
        bars = []
        for j, (lab, val, col) in enumerate((("CPU floor", cpu, LAUNCH_COLOR), ("device floor", dev, CLASS_COLORS["gemm"]),
                                             ("step time", step_t, "#333"))):
            y = 4 + j * 22
            w = val / vmax * bw
            bars.append(f'<text x="0" y="{y + 13}">{lab}</text><rect class="floor" x="100" y="{y + 2}" width="{max(w, 0.5):.1f}" '
                        f'height="15" fill="{col}" fill-opacity="{0.9 if j < 2 else 0.25}">{_t(f"{lab}: {_us(val)}")}</rect>'
                        f'<text x="{106 + w:.1f}" y="{y + 13}">{_us(val)}</text>')
        verdict = str(f["verdict"])
        t_launch = f.get("t_launch_ns")
        expl = (f"{v.figures['n_launch_calls']} launch calls × {_us(t_launch)} per launch (median inter-launch interval) "
                f"vs {_us(dev)} of GPU busy time")
        overhead = v.inv.trace.profiler_overhead_ns
        oh = (f"; nsys's own overhead in this trace: {v.inv.trace.profiler_overhead_count:,} rows, {_us(overhead)}"
              if overhead else "")
        blocks.append(
            f'<div><div class="sub">{title}</div><span class="verdict {escape(verdict)}" id="verdict-{i}">{escape(verdict)}</span>'
            f'<span class="sub">{escape(expl)}{escape(oh)}</span>'
            f'<svg class="chart floors" width="760" height="74" xmlns="http://www.w3.org/2000/svg">{"".join(bars)}</svg></div>')
    return "".join(blocks)


# ---------------------------------------------------------------- tables


def _summary(views: list[StepView]) -> str:
    fields = (("step_time_ns", "step time"), ("gpu_busy_ns", "GPU busy"), ("gpu_span_ns", "GPU span"),
              ("idle_ns", "GPU idle"), ("kernel_time_sum_ns", "Σ kernel time"), ("n_kernels", "kernels"),
              ("n_launch_calls", "launch calls"), ("launch_call_ns", "time in launch calls"))
    head = "<tr><th></th>" + "".join(f"<th>{escape(_panel_name(v, i, len(views)))}</th>" for i, v in enumerate(views)) + "</tr>"
    rows = []
    for key, lab in fields:
        cells = "".join(f"<td>{_us(v.figures[key]) if key.endswith('_ns') else _num(v.figures[key])}</td>" for v in views)
        rows.append(f"<tr><td>{lab}</td>{cells}</tr>")
    layers = "".join(
        f"<td>{v.figures['layers']} × {v.figures['kernels_per_layer']}</td>" if v.figures.get("layers") else "<td>–</td>"
        for v in views)
    rows.append(f"<tr><td>layers × kernels per layer</td>{layers}</tr>")
    phase = "".join(f"<td>{escape(str(v.figures.get('phase') or '–'))}</td>" for v in views)
    rows.append(f"<tr><td>phase</td>{phase}</tr>")
    return f'<table id="summary">{head}{"".join(rows)}</table>'


def _top_kernels(v: StepView, n: int = 15) -> str:
    total = v.kernels["time_ns"].sum() or 1
    rows = "".join(
        f"<tr><td><code title='{escape(str(cut(r['demangled'], DOCUMENT)))}'>{escape(_short(r['name'], 90))}</code></td>"
        f"<td>{escape(str(r['class']))}</td><td>{r['count']}</td><td>{_us(r['time_ns'])}</td>"
        f"<td>{100 * r['time_ns'] / total:.1f}%</td></tr>"
        for r in v.kernels.head(n).iter_rows(named=True))
    return (f'<table class="top-kernels"><tr><th>kernel</th><th>class</th><th>count</th><th>time</th><th>share</th></tr>'
            f"{rows}</table>")


def _budget(budget: pl.DataFrame | None, note: str | None) -> str:
    if budget is None:
        return f'<p class="note">{escape(note)}</p>' if note else ""
    budget = budget.filter(pl.col("measured_bytes").is_not_null() | pl.col("min_bytes").is_not_null())
    rows = []
    vmax = max(int(budget["measured_bytes"].max() or 1), int(budget["min_bytes"].max() or 1))
    y = 4
    for r in budget.sort("measured_bytes", descending=True).iter_rows(named=True):
        m, mn = int(r["measured_bytes"] or 0), int(r["min_bytes"] or 0)  # null: no cell / no minimum
        c = CLASS_COLORS.get(r["class"], "#ccc")
        rows.append(f'<text x="0" y="{y + 12}">{escape(str(r["class"]))}</text>'
                    f'<rect x="140" y="{y + 2}" width="{m / vmax * 700:.1f}" height="7" fill="{c}">{_t(f"measured {m:,} B")}</rect>'
                    f'<rect x="140" y="{y + 10}" width="{mn / vmax * 700:.1f}" height="5" fill="#333">{_t(f"minimum {mn:,} B")}</rect>'
                    f'<text x="{146 + m / vmax * 700:.1f}" y="{y + 12}">{m / 1e6:,.1f} MB measured · {mn / 1e6:,.1f} MB minimum'
                    f'{f" · ×{m / mn:.2f}" if mn else ""}</text>')
        y += ROW + 2
    return (f'<svg id="budget" class="chart" width="{WIDTH}" height="{y + 4}" xmlns="http://www.w3.org/2000/svg">'
            f'{"".join(rows)}</svg><div class="sub">coloured bar: bytes measured by ncu; black bar: theoretical minimum'
            f'{"<br>" + escape(note) if note else ""}</div>')


# ---------------------------------------------------------------- page


def render_html(view: StepView, other: StepView | None = None, budget: pl.DataFrame | None = None,
                budget_note: str | None = None) -> str:
    views = [view] + ([other] if other is not None else [])
    t = view.inv.trace
    gpu = t.gpus["name"][0] if t.gpus.height else None
    src = f"{t.format}" + (f" · nsys {t.nsys_version}" if t.nsys_version else "") + (f" · {gpu}" if gpu else "")
    notes = sorted({n for v in views for n in v.notes} | {w for v in views for w in v.inv.warnings})
    title = f"stepscope · {view.label}" + (f" vs {other.label}" if other else "")
    body = [
        f"<h1>{escape(title)}</h1>",
        f'<div class="sub">{escape(src)} · {len(view.inv.step_ids())} step(s) in the trace'
        + "".join(f"<br>{escape(_panel_name(v, i, len(views)))}: {escape(v.chosen)}; delimited by {escape(v.delimiter)}"
                  for i, v in enumerate(views)) + "</div>",
        "".join(f'<div class="note">note: {escape(n)}</div>' for n in notes),
        "<h2>Summary</h2>", _summary(views),
        '<h2 id="floors">Floors and verdict</h2>', _floors(views),
        "<h2>Timeline</h2>",
        _legend(any(v.gaps is not None for v in views)),
        _timeline(views),
        "<h2>Class breakdown</h2>", _classes(views),
        "<h2>Gap histogram</h2>",
        '<div class="row" id="gap-histograms">' + "".join(_gap_histogram(v, i, len(views)) for i, v in enumerate(views)) + "</div>",
        "<h2>Top kernels</h2>",
        '<div class="row">' + "".join(f'<div><div class="sub">{escape(_panel_name(v, i, len(views)))}</div>{_top_kernels(v)}</div>'
                                      for i, v in enumerate(views)) + "</div>",
    ]
    if budget is not None or budget_note:
        body += ["<h2>Byte budget</h2>", _budget(budget, budget_note)]
    body.append('<p class="sub">Definitions of every figure: stepscope DEFINITIONS.md. '
                "Hover any bar for its exact value.</p>")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>
<script>window.addEventListener("error",function(e){{document.documentElement.setAttribute("data-js-error",String(e.message))}});</script>
<style>{CSS}</style></head>
<body>
{"".join(body)}
<script>document.body.setAttribute("data-charts",String(document.querySelectorAll("svg.chart").length));
document.body.setAttribute("data-ready","1");</script>
</body></html>
"""
