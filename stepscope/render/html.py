"""Self-contained HTML report of one step (and optionally a second one beside it).

Every picture is inline SVG written here: no plotting library, no CDN, no JavaScript needed to
see the charts. One small inline script (TIMELINE_JS, ~5 KB) zooms and pans the timeline by
moving its shapes; two one-liners mark the page as rendered and record errors, for the
headless-browser test. Tooltips are SVG <title> elements. A ~400-kernel decode step makes a
file of ~150-300 KB; a plotly page would carry ~3.5 MB of plotly.js before any data.
"""

from __future__ import annotations

import math
from html import escape

from stepscope.classes import COLOURS
from stepscope.render.names import DOCUMENT, cut
from stepscope.render.report_data import (GAP_KINDS, ReportView, StepView, by_measured_bytes, class_by_lines, class_order,
                                          class_rows, footer, phase_line)
from stepscope.render.run import run_html
from stepscope.render.sentences import cpu_floor_how
from stepscope.render.run_compare import runs_compare_html
from stepscope.render.units import ms, nbytes, plural, tick, us

CLASS_COLORS = COLOURS  # the class table's (stepscope/data/classes.toml)
GAP_COLORS = {"host_bound": "#e15759", "sync": "#9c4dcc", "device_side": "#9d9d9d", "host_pause": "#f28e2b"}
GAP_LABELS = {"host_bound": "host-bound", "sync": "sync", "device_side": "device-side", "host_pause": "host-pause"}
LAUNCH_COLOR, GRAPH_COLOR, RANGE_COLOR = "#6b6b6b", "#1b7837", "#cfd8e3"
WAIT_COLOR = "#3b0a0a"  # over a collective: the part spent waiting for the slowest rank

WIDTH = 1320          # SVG width in px
LEFT = 150            # label column of the timeline
ROW = 18              # row height
FONT = "font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif"

CSS = """
body{%s;margin:24px;color:#222;max-width:1400px}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
.sub{color:#666;font-size:13px} .note{color:#8a6d00;font-size:13px} .defect{color:#a40000}
table{border-collapse:collapse;font-size:13px;margin:6px 0} td,th{padding:3px 10px;border-bottom:1px solid #eee;text-align:right}
td:first-child,th:first-child{text-align:left} th{background:#f6f6f6}
.verdict{display:inline-block;padding:4px 10px;border-radius:4px;font-weight:600;margin:4px 12px 4px 0}
.launch-bound{background:#fde2e1;color:#a01818} .device-bound{background:#e1f0e1;color:#1d5e1d}
.row{display:flex;gap:24px;flex-wrap:wrap} .sw{display:inline-block;width:11px;height:11px;margin:0 4px 0 12px;vertical-align:-1px}
svg text{font-size:11px;fill:#333} rect.k:hover,rect.c:hover{stroke:#000;stroke-width:1}
code{font-size:12px}
.tl-tools{margin:4px 0} .tl-tools button{font:inherit;font-size:12px;padding:1px 8px;margin-right:4px}
#timeline{cursor:grab;touch-action:pan-y} #timeline.dragging{cursor:grabbing}
.hatch{background:repeating-linear-gradient(45deg,#777 0 1px,#f3f3f3 1px 4px)}
""" % FONT


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
#
# Time 0 of a panel is its step's begin (`step_begin`): the step's time starts there. Whatever of
# the step happened earlier — launch calls issued while the previous step's GPU work still ran,
# the start of its range — is drawn left of 0 over a hatched band, with that previous work
# itself. Every panel (and every rank of a TP step) shares one axis. The plot is SVG that reads
# without JavaScript; TIMELINE_JS only moves the plot's shapes when zooming and panning.


def _rect(cls: str, x0: float, y: float, w: float, h: float, fill: str, tip: str, extra: str = "") -> str:
    """A rect of the plot. Positions carry 4 decimals because zooming multiplies their error
    (up to 5,000×: 0.05 px of rounding would move a kernel 250 px); `data-w` keeps the exact
    width when the drawn one is the 0.6 px minimum, so a zoomed-in sliver grows to its true width."""
    exact = f' data-w="{w:.4f}"' if w < 0.6 else ""
    return (f'<rect class="{cls}" x="{x0:.4f}" y="{y}" width="{max(w, 0.6):.4f}" height="{h}" fill="{fill}"{exact}'
            f"{extra}>{_t(tip)}</rect>")


def _ticks(lo_ns: float, hi_ns: float) -> list[float]:
    """Tick times for an axis from lo to hi (ns from the step's begin): multiples of a nice step."""
    step = _nice(hi_ns - lo_ns)
    k = math.ceil(lo_ns / step)
    out = []
    while k * step <= hi_ns:
        out.append(k * step)
        k += 1
    return out


def _axis(pre: int, span: int, sx: float, y: int) -> str:
    """Ticks, labels and grid lines; TIMELINE_JS redraws the same markup for a zoomed window."""
    out = [f'<line x1="{LEFT}" y1="{y}" x2="{LEFT + span * sx:.1f}" y2="{y}" stroke="#888"/>']
    for t in _ticks(-pre, span - pre):
        xx = LEFT + (t + pre) * sx
        out.append(f'<line x1="{xx:.1f}" y1="0" x2="{xx:.1f}" y2="{y}" stroke="#000" stroke-opacity="{0.3 if t == 0 else 0.06}"/>'
                   f'<line x1="{xx:.1f}" y1="{y}" x2="{xx:.1f}" y2="{y + 4}" stroke="#888"/>'
                   f'<text class="tick" x="{xx:.1f}" y="{y + 16}" text-anchor="middle">{tick(t)}</text>')
    return "".join(out)


def _timeline(views: list[StepView]) -> str:
    pre = max(v.begin - v.t0 for v in views)            # the widest tail, left of 0
    post = max(max(v.t1 - v.begin, 1) for v in views)
    span = pre + post
    plot_w = WIDTH - LEFT - 10
    sx = plot_w / span
    plot: list[str] = []
    labels: list[str] = []
    y = 4
    for vi, v in enumerate(views):
        labels.append(f'<text x="0" y="{y + 12}" style="font-weight:600">{escape(_panel_name(v, vi, len(views)))}</text>')
        y += ROW + 2
        ranks = v.ranks
        for rv in ranks:  # a TP step: every rank on the one clock, so waiting lines up with its cause
            if len(ranks) > 1:
                tag = " (shown step)" if rv is v else ""
                labels.append(f'<text class="rank" x="0" y="{y + 12}" style="font-style:italic">'
                              f'{escape(rv.rank_label + tag)}</text>')
                y += ROW
            y = _rank_rows(rv, v.begin - pre, sx, y, plot, labels)
        y += 10
    h = y + 36
    return (f'<div class="tl-tools"><button type="button" data-zoom="in" title="zoom in">+</button>'
            f'<button type="button" data-zoom="out" title="zoom out">−</button>'
            f'<button type="button" data-zoom="reset" title="the whole step">reset</button> '
            f'<span class="sub">zoom: Ctrl/⌘ + wheel (or pinch) over the timeline, or the buttons · pan: drag, or '
            f'Shift + wheel · reset: double-click · the window is kept in the address (#t=from,to in µs)</span></div>'
            f'<svg id="timeline" class="chart" width="{WIDTH}" height="{h}" viewBox="0 0 {WIDTH} {h}" '
            f'xmlns="http://www.w3.org/2000/svg" data-left="{LEFT}" data-plot-w="{plot_w}" '
            f'data-ns-per-px="{1 / sx!r}" data-pre-ns="{pre}" data-axis-y="{y}">'
            f'<defs><clipPath id="tl-clip"><rect x="{LEFT}" y="0" width="{plot_w}" height="{h}"/></clipPath>'
            f'<pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">'
            f'<line x1="0" y1="0" x2="0" y2="6" stroke="#555" stroke-width="1.2" stroke-opacity="0.5"/></pattern></defs>'
            f'<g id="tl-axis">{_axis(pre, span, sx, y)}</g>'
            f'<g id="tl-plot" clip-path="url(#tl-clip)">{"".join(plot)}</g>'
            f'<g id="tl-labels">{"".join(labels)}'
            f'<text x="{LEFT + plot_w}" y="{y + 30}" text-anchor="end">time from the begin of each step '
            f'(step_begin); left of 0: before it</text></g></svg>')


def _rank_rows(v: StepView, left_ns: int, sx: float, y: int, plot: list[str], labels: list[str]) -> int:
    """The step range, host rows and device rows of one rank's step; `left_ns`: the time at the
    plot's left edge. Returns the next y."""

    def x(ns: int) -> float:
        return LEFT + (ns - left_ns) * sx

    f = v.figures
    top = y
    if f.get("w_start") is not None:
        tip = f"{cut(f['name'], DOCUMENT)}: {ms(f['w_end'] - f['w_start'])}"
        labels.append(f'<text x="4" y="{y + 12}">step range</text>')
        plot.append(_rect("range", x(f["w_start"]), y + 3, (f["w_end"] - f["w_start"]) * sx, ROW - 6, RANGE_COLOR, tip))
        y += ROW
    # host rows: the launch calls
    threads: dict[tuple, list[dict]] = {}  # (pid, tid) -> its calls, threads in order of their first call
    for r in v.launches:
        threads.setdefault((r["pid"], r["tid"]), []).append(r)
    for (pid, tid), grp in threads.items():
        labels.append(f'<text x="4" y="{y + 12}">host {tid}</text>')
        for r in grp:
            graph = bool(r["is_graph_launch"])
            x0 = x(r["start"])
            tip = f"{r['api_name']} {us(r['end'] - r['start'])} (corr {r['corr']})"
            plot.append(_rect("launch graph-launch" if graph else "launch", x0, y + 3, (r["end"] - r["start"]) * sx,
                              ROW - 6, GRAPH_COLOR if graph else LAUNCH_COLOR, tip))
            if graph:
                plot.append(f'<path class="graph-mark" data-x="{x0:.4f}" data-y="{y + 1}" d="M{x0:.1f},{y + 1} l-4,-6 h8 z" '
                            f'fill="{GRAPH_COLOR}">{_t("graph replay: " + str(r["api_name"]))}</path>')
        y += ROW
    # device rows: one per stream, gaps shaded across the device's rows
    tail = v.tail or ()
    for dev in sorted({r["device"] for r in v.acts}):
        a = [r for r in v.acts if r["device"] == dev]
        streams = sorted({r["stream"] for r in a} | {r["stream"] for r in tail})
        dev_top = y
        height = ROW * len(streams)
        for g in (g for g in v.gaps if g["device"] == dev):
            tip = (f"{GAP_LABELS.get(g['kind'], g['kind'])} gap {us(g['gap_ns'])}: {cut(g['prev_name'], DOCUMENT)} → "
                   f"{cut(g['next_name'], DOCUMENT)}")
            plot.append(_rect(f"gap gap-{g['kind']}", x(g["gap_start"]), dev_top, g["gap_ns"] * sx, height,
                              GAP_COLORS.get(g["kind"], "#ccc"), tip, ' fill-opacity="0.35"'))
        waits = [r for r in v.waits if r["matched"] and r["device"] == dev] if v.waits is not None else None
        for s in streams:
            labels.append(f'<text x="4" y="{y + 12}">GPU {dev} · stream {s}</text>')
            for r in (r for r in tail if r["stream"] == s):
                c = r["class"] or "other"
                tip = f"step {r['step']}'s {cut(r['name'], DOCUMENT)} [{c}] {us(r['end'] - r['start'])}: the previous step's GPU work"
                plot.append(_rect("prev", x(r["start"]), y + 2, (r["end"] - r["start"]) * sx, ROW - 4,
                                  CLASS_COLORS.get(c, "#ccc"), tip, ' fill-opacity="0.45"'))
            for r in (r for r in a if r["stream"] == s):
                c = r["class"] or "other"
                tip = f"{cut(r['name'], DOCUMENT)} [{c}] {us(r['end'] - r['start'])}"
                plot.append(_rect("k", x(r["start"]), y + 2, (r["end"] - r["start"]) * sx, ROW - 4,
                                  CLASS_COLORS.get(c, "#ccc"), tip, f' data-class="{c}"'))
            # the part of each collective spent waiting for the slowest rank, darkened over it
            if waits:
                for r in (r for r in waits if r["stream"] == s):
                    for lo, hi in ((r["start"], r["last_start"]), (r["first_end"], r["end"])):
                        if hi > lo:
                            tip = f"waiting for the slowest rank in {cut(r['name'], DOCUMENT)}: {us(hi - lo)}"
                            plot.append(_rect("wait", x(lo), y + 2, (hi - lo) * sx, ROW - 4, WAIT_COLOR, tip,
                                              ' fill-opacity="0.55"'))
            y += ROW
        # graph replays: a bracket under the device rows per replay (kernels sharing the launch's corr)
        replays: dict = {}  # corr -> {start, end, n}: the replay's first start, last end, kernels
        for r in a:
            if r["graph_node_id"] is not None:
                rep = replays.get(r["corr"])
                if rep is None:
                    replays[r["corr"]] = {"start": r["start"], "end": r["end"], "n": 1}
                else:
                    rep["start"], rep["end"], rep["n"] = min(rep["start"], r["start"]), max(rep["end"], r["end"]), rep["n"] + 1
        if replays:
            for r in sorted(replays.values(), key=lambda r: r["start"]):
                x0, x1 = x(r["start"]), x(r["end"])
                tip = f"graph replay: {plural(r['n'], 'kernel')}, {us(r['end'] - r['start'])}"
                plot.append(f'<path class="graph-replay" data-x0="{x0:.4f}" data-x1="{x1:.4f}" data-y="{y + 1}" '
                            f'd="M{x0:.1f},{y + 1} v4 H{x1:.1f} v-4" stroke="{GRAPH_COLOR}" '
                            f'fill="none" stroke-width="1.5">{_t(tip)}</path>')
            y += 8
    # before the step's begin: hatched over the rank's rows (under the shapes for hovering, over
    # them for the hatch)
    left = v._t0()
    if left < v.begin:
        tip = (f"before step {v.step}'s begin: {us(v.begin - left)} in which the previous step's GPU work "
               f"still ran on GPU {f['device']}; the step's time starts at its end")
        w = (v.begin - left) * sx
        plot.append(_rect("tail-zone", x(left), top, w, y - top, "url(#hatch)", tip,
                                     ' pointer-events="none"'))
        plot.insert(0, _rect("tail", x(left), top, w, y - top, "#f3f3f3", tip))
    return y


TIMELINE_JS = r"""
(function () {
  var svg = document.getElementById("timeline");
  if (!svg) return;
  var d = svg.dataset, L = +d.left, W = +d.plotW, nsPx = +d.nsPerPx, pre = +d.preNs, axisY = +d.axisY;
  var MAXZOOM = 5000, lo = 0, hi = W;  // the window shown, in px of the whole view
  var shapes = [].slice.call(svg.querySelectorAll("#tl-plot rect, #tl-plot path"));
  shapes.forEach(function (e) {
    if (e.tagName === "rect") { e._x = +e.getAttribute("x"); e._w = +(e.getAttribute("data-w") || e.getAttribute("width")); }
  });
  function nice(span) {
    var raw = Math.max(span / 10, 1), mag = Math.pow(10, Math.floor(Math.log10(raw)));
    for (var m of [1, 2, 5, 10]) if (m * mag >= raw) return m * mag;
    return 10 * mag;
  }
  function label(ns) {  // stepscope/render/units.py's tick()
    if (ns === 0) return "0";
    var a = Math.abs(ns), u = [[1e6, "ms"], [1e3, "\u00b5s"], [1, "ns"]];
    for (var i = 0; i < u.length; i++) {
      if (a >= u[i][0] || u[i][0] === 1) {
        var v = ns / u[i][0];
        return (Math.abs(v) < 10 && u[i][0] > 1 && v !== Math.trunc(v) ? v.toFixed(1) : v.toFixed(0)) + " " + u[i][1];
      }
    }
  }
  function axis() {
    var tlo = lo * nsPx - pre, thi = hi * nsPx - pre, step = nice(thi - tlo), z = W / (hi - lo);
    var out = ['<line x1="' + L + '" y1="' + axisY + '" x2="' + (L + W).toFixed(1) + '" y2="' + axisY + '" stroke="#888"/>'];
    for (var k = Math.ceil(tlo / step); k * step <= thi; k++) {
      var t = k * step, x = (L + ((t + pre) / nsPx - lo) * z).toFixed(1);
      out.push('<line x1="' + x + '" y1="0" x2="' + x + '" y2="' + axisY + '" stroke="#000" stroke-opacity="' +
               (t === 0 ? 0.3 : 0.06) + '"/><line x1="' + x + '" y1="' + axisY + '" x2="' + x + '" y2="' + (axisY + 4) +
               '" stroke="#888"/><text class="tick" x="' + x + '" y="' + (axisY + 16) + '" text-anchor="middle">' +
               label(t) + "</text>");
    }
    svg.querySelector("#tl-axis").innerHTML = out.join("");
  }
  function draw() {
    var z = W / (hi - lo);
    var X = function (x) { return (L + (x - L - lo) * z).toFixed(2); };
    shapes.forEach(function (e) {
      if (e.tagName === "rect") {
        e.setAttribute("x", X(e._x));
        e.setAttribute("width", Math.max(e._w * z, 0.6).toFixed(2));
      } else if (e.dataset.x !== undefined) {
        e.setAttribute("d", "M" + X(+e.dataset.x) + "," + e.dataset.y + " l-4,-6 h8 z");
      } else if (e.dataset.x0 !== undefined) {
        e.setAttribute("d", "M" + X(+e.dataset.x0) + "," + e.dataset.y + " v4 H" + X(+e.dataset.x1) + " v-4");
      }
    });
    axis();
    svg.setAttribute("data-window-us", (((lo * nsPx - pre) / 1e3).toFixed(1)) + "," + (((hi * nsPx - pre) / 1e3).toFixed(1)));
  }
  function show(a, b, keep) {
    var w = Math.min(Math.max(b - a, W / MAXZOOM), W);
    a = Math.min(Math.max(a, 0), W - w);
    lo = a; hi = a + w;
    draw();
    if (keep !== false) {
      try { history.replaceState(null, "", lo === 0 && hi === W ? location.pathname + location.search : "#t=" + svg.dataset.windowUs); }
      catch (err) { /* a browser that keeps no history for this page: the view still changes */ }
    }
  }
  function zoom(f, px) {  // by f around the plot x px
    var at = lo + (px - L) / W * (hi - lo), w = (hi - lo) * f;
    show(at - (px - L) / W * w, at - (px - L) / W * w + w);
  }
  function plotX(ev) {
    var r = svg.getBoundingClientRect();
    return (ev.clientX - r.left) * (svg.viewBox.baseVal.width / r.width);
  }
  svg.addEventListener("wheel", function (ev) {
    var px = plotX(ev);
    if (px < L) return;
    if (ev.ctrlKey || ev.metaKey) { ev.preventDefault(); zoom(Math.exp(ev.deltaY * 0.002), px); }
    else if (ev.shiftKey || Math.abs(ev.deltaX) > Math.abs(ev.deltaY)) {
      ev.preventDefault();
      var dx = (ev.deltaX || ev.deltaY) * (hi - lo) / W;
      show(lo + dx, hi + dx);
    }
  }, { passive: false });
  var drag = null;
  svg.addEventListener("pointerdown", function (ev) {
    if (ev.button !== 0 || plotX(ev) < L) return;
    drag = { x: plotX(ev), lo: lo, hi: hi };
    svg.setPointerCapture(ev.pointerId);
    svg.classList.add("dragging");
  });
  svg.addEventListener("pointermove", function (ev) {
    if (!drag) return;
    var dx = (drag.x - plotX(ev)) * (drag.hi - drag.lo) / W;
    show(drag.lo + dx, drag.hi + dx, false);
  });
  function end() { if (drag) { drag = null; svg.classList.remove("dragging"); show(lo, hi); } }
  svg.addEventListener("pointerup", end);
  svg.addEventListener("pointercancel", end);
  svg.addEventListener("dblclick", function () { show(0, W); });
  [].forEach.call(document.querySelectorAll(".tl-tools button"), function (b) {
    b.addEventListener("click", function () {
      var z = b.dataset.zoom;
      if (z === "reset") show(0, W); else zoom(z === "in" ? 0.5 : 2, L + W / 2);
    });
  });
  var m = /^#t=(-?[\d.]+),(-?[\d.]+)$/.exec(location.hash);  // a window in µs from the step's begin
  if (m) show((+m[1] * 1e3 + pre) / nsPx, (+m[2] * 1e3 + pre) / nsPx, false); else draw();
})();
"""


def _panel_name(v: StepView, i: int, n: int) -> str:
    tag = ("A: " if i == 0 else "B: ") if n > 1 else ""
    return f"{tag}{v.label}"


def _legend(gaps: bool, waits: bool = False) -> str:
    items = "".join(f'<span class="sw" style="background:{c}"></span>{k}' for k, c in CLASS_COLORS.items())
    items += f'<br><span class="sw" style="background:{LAUNCH_COLOR}"></span>launch call'
    items += f'<span class="sw" style="background:{GRAPH_COLOR}"></span>graph replay (cudaGraphLaunch ▼, bracket under its kernels)'
    items += f'<span class="sw" style="background:{RANGE_COLOR}"></span>step range'
    items += '<span class="sw hatch"></span>before the step\'s begin (time 0): the previous step\'s GPU work'
    if waits:
        items += (f'<span class="sw" style="background:{WAIT_COLOR};opacity:.55"></span>'
                  "collective waiting for the slowest rank")
    if gaps:
        items += "".join(f'<span class="sw" style="background:{GAP_COLORS[k]};opacity:.5"></span>{GAP_LABELS[k]} gap'
                         for k in GAP_KINDS)
    return f'<div class="sub" id="legend">{items}</div>'


# ---------------------------------------------------------------- class breakdown


def _classes(views: list[StepView]) -> str:
    frames = [v.classes for v in views]
    order = class_order(views)
    vmax = max((max((r["time_ns"] for r in f), default=None) or 1) for f in frames)
    bar_w = 700
    rows = []
    y = 4
    for c in order:
        rows.append(f'<text x="0" y="{y + 12}">{escape(c)}</text>')
        for i, f in enumerate(frames):
            r = next((x for x in f if x["class"] == c), None)
            t = int(r["time_ns"]) if r else 0
            n = int(r["count"]) if r else 0
            w = max(t / vmax * bar_w, 0.5 if t else 0)
            op = "1" if i == 0 else "0.55"
            tag = ("A " if i == 0 else "B ") if len(frames) > 1 else ""
            count = plural(n, "kernel")
            rows.append(f'<rect class="c" x="140" y="{y + 2}" width="{w:.1f}" height="{ROW - 6}" fill="{CLASS_COLORS.get(c, "#ccc")}" '
                        f'fill-opacity="{op}">{_t(f"{tag}{c}: {count}, {us(t)}")}</rect>'
                        f'<text x="{146 + w:.1f}" y="{y + 12}">{tag}{us(t)} · {n}×</text>')
            y += ROW - 2
        y += 4
    svg = (f'<svg id="class-breakdown" class="chart" width="{WIDTH}" height="{y + 4}" '
           f'xmlns="http://www.w3.org/2000/svg">{"".join(rows)}</svg>')
    return svg + _class_table(views, order)


def _framework(views: list[StepView]) -> str:
    """The framework class of each view by op family (and by launching op, with NVTX op ranges)."""
    from stepscope.analysis.classify import FAMILY_LABELS

    parts = []
    for i, v in enumerate(views):
        fam = v.framework
        if not fam:
            continue
        rows = "".join(f"<tr><td>{escape(FAMILY_LABELS.get(r['family'], r['family']))}</td><td>{r['count']}</td>"
                       f"<td>{us(r['time_ns'])}</td></tr>" for r in fam)
        ops = v.framework_ops
        op_rows = "".join(f"<tr><td>{escape(r['op'])}</td><td>{escape(FAMILY_LABELS.get(r['family'], r['family']))}</td>"
                          f"<td>{r['count']}</td><td>{us(r['time_ns'])}</td></tr>" for r in ops[:10])
        advice = v.framework_advice
        parts.append(f'<div><div class="sub">{escape(_panel_name(v, i, len(views)))}: framework glue by op family</div>'
                     f'<table class="framework" id="framework-{i}"><tr><th>op family</th><th>count</th><th>time</th></tr>'
                     f"{rows}</table>"
                     + (f'<table class="framework-ops"><tr><th>launching op</th><th>op family</th><th>launches</th>'
                        f"<th>time</th></tr>{op_rows}</table><p class=\"note\">{escape(advice)}</p>" if ops else "")
                     + "</div>")
    return f'<div class="row">{"".join(parts)}</div>' if parts else ""


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
            cells.append(f"<td>{n}</td><td>{us(t)}</td><td>{share:.1f}%</td>")
        if len(views) == 2:
            cells.append(f"<td>{vals[1][0] - vals[0][0]:+d}</td><td>{us(vals[1][1] - vals[0][1], sign=True)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f'<table id="class-table">{head}{"".join(body)}</table>'


# ---------------------------------------------------------------- gaps


def _gap_histogram(v: StepView, idx: int, n: int) -> str:
    title = _panel_name(v, idx, n)
    g = v.gaps
    if not g:
        return f'<div><div class="sub">{escape(title)}</div><p>no gaps: the GPU was never idle inside this step</p></div>'
    cmap: dict[tuple, tuple[int, int]] = {}  # (log2 bin, kind) -> (gaps, time)
    tot: dict[int, int] = {}                 # log2 bin -> gaps
    tmap: dict[str, tuple[int, int]] = {}    # kind -> (gaps, time)
    for r in g:
        b, k, ns = _log2_bin(r["gap_ns"]), r["kind"], r["gap_ns"]
        nn, t = cmap.get((b, k), (0, 0))
        cmap[(b, k)] = (nn + 1, t + ns)
        tot[b] = tot.get(b, 0) + 1
        nn, t = tmap.get(k, (0, 0))
        tmap[k] = (nn + 1, t + ns)
    lo, hi = min(tot), max(tot)
    nmax = max(tot.values())
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
                         f'fill="{GAP_COLORS[k]}">{_t(f"{GAP_LABELS[k]}: {nn} gaps in [{tick(2 ** b)}, {tick(2 ** (b + 1))}), {us(t)} in all")}</rect>')
        parts.append(f'<text x="{x0 + bw / 2:.1f}" y="{ph + 14}" text-anchor="middle">{tick(2 ** b)}</text>')
    parts.append(f'<line x1="{pad}" y1="{ph}" x2="{w - 10}" y2="{ph}" stroke="#888"/>')
    parts.append(f'<text x="{pad - 4}" y="14" text-anchor="end">{nmax}</text><text x="{pad - 4}" y="{ph}" text-anchor="end">0</text>')
    parts.append(f'<text x="{pad}" y="{ph + 30}">gap length (log₂ bins, lower edge); bar height = number of gaps</text>')
    line = " · ".join(f"{GAP_LABELS[k]} {tmap.get(k, (0, 0))[0]} gaps, {us(tmap.get(k, (0, 0))[1])}" for k in GAP_KINDS)
    return (f'<div><div class="sub">{escape(title)}</div>'
            f'<svg class="chart gap-histogram" width="{max(w, 480)}" height="{ph + 36}" xmlns="http://www.w3.org/2000/svg">'
            f'{"".join(parts)}</svg><div class="sub">{line}</div>{_top_gaps(g)}</div>')


def _log2_bin(gap_ns: int) -> int:
    """The gap's log2 bin (lower edge 2**bin ns), computed as ln(x) / ln(2) like polars' log(2)
    (math.log2 differs from it just below 2**48)."""
    return math.floor(math.log(float(max(gap_ns, 1))) / math.log(2))


def _top_gaps(g: tuple) -> str:
    top = sorted(g, key=lambda r: -r["gap_ns"])[:5]
    rows = "".join(
        f"<tr><td>{GAP_LABELS.get(r['kind'], r['kind'])}</td><td>{us(r['gap_ns'])}</td>"
        f"<td style='text-align:left'><code>{escape(_short(r['prev_name']))}</code> → <code>{escape(_short(r['next_name']))}</code></td>"
        f"<td style='text-align:left'>{escape(str(r.get('next_api') or ''))}</td></tr>"
        for r in top)
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
                        f'height="15" fill="{col}" fill-opacity="{0.9 if j < 2 else 0.25}">{_t(f"{lab}: {ms(val)}")}</rect>'
                        f'<text x="{106 + w:.1f}" y="{y + 13}">{ms(val)}</text>')
        verdict = str(f["verdict"])
        t_launch = f.get("t_launch_ns")
        wait = (v.tp or {}).get("collective_wait_ns")
        device = (f"device work: {ms(v.figures['gpu_busy_ns'])} of GPU busy time less {ms(wait)} of collectives "
                  "waiting for the slowest rank" if wait else "of GPU busy time")
        how = cpu_floor_how(f, v.figures["n_launch_calls"])
        expl = (f"{how} per launch (median inter-launch interval) " if how.endswith(us(t_launch)) else f"{how} ") + \
            f"vs {ms(dev)} {device}"
        overhead = v.profiler_overhead_ns
        oh = (f"; {v.tracer}'s own overhead in this trace: {v.profiler_overhead_count:,} rows, {ms(overhead)}"
              if overhead else "")
        u = v.untraced
        untr = ""
        if u:
            untr = (f'<p class="sub" id="untraced-{i}">untraced ({escape(u["source"].split(":")[0])}): step '
                    f'{ms(u["step_time_ns"])} against {ms(step_t)} under {escape(v.tracer)}; {escape(str(u["verdict"]))}. '
                    f'{escape(u["source"])}</p>')
        blocks.append(
            f'<div><div class="sub">{title}</div><span class="verdict {escape(verdict)}" id="verdict-{i}">{escape(verdict)}</span>'
            f'<span class="sub">{escape(expl)}{escape(oh)}</span>{untr}'
            f'<svg class="chart floors" width="760" height="74" xmlns="http://www.w3.org/2000/svg">{"".join(bars)}</svg>'
            f'{_tp_block(v, i)}</div>')
    return "".join(blocks)


def _tp_block(v: StepView, i: int) -> str:
    """A TP step: its verdict (the binding rank and its cause) and every rank's split."""
    if v.tp is None:
        return ""
    out = ""
    if v.tp.get("tp_verdict"):
        out += f'<p id="tp-verdict-{i}"><b>TP step:</b> {escape(v.tp["tp_verdict"])}</p>'
    head = ("<tr><th>rank</th><th>pid</th><th>GPU</th><th>step</th><th>step time</th><th>collectives</th>"
            "<th>transfer</th><th>waiting</th><th>device floor</th><th>CPU floor</th><th>verdict</th></tr>")
    rows, notes = [], []
    for rv in v.ranks:
        t, f = rv.tp or {}, rv.floors
        rows.append(f"<tr><td>{t.get('rank', '–')}</td><td>{rv.figures['pid']}</td><td>{rv.figures['device']}</td>"
                    f"<td>{rv.step}</td><td>{ms(rv.figures['step_time_ns'])}</td><td>{ms(t.get('collective_ns'))}</td>"
                    f"<td>{ms(t.get('collective_transfer_ns'))}</td><td>{ms(t.get('collective_wait_ns'))}</td>"
                    f"<td>{ms(f['device_floor_ns'])}</td><td>{ms(f['cpu_floor_ns'])}</td><td>{escape(str(f['verdict']))}</td></tr>")
        if t.get("split_note"):
            notes.append(t["split_note"])
    out += f'<table class="ranks" id="ranks-{i}">{head}{"".join(rows)}</table>'
    out += "".join(f'<div class="note">not split into transfer and wait: {escape(n)}</div>' for n in sorted(set(notes)))
    skew = v.tp.get("rank_skew_ns")
    if skew is not None:
        out += f'<div class="sub">rank skew of this TP step: {ms(skew)} (spread of its ranks\' step times)</div>'
    return out


# ---------------------------------------------------------------- tables


def _summary(views: list[StepView]) -> str:
    fields = (("step_time_ns", "step time"), ("gpu_busy_ns", "GPU busy"), ("gpu_span_ns", "GPU span"),
              ("idle_ns", "GPU idle"), ("kernel_time_sum_ns", "Σ kernel time"), ("n_kernels", "kernels"),
              ("n_launch_calls", "launch calls"), ("launch_call_ns", "time in launch calls"))
    head = "<tr><th></th>" + "".join(f"<th>{escape(_panel_name(v, i, len(views)))}</th>" for i, v in enumerate(views)) + "</tr>"
    rows = []
    for key, lab in fields:
        cells = "".join(f"<td>{ms(v.figures[key]) if key.endswith('_ns') else _num(v.figures[key])}</td>" for v in views)
        rows.append(f"<tr><td>{lab}</td>{cells}</tr>")
    layers = "".join(
        f"<td>{v.figures['layers']} × {v.figures['kernels_per_layer']}</td>" if v.figures.get("layers") else "<td>–</td>"
        for v in views)
    rows.append(f"<tr><td>layers × kernels per layer</td>{layers}</tr>")
    phase = "".join(f"<td>{escape(str(v.figures.get('phase') or '–'))}</td>" for v in views)
    rows.append(f"<tr><td>phase</td>{phase}</tr>")
    return f'<table id="summary">{head}{"".join(rows)}</table>'


def _top_kernels(v: StepView, n: int = 15) -> str:
    total = sum(r["time_ns"] for r in v.kernels) or 1
    rows = "".join(
        f"<tr><td><code title='{escape(str(cut(r['demangled'], DOCUMENT)))}'>{escape(_short(r['name'], 90))}</code></td>"
        f"<td>{escape(str(r['class']))}</td><td>{r['count']}</td><td>{us(r['time_ns'])}</td>"
        f"<td>{100 * r['time_ns'] / total:.1f}%</td></tr>"
        for r in v.kernels[:n])
    return (f'<table class="top-kernels"><tr><th>kernel</th><th>class</th><th>count</th><th>time</th><th>share</th></tr>'
            f"{rows}</table>")


def _budget(budget: tuple | None, note: str | None) -> str:
    if budget is None:
        return f'<p class="note">{escape(note)}</p>' if note else ""
    budget = [r for r in budget if r["measured_bytes"] is not None or r["min_bytes"] is not None]
    rows = []
    vmax = max(int(max((r["measured_bytes"] for r in budget if r["measured_bytes"] is not None), default=None) or 1),
               int(max((r["min_bytes"] for r in budget if r["min_bytes"] is not None), default=None) or 1))
    y = 4
    for r in by_measured_bytes(budget):
        m, mn = int(r["measured_bytes"] or 0), int(r["min_bytes"] or 0)  # null: no cell / no minimum
        c = CLASS_COLORS.get(r["class"], "#ccc")
        rows.append(f'<text x="0" y="{y + 12}">{escape(str(r["class"]))}</text>'
                    f'<rect x="140" y="{y + 2}" width="{m / vmax * 700:.1f}" height="7" fill="{c}">{_t(f"measured {nbytes(m)} ({m:,} B)")}</rect>'
                    f'<rect x="140" y="{y + 10}" width="{mn / vmax * 700:.1f}" height="5" fill="#333">{_t(f"minimum {nbytes(mn)} ({mn:,} B)")}</rect>'
                    f'<text x="{146 + m / vmax * 700:.1f}" y="{y + 12}">{nbytes(m)} measured · {nbytes(mn)} minimum'
                    f'{f" · ×{m / mn:.2f}" if mn else ""}</text>')
        y += ROW + 2
    return (f'<svg id="budget" class="chart" width="{WIDTH}" height="{y + 4}" xmlns="http://www.w3.org/2000/svg">'
            f'{"".join(rows)}</svg><div class="sub">coloured bar: bytes measured by ncu; black bar: theoretical minimum'
            f'{"<br>" + escape(note) if note else ""}</div>')


# ---------------------------------------------------------------- page


def capture_html(views) -> str:
    """The capture's own defects (StepView.capture), before the verdict: each figure below is only
    as complete as the capture."""
    lines = list(dict.fromkeys(line for v in views for line in v.capture))
    return "".join(f'<div class="note defect"><b>capture:</b> {escape(line)}</div>' for line in lines)


def verdict_block(blocks) -> str:
    """The verdict block (ReportView.verdict_block: render/headline.py's rows), at the top of the page."""
    rows = "".join(f'<p><b>{escape(label if whose is None else f"{whose}: {label}")}:</b> {escape(text)}</p>'
                   for whose, rs in blocks for label, text in rs)
    return f'<div id="verdict-block">{rows}</div>' if rows else ""


def render_html(view: StepView, other: StepView | None = None, budget: tuple | None = None,
                budget_note: str | None = None, run: dict | None = None, run_steps=(), blocks=(),
                runs: dict | None = None) -> str:
    views = [view] + ([other] if other is not None else [])
    gpu = view.gpu_name
    src = f"{view.trace_format}" + (f" · nsys {view.nsys_version}" if view.nsys_version else "") + (f" · {gpu}" if gpu else "")
    notes = sorted({n for v in views for n in v.notes} | {w for v in views for w in v.warnings})
    title = f"stepscope · {view.label}" + (f" vs {other.label}" if other else "")
    body = [
        f"<h1>{escape(title)}</h1>",
        f'<div class="sub">{escape(src)} · {plural(view.n_steps, "step")} in the trace'
        + "".join(f"<br>{escape(_panel_name(v, i, len(views)))}: {escape(v.chosen)}; delimited by {escape(v.delimiter)}"
                  + "".join(f"<br>{escape(_panel_name(v, i, len(views)))}: {escape(line)}"
                            for line in [phase_line(v.figures)] + class_by_lines(v.kernels) if line)
                  for i, v in enumerate(views)) + "</div>",
        capture_html(views),
        verdict_block(blocks),
        "".join(f'<div class="note">note: {escape(n)}</div>' for n in notes),
        *(["<h2 id=\"run\">The run</h2>", run_html(run, list(run_steps), view.tracer)] if run is not None else []),
        *(["<h2 id=\"runs\">The two runs, by matched steps</h2>", runs_compare_html(runs)] if runs else []),
        "<h2>Summary</h2>", _summary(views),
        '<h2 id="floors">Floors and verdict</h2>', _floors(views),
        "<h2>Timeline</h2>",
        _legend(any(v.gaps is not None for v in views), any(len(v.ranks) > 1 for v in views)),
        _timeline(views),
        "<h2>Class breakdown</h2>", _classes(views), _framework(views),
        "<h2>Gap histogram</h2>",
        '<div class="row" id="gap-histograms">' + "".join(_gap_histogram(v, i, len(views)) for i, v in enumerate(views)) + "</div>",
        "<h2>Top kernels</h2>",
        '<div class="row">' + "".join(f'<div><div class="sub">{escape(_panel_name(v, i, len(views)))}</div>{_top_kernels(v)}</div>'
                                      for i, v in enumerate(views)) + "</div>",
    ]
    if budget is not None or budget_note:
        body += ["<h2>Byte budget</h2>", _budget(budget, budget_note)]
    body.append(f'<p class="sub" id="footer">{escape(footer())} Hover any bar for its exact value.</p>')
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>
<script>window.addEventListener("error",function(e){{document.documentElement.setAttribute("data-js-error",String(e.message))}});</script>
<style>{CSS}</style></head>
<body>
{"".join(body)}
<script>{TIMELINE_JS}</script>
<script>document.body.setAttribute("data-charts",String(document.querySelectorAll("svg.chart").length));
document.body.setAttribute("data-ready","1");</script>
</body></html>
"""


def render(view: ReportView) -> str:
    """The report renderer's protocol (render/report_data.RENDERERS)."""
    return render_html(view.step, view.other, budget=view.budget, budget_note=view.budget_note, run=view.run,
                       run_steps=view.run_steps, blocks=view.verdict_block(), runs=view.runs)


class HtmlRenderer:
    """The self-contained HTML report (the pipeline's Renderer): render(ReportView) as UTF-8."""

    def render(self, view: ReportView) -> bytes:
        return render(view).encode("utf-8")
