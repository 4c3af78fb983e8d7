"""The one step that stands for a group of steps, wherever one step's figures are quoted.

A verdict beside a median of other figures describes no step that ran. So the terminal's
summary of each kind of step, `report` and `compare` (and the `tp` projection) quote one real
step: among the candidates, the median by step time (the lower of the two middle ones for an
even count; ties: the lower step index). Candidates: the steps of one kind (same process,
device, delimiter, phase and kernel count); for a whole trace, the most common kind of its
summary rank (collectives.summary_rank: on a multi-rank trace the rank that binds most TP
steps), so that neither a warm-up nor another rank's waiting stands for it.
"""

from __future__ import annotations

import polars as pl

KIND = ("pid", "device", "delimiter", "phase", "n_kernels")


def median_step(steps: pl.DataFrame) -> int:
    """The median step of `steps` (rows with step, step_time_ns) by step time."""
    s = steps.sort("step_time_ns", "step")
    return int(s["step"][(s.height - 1) // 2])


def kinds(steps: pl.DataFrame) -> list[pl.DataFrame]:
    """The steps grouped by KIND, in order of their first step."""
    key = pl.concat_str([pl.col(c).cast(pl.String).fill_null("?") for c in KIND], separator="|")
    s = steps.with_columns(_kind=key).sort("step")
    return [g.drop("_kind") for _, g in s.group_by("_kind", maintain_order=True)]


def step_kinds(inv, ids: list[int]) -> list[tuple[dict, list[int]]]:
    """Steps `ids` grouped by kind (same process, device, delimiter, phase and kernel count), each
    with the row of its representative step: the median by step time."""
    out = []
    for grp in kinds(inv.steps.filter(pl.col("step").is_in(ids))):
        rep = median_step(grp)
        out.append((grp.filter(pl.col("step") == rep).row(0, named=True), grp["step"].to_list()))
    return out


def representative(inv, diag=None) -> dict:
    """{step, why, candidates}: the step that stands for the whole trace. `diag` (its
    Diagnosis) tells the summary rank of a multi-rank trace (computed when not given)."""
    s = inv.steps
    rank_note = ""
    if s.select("pid", "device").unique().height > 1:
        from stepscope.analysis.collectives import summary_rank

        if diag is None:
            from stepscope.analysis.diagnosis import diagnose

            diag = diagnose(inv)
        r = summary_rank(diag.collectives.ranks, diag.tp)
        s = s.filter((pl.col("pid") == r["pid"]) & (pl.col("device") == r["device"]))
        rank_note = f" of rank {r['rank']} of {r['ranks']} ({r['why']})"
    groups = sorted(kinds(s), key=lambda g: (-g.height, g["step"].min()))
    common = groups[0]
    step = median_step(common)
    if s.height == 1:
        why = "the only step" + (rank_note or " of the trace")
    elif common.height == 1:
        why = f"the first of {s.height} steps{rank_note}, each of its own kind"
    else:
        why = (f"the median by step time of the {common.height} steps of the most common kind"
               + (f" (of {s.height})" if common.height < s.height else "") + rank_note)
    return {"step": step, "why": why, "candidates": common["step"].to_list()}


def pick_step(inv, which: str | int | None = None, diag=None) -> int:
    """The step a report shows: the one `which` selects (stepscope.selection's grammar), else a
    typical one among the steps it selects (all by default).

    Typical = among the steps of the most common kind (same process, device, phase and kernel
    count), the one with the median step time: not a warm-up, not an outlier. On a multi-rank
    trace only the steps of its summary rank (the binding rank, collectives.summary_rank) are
    candidates, when the selection holds any: the other ranks' steps of the same TP step are
    drawn beside it (`peers`).
    """
    if which in (None, "", "all"):
        # the trace's representative step (analysis/representative.py: the median by step time
        # of the most common kind of the summary rank's steps, the step compare and tp quote too)
        return representative(inv, diag)["step"]
    from stepscope.selection import parse_steps

    ids = parse_steps(which, inv.steps)  # an InputError when it selects none
    if len(ids) == 1:
        return ids[0]
    s = inv.steps.filter(pl.col("step").is_in(ids))
    if s.select("pid", "device").unique().height > 1:
        from stepscope.analysis.collectives import summary_rank

        d = diag
        r = summary_rank(d.collectives.ranks, d.tp)
        mine = s.filter((pl.col("pid") == r["pid"]) & (pl.col("device") == r["device"]))
        s = mine if mine.height else s
    s = s.with_columns(_kind=pl.concat_str(
        [pl.col(c).cast(pl.String).fill_null("?") for c in ("pid", "device", "phase", "n_kernels")],
        separator="|"))
    common = s.group_by("_kind").agg(pl.len().alias("n"), pl.col("step").min().alias("first")).sort(
        ["n", "first"], descending=[True, False])["_kind"][0]
    members = s.filter(pl.col("_kind") == common).sort("step_time_ns", "step")
    return int(members["step"][(members.height - 1) // 2])
