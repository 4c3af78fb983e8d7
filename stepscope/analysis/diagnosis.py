"""Gaps, launch overhead, floors and verdicts of every step, computed once as frames and shared
by every renderer (render/ writes them as JSON or text)."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import polars as pl

from stepscope.analysis.collectives import Collectives, collectives, group_verdicts
from stepscope.analysis.floors import floors
from stepscope.analysis.gaps import gap_totals, gaps_and_pauses, histogram
from stepscope.analysis.inventory import Inventory
from stepscope.analysis.launch import launch_summary
from stepscope.analysis.verdict import verdict_expr, verdicts
from stepscope.analysis.whatif import predict_graph_step
from stepscope.selection import parse_steps

TOP_GAPS = 5


@dataclass
class Diagnosis:
    inv: Inventory
    gaps: pl.DataFrame         # one row per gap
    gap_totals: pl.DataFrame   # step × kind
    histogram: pl.DataFrame    # step × log2 bin × kind
    launch: pl.DataFrame       # one row per step
    launch_by_api: pl.DataFrame
    floors: pl.DataFrame       # one row per step
    graph_prediction: pl.DataFrame  # step, predicted_graph_step_{time,low,high}_ns (null for graph replays)
    collectives: Collectives | None = None  # transfer vs wait per collective and step (multi-rank)
    tp: pl.DataFrame | None = None  # per step of a multi-rank trace: the collectives.STEP_SCHEMA
                                    # figures, rank_skew_ns, binding_rank, tp_verdict (else empty)
    untraced: pl.DataFrame | None = None  # per step: untraced.SCHEMA (measured or estimated)
    engine: pl.DataFrame | None = None  # per vLLM step: anatomy.SCHEMA (empty for other traces)
    prologue: pl.DataFrame | None = None  # per step: whatif.prologue (the host work before the forward)
    verdicts: pl.DataFrame | None = None  # per step: verdict.SCHEMA, the one verdict every renderer quotes
    replay: object | None = None  # a graph trace's own what-if constants (whatif.Capture), else None
    calibration: object | None = None  # the whatif.Calibration its predictions used
    pauses: pl.DataFrame | None = None  # per host pause: pauses.PAUSE_SCHEMA (longest first in a step)
    _top_gaps: pl.DataFrame | None = None

    def drop_event_frames(self) -> None:
        """Keep each step's longest gaps, then empty the per-gap frame and the inventory's
        per-event frames (see Inventory.drop_event_frames)."""
        self.top_gaps()
        self.gaps = self.gaps.clear()
        self.inv.drop_event_frames()

    def self_check(self) -> None:
        """What must hold on any trace: the inventory's checks (busy + idle = span, class times
        and counts = the kernels'), the gap kinds adding up to the idle time, busy within the
        span, the device floor within the busy time, a positive untraced estimate, one verdict
        per step and that verdict Equation 1.3's."""
        self.inv.self_check()
        s = self.inv.steps
        idle = self.gap_totals.group_by("step").agg(pl.col("time_ns").sum().alias("_g"))
        chk = s.select("step", "idle_ns", "gpu_busy_ns", "gpu_span_ns").join(idle, on="step", how="left").fill_null(0)
        assert (chk["_g"] == chk["idle_ns"]).all(), "gap kinds do not add up to idle_ns"
        assert ((chk["gpu_busy_ns"] >= 0) & (chk["gpu_busy_ns"] <= chk["gpu_span_ns"])).all()
        f = self.floors.join(s.select("step", "gpu_busy_ns"), on="step")
        assert (f["device_floor_ns"] <= f["gpu_busy_ns"]).all()
        if self.untraced is not None and self.untraced.height:
            assert (self.untraced["untraced_estimated_ns"] > 0).all()
        v = self.verdicts
        assert v["step"].to_list() == sorted(s["step"].to_list()), "a step without a verdict"
        assert v.select((pl.col("verdict") == verdict_expr(wait="host_wait_ns", step="step_time_ns",
                                                          pause="host_pause_ns")).all()).item(), \
            "a verdict that is not Equation 1.3's"
        assert (v["cpu_floor_ns"] <= v["step_time_ns"]).all(), "a CPU floor above its step's time"

    def only_steps(self, spec: str | None) -> "Diagnosis":
        """The diagnosis narrowed to the steps `spec` selects (stepscope.selection's grammar),
        for the commands that summarize steps (compare, tp). On a trace with TP steps a selected
        step brings its whole TP step along (every rank's step of that group): a TP step's
        binding rank and waits are only defined over all of its ranks.

        The analyses run on the whole trace first, so each kept step's figures are exactly those
        `analyze` reports for it (a step's begin depends on its predecessor's GPU work)."""
        if spec in (None, "", "all"):
            return self
        ids = parse_steps(spec, self.inv.steps)
        if self.tp is not None and self.tp.height:
            groups = self.tp.filter(pl.col("step").is_in(ids))["group"].unique().to_list()
            ids = sorted(set(ids) | set(self.tp.filter(pl.col("group").is_in(groups))["step"].to_list()))
        keep = pl.col("step").is_in(ids)
        # no longer the kept analysis (kept=None): nothing derived from these few steps may be
        # stored under its key as if it were the whole trace's (library.step_texts)
        inv = replace(self.inv, steps=self.inv.steps.filter(keep), classes=self.inv.classes.filter(keep),
                      kernels=self.inv.kernels.filter(keep), kept=None)
        # every per-step frame of the diagnosis (gaps, floors, verdicts, tp, untraced, ...)
        per_step = {f.name: getattr(self, f.name).filter(keep) for f in fields(self)
                    if isinstance(getattr(self, f.name), pl.DataFrame) and "step" in getattr(self, f.name).columns}
        return replace(self, inv=inv, **per_step)

    def top_gaps(self) -> pl.DataFrame:
        """The TOP_GAPS longest gaps of each step, longest first (ties: earliest first)."""
        if self._top_gaps is None:
            self._top_gaps = longest_gaps(self.gaps)
        return self._top_gaps



def longest_gaps(gaps: pl.DataFrame) -> pl.DataFrame:
    """The TOP_GAPS longest of the per-gap frame `gaps` in each step, longest first (ties: earliest
    first): Diagnosis.top_gaps, and a window's (analysis/windows.py)."""
    g = gaps.select(pl.col("step").set_sorted(), "gap_start", "gap_ns", "kind", "prev_name", "next_name", "next_api")
    # a per-step threshold first, so only a handful of rows sort
    return (g.filter(pl.col("gap_ns") >= pl.col("gap_ns").top_k(TOP_GAPS).min().over("step"))
            .sort("step", "gap_ns", "gap_start", descending=[False, True, False])
            .group_by("step", maintain_order=True).head(TOP_GAPS))


# The frames of a Diagnosis that depend on the inventory alone (not on the what-if's
# calibration): what calibration_free() computes and diagnose() takes back (library.py keeps
# them beside a one-shot analysis). `top_gaps` stands for the per-gap frame, which a one-shot run reads only
# through top_gaps(); `gaps` then holds no row.
CALIBRATION_FREE = ("gaps", "top_gaps", "pauses", "gap_totals", "histogram", "launch", "launch_by_api", "floors", "tp",
                    "prologue", "engine", "collective_ranks", "collective_kernels", "collective_steps",
                    "collective_work", "untraced_replay", "replay_figures")


def calibration_free(inv: Inventory) -> dict[str, pl.DataFrame]:
    """The CALIBRATION_FREE frames of `inv`'s diagnosis (`gaps` whole, `top_gaps` None: taken from it)."""
    from stepscope.analysis.anatomy import anatomy
    from stepscope.analysis.untraced import replay_ends
    from stepscope.analysis.whatif import prologue, replay_figures

    launch, by_api = launch_summary(inv)
    gaps, pauses = gaps_and_pauses(inv, launch)
    hist = histogram(gaps)
    totals = gap_totals(gaps, inv.step_ids(), hist)
    coll = collectives(inv)
    f = floors(inv, launch, totals=totals, work=coll.work, pauses=pauses)
    tp = coll.steps.join(group_verdicts(coll, inv.steps, f), on="step", how="left")
    pro = prologue(inv)
    return dict(gaps=gaps, top_gaps=None, pauses=pauses, gap_totals=totals, histogram=hist, launch=launch, launch_by_api=by_api,
                floors=f, tp=tp, prologue=pro, engine=anatomy(inv), collective_ranks=coll.ranks,
                collective_kernels=coll.kernels, collective_steps=coll.steps, collective_work=coll.work,
                untraced_replay=replay_ends(inv), replay_figures=replay_figures(inv, pro))


def diagnose(inv: Inventory, calibration=None, known: dict[str, pl.DataFrame] | None = None) -> Diagnosis:
    """`calibration`: the what-if's (a whatif.Calibration, one GraphConstants or a file; None:
    the default, whatif.chosen).
    `known`: calibration_free(inv), when already known."""
    m = calibration_free(inv) if known is None else known
    from stepscope.analysis.untraced import untraced
    from stepscope.analysis.whatif import chosen, measure
    from stepscope.paths import shown

    coll = Collectives(m["collective_ranks"], m["collective_kernels"], m["collective_steps"], m["collective_work"])
    launch, f, pro = m["launch"], m["floors"], m["prologue"]
    calibration = chosen(calibration)
    graph = predict_graph_step(inv, calibration, work=f, pro=pro)
    untr = untraced(inv, launch, f, pro, calibration, m["untraced_replay"])
    return Diagnosis(
        inv=inv, gaps=m["gaps"], gap_totals=m["gap_totals"], histogram=m["histogram"],
        launch=launch, launch_by_api=m["launch_by_api"], floors=f,
        graph_prediction=graph, collectives=coll, tp=m["tp"],
        untraced=untr, engine=m["engine"], prologue=pro, verdicts=verdicts(f, graph, untr),
        replay=(measure(inv, shown(inv.trace.path), pro, f, m["replay_figures"]) if not inv.graph_steps.is_empty()
                else None),
        calibration=calibration, pauses=m["pauses"], _top_gaps=m["top_gaps"],
    )
