"""The step's HBM byte budget: each step kernel joined to a measured cell, next to the minimum.

`budget(step_kernels, cells, card, batch, context, phase, gpu_name)` takes one step's kernels
(columns name, demangled, class, grid_x/y/z, block_x/y/z, count, time_ns — one row per
distinct kernel launch configuration, `count` calls) and a cells table (stepscope.bytes.cells).

Join, in order, saying which way each kernel was joined (`join` column):

1. `launch`: same kernel (function base name, compared between nsys's short/demangled name and
   ncu's printed name) **and** same grid **and** same block as a measured launch. Among
   several such cells the one whose token count is nearest the step's wins.
2. `name`: same kernel base name, other launch configuration: the cell at the nearest token
   count (bytes of a different shape: an approximation, flagged).
3. `op`: no cell with this kernel: the cell of the op the kernel's class stands for (norm →
   add_norm, rope, kv_cache_write → kv_write, activation → silu_mul, embedding, sampling →
   argmax, attention_* → attn_*) at the nearest token count, taking that cell's heaviest
   launch. GEMMs are never joined this way (the projection cannot be told from the class).
4. none: listed in `unjoined_kernels`, never silently counted as zero.

Per (class, op) row: calls, measured bytes per call, measured step bytes, minimum
(`stepscope.bytes.minbytes.step_rows`), amplification = measured / minimum, removable =
measured − minimum, the bandwidth floor bytes / peak HBM bandwidth, and the kernels' measured
time. The step row sums the rows (self-checked).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

from stepscope.bytes.cells import check_gpu
from stepscope.bytes.hbm import peak_hbm_bps
from stepscope.bytes.minbytes import step_rows
from stepscope.errors import InputError

CLASS_TO_OP = {
    "norm": "add_norm", "rope": "rope", "kv_cache_write": "kv_write", "activation": "silu_mul",
    "embedding": "embedding", "sampling": "argmax", "attention_decode": "attn_decode",
    "attention_prefill": "attn_prefill",
}
DIMS = ["grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z"]


def kernel_base(name: str | None) -> str | None:
    """'void at::native::reduce_kernel<512, 1, …>(…)' -> 'reduce_kernel'; short names as-is."""
    if not name:
        return None
    s = name.strip()
    if s.startswith("void "):
        s = s[5:]
    out, depth = [], 0
    for ch in s:  # drop template arguments and the parameter list
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif ch == "(" and depth == 0:
            break
        elif depth == 0:
            out.append(ch)
    base = "".join(out).strip()
    base = base.split("::")[-1].strip()
    return base or name


def _op_label(op: str | None, proj: str | None) -> str | None:
    if op is None:
        return None
    return f"{op}:{proj}" if proj else op


@dataclass
class BudgetResult:
    kernels: pl.DataFrame          # one row per step kernel with its join
    rows: pl.DataFrame             # per (class, op)
    classes: pl.DataFrame          # per class, ranked by removable bytes
    step: dict[str, Any]
    peak_bps: float | None
    gpu: str | None
    warnings: list[str] = field(default_factory=list)

    def self_check(self) -> None:
        m = self.rows["measured_bytes"].fill_null(0).sum()
        assert m == self.step["measured_bytes"]
        assert self.rows["min_bytes"].fill_null(0).sum() == self.step["min_bytes"]

    def to_dict(self) -> dict:
        return {"gpu": self.gpu, "peak_hbm_bps": self.peak_bps,
                "rows": self.rows.to_dicts(), "classes": self.classes.to_dicts(),
                "step": self.step, "kernels": self.kernels.to_dicts(),
                "warnings": self.warnings}


def _usable_cells(cells: pl.DataFrame) -> pl.DataFrame:
    c = cells
    if "error" in c.columns:
        c = c.filter(pl.col("error").is_null())
    if "matched" in c.columns:
        c = c.filter(pl.col("matched").fill_null(True))
    for col in ("op", "proj", "cell"):
        if col not in c.columns:
            c = c.with_columns(pl.lit(None, pl.String).alias(col))
    if "tokens" not in c.columns:
        c = c.with_columns(pl.lit(None, pl.Int64).alias("tokens"))
    c = c.filter(pl.col("kernel").is_not_null())
    return c.with_columns(
        pl.col("kernel").map_elements(kernel_base, return_dtype=pl.String).alias("base"),
        (pl.col("dram_read_bytes").fill_null(0) + pl.col("dram_write_bytes").fill_null(0))
        .alias("bytes_per_call"),
    )


def _pick(cands: list[dict], tokens: int) -> dict:
    return min(cands, key=lambda r: (abs((r.get("tokens") or 0) - tokens), r.get("cell") or ""))


def budget(step_kernels: pl.DataFrame, cells: pl.DataFrame, card: Any, batch: int,
           context: int, phase: str, gpu_name: str | None = None,
           peak_bps: float | None = None) -> BudgetResult:
    """Join one step's kernels to measured cells and set the bytes against the minimum."""
    need = {"name", "class", "count", "time_ns", *DIMS}
    missing = need - set(step_kernels.columns)
    if missing:
        raise InputError(f"step kernels lack columns {', '.join(sorted(missing))}")
    check_gpu(cells, gpu_name, "the cells")
    if peak_bps is None:
        gpus = sorted({g for g in (cells["gpu"].to_list() if "gpu" in cells.columns else []) if g})
        peak_bps = peak_hbm_bps(gpu_name) or (peak_hbm_bps(gpus[0]) if gpus else None)
    tokens = batch if phase == "decode" else batch * context
    usable = _usable_cells(cells).to_dicts()
    by_launch: dict[tuple, list[dict]] = {}
    by_base: dict[str, list[dict]] = {}
    by_op: dict[str, list[dict]] = {}
    for r in usable:
        key = (r["base"], *(r.get(d) for d in DIMS))
        by_launch.setdefault(key, []).append(r)
        by_base.setdefault(r["base"], []).append(r)
        if r.get("op"):
            by_op.setdefault(r["op"], []).append(r)

    out = []
    sk = step_kernels
    if "demangled" not in sk.columns:
        sk = sk.with_columns(pl.lit(None, pl.String).alias("demangled"))
    for k in sk.to_dicts():
        cls = k["class"]
        t = batch if cls == "sampling" else (context if cls == "attention_prefill" else tokens)
        bases = {b for b in (kernel_base(k.get("name")), kernel_base(k.get("demangled"))) if b}
        hit, how = None, None
        for b in bases:
            cands = by_launch.get((b, *(k.get(d) for d in DIMS)))
            if cands:
                hit, how = _pick(cands, t), "launch"
                break
        if hit is None:
            cands = [r for b in bases for r in by_base.get(b, [])]
            if cands:
                hit, how = _pick(cands, t), "name"
        if hit is None and cls in CLASS_TO_OP:
            op = CLASS_TO_OP[cls]
            if op == "add_norm" and "fused_add" not in (k.get("name") or "") + (
                    k.get("demangled") or "") and "norm" in by_op:
                op = "norm"
            cands = by_op.get(op) or []
            if cands:
                near = _pick(cands, t)
                same = [r for r in cands if r.get("cell") == near.get("cell")]
                hit, how = max(same, key=lambda r: r["bytes_per_call"]), "op"
        row = {
            "name": k.get("name"), "demangled": k.get("demangled"), "class": cls,
            "grid": f"({k['grid_x']}, {k['grid_y']}, {k['grid_z']})",
            "block": f"({k['block_x']}, {k['block_y']}, {k['block_z']})",
            "count": int(k["count"]), "time_ns": int(k["time_ns"]), "join": how,
            "cell": hit.get("cell") if hit else None,
            "op": _op_label(hit.get("op"), hit.get("proj")) if hit else None,
            "bytes_per_call": int(hit["bytes_per_call"]) if hit else None,
        }
        row["measured_bytes"] = row["bytes_per_call"] * row["count"] if hit else None
        out.append(row)
    kschema = {"name": pl.String, "demangled": pl.String, "class": pl.String, "grid": pl.String,
               "block": pl.String, "count": pl.Int64, "time_ns": pl.Int64, "join": pl.String,
               "cell": pl.String, "op": pl.String, "bytes_per_call": pl.Int64,
               "measured_bytes": pl.Int64}
    kern = pl.DataFrame(out, schema=kschema)

    # measured side, per (class, op); unjoined kernels keep their class with op null
    meas = kern.group_by("class", "op").agg(
        pl.col("count").sum().alias("calls"),
        pl.when(pl.col("measured_bytes").is_not_null().any())
        .then(pl.col("measured_bytes").sum()).otherwise(None).alias("measured_bytes"),
        pl.col("time_ns").sum().alias("time_ns"),
    )
    plan = pl.DataFrame(step_rows(card, batch, context, phase)).select(
        "class", "op", pl.col("calls").alias("min_calls"), "min_bytes")
    rows = meas.join(plan, on=["class", "op"], how="full", coalesce=True).with_columns(
        pl.col("calls").fill_null(0), pl.col("time_ns").fill_null(0))
    rows = rows.with_columns(
        pl.when(pl.col("calls") > 0).then(pl.col("measured_bytes") / pl.col("calls"))
        .otherwise(None).alias("measured_bytes_per_call"),
        pl.when((pl.col("min_bytes") > 0) & pl.col("measured_bytes").is_not_null())
        .then(pl.col("measured_bytes") / pl.col("min_bytes")).otherwise(None)
        .alias("amplification"),
        (pl.col("measured_bytes") - pl.col("min_bytes").fill_null(0)).alias("removable_bytes"),
        _floor("measured_bytes", peak_bps).alias("floor_ns"),
    ).sort("class", "op", nulls_last=True)
    classes = rows.group_by("class").agg(
        pl.col("calls").sum(),
        pl.when(pl.col("measured_bytes").is_not_null().any())
        .then(pl.col("measured_bytes").sum()).otherwise(None).alias("measured_bytes"),
        pl.col("min_bytes").sum(), pl.col("time_ns").sum(),
    ).with_columns(
        (pl.col("measured_bytes") - pl.col("min_bytes")).alias("removable_bytes"),
        _floor("measured_bytes", peak_bps).alias("floor_ns"),
    ).sort("removable_bytes", descending=True, nulls_last=True)
    measured = int(kern["measured_bytes"].fill_null(0).sum())
    minimum = int(rows["min_bytes"].fill_null(0).sum())
    unjoined = kern.filter(pl.col("join").is_null())
    step = {
        "measured_bytes": measured, "min_bytes": minimum, "removable_bytes": measured - minimum,
        "amplification": measured / minimum if minimum else None,
        "floor_ns": int(measured / peak_bps * 1e9) if peak_bps else None,
        "min_floor_ns": int(minimum / peak_bps * 1e9) if peak_bps else None,
        "time_ns": int(kern["time_ns"].sum()), "calls": int(kern["count"].sum()),
        "joined": {j: int(kern.filter(pl.col("join") == j)["count"].sum())
                   for j in ("launch", "name", "op")},
        "unjoined_kernels": [
            {"name": r["name"], "class": r["class"], "grid": r["grid"], "block": r["block"],
             "count": r["count"]} for r in unjoined.to_dicts()],
        "batch": batch, "context": context, "phase": phase,
    }
    warnings = []
    if unjoined.height:
        warnings.append(f"{int(unjoined['count'].sum())} kernel call(s) of {unjoined.height} "
                        "kernel(s) have no cell: their bytes are not in measured_bytes")
    approx = kern.filter(pl.col("join").is_in(["name", "op"]))
    if approx.height:
        warnings.append(f"{approx.height} kernel(s) joined by name/op only (another launch "
                        "configuration was measured): their bytes are approximate")
    res = BudgetResult(kern, rows, classes, step, peak_bps, gpu_name, warnings)
    res.self_check()
    return res


def _floor(col: str, peak_bps: float | None) -> pl.Expr:
    if not peak_bps:
        return pl.lit(None, pl.Int64)
    return (pl.col(col) / peak_bps * 1e9).round(0).cast(pl.Int64)


def step_kernels_from_inventory(inv, step: int) -> pl.DataFrame:
    """One step's kernels with launch configuration, from the analyzer's Inventory."""
    a = inv.acts.filter((pl.col("step") == step) & pl.col("is_kernel"))
    return (a.group_by("name", "demangled", "class", *DIMS)
            .agg(pl.len().cast(pl.Int64).alias("count"),
                 (pl.col("end") - pl.col("start")).sum().alias("time_ns"))
            .sort("time_ns", descending=True))
