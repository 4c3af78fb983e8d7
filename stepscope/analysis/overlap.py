"""Processes whose kernels run at the same times on one device.

One GPU runs one process's kernels at a time unless MPS or green contexts share it; an export
that shows two processes busy on one device at once is, far more often, two exports merged or a
process recorded twice (one copy shifted by a microsecond gave a 1 µs step and a "0.001 ms" rank
in `tp`). The figures per process on that device cannot be trusted then: this names them.
"""

from __future__ import annotations

import polars as pl

from stepscope.analysis.notes import SHARED_DEVICE, note

# share of the smaller process's busy time on the device that another process's kernels cover
SHARED_SHARE = 0.10


def shared_devices(acts: pl.DataFrame) -> list:
    """One warning per device where two or more processes' kernels overlap in time for more
    than SHARED_SHARE of the less busy one's busy time. `acts`: the GPU activities (pid,
    device, start, end, is_kernel)."""
    k = acts.lazy().filter(pl.col("is_kernel") & pl.col("pid").is_not_null() & pl.col("device").is_not_null()
                           ).select("pid", "device", "start", "end")
    multi = (k.group_by("device").agg(pl.col("pid").n_unique().alias("n")).filter(pl.col("n") > 1)
             .select("device").collect())
    if multi.is_empty():
        return []
    k = k.join(multi.lazy(), on="device", how="semi").sort("device", "pid", "start")
    # each process's busy intervals on the device (its kernels' union: disjoint by construction)
    busy = (k.with_columns(reach=pl.col("end").cum_max().shift(1).over("device", "pid"))
            .with_columns(new=(pl.col("reach").is_null() | (pl.col("start") > pl.col("reach"))).cum_sum()
                          .over("device", "pid"))
            .group_by("device", "pid", "new").agg(pl.col("start").min(), pl.col("end").max()))
    per_pid = busy.group_by("device", "pid").agg((pl.col("end") - pl.col("start")).sum().alias("busy"))
    # a sweep over the union intervals: where two or more are open, two processes are busy at once
    ev = pl.concat([busy.select("device", t=pl.col("start"), d=pl.lit(1, pl.Int32)),
                    busy.select("device", t=pl.col("end"), d=pl.lit(-1, pl.Int32))])
    ev = (ev.sort("device", "t", "d").with_columns(open=pl.col("d").cum_sum().over("device"))
          .with_columns(span=(pl.col("t").shift(-1).over("device") - pl.col("t")).fill_null(0)))
    both = ev.filter(pl.col("open") >= 2).group_by("device").agg(pl.col("span").sum().alias("both"))
    rows = (per_pid.group_by("device").agg(pl.col("pid").sort(), pl.col("busy").min().alias("least"))
            .join(both, on="device").filter(pl.col("both") > SHARED_SHARE * pl.col("least"))
            .sort("device").collect())
    return [note(SHARED_DEVICE, pids=tuple(r["pid"]), device=r["device"], both=r["both"], least=r["least"])
            for r in rows.iter_rows(named=True)]
