"""`stepscope report -o report.html`: a self-contained page, opened in headless Chromium.

The page must load offline with no console errors, mark itself rendered, and hold the expected
charts; the screenshot is kept under the test's tmp folder (and regenerated for the README with
`STEPSCOPE_SCREENSHOT=docs/img/report.png pytest tests/test_report_html.py`).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import polars as pl
import pytest
from tests.conftest import CliRunner

from stepscope.analysis.inventory import analyze_trace
from stepscope.cli import app
from stepscope.ingest import read_trace
from stepscope.render.report_data import pick_step
from tests import kineto_fake
from tests.conftest import EXTERNAL, FIXTURES, need, ro

CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
EAGER = FIXTURES / "llama8b_decode_b1_eager.sqlite"
GRAPH = FIXTURES / "llama8b_decode_b1_graph.sqlite"


def chromium(args: list[str], html: Path, fragment: str = "") -> subprocess.CompletedProcess:
    cmd = [CHROMIUM, "--headless=new", "--disable-gpu", "--no-sandbox", "--no-first-run",
           "--enable-logging=stderr", "--v=0", "--virtual-time-budget=5000", *args, html.resolve().as_uri() + fragment]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=html.parent)


def render(tmp_path: Path, *args: str, name: str = "report.html") -> Path:
    out = tmp_path / name
    r = CliRunner().invoke(app, ["report", *args, "-o", str(out)])
    assert r.exit_code == 0, r.output
    return out


def test_html_is_self_contained(tmp_path):
    out = render(tmp_path, str(need(GRAPH)), "--compare", str(need(EAGER)))
    html = out.read_text()
    assert out.stat().st_size < 1_000_000  # ~420 KB for two 420-kernel steps
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)  # nothing fetched from the network
    assert "<link" not in html and "@import" not in html
    for element in ('id="timeline"', 'id="class-breakdown"', 'id="class-table"', 'id="gap-histograms"',
                    'id="summary"', 'id="verdict-0"', 'id="verdict-1"', 'class="launch graph-launch"', 'class="graph-replay"'):
        assert element in html, element


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (CI installs Debian's chromium)")
def test_html_opens_in_headless_chromium(tmp_path):
    out = render(tmp_path, str(need(GRAPH)), "--compare", str(need(EAGER)))
    dom = chromium(["--dump-dom"], out)
    assert dom.returncode == 0, dom.stderr[-2000:]
    console = [line for line in dom.stderr.splitlines() if ":CONSOLE" in line]
    assert console == [], console
    assert 'data-ready="1"' in dom.stdout
    assert not re.search(r"<html[^>]*data-js-error", dom.stdout)
    assert 'data-charts="' in dom.stdout and int(re.search(r'data-charts="(\d+)"', dom.stdout)[1]) >= 6
    # one rect per GPU activity of each shown step
    n = 0
    for path in (GRAPH, EAGER):
        inv = analyze_trace(read_trace(path))
        n += inv.acts.filter(pl.col("step") == pick_step(inv)).height
    assert dom.stdout.count('class="k"') == n
    shot = Path(os.environ.get("STEPSCOPE_SCREENSHOT") or tmp_path / "report.png").resolve()
    r = chromium([f"--screenshot={shot}", "--window-size=1400,1700", "--hide-scrollbars"], out)
    assert r.returncode == 0, r.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 50_000  # not a blank page


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")
def test_html_of_a_kineto_trace_and_a_foreign_export(tmp_path):
    k = kineto_fake.write(tmp_path / "t.json.gz")
    paths = [render(tmp_path, str(k), "--step-regex", r"^ProfilerStep#\d+$", name="k.html")]
    foreign = EXTERNAL / "nsysai_mfu_2gpu_before.sqlite"
    if foreign.exists():
        paths.append(render(tmp_path, str(foreign), name="f.html"))
    for p in paths:
        dom = chromium(["--dump-dom"], p)
        assert 'data-ready="1"' in dom.stdout
        assert [line for line in dom.stderr.splitlines() if ":CONSOLE" in line] == []


MEASURE = """<script>window.addEventListener('load', () => {
  const svg = document.getElementById('run-chart'), w = svg.width.baseVal.value, out = [];
  svg.querySelectorAll('text').forEach(t => { const b = t.getBBox(); out.push([t.textContent, b.x, b.x + b.width, w]); });
  const p = document.createElement('pre'); p.id = 'measured'; p.textContent = JSON.stringify(out);
  document.body.appendChild(p); });</script>"""


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")
def test_run_chart_labels_inside_the_chart(tmp_path):
    """The run chart's axis labels lie inside its SVG as Chromium lays them out (a whole run's
    longest step, Qwen3-MoE's 1,043 ms JIT-paused one, was labelled `1043 ms` from x = -1.9 px: cut
    at the page's edge); the top label reads as the run's longest step (analyze --json)."""
    import json

    from tests.conftest import gunzipped

    src = gunzipped(FIXTURES / "models" / "qwen3-30b-a3b_r32_graph_plain.sqlite.gz")
    out = render(tmp_path, str(src))
    measured = tmp_path / "measured.html"
    measured.write_text(out.read_text(encoding="utf-8").replace("</body>", MEASURE + "</body>"), encoding="utf-8")
    dom = chromium(["--dump-dom"], measured).stdout
    labels = json.loads(re.search(r'<pre id="measured">(.*?)</pre>', dom, re.S)[1].replace("&quot;", '"'))
    assert len(labels) >= 4
    for text, x0, x1, width in labels:
        assert 0 <= x0 and x1 <= width, (text, x0, x1, width)
    r = CliRunner().invoke(app, ["analyze", str(src), "--json", "--steps", "all", "--no-cache"])
    longest = max(s["step_time_ns"] for s in json.loads(r.stdout)["steps"])
    top = labels[0][0]
    value, unit = top.split()
    assert abs(float(value) * {"s": 1e9, "ms": 1e6, "µs": 1e3}[unit] - longest) <= 0.01 * longest, (top, longest)


def test_markdown_report(tmp_path):
    out = render(tmp_path, str(need(EAGER)), "--compare", str(need(GRAPH)), name="report.md")
    md = out.read_text()
    assert md.startswith("## stepscope: llama8b_decode_b1_eager.sqlite · step 0 vs llama8b_decode_b1_graph.sqlite")
    assert "| gemm | 129 |" in md
    assert "**launch-bound**" in md and "**device-bound**" in md
    for h in ("### Summary", "### Floors and verdict", "### Classes", "### Gaps", "### Top kernels"):
        assert h in md
    assert "docs/DEFINITIONS.md" in md.splitlines()[-1] and "docs/KERNEL_CLASSES.md" in md.splitlines()[-1]
    # every table row has as many cells as its header
    for block in md.split("\n\n"):
        rows = [r for r in block.splitlines() if r.startswith("| ")]
        if rows:
            assert len({r.replace("\\|", "").count("|") for r in rows}) == 1, block


def test_report_bad_inputs(tmp_path):
    k = kineto_fake.write(tmp_path / "t.json")
    r = CliRunner().invoke(app, ["report", str(k), "-o", str(tmp_path / "r.pdf")])
    assert r.exit_code != 0 and ".html or .md" in r.output
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2, 3]")
    r = CliRunner().invoke(app, ["report", str(bad), "-o", str(tmp_path / "r.html")])
    assert r.exit_code != 0 and "not a PyTorch-profiler" in r.output
    assert not (tmp_path / "r.html").exists()
    r = CliRunner().invoke(app, ["report", str(k), "--step", "99", "--step-regex", r"^ProfilerStep#\d+$",
                                 "-o", str(tmp_path / "r.html")])
    assert r.exit_code != 0 and "no step 99" in r.output
    r = CliRunner().invoke(app, ["report", str(k), "-o", str(tmp_path / "missing" / "r.html"),
                                 "--step-regex", r"^ProfilerStep#\d+$"])
    assert r.exit_code != 0 and "does not exist" in r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.json", "t.json"]


def test_cells_byte_budget_section(tmp_path):
    """--cells: the byte budget per class (issue 5), or a note when this build lacks it."""
    inv = analyze_trace(read_trace(need(EAGER)))
    try:
        from stepscope.bytes.budget import step_kernels_from_inventory
        from stepscope.bytes.cells import frame, write_cells
    except ImportError:
        k = kineto_fake.write(tmp_path / "t.json")
        out = render(tmp_path, str(k), "--step-regex", r"^ProfilerStep#\d+$", "--cells", str(tmp_path / "c.parquet"))
        assert "byte budget unavailable" in out.read_text()
        return
    # a stand-in cells table: every launch configuration of the step measured at 1 MB read + 1 KB written
    sk = step_kernels_from_inventory(inv, 0)
    rows = [dict(gpu="NVIDIA H200", model="llama-3.1-8b", cell=f"c{i}", kernel=r["demangled"] or r["name"],
                 launch=0, tokens=1, matched=True, dram_read_bytes=1_000_000, dram_write_bytes=1000,
                 duration_ns=1000, **{d: r[d] for d in ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z")})
            for i, r in enumerate(sk.iter_rows(named=True))]
    cells = write_cells(frame(rows), tmp_path / "cells")[0]
    html = render(tmp_path, str(EAGER), "--cells", str(cells)).read_text()
    assert 'id="budget"' in html and "Byte budget" in html
    md = render(tmp_path, str(EAGER), "--cells", str(cells), name="r.md").read_text()
    calls = sk["count"].sum()
    measured = (1_000_000 + 1000) * calls
    assert f"step: {measured / 1e6:.2f} MB measured" in md  # 420 calls × 1.001 MB = 420.42 MB
    assert "| gemm | 129.13 MB |" in md  # 129 GEMM calls × 1.001 MB


EAGER_TP2 = FIXTURES / "llama8b_decode_b1_eager_tp2.sqlite"

# Plain SQL: the i-th NCCL kernel of each device is one collective; a kernel waits before the
# last device's start and after the first device's end.
WAIT_PARTS_SQL = """
WITH k AS (SELECT deviceId AS dev, k.start, k.end, ROW_NUMBER() OVER (PARTITION BY deviceId ORDER BY k.start) AS i
           FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName WHERE s.value LIKE 'nccl%'),
     m AS (SELECT i, max(start) AS ls, min(end) AS fe FROM k GROUP BY i)
SELECT sum(k.start < m.ls) + sum(m.fe < k.end) FROM k JOIN m USING (i)
"""


def test_html_tp_timeline_shows_every_rank(tmp_path):

    out = render(tmp_path, str(need(EAGER_TP2)))
    html = out.read_text()
    con = ro(EAGER_TP2)
    ranks = con.execute("""SELECT DISTINCT deviceId, (globalPid >> 24) & 16777215 FROM CUPTI_ACTIVITY_KIND_KERNEL
                           ORDER BY deviceId""").fetchall()
    for dev, pid in ranks:
        assert f"rank {dev} · pid {pid} · GPU {dev}" in html
        assert f"GPU {dev} · stream 7" in html
    # every GPU activity of both ranks' steps is drawn (each rank's step holds all of its rows here)
    n = con.execute("SELECT (SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL) + "
                    "(SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMSET)").fetchone()[0]
    assert html.count('class="k"') == n
    assert html.count('class="wait"') == con.execute(WAIT_PARTS_SQL).fetchone()[0]
    assert 'id="tp-verdict-0"' in html and "launch-bound: rank 1&#x27;s host" in html
    assert html.count("<tr><td>0</td><td>798</td>") == 1 and html.count("<tr><td>1</td><td>799</td>") == 1


def test_markdown_tp_ranks_table(tmp_path):
    out = render(tmp_path, str(need(EAGER_TP2)), name="tp.md")
    md = out.read_text()
    assert "**TP step:** launch-bound: rank 1's host" in md
    assert "| 0 | 798 | 0 | 1 |" in md and "| 1 | 799 | 1 | 0 |" in md
    for block in md.split("\n\n"):
        rows = [r for r in block.splitlines() if r.startswith("| ")]
        if rows:
            assert len({r.replace("\\|", "").count("|") for r in rows}) == 1, block


# --- the timeline: time 0 at step_begin, the previous step's tail hatched, zoom and pan ---------

from stepscope.render.html import LEFT, WIDTH, _ticks  # noqa: E402
from stepscope.render.units import tick  # noqa: E402

PLOT_W = WIDTH - LEFT - 10


def _timeline_attrs(html: str) -> dict:
    svg = re.search(r'<svg id="timeline"[^>]*>', html)[0]
    return {k: float(v) for k, v in re.findall(r'data-(ns-per-px|pre-ns|plot-w|left)="([^"]+)"', svg)}


def _kernel_xs(html: str) -> list[float]:
    return [float(x) for x in re.findall(r'<rect class="k" x="([^"]+)"', html)]


def _tick_labels(html: str) -> list[str]:
    axis = re.search(r'<g id="tl-axis">(.*?)</g>', html, re.S)[1]
    return re.findall(r'<text class="tick"[^>]*>([^<]*)</text>', axis)


# the graph step's GPU activities (420 kernels and a memset, all on stream 7) and its NVTX range
GRAPH_STARTS_SQL = ("SELECT start FROM (SELECT start FROM CUPTI_ACTIVITY_KIND_KERNEL UNION ALL "
                    "SELECT start FROM CUPTI_ACTIVITY_KIND_MEMSET) ORDER BY start")
GRAPH_RANGE_SQL = "SELECT start FROM NVTX_EVENTS WHERE text LIKE 'step phase=%'"


def test_timeline_time_zero_is_the_step_begin(tmp_path):
    """The graph step's range starts its time (no earlier GPU work): 0 sits at the plot's left
    edge and each activity at (its start − the NVTX range start) on the axis; plain SQL on the export."""
    html = render(tmp_path, str(need(GRAPH))).read_text()
    a = _timeline_attrs(html)
    assert a["pre-ns"] == 0 and a["left"] == LEFT and a["plot-w"] == PLOT_W
    con = ro(GRAPH)
    (begin,) = con.execute(GRAPH_RANGE_SQL).fetchone()
    starts = [s for (s,) in con.execute(GRAPH_STARTS_SQL)]
    xs = _kernel_xs(html)
    assert len(xs) == len(starts) == 421
    for s, x in zip(starts, xs):
        assert abs(x - (LEFT + (s - begin) / a["ns-per-px"])) < 1e-3
    assert _tick_labels(html)[0] == "0" and "6 ms" not in _tick_labels(html)
    assert 'class="tail' not in html and 'class="prev"' not in html  # nothing came before it


def test_the_previous_steps_tail_is_hatched(tmp_path):
    """Step 17 of the 2-GPU nsys-ai capture launches its first kernels while step 16's GPU work
    still runs: the timeline starts at that launch, left of 0, hatched, with step 16's work."""
    path = need(EXTERNAL / "nsysai_mfu_2gpu_before.sqlite")
    html = render(tmp_path, str(path), "--steps", "17").read_text()
    inv = analyze_trace(read_trace(path))
    s = inv.steps.filter(pl.col("step") == 17).row(0, named=True)
    first_launch = inv.launch_calls.filter(pl.col("step") == 17)["start"].min()
    left = min(first_launch, s["first_start"], s["step_begin"])
    assert s["step_begin"] - left > 50_000  # more than 50 µs of tail
    a = _timeline_attrs(html)
    assert a["pre-ns"] == s["step_begin"] - left
    zone = re.search(r'<rect class="tail-zone" x="([^"]+)" y="[^"]+" width="([^"]+)"', html)
    assert float(zone[1]) == LEFT and abs(float(zone[2]) - a["pre-ns"] / a["ns-per-px"]) < 1e-3
    prev = inv.acts.filter((pl.col("device") == s["device"]) & (pl.col("step") != 17) & (pl.col("end") > left)
                           & (pl.col("start") < s["step_begin"]))
    assert prev.height >= 1 and set(prev["step"].to_list()) == {16}
    assert html.count('class="prev"') == prev.height
    zero = re.search(r'<text class="tick" x="([^"]+)"[^>]*>0</text>', html)
    assert abs(float(zero[1]) - (LEFT + a["pre-ns"] / a["ns-per-px"])) < 0.05  # 0 is the step's begin


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")
def test_timeline_zooms_to_the_window_in_the_address(tmp_path):
    out = render(tmp_path, str(need(GRAPH)))
    html = out.read_text()
    a = _timeline_attrs(html)
    # unzoomed, the script redraws what the page was written with
    dom = chromium(["--dump-dom"], out).stdout
    assert 'data-ready="1"' in dom and not re.search(r"<html[^>]*data-js-error", dom)
    assert _tick_labels(dom) == _tick_labels(html) == [tick(t) for t in _ticks(0, PLOT_W * a["ns-per-px"])]
    assert all(abs(x - y) < 0.01 for x, y in zip(_kernel_xs(dom), _kernel_xs(html)))
    # #t=1000,2000: the second millisecond of the step fills the plot
    dom = chromium(["--dump-dom"], out, "#t=1000,2000").stdout
    assert 'data-window-us="1000.0,2000.0"' in dom and not re.search(r"<html[^>]*data-js-error", dom)
    assert _tick_labels(dom) == [tick(t) for t in _ticks(1e6, 2e6)] == ["1 ms", "1.1 ms", "1.2 ms", "1.3 ms", "1.4 ms",
                                                                         "1.5 ms", "1.6 ms", "1.7 ms", "1.8 ms",
                                                                         "1.9 ms", "2 ms"]
    con = ro(GRAPH)
    (begin,) = con.execute(GRAPH_RANGE_SQL).fetchone()
    starts = [s for (s,) in con.execute(GRAPH_STARTS_SQL)]
    for s, x in zip(starts, _kernel_xs(dom)):  # every kernel where the window puts it, to 0.02 px
        assert abs(x - (LEFT + (s - begin - 1e6) * PLOT_W / 1e6)) < 0.02, s
