"""Rich terminal report: one table per step kind, the class breakdown and a coverage line."""

from __future__ import annotations

import polars as pl
from rich.console import Console
from rich.table import Table

from stepscope.analysis.classify import CLASSES
from stepscope.analysis.inventory import Inventory
from stepscope.paths import shown
from stepscope.render.names import term


def us(ns) -> str:
    return "–" if ns is None else f"{ns / 1e3:,.1f}"


def ms(ns) -> str:
    return "–" if ns is None else f"{ns / 1e6:,.3f} ms"


def step_kinds(inv: Inventory, ids: list[int]) -> list[tuple[dict, list[int]]]:
    """Steps grouped by kind: same process, device, delimiter, phase and kernel count."""
    s = inv.steps.filter(pl.col("step").is_in(ids))
    kinds = []
    for _, grp in s.group_by(["pid", "device", "delimiter", "phase", "n_kernels"], maintain_order=True):
        kinds.append((grp.row(0, named=True), grp["step"].to_list()))
    return kinds


def verdict_line(diag, step: int) -> str:
    """One sentence for the top of a step's report: the bound, the fix, where GPU time goes."""
    f = diag.step_sections(step)["floors"]
    s = diag.inv.steps.filter(pl.col("step") == step).row(0, named=True)
    c = diag.inv.classes.filter(pl.col("step") == step).sort("time_ns", descending=True)
    total = c["time_ns"].sum() or 1
    top = c.row(0, named=True) if c.height else None
    phase = s["phase"] or "this"
    out = f"{phase} step is {f['verdict']} ({ms(s['step_time_ns'])})"
    pred = f.get("predicted_graph_step_time_ns")
    if f["verdict"] == "launch-bound" and pred is not None and pred < s["step_time_ns"]:
        out += f"; CUDA graphs would cut it to about {ms(pred)}"
    elif f["verdict"] == "device-bound":
        out += f"; the GPU is busy {100 * s['gpu_busy_ns'] / max(s['step_time_ns'], 1):.0f}% of it"
    if top:
        out += f"; {top['class']} holds {100 * top['time_ns'] / total:.0f}% of GPU time"
    return out + "."


def render_analyze(inv: Inventory, ids: list[int], console: Console | None = None, extra=None,
                   headline=None) -> None:
    console = console or Console()
    t = inv.trace
    console.print(f"[bold]{term(shown(t.path), 1000)}[/]  nsys {term(t.nsys_version or '?')} · schema "
                  f"{term(t.schema_version or '?')}"
                  f" · {int(inv.acts['is_kernel'].sum()):,} kernels · {len(inv.step_ids())} steps")
    for g in t.gpus.iter_rows(named=True):
        console.print(f"  GPU {g['device']}: {term(g['name'])} ({g['sm_count']} SMs)")
    for w in inv.warnings:
        console.print(f"[yellow]warning:[/] {term(w, 2000)}")
    for first, members in step_kinds(inv, ids):
        _render_kind(inv, first, members, console, headline)
        if extra is not None:
            extra(first["step"], members, console)


def _render_kind(inv: Inventory, first: dict, members: list[int], console: Console, headline=None) -> None:
    s = inv.steps.filter(pl.col("step").is_in(members))
    med = {c: s[c].median() for c in ("step_time_ns", "gpu_busy_ns", "gpu_span_ns", "idle_ns",
                                      "kernel_time_sum_ns", "n_launch_calls", "launch_call_ns")}
    phase = first["phase"] or "phase unknown"
    title = (f"{phase} step · {first['delimiter']} “{term(first['name'])}” · pid {first['pid']} · "
             f"device {first['device']} · {len(members)} step(s)")
    console.rule(f"[bold]{title}")
    if headline is not None:
        console.print(f"[bold]Verdict:[/] {term(headline(first['step']), 2000)}")
    layers = f"{first['layers']} layers × {first['kernels_per_layer']} kernels" if first["layers"] else "no layer pattern"
    console.print(
        f"step time {ms(med['step_time_ns'])} · GPU busy {ms(med['gpu_busy_ns'])} · span "
        f"{ms(med['gpu_span_ns'])} · idle {ms(med['idle_ns'])} · {first['n_kernels']} kernels "
        f"({layers}) · {int(med['n_launch_calls'])} launch calls, {ms(med['launch_call_ns'])} in them"
        + ("  [dim](medians over the steps of this kind)[/]" if len(members) > 1 else ""))
    c = inv.classes.filter(pl.col("step") == first["step"])
    total = c["time_ns"].sum() or 1
    table = Table(show_edge=False, header_style="bold")
    for col, j in (("class", "left"), ("count", "right"), ("time µs", "right"), ("mean µs", "right"),
                   ("share", "right")):
        table.add_column(col, justify=j)
    order = {k: i for i, k in enumerate(CLASSES)}
    for r in sorted(c.iter_rows(named=True), key=lambda r: (-r["time_ns"], order.get(r["class"], 99))):
        table.add_row(r["class"], str(r["count"]), us(r["time_ns"]), us(r["time_ns"] / r["count"]),
                      f"{100 * r['time_ns'] / total:.1f}%")
    console.print(table)
    other = inv.kernels.filter((pl.col("step") == first["step"]) & (pl.col("class") == "other"))
    share = other["time_ns"].sum() / total
    console.print(f"coverage: {100 * (1 - share):.1f}% of GPU time classified"
                  + (f"; other {100 * share:.1f}%:" if other.height else ""))
    for r in other.head(10).iter_rows(named=True):
        console.print(f"  other  {100 * r['time_ns'] / total:5.1f}%  ×{r['count']}  {term(r['name'])}")
    if other.height > 10:
        console.print(f"  … and {other.height - 10} more unclassified kernel names (see --json)")


def render_diagnosis(diag, step: int, console: Console) -> None:
    """Gaps by kind, launch overhead and the Equation 1.3 verdict of one step."""
    sec = diag.step_sections(step)
    g, f, lau = sec["gaps"], sec["floors"], sec["launch"]
    table = Table(show_edge=False, header_style="bold", title="GPU idle by cause", title_justify="left")
    for col in ("gap kind", "count", "time µs"):
        table.add_column(col, justify="left" if col == "gap kind" else "right")
    for kind in ("host_bound", "sync", "device_side"):
        table.add_row(kind.replace("_", "-"), str(g[kind]["count"]), us(g[kind]["time_ns"]))
    console.print(table)
    _render_histogram(g["histogram"], console)
    for r in g["top"][:3]:
        console.print(f"  gap {us(r['gap_ns'])} µs ({r['kind'].replace('_', '-')}): {term(r['prev_name'])} → "
                      f"{term(r['next_name'])}" + (f" [dim]launched by {term(r['next_api'])}[/]" if r["next_api"] else ""))
    if lau.get("interval_median_ns") is not None:
        console.print(f"host inter-launch interval: median {us(lau['interval_median_ns'])} µs, "
                      f"p90 {us(lau['interval_p90_ns'])} µs · launch latency median "
                      f"{us(lau.get('latency_median_ns'))} µs")
    po = lau["profiler_overhead"]
    if po["count"]:
        console.print(f"[dim]nsys's own overhead in this trace: {po['count']} records, {ms(po['time_ns'])} "
                      "(host cost per launch is inflated by tracing)[/]")
    bound = f["verdict"]
    colour = "red" if bound == "launch-bound" else "green"
    console.print(
        f"[bold {colour}]{bound}[/]: CPU floor {ms(f['cpu_floor_ns'])} (launch calls × "
        f"{us(f['t_launch_ns'])} µs) vs device floor {ms(f['device_floor_ns'])} (GPU busy); "
        f"host-bound gaps cost {ms(f['host_bound_gap_ns'])}")
    pred = f.get("predicted_graph_step_time_ns")
    step_ns = diag.inv.steps.filter(pl.col("step") == step)["step_time_ns"][0]
    if pred is not None and pred < step_ns:
        from stepscope.analysis.whatif import DEFAULT

        console.print(f"[bold]what-if CUDA graph:[/] this step would take about {ms(pred)} instead of "
                      f"{ms(step_ns)} (device work + {DEFAULT.node_gap_ns / 1e3:.2f} µs per graph node "
                      f"+ {ms(DEFAULT.graph_launch_lead_ns)} graph launch, measured on H200 graph captures)")


DECADES = ((0, 1_000, "< 1 µs"), (1_000, 10_000, "1–10 µs"), (10_000, 100_000, "10–100 µs"),
           (100_000, 1_000_000, "0.1–1 ms"), (1_000_000, None, "≥ 1 ms"))


def _render_histogram(hist: list[dict], console: Console) -> None:
    """The log₂ gap histogram of the JSON, folded into decades for the terminal."""
    if not hist:
        return
    kinds = ("host_bound", "sync", "device_side")
    t = Table(show_edge=False, header_style="bold", title="gaps by length", title_justify="left")
    t.add_column("length")
    for k in kinds:
        t.add_column(k.replace("_", "-"), justify="right")
    for lo, hi, label in DECADES:
        cells = []
        for k in kinds:
            n = sum(b["count"] for b in hist if b["kind"] == k and b["bin_lo_ns"] >= lo
                    and (hi is None or b["bin_lo_ns"] < hi))
            cells.append(str(n) if n else "·")
        if any(c != "·" for c in cells):
            t.add_row(label, *cells)
    console.print(t)


def render_compare(doc: dict, console: Console | None = None) -> None:
    console = console or Console()
    a, b = doc["a"], doc["b"]
    console.rule(f"[bold]A {term(a['path'])}  vs  B {term(b['path'])}")
    t = Table(show_edge=False, header_style="bold")
    for col in ("figure (median per step)", "A", "B", "B − A"):
        t.add_column(col, justify="left" if col.startswith("figure") else "right")
    rows = [("step time", "step_time_ns"), ("GPU busy", "gpu_busy_ns"), ("GPU idle", "idle_ns"),
            ("CPU floor", "cpu_floor_ns"), ("device floor", "device_floor_ns")]
    for label, k in rows:
        t.add_row(label, ms(a[k]), ms(b[k]), ms(b[k] - a[k]))
    for kind in ("host_bound", "sync", "device_side"):
        va, vb = a["idle_by_kind_ns"][kind], b["idle_by_kind_ns"][kind]
        t.add_row(f"  idle {kind.replace('_', '-')}", ms(va), ms(vb), ms(vb - va))
    t.add_row("kernels", str(a["n_kernels"]), str(b["n_kernels"]), str(b["n_kernels"] - a["n_kernels"]))
    t.add_row("launch calls", str(a["n_launch_calls"]), str(b["n_launch_calls"]),
              str(b["n_launch_calls"] - a["n_launch_calls"]))
    t.add_row("verdict", a["verdict"], b["verdict"], "")
    console.print(t)
    c = Table(show_edge=False, header_style="bold", title="per class (time per step)", title_justify="left")
    for col in ("class", "A µs", "B µs", "Δ µs", "A count", "B count"):
        c.add_column(col, justify="left" if col == "class" else "right")
    for cls, r in sorted(doc["classes"].items(), key=lambda kv: -abs(kv[1]["delta_time_ns"])):
        c.add_row(cls, us(r["a_time_ns"]), us(r["b_time_ns"]), us(r["delta_time_ns"]),
                  f"{r['a_count']:g}", f"{r['b_count']:g}")
    console.print(c)
    for label, key in (("added in B", "kernels_added"), ("removed in B", "kernels_removed")):
        names = doc[key]
        if names:
            listed = ", ".join(f"{term(n['name'])} ×{n['count_per_step']:g}" for n in names[:6])
            console.print(f"kernels {label}: {listed}" + (f" … (+{len(names) - 6})" if len(names) > 6 else ""))
    console.print(f"[bold]speedup (A/B): {doc['speedup']}×[/]")
    console.print(term(doc["verdict"], 2000))


def render_tp(doc: dict, console: Console | None = None) -> None:
    console = console or Console()
    t = Table(show_edge=False, header_style="bold", title="Equation 1.3 per TP width", title_justify="left")
    for col in ("TP", "CPU floor", "device floor", "step", "bound"):
        t.add_column(col, justify="left" if col == "bound" else "right")
    for r in doc["projection"]:
        colour = "red" if r["bound"] == "launch-bound" else "green"
        t.add_row(str(r["tp"]), ms(r["cpu_floor_ns"]), ms(r["device_floor_ns"]), ms(r["step_time_ns"]),
                  f"[{colour}]{r['bound']}[/]")
    console.print(t)
    w = doc["launch_bound_from_tp"]
    console.print(f"[bold]launch-bound from TP={w}[/]: beyond it, more GPUs do not shorten the step"
                  if w else "device-bound at every width projected")
    for n in doc["notes"]:
        console.print(f"[dim]{term(n, 2000)}[/]")
    if "ranks" in doc:
        r = Table(show_edge=False, header_style="bold", title="ranks", title_justify="left")
        for col in ("pid", "device", "step", "NCCL", "NCCL waiting"):
            r.add_column(col, justify="right")
        for x in doc["ranks"]:
            r.add_row(str(x["pid"]), str(x["device"]), ms(x["step_time_ns"]), ms(x["comm_time_ns"]),
                      ms(x["comm_wait_ns"]))
        console.print(r)
        console.print(f"rank skew: {ms(doc['rank_skew_ns'])}")
