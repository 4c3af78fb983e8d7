"""What the HTML and Markdown reports show, gathered once: one chosen step of a trace.

Gaps and floors come from diagnose(), the analyses `analyze` itself reports.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from stepscope.analysis.inventory import Inventory
from stepscope.errors import InputError
from stepscope.paths import shown
from stepscope.render.names import cut
from stepscope.selection import is_index

GAP_KINDS = ("host_bound", "sync", "device_side")


def pick_step(inv: Inventory, which: str | int | None = None) -> int:
    """The step a report shows: the one asked for, else a typical one.

    Typical = among the steps of the most common kind (same process, device, phase and kernel
    count), the one with the median step time: not a warm-up, not an outlier.
    """
    ids = inv.step_ids()
    if which not in (None, ""):
        if which == "first":
            return ids[0]
        if is_index(str(which)) and int(which) in ids:
            return int(which)
        raise InputError(f"no step {which} in this trace (it has steps {ids[0]}–{ids[-1]})")
    s = inv.steps.with_columns(_kind=pl.concat_str(
        [pl.col(c).cast(pl.String).fill_null("?") for c in ("pid", "device", "phase", "n_kernels")],
        separator="|"))
    common = s.group_by("_kind").agg(pl.len().alias("n"), pl.col("step").min().alias("first")).sort(
        ["n", "first"], descending=[True, False])["_kind"][0]
    members = s.filter(pl.col("_kind") == common).sort("step_time_ns", "step")
    return int(members["step"][(members.height - 1) // 2])


@dataclass
class StepView:
    """One step of one trace, with everything a report draws."""

    inv: Inventory
    step: int
    figures: dict
    classes: pl.DataFrame          # class, count, time_ns
    kernels: pl.DataFrame          # name, demangled, class, count, time_ns
    acts: pl.DataFrame             # the step's activities (start, end, stream, class, name, ...)
    launches: pl.DataFrame         # the host calls that launched them (pid, tid, corr, start, end, api_name, is_graph_launch)
    gaps: pl.DataFrame             # find_gaps rows of this step
    floors: dict                   # the step's floors row
    notes: list[str] = field(default_factory=list)
    chosen: str = "a typical step: median step time among the steps of the most common kind"

    @property
    def label(self) -> str:
        return f"{shown(self.inv.trace.path.name)} · step {self.step}"

    @property
    def delimiter(self) -> str:
        f = self.figures
        return f"{f['delimiter']} “{cut(f['name'])}”"

    @property
    def t0(self) -> int:
        """Left edge of the step's timeline: its begin, or its first host/GPU event if earlier."""
        cands = [self.figures.get("step_begin"), self.figures.get("first_start")]
        if self.launches.height:
            cands.append(self.launches["start"].min())
        return int(min(c for c in cands if c is not None))

    @property
    def t1(self) -> int:
        cands = [self.figures.get("step_end"), self.figures.get("last_end")]
        if self.launches.height:
            cands.append(self.launches["end"].max())
        return int(max(c for c in cands if c is not None))


def class_rows(views: list["StepView"], order: list[str]) -> list[tuple[str, list[tuple[int, int, float]]]]:
    """Per class, per view: (count, time_ns, share of the step's GPU time) — for the HTML and
    Markdown class tables alike."""
    out = []
    for c in order:
        cells = []
        for v in views:
            r = v.classes.filter(pl.col("class") == c)
            total = v.classes["time_ns"].sum() or 1
            n = int(r["count"][0]) if r.height else 0
            t = int(r["time_ns"][0]) if r.height else 0
            cells.append((n, t, 100 * t / total))
        out.append((c, cells))
    return out


def _diagnosis(inv: Inventory):
    """(gaps, floors) frames of every step, from the analyses `analyze` itself uses."""
    from stepscope.analysis.diagnosis import diagnose

    d = diagnose(inv)
    return d.gaps, d.floors


def step_view(inv: Inventory, step: int, diag=None, chosen: str | None = None) -> StepView:
    gaps, floors = diag if diag is not None else _diagnosis(inv)
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
    return StepView(
        inv=inv, step=step, figures=fig,
        classes=inv.classes.filter(pl.col("step") == step).drop("step"),
        kernels=inv.kernels.filter(pl.col("step") == step).drop("step"),
        acts=acts, launches=calls, gaps=g, floors=f,
        **({"chosen": chosen} if chosen else {}),
    )


def budget_for(view: StepView, cells_path) -> tuple[pl.DataFrame | None, str | None]:
    """The step's HBM byte budget per class (issue 5's `stepscope.bytes.budget`), when available.

    Returns (frame with class, measured_bytes, min_bytes, ...; a note or None) or (None, why not).
    Model, phase, batch and context come from the step's recorded name, as `stepscope budget` does.
    """
    if cells_path is None:
        return None, None
    from stepscope.bytes.budget import budget, step_kernels_from_inventory
    from stepscope.bytes.cells import read_cells
    from stepscope.analysis.steps import step_shape

    cells = read_cells(cells_path)
    fig = view.figures
    shape = step_shape(fig.get("name"))
    model, phase = shape.get("model"), shape.get("phase") or fig.get("phase")
    batch, context = shape.get("batch"), shape.get("context")
    lacking = [n for n, v in (("model", model), ("phase", phase), ("batch", batch), ("context", context)) if not v]
    if lacking:
        return None, (f"byte budget skipped: the step's name does not record {', '.join(lacking)} "
                      "(run `stepscope budget` with them)")
    gpus = view.inv.trace.gpus
    gpu_name = gpus["name"][0] if gpus.height else None
    peak = float(gpus["memory_bandwidth_bps"][0]) if gpus.height and gpus["memory_bandwidth_bps"][0] else None
    res = budget(step_kernels_from_inventory(view.inv, view.step), cells, model, int(batch), int(context),
                 str(phase), gpu_name, peak)
    st = res.step
    note = (f"step: {st['measured_bytes'] / 1e6:,.1f} MB measured vs {st['min_bytes'] / 1e6:,.1f} MB minimum"
            + (f" (×{st['amplification']:.2f})" if st.get("amplification") else "")
            + (f"; bandwidth floor {st['floor_ns'] / 1e3:,.1f} µs" if st.get("floor_ns") else "")
            + "".join(f"; {w}" for w in res.warnings))
    return res.classes, note
