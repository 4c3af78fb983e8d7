"""The `framework` class broken down: what the glue kernels do, and which op launched them.

Op family (the [[family]] rules of rules.toml, on the kernel's names): elementwise arithmetic,
copies and casts, concatenation, reductions, indexing, fills, engine bookkeeping. Launching op
(the [[op]] rules, on NVTX range names): when PyTorch's emit_nvtx (or any profiler that names
its ranges after ops) wrapped the launch call, the outermost such range around it, i.e. the
op the model code called (`aten::to`, not the `aten::copy_` it runs inside). Families are
decided once per distinct kernel name; ops by one as-of join of the launch calls on the
outermost op ranges of their thread.
"""

from __future__ import annotations

import polars as pl

from stepscope.analysis.classify import FAMILY_DTYPE, RuleSet

FAMILY_SCHEMA = {"step": pl.Int64, "family": pl.String, "count": pl.Int64, "time_ns": pl.Int64}
OP_SCHEMA = {"step": pl.Int64, "op": pl.String, "family": pl.String, "count": pl.Int64, "time_ns": pl.Int64}


def family_table(names: pl.DataFrame, rules: RuleSet) -> pl.DataFrame:
    """(short_id, demangled_id, family) for every distinct kernel name."""
    from stepscope.analysis.classify import memo_first_match

    # family_of's order: the demangled name first, then the short one (field "any")
    fam = memo_first_match(names, rules, "family", [(f.family, f.pattern, "any") for f in rules.families], "other")
    return names.select("short_id", "demangled_id").with_columns(fam.cast(FAMILY_DTYPE).alias("family"))


def op_ranges(nvtx: pl.DataFrame, rules: RuleSet) -> pl.DataFrame:
    """(pid, tid, r_start, r_end, op): the outermost op-named NVTX range of each nest, per thread."""
    if nvtx.is_empty() or not rules.ops:
        return pl.DataFrame(schema={"pid": pl.Int64, "tid": pl.Int64, "r_start": pl.Int64, "r_end": pl.Int64,
                                    "op": pl.String})
    op = pl.coalesce([pl.col("name").str.extract(p, 1) for p in rules.ops])
    r = (nvtx.lazy().select(pl.col("pid").cast(pl.Int64), pl.col("tid").cast(pl.Int64), "start", "end", op.alias("op"))
         .filter(pl.col("op").is_not_null()).sort("pid", "tid", "start", "end", descending=[False, False, False, True])
         .collect())
    # push/pop ranges nest on their thread: a range is outermost when no earlier one reaches it
    reach = pl.col("end").cum_max().shift(1).over("pid", "tid")
    return r.filter(reach.is_null() | (reach < pl.col("start"))).select(
        "pid", "tid", pl.col("start").alias("r_start"), pl.col("end").alias("r_end"), "op")


def framework_tables(acts: pl.DataFrame, names: pl.DataFrame, nvtx: pl.DataFrame,
                     rules: RuleSet) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(FAMILY_SCHEMA, OP_SCHEMA) over the framework-class kernels of every step.

    acts: step, is_kernel, class, short_id, demangled_id, start, end, pid, tid, launch_start."""
    glue = (acts.lazy().filter(pl.col("is_kernel") & (pl.col("class") == "framework") & pl.col("step").is_not_null())
            .select("step", "short_id", "demangled_id", "start", "end", "pid", "tid", "launch_start").collect())
    if glue.is_empty():
        return pl.DataFrame(schema=FAMILY_SCHEMA), pl.DataFrame(schema=OP_SCHEMA)
    ids = ["short_id", "demangled_id"]
    # the families of the names the glue kernels have, not of every name the trace has
    glue = glue.join(family_table(names.join(glue.select(ids).unique(), on=ids, how="semi"), rules), on=ids,
                     how="left")
    agg = (pl.len().cast(pl.Int64).alias("count"), (pl.col("end") - pl.col("start")).sum().alias("time_ns"))
    fams = (glue.group_by("step", "family").agg(*agg)
            .select("step", pl.col("family").cast(pl.String), "count", "time_ns")
            .sort("step", "time_ns", "family", descending=[False, True, False]))
    ranges = op_ranges(nvtx, rules)
    if ranges.is_empty():
        return fams, pl.DataFrame(schema=OP_SCHEMA)
    hit = (glue.drop_nulls("launch_start").with_columns(pl.col("pid").cast(pl.Int64), pl.col("tid").cast(pl.Int64))
           .sort("launch_start")
           .join_asof(ranges.sort("r_start"), left_on="launch_start", right_on="r_start", by=["pid", "tid"],
                      strategy="backward", check_sortedness=False)
           .filter(pl.col("r_end") >= pl.col("launch_start")))
    if hit.is_empty():
        return fams, pl.DataFrame(schema=OP_SCHEMA)
    ops = (hit.group_by("step", "op").agg(*agg, pl.col("family").cast(pl.String).mode().sort().first().alias("family"))
           .select(list(OP_SCHEMA)).sort("step", "count", "time_ns", "op", descending=[False, True, True, False]))
    return fams, ops
