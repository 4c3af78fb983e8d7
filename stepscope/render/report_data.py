"""What the HTML and Markdown reports show, gathered once: one chosen step of a trace.

Gaps and floors come from diagnose(), the analyses `analyze` itself reports.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from stepscope.analysis.inventory import Inventory
from stepscope.analysis.representative import pick_step, representative  # noqa: F401 (pick_step: the report's step)
from stepscope.errors import InputError
from stepscope.paths import shown
from stepscope.render.capture import defect_line, defect_rows, shown_warnings
from stepscope.render.names import cut
from stepscope.analysis.step_view import _plain, step_diagnosis
from stepscope.render.sentences import tp_sentence, untraced_source
from stepscope.selection import is_index, parse_steps  # noqa: F401

GAP_KINDS = ("host_bound", "sync", "device_side", "host_pause")
PHASE_BY = {"combine": "the split-KV combine pass", "launch": "the attention kernel's launch configuration",
            "shape": "the step's shape (tokens through the layers vs sequences sampled)"}


def phase_line(fig: dict) -> str | None:
    """What decided a step's phase, when its name did not record it (None when it did)."""
    by = fig.get("phase_by")
    if by in (None, "name"):
        return None
    if by == "kernel name":
        return ("phase not in the step's name and not told by the trace: the attention kernels' names "
                f"decided prefill/decode ({fig.get('phase_detail')})")
    return f"phase {fig['phase']} from {PHASE_BY.get(by, by)}: {fig.get('phase_detail')}"


def class_by_lines(kernels, limit: int = 4) -> list[str]:
    """One line per reason a step's kernels were classed by something other than their name:
    "classed by evidence, not by name: triton_poi_fused_3 ×31, … → rope (between gemm and …)".
    `kernels`: the step's kernel rows (dicts: name, class, count, class_by)."""
    groups: dict[tuple, dict] = {}  # (class, class_by) -> name -> count, in order of appearance
    for r in kernels:
        if r.get("class_by") is not None:
            names = groups.setdefault((r["class"], r["class_by"]), {})
            names[r["name"]] = names.get(r["name"], 0) + r["count"]
    out = []
    for (cls, why), counts in groups.items():
        g = sorted(counts.items(), key=lambda nc: (-nc[1], nc[0] is not None, nc[0] or ""))
        names = ", ".join(f"{n} ×{c}" for n, c in g[:limit])
        more = f" and {len(g) - limit} more" if len(g) > limit else ""
        out.append(f"classed by evidence, not by name: {names}{more} → {cls} ({why})")
    return out


def framework_lines(fam: tuple, ops: tuple, limit: int = 6) -> list[str]:
    """The framework class of a step in words (its rows of inv.framework, `fam`, and of
    inv.framework_ops, `ops`: analysis/step_view.KindFigures): by op family, by launching op
    (when NVTX ranges name ops), and what to do about the op with the most launches."""
    from stepscope.analysis.classify import FAMILY_LABELS

    if not fam:
        return []
    from stepscope.render.units import us

    out = ["framework by op family: " + " · ".join(
        f"{FAMILY_LABELS.get(r['family'], r['family'])} ×{r['count']} ({us(r['time_ns'])})" for r in fam)]
    if ops:
        shown = ", ".join(f"{r['op']} ×{r['count']}" for r in ops[:limit])
        more = f" and {len(ops) - limit} more" if len(ops) > limit else ""
        out.append(f"framework launches by the op that issued them (NVTX ranges): {shown}{more}")
        top = ops[0]
        out.append(f"{top['count']} {top['op']} launches per step ({FAMILY_LABELS.get(top['family'], top['family'])}, "
                   f"{us(top['time_ns'])}): fuse them (torch.compile) or capture the step in a CUDA graph")
    return out


def footer() -> str:
    """The line under every report: which stepscope wrote it and where its terms are defined.
    The docs are named by their path in the repository, not linked: a report is read offline
    and must not point at the network."""
    from stepscope import __version__

    return (f"Written by stepscope {__version__}. Every figure is defined in "
            "docs/DEFINITIONS.md and every kernel class in docs/KERNEL_CLASSES.md of the stepscope "
            "repository.")


def chosen(inv: Inventory, which: str | None) -> str | None:
    """How the shown step was chosen, for the report's header; None: the default wording."""
    if which in (None, "", "all"):
        return None
    ids = parse_steps(which, inv.steps)
    if len(ids) == 1:
        return f"as asked (--steps {which})"
    return (f"a typical step among the {len(ids)} selected by --steps {which}: median step time among "
            "those of the most common kind")


@dataclass(frozen=True)
class StepView:
    """One step of one trace, with everything a report draws: built once by step_view(), read
    by the renderers (which see no Inventory and no Diagnosis, only what is here)."""

    step: int
    figures: dict
    classes: tuple                 # {class, count, time_ns} per class
    kernels: tuple                 # {name, demangled, class, count, time_ns, class_by} per kernel, longest first
    # the frames a report draws, as plain rows (a dict per row, in the frame's order): a report
    # renderer filters and sorts them in Python and imports no polars
    acts: tuple                    # the step's activities by start (start, end, stream, class, name, ...)
    launches: tuple                # the host calls that launched them, by start (pid, tid, corr, start, end, api_name, is_graph_launch)
    gaps: tuple                    # find_gaps rows of this step
    floors: dict                   # the step's floors row
    trace_name: str                # the trace's file name as reports show it (paths.shown)
    trace_format: str              # nsys-sqlite, kineto, ...
    nsys_version: str | None = None
    gpu_name: str | None = None    # the trace's first GPU, when it names one
    n_steps: int = 0               # steps in the trace
    warnings: tuple = ()           # the inventory's warnings (str), but those a capture defect stands for
    capture: tuple = ()            # the capture's own defects (analysis/capture_check.py): one sentence each
    profiler_overhead_count: int = 0  # nsys's own overhead rows in the trace, and their time
    profiler_overhead_ns: int = 0
    framework: tuple = ()          # the step's framework class by op family: {family, count, time_ns}
    framework_ops: tuple = ()      # ... by the op that launched it (NVTX ranges): {op, family, count, time_ns}
    framework_advice: str = ""     # what to do about the op with the most launches ("" without ops)
    notes: tuple = ()
    chosen: str = "the representative step"  # why this step (representative()'s `why`, or "as asked")
    tp: dict | None = None         # the step's tp row (rank, collectives split, binding rank, tp_verdict)
    waits: tuple | None = None     # the step's collective kernels with their wait intervals (rows)
    peers: tuple = ()              # the other ranks' steps of its TP step (StepView)
    untraced: dict | None = None   # the step's untraced section (measured from the sidecar, or estimated)
    engine: dict | None = None     # a vLLM step's anatomy (forward, sampling, frontend)
    # the previous steps' GPU work on this step's device that runs after this step's first event
    # and before its begin (step_begin waits for it): start, end, stream, class, name, step (rows)
    tail: tuple | None = None
    diagnosis: object = None       # the step's StepDiagnosis (analysis/step_view.py): its verdict block's source

    @property
    def verdict_rows(self) -> list[tuple[str, str]]:
        """The step's verdict block (render/headline.py), as `analyze` opens with it."""
        from stepscope.render.headline import step_rows

        return step_rows(self.diagnosis) if self.diagnosis is not None else []

    @property
    def tracer(self) -> str:
        """What traced the step, as the sentences name it ("under nsys", "under torch.profiler")."""
        from stepscope.analysis.step_view import tracer_name

        return tracer_name(self.trace_format)

    @property
    def ranks(self) -> list["StepView"]:
        """This step and its peers, by rank."""
        views = [self, *self.peers]
        return sorted(views, key=lambda v: (v.tp or {}).get("rank", 0))

    @property
    def rank_label(self) -> str:
        f = self.figures
        rank = f"rank {self.tp['rank']} · " if self.tp else ""
        return f"{rank}pid {f['pid']} · GPU {f['device']}"

    @property
    def label(self) -> str:
        return f"{self.trace_name} · step {self.step}"

    @property
    def delimiter(self) -> str:
        f = self.figures
        return f"{f['delimiter']} “{cut(f['name'])}”"

    @property
    def begin(self) -> int:
        """Where the step's time starts (`step_begin` of DEFINITIONS.md): time 0 of its timeline."""
        return _begin(self.figures, self.launches)

    @property
    def t0(self) -> int:
        """Left edge of the step's timeline: its begin, or its first host/GPU event if earlier
        (of its peers too: the ranks of a TP step share one clock and one axis)."""
        return min(v._t0() for v in [self, *self.peers])

    @property
    def t1(self) -> int:
        return max(v._t1() for v in [self, *self.peers])

    def _t0(self) -> int:
        return _first_event(self.figures, self.launches)

    def _t1(self) -> int:
        cands = [self.figures.get("step_end"), self.figures.get("last_end")]
        cands += [r["end"] for r in self.launches]
        return int(max(c for c in cands if c is not None))


def _first_event(fig: dict, launches: tuple) -> int:
    cands = [fig.get("step_begin"), fig.get("first_start")]
    cands += [r["start"] for r in launches]
    return int(min(c for c in cands if c is not None))


def _begin(fig: dict, launches: tuple) -> int:
    b = fig.get("step_begin")
    return int(b) if b is not None else _first_event(fig, launches)


@dataclass(frozen=True)
class ReportView:
    """What one report shows: a step, optionally a second one beside it, its byte budget (or
    why there is none). Every report renderer is `render(ReportView) -> str`."""

    step: StepView
    other: StepView | None = None
    budget: tuple | None = None    # per class (rows): class, measured_bytes, min_bytes, ...
    budget_note: str | None = None
    run: dict | None = None        # the first trace's run view (analysis/run.py), when it is a run
    run_steps: tuple = ()          # its steps for the chart: index, begin_ns, step_time_ns, phase
    comparison: dict | None = None  # with `other`: the compare document of the two traces
    runs: dict | None = None       # with a second trace, both runs by matched steps (analysis/run_compare.py)

    def verdict_block(self) -> list[tuple[str | None, list[tuple[str, str]]]]:
        """What every report opens with: (whose, rows) — the compare rows first when there are
        two traces, then each step's verdict block (render/headline.py)."""
        from stepscope.render.headline import compare_rows

        if self.other is None:
            return [(None, self.step.verdict_rows)]
        out = [("A vs B", compare_rows(self.comparison))] if self.comparison else []
        return out + [("A", self.step.verdict_rows), ("B", self.other.verdict_rows)]


def by_measured_bytes(budget) -> list[dict]:
    """Byte-budget rows by measured bytes, largest first; rows without a measurement before
    them, as polars sorts nulls in descending order."""
    return sorted(budget, key=lambda r: (r["measured_bytes"] is not None, -(r["measured_bytes"] or 0)))


# the output's extension picks the renderer (pyinstrument's habit): module of render/, its render()
RENDERERS = {".html": "html", ".htm": "html", ".md": "markdown", ".markdown": "markdown"}


def renderer(suffix: str, output=None):
    """The `render(ReportView) -> str` of a file extension (or a format name: html, markdown);
    an InputError naming the output when there is none."""
    from importlib import import_module

    key = suffix.lower()
    name = RENDERERS.get(key) or RENDERERS.get("." + key) or (key if key in RENDERERS.values() else None)
    if name is None:
        raise InputError(f"-o {output if output is not None else suffix}: the extension picks the format; "
                         "use .html or .md")
    return import_module(f"stepscope.render.{name}").render


def class_order(views: list["StepView"]) -> list[str]:
    """Every class of the views, by its largest time in any of them (longest first)."""
    most: dict[str, int] = {}
    for v in views:
        for r in v.classes:
            most[r["class"]] = max(most.get(r["class"], r["time_ns"]), r["time_ns"])
    return sorted(most, key=lambda c: -most[c])


def class_rows(views: list["StepView"], order: list[str]) -> list[tuple[str, list[tuple[int, int, float]]]]:
    """Per class, per view: (count, time_ns, share of the step's GPU time) — for the HTML and
    Markdown class tables alike."""
    out = []
    for c in order:
        cells = []
        for v in views:
            r = next((x for x in v.classes if x["class"] == c), None)
            total = sum(x["time_ns"] for x in v.classes) or 1
            n = int(r["count"]) if r else 0
            t = int(r["time_ns"]) if r else 0
            cells.append((n, t, 100 * t / total))
        out.append((c, cells))
    return out


def _why(inv: Inventory, step: int, diag) -> str:
    rep = representative(inv, diag)
    return rep["why"] if rep["step"] == step else "as asked"


def step_view(inv: Inventory, step: int, diag, chosen: str | None = None, peers: bool = True, *,
              whatif: dict | None) -> StepView:
    """One step's view; `diag`: the trace's Diagnosis (library.report's), `whatif` its what-if
    calibration's description (pipeline.whatif_of). On a multi-rank trace the view holds the
    other ranks' steps of its TP step as `peers`."""
    d = diag
    gaps, floors = d.gaps, d.floors
    fig = inv.steps.filter(pl.col("step") == step).row(0, named=True)
    acts = inv.acts.filter(pl.col("step") == step).sort("start")
    calls = (
        acts.filter(pl.col("launch_start").is_not_null())
        .select("pid", "corr").unique()
        .join(inv.api.select("pid", "tid", "corr", "start", "end", "api_name", "is_graph_launch"),
              on=["pid", "corr"], how="inner")
        .unique(["pid", "corr"], keep="first").sort("start")
    )
    g = gaps.filter(pl.col("step") == step)
    f = floors.filter(pl.col("step") == step).row(0, named=True)  # diagnose() floors every step
    tp_rows = d.tp.filter(pl.col("step") == step) if d.tp is not None else None
    tp = tp_rows.row(0, named=True) if tp_rows is not None and tp_rows.height else None
    if tp is not None:
        tp["tp_verdict"] = tp_sentence(tp)
    waits = d.collectives.kernels.filter(pl.col("step") == step) if d.collectives is not None else None
    sd = step_diagnosis(d, step, whatif=whatif)
    launches = tuple(calls.to_dicts())
    left, begin = _first_event(fig, launches), _begin(fig, launches)
    tail = inv.acts.filter(
        (pl.col("device") == fig["device"]) & pl.col("step").is_not_null() & (pl.col("step") != step)
        & (pl.col("end") > left) & (pl.col("start") < begin)
    ).select("start", "end", "stream", "class", "name", "step").sort("start")
    why = chosen or _why(inv, step, d)
    if chosen is None and tp is not None and tp["ranks"] > 1:
        why += "; the other ranks' steps of its TP step are drawn beside it"
    others = ()
    if peers and tp is not None and tp["ranks"] > 1:
        ids = d.tp.filter((pl.col("group") == tp["group"]) & (pl.col("step") != step))["step"].to_list()
        others = tuple(step_view(inv, s, d, chosen="the same TP step on another rank", peers=False, whatif=whatif) for s in ids)
    trace = inv.trace
    ops = tuple(inv.framework_ops.filter(pl.col("step") == step).drop("step").to_dicts())
    fam = tuple(inv.framework.filter(pl.col("step") == step).drop("step").to_dicts())
    return StepView(
        step=step, figures=fig,
        classes=_plain(inv.classes.filter(pl.col("step") == step).drop("step")),
        kernels=_plain(inv.kernels.filter(pl.col("step") == step).drop("step")),
        acts=tuple(acts.to_dicts()), launches=launches, gaps=tuple(g.to_dicts()), floors=f,
        trace_name=shown(trace.path.name), trace_format=trace.format, nsys_version=trace.nsys_version,
        gpu_name=trace.gpus["name"][0] if trace.gpus.height else None,
        n_steps=len(inv.step_ids()), warnings=tuple(shown_warnings(inv)),
        capture=tuple(defect_line(r) for r in defect_rows(inv)),
        profiler_overhead_count=trace.profiler_overhead_count, profiler_overhead_ns=trace.profiler_overhead_ns,
        framework=fam, framework_ops=ops, framework_advice=framework_lines(fam, ops)[-1] if ops else "",
        chosen=why, tp=tp, waits=None if waits is None else tuple(waits.to_dicts()), peers=others,
        untraced=None if sd.untraced is None else {**sd.untraced, "source": untraced_source(sd.untraced["source"], sd.sidecar)},
        engine=sd.engine, tail=tuple(tail.to_dicts()), diagnosis=sd,
    )


def budget_for(res, lacking=()) -> tuple[tuple | None, str | None]:
    """The report's rows and note of the step's HBM byte budget per class (`res`, a
    bytes.budget BudgetResult that library.report computed; None: no --cells, or `lacking` the
    shape figures that neither the step's name nor the sidecar records).

    Returns (rows with class, measured_bytes, min_bytes, ...; a note or None) or (None, why not).
    """
    from stepscope.render.units import ms, nbytes

    if lacking:
        return None, (f"byte budget skipped: neither the step's name nor the capture's sidecar records "
                      f"{', '.join(lacking)} (give {' '.join('--' + k for k in lacking)})")
    if res is None:
        return None, None
    st = res.step
    note = (f"step: {nbytes(st['measured_bytes'])} measured vs {nbytes(st['min_bytes'])} minimum"
            + (f" (×{st['amplification']:.2f})" if st.get("amplification") else "")
            + (f"; bandwidth floor {ms(st['floor_ns'])}" if st.get("floor_ns") else "")
            + "".join(f"; {w}" for w in res.warnings))
    return tuple(res.classes.to_dicts()), note
