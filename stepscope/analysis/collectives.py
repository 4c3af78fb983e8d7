"""Multi-rank traces: collective time split into transfer and waiting, per step and rank
(docs/DEFINITIONS.md, "Tensor parallelism").

rank        one (process, device) of the trace that has steps; numbered 0, 1, ... by device,
            then pid (torchrun and vLLM give local rank r the r-th GPU)
step group  the k-th step (by begin) of every rank: the ranks of a TP job run the same steps
collective  the i-th kernel of one name on the j-th collective stream of every rank: a
            communicator issues the same collectives in the same order on each of its ranks.
            It is matched when every rank of the trace has that kernel and all of them overlap.
transfer    the part of a rank's collective kernel during which every rank is inside it:
            min(end) - max(start) over the matched kernels
wait        the rest of the kernel (duration - transfer): the rank waiting for the slowest one
device work the union of a step's activities with each collective cut to its transfer interval
            (busy - wait, unless other streams run beside a waiting collective)

A collective that is not matched (a rank's process missing from the trace, a window that cut
some collectives off, a communicator not spanning every rank) is not split: its step reports
why and keeps its whole busy time as device work.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import polars as pl

from stepscope.analysis.inventory import Inventory
from stepscope.analysis.steps import step_shape

STEP_SCHEMA = {
    "step": pl.Int64, "rank": pl.Int64, "ranks": pl.Int64, "group": pl.Int64, "collectives": pl.Int64,
    "collective_ns": pl.Int64, "collective_transfer_ns": pl.Int64, "collective_wait_ns": pl.Int64,
    "split": pl.Boolean, "split_note": pl.String, "wait_op": pl.String,
}


@dataclass
class Collectives:
    ranks: pl.DataFrame    # pid, device, rank
    kernels: pl.DataFrame  # one row per collective kernel: step, rank, name, start, end, matched,
                           # last_start, first_end, transfer_ns, wait_ns
    steps: pl.DataFrame    # STEP_SCHEMA, one row per step of a trace that needs it (else empty)
    work: pl.DataFrame     # step, device_work_ns: only the steps whose collectives waited

    @property
    def multi_rank(self) -> bool:
        return self.ranks.height > 1


def rank_ids(steps: pl.DataFrame) -> pl.DataFrame:
    """(pid, device, rank) of every rank of the trace."""
    return (steps.select("pid", "device").unique().sort("device", "pid")
            .with_columns(rank=pl.int_range(pl.len(), dtype=pl.Int64)))


def rank_keys(ranks: pl.DataFrame) -> list[str]:
    """The columns that name a rank in `ranks` besides its number: (pid, device) in one trace,
    (report, pid, device) across the reports of a run (analysis/reports_run.py)."""
    return [c for c in ranks.columns if c not in ("rank", "host")]


def step_groups(steps: pl.DataFrame, ranks: pl.DataFrame) -> pl.DataFrame:
    """(step, rank, group): each rank's steps numbered in begin order."""
    keys = rank_keys(ranks)
    return (steps.select("step", *keys, "step_begin").join(ranks.select(*keys, "rank"), on=keys)
            .sort("rank", "step_begin", "step")
            .select("step", "rank", pl.int_range(pl.len(), dtype=pl.Int64).over("rank").alias("group")))


def match_collectives(kernels: pl.DataFrame, ranks: pl.DataFrame) -> pl.DataFrame:
    """Every collective kernel with its counterparts on the other ranks (see the module doc)."""
    n_ranks = ranks.height
    keys = rank_keys(ranks)
    c = kernels.join(ranks.select(*keys, "rank"), on=keys, how="inner")
    # the j-th collective stream of a rank: stream ids are numbered per process, so rank 0's
    # stream 7 may be rank 1's stream 15 (nsysai_mfu_2gpu_*); order of first use is what matches
    first_use = c.group_by("rank", "stream").agg(pl.col("start").min().alias("_first"))
    first_use = first_use.sort("rank", "_first", "stream").with_columns(
        s_idx=pl.int_range(pl.len(), dtype=pl.Int64).over("rank"))
    c = c.join(first_use.select("rank", "stream", "s_idx"), on=["rank", "stream"])
    # the ordinal per (rank, stream, name) in start order: over() keeps the rows' order in a group
    c = c.sort("rank", "s_idx", "start", "end").with_columns(
        i=pl.int_range(pl.len(), dtype=pl.Int64).over("rank", "s_idx", "name"))
    peers = c.group_by("s_idx", "name", "i").agg(
        n=pl.len(), last_start=pl.col("start").max(), first_end=pl.col("end").min())
    c = c.join(peers, on=["s_idx", "name", "i"], how="left")
    matched = (pl.col("n") == n_ranks) & (pl.col("first_end") >= pl.col("last_start")) & pl.lit(n_ranks > 1)
    transfer = pl.when(pl.col("matched")).then(pl.col("first_end") - pl.col("last_start"))
    return c.with_columns(matched=matched).with_columns(transfer_ns=transfer).with_columns(
        wait_ns=pl.col("end") - pl.col("start") - pl.col("transfer_ns"),
    ).select("step", "rank", *dict.fromkeys(("pid", "device", *keys)), "stream", "name", "start", "end", "matched",
             "last_start", "first_end", "transfer_ns", "wait_ns").sort("rank", "start")


_OP = re.compile(r"nccl(?:Dev)?Kernel_([A-Za-z]+?)(?:_|$)")


def op_name(kernel: str | None) -> str:
    """A collective kernel's operation, as people say it: all-reduce, send-recv, all-gather."""
    m = _OP.search(kernel or "")
    if m:
        return re.sub(r"(?<!^)(?=[A-Z])", "-", m.group(1)).lower()
    if "cross_device_reduce" in (kernel or ""):
        return "all-reduce"  # vLLM's custom all-reduce
    return "collectives"


def declared_tp(steps: pl.DataFrame) -> int | None:
    """The largest tp=N recorded in the step names (stepscope's own ranges carry it)."""
    tps = [step_shape(n).get("tp") for n in steps["name"].unique().to_list()]
    tps = [t for t in tps if isinstance(t, int)]
    return max(tps) if tps else None


def collectives(inv: Inventory) -> Collectives:
    steps = inv.steps
    ranks = rank_ids(steps)
    kernels = match_collectives(inv.collectives, ranks)
    tp = declared_tp(steps)
    needed = ranks.height > 1 or kernels.height > 0 or (tp or 1) > 1
    if not needed:  # one GPU, no collectives: nothing to split, no section (single-GPU figures stay)
        return Collectives(ranks, kernels, pl.DataFrame(schema=STEP_SCHEMA),
                           pl.DataFrame(schema={"step": pl.Int64, "device_work_ns": pl.Int64}))
    steps_out = step_collectives(steps, ranks, kernels, tp)
    waited = steps_out.filter(pl.col("split") & (pl.col("collective_wait_ns") > 0)).select("step")
    return Collectives(ranks, kernels, steps_out, device_work(inv, kernels, waited))


def step_collectives(steps: pl.DataFrame, ranks: pl.DataFrame, kernels: pl.DataFrame, tp: int | None) -> pl.DataFrame:
    """STEP_SCHEMA, one row per step: its group, its collectives' time split into transfer and
    wait (match_collectives' `kernels`), or why not; `tp`: the width the step names declare."""
    groups = step_groups(steps, ranks)
    dur = pl.col("end") - pl.col("start")
    inside = kernels.filter(pl.col("step").is_not_null())
    per = inside.group_by("step").agg(
        collectives=pl.len().cast(pl.Int64), collective_ns=dur.sum(),
        matched=pl.col("matched").sum().cast(pl.Int64),
        collective_transfer_ns=pl.col("transfer_ns").sum(), collective_wait_ns=pl.col("wait_ns").sum(),
    )
    # the operation a rank waits in most, for the verdict sentence
    ops = {n: op_name(n) for n in inside["name"].unique().to_list()}
    by_op = (inside.with_columns(op=pl.col("name").replace_strict(ops, default="collectives", return_dtype=pl.String))
             .group_by("step", "op").agg(pl.col("wait_ns").sum().fill_null(0), dur.sum().alias("_t"))
             .sort("step", "wait_ns", "_t", "op", descending=[False, True, True, False])
             .group_by("step", maintain_order=True).agg(pl.col("op").first().alias("wait_op")))
    s = (groups.join(per, on="step", how="left").join(by_op, on="step", how="left")
         .with_columns(pl.col("collectives", "collective_ns", "matched").fill_null(0), ranks=pl.lit(ranks.height, pl.Int64)))
    n_ranks = ranks.height
    lone = (f"only one rank's process is in this trace although its steps record tp={tp}: "
            if (tp or 1) > 1 else "the other ranks of these collectives are not in this trace: ")
    lone += "waiting cannot be told from transfer without every rank's kernels"
    unmatched = pl.format("{} of {} collective kernels have no overlapping counterpart on every rank (a cut "
                          "trace window, or a communicator that does not span every rank): not split",
                          pl.col("collectives") - pl.col("matched"), pl.col("collectives"))
    split = (pl.col("matched") == pl.col("collectives")) & pl.lit(n_ranks > 1)
    s = s.with_columns(
        split=split,
        split_note=pl.when(pl.lit(n_ranks == 1) & ((pl.col("collectives") > 0) | pl.lit((tp or 1) > 1)))
        .then(pl.lit(lone)).when(~split & pl.lit(n_ranks > 1)).then(unmatched)
        .otherwise(pl.lit(None, pl.String)),
    ).with_columns(
        # an unsplit step's collectives have no transfer/wait figures; a split step with none has zeros
        *[pl.when(pl.col("split")).then(pl.col(c).fill_null(0)).otherwise(None).alias(c)
          for c in ("collective_transfer_ns", "collective_wait_ns")],
    )
    return s.select([pl.col(c).cast(t) for c, t in STEP_SCHEMA.items()]).sort("step")


def device_work(inv: Inventory, kernels: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """(step, device_work_ns) of `steps`: the union of the step's activities with each matched
    collective replaced by its transfer interval [last_start, first_end]."""
    if steps.is_empty():
        return pl.DataFrame(schema={"step": pl.Int64, "device_work_ns": pl.Int64})
    acts = inv.in_steps("step", "start", "end", "prev_end", "class", "is_kernel")
    touching = touching_steps(acts)
    return work_of(inv.steps.select("step", "gpu_busy_ns"), kernels, steps, touching,
                   other_activities(acts, steps.join(touching, on="step", how="semi")))


_COMM = pl.col("is_kernel") & (pl.col("class") == "comm")


def touching_steps(acts: pl.DataFrame) -> pl.DataFrame:
    """(step) of the steps where a collective overlaps another activity. In the others (the
    committed captures: NCCL shares the compute stream) cutting each collective to its transfer
    shortens the union by exactly its wait, without re-sorting a million rows. acts are in
    (step, start) order, so a collective is alone when the union before it ended by its start
    and the next activity starts after it."""
    return (acts.lazy().with_columns(_next=pl.col("start").shift(-1), _next_step=pl.col("step").shift(-1))
            .filter(_COMM & ((pl.col("prev_end") > pl.col("start"))
                             | ((pl.col("_next_step") == pl.col("step")) & (pl.col("_next") < pl.col("end")))))
            .select("step").unique().collect())


def other_activities(acts: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """(step, start, end): the activities of `steps` other than the collectives."""
    return acts.join(steps, on="step", how="semi").filter(~_COMM).select("step", "start", "end")


def work_of(busy: pl.DataFrame, kernels: pl.DataFrame, steps: pl.DataFrame, touching: pl.DataFrame,
            other: pl.DataFrame) -> pl.DataFrame:
    """(step, device_work_ns) of `steps` from (step, gpu_busy_ns), the matched collective
    `kernels`, the `touching` steps (touching_steps) and their `other` activities
    (other_activities); every other step's work is its busy time less its collectives' wait."""
    if steps.is_empty():
        return pl.DataFrame(schema={"step": pl.Int64, "device_work_ns": pl.Int64})
    overlapping = steps.join(touching, on="step", how="semi")
    plain = steps.join(overlapping, on="step", how="anti")
    exact = (busy.join(plain, on="step", how="semi").select("step", "gpu_busy_ns")
             .join(kernels.group_by("step").agg(pl.col("wait_ns").sum()), on="step")
             .select("step", (pl.col("gpu_busy_ns") - pl.col("wait_ns")).cast(pl.Int64).alias("device_work_ns")))
    steps = overlapping
    if steps.is_empty():
        return exact.sort("step")
    other = other.join(steps, on="step", how="semi").select("step", "start", "end")
    transfer = kernels.join(steps, on="step", how="semi").select(
        "step", pl.col("last_start").alias("start"), pl.col("first_end").alias("end"))
    a = pl.concat([other, transfer]).sort("step", "start", "end")
    prev_end = pl.col("end").cum_max().shift(1).over("step")
    a = a.with_columns(prev_end=prev_end)
    own = (pl.col("end") - pl.max_horizontal("start", pl.col("prev_end").fill_null(pl.col("start")))).clip(lower_bound=0)
    union = a.group_by("step").agg(device_work_ns=own.sum().cast(pl.Int64))
    return pl.concat([exact, union]).sort("step")


def group_verdicts(coll: Collectives, steps: pl.DataFrame, floors: pl.DataFrame) -> pl.DataFrame:
    """Per step of a multi-rank trace: its group's rank skew, binding rank and what binds it
    (render/sentences.py's tp_sentence says it in words).

    rank skew     max - min of the step times of the group's ranks
    binding rank  the rank that waits least in collectives (the others wait for it), when
                  every rank's step of the group has collectives and was split; else none
                  (ranks that never meet in a collective do not wait for one another)
    bound         the binding rank's verdict (launch-bound: its host; device-bound: its GPU),
                  with its floors binding_cpu_floor_ns and binding_device_floor_ns
    waits         the other ranks of the group, by rank: rank, collective_wait_ns and wait_op
                  (the operation it waits in most); null without a binding rank
    """
    schema = {"step": pl.Int64, "rank_skew_ns": pl.Int64, "binding_rank": pl.Int64, "bound": pl.String,
              "binding_cpu_floor_ns": pl.Int64, "binding_device_floor_ns": pl.Int64,
              "waits": pl.List(pl.Struct({"rank": pl.Int64, "collective_wait_ns": pl.Int64, "wait_op": pl.String}))}
    if coll.steps.is_empty():
        return pl.DataFrame(schema=schema)
    s = (coll.steps.select("step", "rank", "group", "split", "collectives", "collective_wait_ns", "wait_op")
         .join(steps.select("step", "step_time_ns"), on="step")
         .join(floors.select("step", "cpu_floor_ns", "device_floor_ns", "verdict"), on="step"))
    g = s.group_by("group").agg(
        n=pl.len(), all_split=(pl.col("split") & (pl.col("collectives") > 0)).all(),
        rank_skew_ns=(pl.col("step_time_ns").max() - pl.col("step_time_ns").min()),
        binding_rank=pl.col("rank").sort_by("collective_wait_ns", "rank").first(),
    )
    g = g.with_columns(
        rank_skew_ns=pl.when(pl.col("n") > 1).then(pl.col("rank_skew_ns")),
        binding_rank=pl.when(pl.col("all_split") & (pl.col("n") > 1)).then(pl.col("binding_rank")),
    )
    s = s.join(g.select("group", "rank_skew_ns", "binding_rank"), on="group")
    bound = s.filter(pl.col("rank") == pl.col("binding_rank")).select(
        "group", pl.col("verdict").alias("bound"), pl.col("cpu_floor_ns").alias("binding_cpu_floor_ns"),
        pl.col("device_floor_ns").alias("binding_device_floor_ns"))
    waits = (s.filter(pl.col("binding_rank").is_not_null() & (pl.col("rank") != pl.col("binding_rank")))
             .sort("group", "rank")
             .group_by("group", maintain_order=True)
             .agg(waits=pl.struct("rank", "collective_wait_ns", "wait_op")))
    s = s.join(bound, on="group", how="left").join(waits, on="group", how="left").with_columns(
        # a binding rank with no other rank waiting (cannot happen with n > 1, kept total): no waits
        waits=pl.when(pl.col("binding_rank").is_not_null()).then(pl.col("waits").fill_null([])))
    return s.select([pl.col(c).cast(t) for c, t in schema.items()]).sort("step")


def summary_rank(ranks: pl.DataFrame, tp: pl.DataFrame | None) -> dict:
    """The rank whose steps stand for a trace in one-number summaries (compare, the TP model, the
    report): the rank that binds most step groups (ties: the lowest), else rank 0. Medians over
    a mix of ranks would blend a rank that works with one that waits."""
    row = {"rank": 0, "ranks": ranks.height, "why": "the only rank" if ranks.height == 1 else
           "rank 0: no step group has a binding rank (no collectives split across every rank)"}
    if tp is not None and tp.height and tp["binding_rank"].drop_nulls().len():
        b = (tp.filter(pl.col("binding_rank").is_not_null()).unique("group")
             .group_by("binding_rank").agg(n=pl.len()).sort(["n", "binding_rank"], descending=[True, False]))
        n_groups = tp.filter(pl.col("binding_rank").is_not_null())["group"].n_unique()
        row["rank"] = int(b["binding_rank"][0])
        row["why"] = f"the binding rank of {int(b['n'][0])} of {n_groups} TP step{'' if n_groups == 1 else 's'}"
    r = ranks.filter(pl.col("rank") == row["rank"]).row(0, named=True)
    return {"rank": row["rank"], "pid": r["pid"], "device": r["device"], "ranks": row["ranks"], "why": row["why"]}
