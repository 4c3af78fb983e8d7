"""Rich terminal report: one table per step kind, the class breakdown and a coverage line."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from stepscope.analysis.step_view import HeadFigures, KindFigures, StepDiagnosis, tracer_name
from stepscope.paths import shown
from stepscope.render.headline import step_rows, verdict_line  # noqa: F401 (verdict_line: the tests' name)
from stepscope.render.console import Col, fitted, page, plural
from stepscope.render.names import cut, term
from stepscope.render.report_data import class_by_lines, framework_lines, phase_line
from stepscope.render.units import ms, ms_num, seconds, us, us_num


MAX_KIND_SECTIONS = 3  # a run of more kinds shows its per-kind sections on request (--kinds)


class TerminalRenderer:
    """`stepscope analyze` on the terminal (the pipeline's Renderer): render(result) is the text
    render_steps prints, on `console` (default: page()), as UTF-8; `kinds`: --kinds."""

    def __init__(self, console: Console | None = None, kinds: bool = False):
        self.console, self.kinds = console, kinds

    def render(self, result) -> bytes:
        console = self.console or page()
        with console.capture() as out:
            render_steps(result, console, kinds=self.kinds)
        return out.get().encode("utf-8")


def render_steps(result, console: Console | None = None, kinds: bool = False) -> None:
    """`analyze` on the terminal: the run view first when the trace is a run (`result.run`,
    analysis/run.py), then each kind of step told by its representative step, with its verdict
    and diagnosis (the pipeline's Result, its views computed: library.analyze(..., views=True))
    — for a run of more than MAX_KIND_SECTIONS kinds only when `kinds` asks."""
    console = console or page()
    run, n_kinds = result.run, len(result.kinds)
    show = run is None or kinds or n_kinds <= MAX_KIND_SECTIONS
    views, figures = result.views, result.figures
    if result.head is None or (show and any(first["step"] not in views or first["step"] not in figures
                                            for first, _ in result.kinds)):
        raise ValueError("the Result holds no step views for the terminal: analyze it with views=True")
    _render_head(result.inventory, result.head, console, run)
    for first, members in (result.kinds if show else ()):
        _render_kind(first, figures[first["step"]], list(members), console, lambda step: verdict_line(views[step]))
        render_diagnosis(views[first["step"]], console)
    if not show:
        console.print(f"[dim]{n_kinds} kinds of step (process, delimiter, phase, kernel count): "
                      "--kinds shows each one's verdict and diagnosis[/]")


def startup_line(row: dict) -> str:
    """A serving run's start-up in one line (analysis/startup.py)."""
    what = row["evidence"] or "CUDA work before the first step"
    return (f"engine start-up {seconds(row['duration_ns'])} (pid {row['pid']}): {what}; longest pause "
            f"{seconds(row['longest_pause_ns'])}, GPU busy {ms(row['gpu_busy_ns'])}; left out of the steps")


def _render_head(inv, head: HeadFigures, console: Console, run: dict | None) -> None:
    t = inv.trace
    # a torch.profiler trace is not labelled as nsys's: its format and version say what wrote it
    source = (f"nsys {term(t.nsys_version or '?')} · schema {term(t.schema_version or '?')}"
              if t.format.startswith("nsys") else
              f"torch.profiler trace · {term(t.schema_version or t.format)}" if t.format == "kineto-json" else term(t.format))
    console.print(f"[bold]{term(shown(t.path), 1000)}[/]  {source}"
                  f" · {plural(head.n_kernels, 'kernel')} · {plural(head.n_steps, 'step')}")
    for g in t.gpus.iter_rows(named=True):
        console.print(f"  GPU {g['device']}: {term(g['name'])} ({g['sm_count']} SMs)")
    from stepscope.render.capture import defect_line, defect_rows, shown_warnings

    for row in defect_rows(inv):  # the capture's own defects come before anything read from it
        console.print(f"[bold red]capture:[/] {term(defect_line(row), 2000)}")
    for w in shown_warnings(inv):
        console.print(f"[yellow]warning:[/] {term(w, 2000)}")
    for row in inv.startup.iter_rows(named=True):
        console.print(term(startup_line(row), 2000))
    if run is not None:
        from stepscope.render.run import render_run

        render_run(run, console, tracer=tracer_name(t.format))


def _render_kind(first: dict, k: KindFigures, members: list[int], console: Console, headline=None) -> None:
    """One kind of step, told by its representative step `first` (its class breakdown `k`): the
    verdict, the figures, the classes and the diagnosis are all that one step's."""
    med = first
    phase = first["phase"] or "phase unknown"
    # the rule says which kind; the range's name (as long as a step's shape in words) under it
    console.rule(f"[bold]{phase} step · pid {first['pid']} · device {first['device']} · {plural(len(members), 'step')}")
    console.print(f"{first['delimiter']} “{term(first['name'])}”")
    evidence = phase_line(first)
    if evidence:
        console.print(f"[dim]{term(evidence, 2000)}[/]")
    if headline is not None:
        console.print(f"[bold]Verdict:[/] {term(headline(first['step']), 2000)}")
    layers = f"{first['layers']} layers × {first['kernels_per_layer']} kernels" if first["layers"] else "no layer pattern"
    console.print(
        f"step time {ms(med['step_time_ns'])} · GPU busy {ms(med['gpu_busy_ns'])} · span "
        f"{ms(med['gpu_span_ns'])} · idle {ms(med['idle_ns'])} · {first['n_kernels']} kernels "
        f"({layers}) · {plural(int(med['n_launch_calls']), 'launch call')}, {ms(med['launch_call_ns'])} in them"
        + (f"  [dim](step {first['step']}: the median by step time of the {len(members)} steps of this kind)[/]"
           if len(members) > 1 else ""))
    total = k.class_time_ns
    table = Table(show_edge=False, header_style="bold")
    for col, j in (("class", "left"), ("count", "right"), ("time µs", "right"), ("mean µs", "right"),
                   ("share", "right")):
        table.add_column(col, justify=j)
    for r in k.classes:
        table.add_row(r["class"], str(r["count"]), us_num(r["time_ns"]), us_num(r["time_ns"] / r["count"]),
                      f"{100 * r['time_ns'] / total:.1f}%")
    console.print(table)
    for line in class_by_lines(k.kernels):
        console.print(f"[dim]{term(line, 2000)}[/]")
    for line in framework_lines(k.framework, k.framework_ops):
        console.print(term(line, 2000))
    other = k.other
    share = k.other_time_ns / total
    console.print(f"coverage: {100 * (1 - share):.1f}% of GPU time classified"
                  + (f"; other {100 * share:.1f}%:" if other else ""))
    for r in other[:10]:
        console.print(f"  other  {100 * r['time_ns'] / total:5.1f}%  ×{r['count']}  {term(r['name'])}")
    if len(other) > 10:
        console.print(f"  … and {len(other) - 10} more unclassified kernel names (see --json)")


def render_diagnosis(v: StepDiagnosis, console: Console) -> None:
    """Gaps by kind, launch overhead and the Equation 1.3 verdict of one step."""
    f, lau = v.floors, v.launch
    table = Table(show_edge=False, header_style="bold", title="GPU idle by cause", title_justify="left")
    for col in ("gap kind", "count", "time µs"):
        table.add_column(col, justify="left" if col == "gap kind" else "right")
    for kind in ("host_bound", "sync", "device_side", "host_pause"):
        if kind == "host_pause" and not v.gaps[kind]["count"]:
            continue  # a row only where the launching thread paused (analysis/pauses.py)
        table.add_row(kind.replace("_", "-"), str(v.gaps[kind]["count"]), us_num(v.gaps[kind]["time_ns"]))
    console.print(table)
    _render_histogram(v.histogram, console)
    for r in v.top_gaps[:3]:
        console.print(f"  gap {us(r['gap_ns'])} ({r['kind'].replace('_', '-')}): {term(r['prev_name'])} → "
                      f"{term(r['next_name'])}" + (f" [dim]launched by {term(r['next_api'])}[/]" if r["next_api"] else ""))
    if lau.get("interval_median_ns") is not None:
        console.print(f"host inter-launch interval: median {us(lau['interval_median_ns'])}, "
                      f"p90 {us(lau['interval_p90_ns'])} · launch latency median "
                      f"{us(lau.get('latency_median_ns'))}")
    po = v.profiler_overhead
    if po["count"]:
        console.print(f"[dim]nsys's own overhead in this trace: {po['count']} records, {ms(po['time_ns'])} "
                      "(host cost per launch is inflated by tracing)[/]")
    tp = v.tp
    if tp:
        _render_collectives(tp, console)
    bound = f["verdict"]
    colour = "red" if bound == "launch-bound" else "green"
    wait = (tp or {}).get("collective_wait_ns")
    busy = v.gpu_busy_ns
    device = (f"GPU busy {ms(busy)} − collective wait {ms(wait)}" if wait else "GPU busy")
    from stepscope.render.sentences import cpu_floor_how, pause_phrase

    how = cpu_floor_how(f, v.n_launch_calls) if v.n_launch_calls else f"launch calls × {us(f['t_launch_ns'])}"
    console.print(
        f"[bold {colour}]{bound}[/]: CPU floor {ms(f['cpu_floor_ns'])} ({how}) vs device floor "
        f"{ms(f['device_floor_ns'])} ({device}); host-bound gaps cost {ms(f['host_bound_gap_ns'])}"
        + (f"; host pauses {ms(f['host_pause_ns'])}" if f.get("host_pause_ns") else ""))
    p = pause_phrase(f, v.step_time_ns)
    if p:
        console.print(f"host pause: {p} (DEFINITIONS.md, \"Host pauses\")")
    # the verdict block's other rows (render/headline.py), the verdict itself being the headline
    for label, text in step_rows(v)[1:]:
        if label.endswith((", how", ", note")):
            console.print(f"[dim]  {term(text, 2000)}[/]")
        elif label.startswith(("what-if", "vLLM")):
            console.print(f"[bold]{label}:[/] {term(text, 2000)}")
        else:
            console.print(f"{label}: {term(text, 2000)}")


def _render_collectives(tp: dict, console: Console) -> None:
    """A rank's collective time, split into transfer and waiting (or why it cannot be)."""
    head = f"collectives, rank {tp['rank']} of {tp['ranks']}: {tp['collectives']} kernels, {ms(tp['collective_ns'])}"
    if tp["split"] and tp["collectives"]:
        console.print(f"{head} = transfer {ms(tp['collective_transfer_ns'])} + waiting for the slowest rank "
                      f"{ms(tp['collective_wait_ns'])}")
    elif not tp["split"]:
        console.print(f"{head}; [yellow]not split into transfer and wait:[/] {tp['split_note']}")
    if tp.get("rank_skew_ns") is not None:
        console.print(f"rank skew of this TP step: {ms(tp['rank_skew_ns'])} (spread of its ranks' step times)")


DECADES = ((0, 1_000, "< 1 µs"), (1_000, 10_000, "1–10 µs"), (10_000, 100_000, "10–100 µs"),
           (100_000, 1_000_000, "0.1–1 ms"), (1_000_000, None, "≥ 1 ms"))


def _render_histogram(hist: list[dict], console: Console) -> None:
    """The log₂ gap histogram of the JSON, folded into decades for the terminal."""
    if not hist:
        return
    kinds = ("host_bound", "sync", "device_side") + (("host_pause",) if any(
        b["kind"] == "host_pause" for b in hist) else ())
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


def _name(path: str) -> str:
    from pathlib import PurePath

    return PurePath(path).name or path


def render_runs_compare(r: dict, console: Console) -> None:
    """Two runs by their matched steps (analysis/run_compare.py): per kind and over the run."""
    from stepscope.render.run_compare import runs_table

    head, rows = runs_table(r)
    cols = [Col(h, "left" if h == "kind" else "right", drop={"A with graphs ms": 2, "off by": 1}.get(h, 0))
            for h in head]
    console.print(fitted(console.width, cols, [[term(c[0]), *c[1:]] for c in rows], total=True,
                         title=f"runs: {r['pairs']} step pairs matched {r['matched']} (A {plural(r['a_steps'], 'step')}, "
                         f"B {r['b_steps']}; unmatched {r['unmatched_a']} / {r['unmatched_b']})"))


def render_compare(doc: dict, console: Console | None = None) -> None:
    console = console or page()
    a, b = doc["a"], doc["b"]
    # the files' names tell A from B, whole (their paths are in --json): on the rule when both
    # fit, else one line each above it
    names = f"A {term(_name(a['path']))}  vs  B {term(_name(b['path']))}"
    if len(names) + 4 <= console.width:
        console.rule(f"[bold]{names}")
    else:
        console.print(f"[bold]A {term(_name(a['path']))}[/]")
        console.print(f"[bold]B {term(_name(b['path']))}[/]")
        console.rule()
    if doc.get("runs"):
        render_runs_compare(doc["runs"], console)
    t = Table(show_edge=False, header_style="bold")
    # a step is named by its index (the JSON's, from 0), its trace's count of steps apart
    console.print(f"[dim]A: step {a['step']} · {plural(a['steps'], 'step')}: {a['chosen']} · B: step {b['step']} · "
                  f"{plural(b['steps'], 'step')}: {b['chosen']}[/]")
    for col in ("figure (the quoted step)", "A", "B", "B − A"):
        t.add_column(col, justify="left" if col.startswith("figure") else "right")
    rows = [("step time", "step_time_ns"), ("GPU busy", "gpu_busy_ns"), ("GPU idle", "idle_ns"),
            ("CPU floor", "cpu_floor_ns"), ("device floor", "device_floor_ns")]
    for label, k in rows:
        t.add_row(label, ms(a[k]), ms(b[k]), ms(b[k] - a[k], sign=True))
    ua, ub = a.get("untraced_step_time_ns"), b.get("untraced_step_time_ns")
    if ua is not None and ub is not None:
        how = lambda x: "measured" if x.get("untraced_measured") else "estimated"  # noqa: E731
        t.add_row(f"step time untraced ({how(a)} / {how(b)})", ms(ua), ms(ub), ms(ub - ua, sign=True))
    for kind in ("host_bound", "sync", "device_side", "host_pause"):
        va, vb = a["idle_by_kind_ns"].get(kind, 0), b["idle_by_kind_ns"].get(kind, 0)
        if kind == "host_pause" and not (va or vb):
            continue
        t.add_row(f"  idle {kind.replace('_', '-')}", ms(va), ms(vb), ms(vb - va, sign=True))
    t.add_row("kernels", str(a["n_kernels"]), str(b["n_kernels"]), str(b["n_kernels"] - a["n_kernels"]))
    t.add_row("launch calls", str(a["n_launch_calls"]), str(b["n_launch_calls"]),
              str(b["n_launch_calls"] - a["n_launch_calls"]))
    t.add_row("verdict", a["verdict"], b["verdict"], "")
    if "rank" in a or "rank" in b:
        label = lambda x: f"rank {x['rank']['rank']} of {x['rank']['ranks']}" if "rank" in x else "one rank"  # noqa: E731
        t.add_row("figures of", label(a), label(b), "")
    console.print(t)
    for tag, x in (("A", a), ("B", b)):
        if "ranks" in x:
            cols = [Col("rank"), Col("pid", drop=3), Col("GPU", drop=3), Col("steps", drop=2), Col("step ms"),
                    Col("GPU busy ms", drop=1), Col("waiting ms"), Col("device floor ms"), Col("CPU floor ms")]
            rows = [[str(x_["rank"]), str(x_["pid"]), str(x_["device"]), str(x_["steps"]), ms_num(x_["step_time_ns"]),
                     ms_num(x_["gpu_busy_ns"]), ms_num(x_["collective_wait_ns"]), ms_num(x_["device_floor_ns"]),
                     ms_num(x_["cpu_floor_ns"])] for x_ in x["ranks"]]
            console.print(fitted(console.width, cols, rows, title=f"{tag}: every rank (medians per step)"))
    c = Table(show_edge=False, header_style="bold", title="per class (the quoted steps)", title_justify="left")
    for col in ("class", "A µs", "B µs", "Δ µs", "A count", "B count"):
        c.add_column(col, justify="left" if col == "class" else "right")
    for cls, r in sorted(doc["classes"].items(), key=lambda kv: -abs(kv[1]["delta_time_ns"])):
        c.add_row(cls, us_num(r["a_time_ns"]), us_num(r["b_time_ns"]), us_num(r["delta_time_ns"], sign=True),
                  f"{r['a_count']:g}", f"{r['b_count']:g}")
    console.print(c)
    # names one side does not show because its graphs are recorded whole are not added or removed
    a_whole, b_whole = bool(a.get("graph_level")), bool(b.get("graph_level"))
    added = "in B, not recorded in A (inside A's CUDA graphs, recorded whole)" if a_whole and not b_whole \
        else "added in B"
    removed = "not recorded in B (inside its CUDA graphs, recorded whole)" if b_whole and not a_whole \
        else "removed in B"
    for label, key in ((added, "kernels_added"), (removed, "kernels_removed")):
        names = doc[key]
        if names:
            listed = ", ".join(f"{term(n['name'])} ×{n['count_per_step']:g}" for n in names[:6])
            console.print(f"kernels {label}: {listed}" + (f" … (+{len(names) - 6})" if len(names) > 6 else ""))
    from stepscope.render.headline import compare_rows

    for label, text in compare_rows(doc):  # the verdict block of two traces, as the compare report opens with it
        console.print(term(text, 2000) if label == "comparison" else f"[bold]{label}:[/] {term(text, 2000)}")


def render_tp(doc: dict, console: Console | None = None) -> None:
    console = console or page()
    modes = [(m, doc["projections"][m]) for m in ("eager", "graph") if doc["projections"].get(m)]
    own = {r["tp"]: r for r in doc["projection"]}
    # one table per mode (stacked: both fit 80 columns), every cell a bare number under a header
    # that names its unit
    groups = [[m] for m, _ in modes]
    narrow = True
    by_width: dict = {}
    for m, p in modes:
        for r in p["rows"]:
            by_width.setdefault(r["tp"], {})[m] = r
    for group in groups:
        own_mode = group[0] == doc["mode"]  # the measured step sits beside its own mode's projection
        title = f"Equation 1.3 per TP width, {group[0]} mode" + (" (measured: the trace's own step)" if own_mode else "")
        t = Table(show_edge=False, header_style="bold", title=title, title_justify="left")
        t.add_column("TP", justify="right", no_wrap=True, min_width=2)
        for m in group:
            tag = "" if narrow else f"{m} "
            for col in ("CPU floor ms", "device floor ms", "step ms", "bound"):
                t.add_column(f"{tag}{col}", justify="left" if col == "bound" else "right", no_wrap=True)
        if own_mode:
            t.add_column("measured ms", justify="right", no_wrap=True)
        for w, per in by_width.items():
            cells = [str(w)]
            for m in group:
                r = per.get(m)
                if r is None:
                    cells += ["", "", "", ""]
                    continue
                colour = "red" if r["bound"] == "launch-bound" else "green"
                cells += [ms_num(r["cpu_floor_ns"]), ms_num(r["device_floor_ns"]), ms_num(r["step_time_ns"]),
                          f"[{colour}]{r['bound']}[/]"]
            measured = own.get(w, {}).get("measured_step_time_ns")
            if own_mode:
                cells.append(ms_num(measured) if measured is not None else "")
            t.add_row(*cells)
        console.print(t)
    for m, p in modes:
        w = p["launch_bound_from_tp"]
        console.print(f"[bold]{m}: launch-bound from TP={w}[/]: beyond it, more GPUs do not shorten the step"
                      if w else f"{m}: device-bound at every width projected")
    for n in doc["notes"]:
        from stepscope.render.units import wrapped

        for line in wrapped(str(cut(n, 2000)), console.width):
            console.print(f"[dim]{term(line, 2000)}[/]")
    if "ranks" in doc:
        # rank and step tell a row apart, never cut; under a width pid, GPU, collectives and
        # transfer go (the title says so)
        cols = [Col("rank"), Col("pid", drop=2), Col("GPU", drop=2), Col("step"), Col("step ms"),
                Col("collectives ms", drop=1), Col("transfer ms", drop=1), Col("waiting ms"),
                Col("device floor ms"), Col("CPU floor ms"), Col("verdict", "left")]
        rows, notes = [], []
        for x in doc["ranks"]:
            for st in x["steps"]:
                rows.append([str(x["rank"]), str(x["pid"]), str(x["device"]), str(st["step"]),
                             ms_num(st["step_time_ns"]), ms_num(st["collective_ns"]),
                             ms_num(st["collective_transfer_ns"]), ms_num(st["collective_wait_ns"]),
                             ms_num(st["device_floor_ns"]), ms_num(st["cpu_floor_ns"]), st["verdict"]])
                if st["split_note"]:
                    notes.append(st["split_note"])
        r = fitted(console.width, cols, rows, title="ranks")
        console.print(r)
        for n in sorted(set(notes)):
            console.print(f"[yellow]not split into transfer and wait:[/] {n}")
    for g in doc.get("tp_steps", []):
        skew = ms(g["rank_skew_ns"])
        console.print(f"TP step {g['group']} ({g['ranks']} ranks, slowest {ms(g['step_time_ns'])}, rank skew {skew})"
                      + (f": {g['verdict']}" if g["verdict"] else ""))
    if doc.get("rank_skew_ns") is not None:
        console.print(f"rank skew: {ms(doc['rank_skew_ns'])} (largest spread of one TP step's rank step times)")
