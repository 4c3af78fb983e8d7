"""The step's HBM byte budget: each step kernel joined to a measured cell, next to the minimum.

`budget(step_kernels, cells, card, batch, context, phase, gpu_name)` takes one step's kernels
(columns name, demangled, class, grid_x/y/z, block_x/y/z, count, time_ns — one row per
distinct kernel launch configuration, `count` calls) and a cells table (stepscope.bytes.cells).

Join, in order, saying which way each kernel was joined (`join` column):

1. `launch`: same kernel (function base name, compared between nsys's short/demangled name and
   ncu's printed name) **and** same grid **and** same block as a measured launch. Among
   several such cells the one whose token count is nearest the step's wins. When cells of
   several ops tie (cuBLASLt dispatches one kernel, one launch shape, for qkv, o and down at
   2048 tokens; one splitKreduce launch shape follows both the o and the down projection at
   one token), the row's calls are shared among those cells in proportion to the calls of
   their ops in the step plan (one kernel row per cell, `shared` = how many cells).
2. `name`: same kernel base name, other launch configuration: the cell at the nearest token
   count.
3. `op`: no cell with this kernel: the cell of the op the kernel's class stands for (norm →
   add_norm, rope, kv_cache_write → kv_write, activation → silu_mul, embedding, sampling →
   argmax, attention_* → attn_*) at the nearest token count. One to one: the cell's launches
   (heaviest first) go to the class's unjoined kernels of the step (longest first); a kernel
   left over (e.g. cuDNN's split-KV `lean_reduction_kernel` when the cell's attention ran as
   one launch) is listed, not given the attention's bytes twice. GEMMs are never joined this
   way (the projection cannot be told from the class).
4. `trace`: memsets/memcpys of the step (class `memops`) carry their bytes in the trace
   itself: a memset writes them, a device-to-device copy reads and writes them.
5. none: listed in `unjoined_kernels` with the reason, never silently counted as zero.

A cell measured at another shape than the step's (decode attention measured at batch 64 for
a batch-1 step; light ops at 1 token for an 8-token step) is scaled by the ratio of the two
minimums: bytes × min(step's op call) / min(cell) (`scale` column; 1.0 at the same shape).
A kernel the trace classed `framework`/`other` that joins a cell of a planned op is counted
in that op's class (`trace_class` keeps the trace's).

Per (class, op) row: calls, measured bytes per call, measured step bytes, minimum
(`stepscope.bytes.minbytes.step_rows`), amplification = measured / minimum, removable =
measured − minimum, the bandwidth floor bytes / peak HBM bandwidth, and the kernels' measured
time. The step row sums the rows (self-checked).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from stepscope.analysis.moe import MOE_GEMM, MOE_ROUTING
from stepscope.bytes.cells import check_gpu
from stepscope.bytes.hbm import peak_hbm_bps
from stepscope.bytes.minbytes import step_rows
from stepscope.classes import BYTE_OP
from stepscope.errors import InputError

CLASS_TO_OP = BYTE_OP  # the op a class's kernel stands for: the class table's byte_op column
DIMS = ["grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z"]


def _base_from_right(s: str) -> str | None:
    """The function name before the outermost parameter list, read from the right: a return
    type may hold '(int)0' or 'T2>0' (nsys: 'std::enable_if<T2>(int)0&&…, void>::type
    vllm::fused_add_rms_norm_kernel<c10::BFloat16, (int)8, (bool)1>(T1 *, …)'), which a
    left-to-right reading takes for the parameters."""
    if not s.endswith(")"):
        return None
    depth, i = 0, len(s) - 1
    while i >= 0:  # the '(' that opens the last parameter list
        depth += {")": 1, "(": -1}.get(s[i], 0)
        if depth == 0:
            break
        i -= 1
    j = i - 1
    while j >= 0 and s[j] == " ":
        j -= 1
    if j >= 0 and s[j] == ">":  # the function's template arguments
        depth = 0
        while j >= 0:
            depth += {">": 1, "<": -1}.get(s[j], 0)
            if depth == 0:
                break
            j -= 1
        j -= 1
    end = j + 1
    while j >= 0 and (s[j].isalnum() or s[j] in "_~"):
        j -= 1
    base = s[j + 1:end]
    return base if base and not base[0].isdigit() else None


def kernel_base(name: str | None) -> str | None:
    """'void at::native::reduce_kernel<512, 1, …>(…)' -> 'reduce_kernel'; short names as-is."""
    if not name:
        return None
    s = name.strip()
    right = _base_from_right(s)
    if right:
        return right
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
    notes: list[str] = field(default_factory=list)  # what the minimum assumes (an MoE step's routing)

    def self_check(self) -> None:
        m = self.rows["measured_bytes"].fill_null(0).sum()
        assert m == self.step["measured_bytes"]
        assert self.rows["plan_min_bytes"].fill_null(0).sum() == self.step["plan_min_bytes"]
        joined = self.rows.filter(pl.col("measured_bytes").is_not_null())["min_bytes"].fill_null(0).sum()
        assert joined == self.step["min_bytes"]

    def to_dict(self) -> dict:
        return {"gpu": self.gpu, "peak_hbm_bps": self.peak_bps,
                "rows": self.rows.to_dicts(), "classes": self.classes.to_dicts(),
                "step": self.step, "kernels": self.kernels.to_dicts(),
                "warnings": self.warnings, **({"notes": self.notes} if self.notes else {})}


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


def _pick(cands: list[dict], tokens: int, want: dict[str, int] | None = None) -> dict:
    """The candidate cell nearest in token count: to the token count the step plan gives the
    cell's op (`want`: op label -> tokens; the prefill LM head runs on 1 row, not 2048), else
    to `tokens`."""
    return min(cands, key=lambda r: (_dist(r, tokens, want), r.get("cell") or ""))


def _dist(r: dict, tokens: int, want: dict[str, int] | None = None) -> int:
    t = (want or {}).get(_op_label(r.get("op"), r.get("proj")) or "", tokens)
    return abs((r.get("tokens") or 0) - t)


def _split(count: int, cells: list[dict], weights: list[float]) -> list[int]:
    """Share `count` calls among cells in proportion to weights (largest remainders)."""
    tot = sum(weights) or 1.0
    exact = [count * w / tot for w in weights]
    n = [int(x) for x in exact]
    order = sorted(range(len(cells)), key=lambda i: (-(exact[i] - n[i]), -weights[i]))
    for i in order[: count - sum(n)]:
        n[i] += 1
    return n


def budget(step_kernels: pl.DataFrame, cells: pl.DataFrame, card: Any, batch: int,
           context: int, phase: str, gpu_name: str | None = None,
           peak_bps: float | None = None, tp: int = 1) -> BudgetResult:
    """Join one step's kernels to measured cells and set the bytes against the minimum.

    `tp` > 1 (one rank of a tensor-parallel step) is only warned about: the minimum and the
    sweep's cells are those of the whole (TP=1) model.
    """
    need = {"name", "class", "count", "time_ns", *DIMS}
    missing = need - set(step_kernels.columns)
    if missing:
        raise InputError(f"step kernels lack columns {', '.join(sorted(missing))}")
    check_gpu(cells, gpu_name, "the cells")
    if peak_bps is None:
        gpus = sorted({g for g in (cells["gpu"].to_list() if "gpu" in cells.columns else []) if g})
        peak_bps = peak_hbm_bps(gpu_name) or (peak_hbm_bps(gpus[0]) if gpus else None)
    tokens = batch if phase == "decode" else batch * context
    plan_rows = step_rows(card, batch, context, phase)
    plan_by_op = {r["op"]: r for r in plan_rows}
    want = {op: r["tokens"] for op, r in plan_by_op.items()
            if not op.startswith("attn_")}  # attention cells: tokens = the class's count
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

    def scale_of(hit: dict) -> float:
        label = _op_label(hit.get("op"), hit.get("proj"))
        cmin = hit.get("cell_min_bytes")
        p = plan_by_op.get(label or "")
        if not cmin or p is None:
            return 1.0
        return p["min_bytes_per_call"] / cmin

    def row_of(k: dict, hit: dict | None, how: str | None, count: int, time_ns: int,
               shared: int = 1, reason: str | None = None) -> dict:
        cls = k["class"]
        label = _op_label(hit.get("op"), hit.get("proj")) if hit else None
        if hit and label is None:
            # a cell that names no op (`cells import` of a plain ncu run): the op of the kernel's
            # class, a GEMM's the projection whose minimum is nearest the bytes it moved, so that
            # the kernel is set against its own minimum (it was set against none: minimum 0)
            label = _order_op(cls, (k.get("name") or "") + " " + (k.get("demangled") or ""), None, 0, 0,
                              int(hit["bytes_per_call"]), plan_by_op)
            inferred.append(k)
        if hit and cls in ("framework", "other", "unknown") and label in plan_by_op:
            cls = plan_by_op[label]["class"]
        sc = scale_of(hit) if hit else None
        bpc = int(round(hit["bytes_per_call"] * sc)) if hit else None
        return {
            "name": k.get("name"), "demangled": k.get("demangled"), "class": cls,
            "trace_class": k["class"],
            "grid": (f"({k['grid_x']}, {k['grid_y']}, {k['grid_z']})"
                     if k.get("grid_x") is not None else None),
            "block": (f"({k['block_x']}, {k['block_y']}, {k['block_z']})"
                      if k.get("block_x") is not None else None),
            "count": int(count), "time_ns": int(time_ns), "join": how,
            "cell": hit.get("cell") if hit else None, "op": label,
            "cell_bytes_per_call": int(hit["bytes_per_call"]) if hit else None,
            "scale": sc, "bytes_per_call": bpc, "shared": shared if hit else None,
            "measured_bytes": bpc * int(count) if hit else None,
            "reason": reason, "l2_hit_pct": hit.get("l2_hit_pct") if hit else None,
        }

    out: list[dict] = []
    pending: list[dict] = []  # kernels for the one-to-one op join
    inferred: list[dict] = []  # kernels joined to a cell without an op
    sk = step_kernels
    if "demangled" not in sk.columns:
        sk = sk.with_columns(pl.lit(None, pl.String).alias("demangled"))
    for k in sk.to_dicts():
        cls = k["class"]
        t = batch if cls == "sampling" else (context if cls == "attention_prefill" else tokens)
        k["_t"] = t
        if cls == "memops" or k.get("trace_bytes") is not None:
            # a memset writes, a device-to-device copy reads and writes, the bytes it records
            tb = int(k.get("trace_bytes") or 0)
            nm = (k.get("name") or "").lower()
            tb *= 2 if ("dtod" in nm or "device to device" in nm) else 1
            hit = {"cell": None, "op": nm or "memop", "proj": None, "bytes_per_call": 0}
            r = row_of(k, hit, "trace", k["count"], k["time_ns"])
            r.update(bytes_per_call=round(tb / max(1, int(k["count"]))), measured_bytes=tb,
                     cell_bytes_per_call=None, scale=None)
            out.append(r)
            continue
        bases = [b for b in dict.fromkeys(
            (kernel_base(k.get("name")), kernel_base(k.get("demangled")))) if b]
        hits, how = [], None
        for b in bases:
            cands = by_launch.get((b, *(k.get(d) for d in DIMS)))
            if cands:
                best = _dist(_pick(cands, t, want), t, want)
                tied: dict[str, dict] = {}
                for r in sorted(cands, key=lambda r: r.get("cell") or ""):
                    if _dist(r, t, want) == best:
                        tied.setdefault(r.get("cell") or "", r)
                hits, how = list(tied.values()), "launch"
                break
        if not hits:
            cands = [r for b in bases for r in by_base.get(b, [])]
            if cands:
                hits, how = [_pick(cands, t, want)], "name"
        if len(hits) == 1:
            out.append(row_of(k, hits[0], how, k["count"], k["time_ns"]))
        elif hits:
            w = [float((plan_by_op.get(_op_label(h.get("op"), h.get("proj")) or "") or {})
                       .get("calls") or 1) for h in hits]
            shares = _split(int(k["count"]), hits, w)
            for h, n in zip(hits, shares):
                if n:
                    out.append(row_of(k, h, how, n, round(k["time_ns"] * n / k["count"]),
                                      shared=len(hits)))
        else:
            pending.append(k)

    # one to one: an op cell's launches to the class's unjoined kernels
    groups: dict[str, list[dict]] = {}
    for k in pending:
        cls = k["class"]
        op = CLASS_TO_OP.get(cls)
        if op == "add_norm" and "fused_add" not in (k.get("name") or "") + (
                k.get("demangled") or "") and "norm" in by_op:
            op = "norm"
        if op is None or not by_op.get(op):
            why = ("no cell for this kernel" + (" or its class" if op else "")
                   + ("" if cls != "comm" else " (communication is not an HBM cell)"))
            out.append(row_of(k, None, None, k["count"], k["time_ns"], reason=why))
            continue
        groups.setdefault(op, []).append(k)
    for op, ks in groups.items():
        near = _pick(by_op[op], ks[0]["_t"], want)
        launches = sorted((r for r in by_op[op] if r.get("cell") == near.get("cell")),
                          key=lambda r: -r["bytes_per_call"])
        ks = sorted(ks, key=lambda k: -k["time_ns"])
        for i, k in enumerate(ks):
            if i < len(launches):
                out.append(row_of(k, launches[i], "op", k["count"], k["time_ns"]))
            else:
                out.append(row_of(
                    k, None, None, k["count"], k["time_ns"],
                    reason=f"cell {near.get('cell')} ({len(launches)} launch(es)) is joined to "
                           f"this class's longer kernel(s); no cell for this one"))
    res = _summarize(out, plan_rows, peak_bps, gpu_name, batch, context, phase, tp)
    res.notes.extend(_notes(card, batch, context, phase))
    if inferred:
        res.warnings.append(f"{len(inferred)} kernel(s) joined to cells that name no op (cells import of a plain ncu "
                            "run): each is set against the minimum of its class's op (a GEMM's: the projection "
                            "whose minimum is nearest the bytes it moved)")
    other = other_model_warning(cells, card)
    if other:  # first: every figure after it depends on it
        res.warnings.insert(0, other)
    return res


KSCHEMA = {"name": pl.String, "demangled": pl.String, "class": pl.String,
           "trace_class": pl.String, "grid": pl.String, "block": pl.String,
           "count": pl.Int64, "time_ns": pl.Int64, "join": pl.String, "cell": pl.String,
           "op": pl.String, "cell_bytes_per_call": pl.Int64, "scale": pl.Float64,
           "bytes_per_call": pl.Int64, "shared": pl.Int64, "measured_bytes": pl.Int64,
           "reason": pl.String, "l2_hit_pct": pl.Float64}


def _summarize(out: list[dict], plan_rows: list[dict], peak_bps: float | None, gpu_name: str | None,
               batch: int, context: int, phase: str, tp: int) -> BudgetResult:
    kern = pl.DataFrame([{k: r.get(k) for k in KSCHEMA} for r in out], schema=KSCHEMA)

    # measured side, per (class, op); unjoined kernels keep their class with op null
    meas = kern.group_by("class", "op").agg(
        pl.col("count").sum().alias("calls"),
        pl.when(pl.col("measured_bytes").is_not_null().any())
        .then(pl.col("measured_bytes").sum()).otherwise(None).alias("measured_bytes"),
        pl.col("time_ns").sum().alias("time_ns"),
        # call-weighted L2 sector hit rate of the measured launches (ncu), for the rows that
        # move fewer DRAM bytes than their minimum
        pl.when(pl.col("l2_hit_pct").is_not_null().any()).then(
            (pl.col("l2_hit_pct") * pl.col("count")).sum()
            / pl.col("count").filter(pl.col("l2_hit_pct").is_not_null()).sum()).alias("l2_hit_pct"),
    )
    plan = pl.DataFrame(plan_rows).select(
        "class", "op", pl.col("calls").alias("min_calls"), "min_bytes", "min_bytes_per_call")
    rows = meas.join(plan, on=["class", "op"], how="full", coalesce=True).with_columns(
        pl.col("calls").fill_null(0), pl.col("time_ns").fill_null(0))
    # the minimum a row's measured bytes are set against is that of the calls measured: an op
    # with 1 of its 32 calls joined (cells of a few kernels) is compared with one call's minimum,
    # not the 32's; plan_min_bytes keeps the step plan's minimum of the op
    rows = rows.with_columns(pl.col("min_bytes").alias("plan_min_bytes")).with_columns(
        pl.when(pl.col("measured_bytes").is_not_null() & pl.col("min_calls").is_not_null())
        .then(pl.col("min_bytes_per_call") * pl.min_horizontal("calls", "min_calls"))
        .otherwise(pl.col("min_bytes")).alias("min_bytes")).drop("min_bytes_per_call")
    rows = rows.with_columns(
        pl.when(pl.col("calls") > 0).then(pl.col("measured_bytes") / pl.col("calls"))
        .otherwise(None).alias("measured_bytes_per_call"),
        pl.when((pl.col("min_bytes") > 0) & pl.col("measured_bytes").is_not_null())
        .then(pl.col("measured_bytes") / pl.col("min_bytes")).otherwise(None)
        .alias("amplification"),
        (pl.col("measured_bytes") - pl.col("min_bytes").fill_null(0)).alias("removable_bytes"),
        _floor("measured_bytes", peak_bps).alias("floor_ns"),
    ).with_columns(
        # below its minimum: the inputs came from L2 (the previous kernel's output) and the
        # outputs still sat in the write-back L2 when the kernel ended (DRAM bytes only)
        pl.when(pl.col("amplification") < 1).then(pl.format(
            "L2-served: L2 sector hit rate {}%{}",
            pl.col("l2_hit_pct").clip(upper_bound=100).round(0).cast(pl.Int64).cast(pl.String).fill_null("?"),
            pl.when(pl.col("l2_hit_pct") > 100).then(pl.lit(" (ncu: over 100)")).otherwise(pl.lit(""))))
        .alias("note"),
    ).sort("class", "op", nulls_last=True)
    measured_row = pl.col("measured_bytes").is_not_null()
    classes = rows.group_by("class").agg(
        pl.col("calls").sum(),
        pl.when(measured_row.any()).then(pl.col("measured_bytes").sum()).otherwise(None).alias("measured_bytes"),
        # a class with measured kernels: the minimum of those (its unjoined ops are in plan_min_bytes)
        pl.when(measured_row.any()).then(pl.col("min_bytes").filter(measured_row).sum())
        .otherwise(pl.col("min_bytes").sum()).alias("min_bytes"),
        pl.col("plan_min_bytes").sum(), pl.col("time_ns").sum(),
    ).with_columns(
        (pl.col("measured_bytes") - pl.col("min_bytes")).alias("removable_bytes"),
        _floor("measured_bytes", peak_bps).alias("floor_ns"),
    ).sort("removable_bytes", descending=True, nulls_last=True)
    measured = int(kern["measured_bytes"].fill_null(0).sum())
    # measured and minimum over the same kernels: the minimum of the ops with measured bytes;
    # an op no kernel of the step joined is listed with its minimum only (unjoined_min_bytes)
    plan_min = int(rows["plan_min_bytes"].fill_null(0).sum())
    minimum = int(rows.filter(pl.col("measured_bytes").is_not_null())["min_bytes"].fill_null(0).sum())
    unjoined = kern.filter(pl.col("join").is_null())
    step = {
        "measured_bytes": measured, "min_bytes": minimum, "removable_bytes": measured - minimum,
        "plan_min_bytes": plan_min, "unjoined_min_bytes": plan_min - minimum,
        "unjoined_ops": rows.filter(pl.col("measured_bytes").is_null() & pl.col("min_bytes").is_not_null())
        ["op"].to_list(),
        "amplification": measured / minimum if minimum else None,
        "floor_ns": int(measured / peak_bps * 1e9) if peak_bps else None,
        "min_floor_ns": int(minimum / peak_bps * 1e9) if peak_bps else None,
        "time_ns": int(kern["time_ns"].sum()), "calls": int(kern["count"].sum()),
        "joined": {j: int(kern.filter(pl.col("join") == j)["count"].sum())
                   for j in ("order", "launch", "name", "op", "trace")},
        "unjoined_kernels": [
            {"name": r["name"], "class": r["class"], "grid": r["grid"], "block": r["block"],
             "count": r["count"], "reason": r["reason"]} for r in unjoined.to_dicts()],
        "batch": batch, "context": context, "phase": phase, "tp": tp,
    }
    warnings = []
    if tp and tp > 1:
        warnings.append(f"this step is one rank of TP={tp}, but the minimum and the cells are "
                        "TP=1 (whole-model shapes): sharded GEMMs/attention are joined by name "
                        "at full width or not at all, and measured vs minimum is not comparable")
    if unjoined.height:
        warnings.append(f"{int(unjoined['count'].sum())} kernel call(s) of {unjoined.height} "
                        "kernel(s) have no cell: their bytes are not in measured_bytes")
    approx = kern.filter(pl.col("join").is_in(["name", "op"]))
    if approx.height:
        warnings.append(f"{approx.height} kernel(s) joined by name/op only (another launch "
                        "configuration was measured): their bytes are approximate")
    scaled = kern.filter((pl.col("scale") - 1).abs() > 0.01)
    if scaled.height:
        warnings.append(f"{scaled.height} kernel(s) joined to a cell of another shape: their "
                        "bytes are scaled by the ratio of the minimums (`scale`)")
    shared = kern.filter(pl.col("shared") > 1)
    if shared.height:
        warnings.append(f"{shared['name'].n_unique()} kernel launch shape(s) measured for "
                        "several ops: their calls are shared among those ops by the step plan")
    res = BudgetResult(kern, rows, classes, step, peak_bps, gpu_name, warnings)
    res.self_check()
    return res


def _notes(card: Any, batch: int, context: int, phase: str) -> list[str]:
    from stepscope.bytes.minbytes import moe_note

    note = moe_note(card, batch, context, phase)
    return [note] if note else []



def _floor(col: str, peak_bps: float | None) -> pl.Expr:
    if not peak_bps:
        return pl.lit(None, pl.Int64)
    return (pl.col(col) / peak_bps * 1e9).round(0).cast(pl.Int64)


def step_kernels_from_inventory(inv, step: int, memops: bool = False) -> pl.DataFrame:
    """One step's kernels with launch configuration, from the analyzer's Inventory; with
    `memops`, the step's memsets/memcpys too (class `memops`, null launch dims,
    `trace_bytes` = the bytes the trace records; `budget` joins them by those bytes)."""
    a = inv.step_acts(step)
    if "bytes" not in a.columns:
        a = a.with_columns(pl.lit(None, pl.Int64).alias("bytes"))
    k = (a.filter(pl.col("is_kernel"))
         .group_by("name", "demangled", "class", *DIMS)
         .agg(pl.len().cast(pl.Int64).alias("count"),
              (pl.col("end") - pl.col("start")).sum().alias("time_ns"))
         .with_columns(pl.lit(None, pl.Int64).alias("trace_bytes")))
    if not memops:
        return k.sort("time_ns", descending=True)
    m = (a.filter(~pl.col("is_kernel"))
         .group_by("name", "demangled", "class")
         .agg(pl.len().cast(pl.Int64).alias("count"),
              (pl.col("end") - pl.col("start")).sum().alias("time_ns"),
              pl.col("bytes").sum().cast(pl.Int64).alias("trace_bytes"))
         .with_columns([pl.lit(None, pl.Int64).alias(d) for d in DIMS]))
    return pl.concat([k, m.select(k.columns)], how="vertical_relaxed").sort(
        "time_ns", descending=True)


# --- the step's own kernels, measured in launch order (stepcells.py) ----------------------------

GEMM_ORDER = ("gemm:qkv", "gemm:o", "gemm:gate_up", "gemm:down")
# the activation op after a gate_up GEMM of an MoE layer
_ACT_AFTER = {"moe_gemm:gate_up": "moe_act", "gemm:shared_gate_up": "shared_act", "gemm:gate_up": "silu_mul"}
# an MoE routing kernel's op, by its name (vLLM's Triton backend: topkGating, moe_align_block_size,
# count_and_sort_expert_tokens, moe_sum_vec)
ROUTING_OPS = (("moe_topk", r"topk|gating"), ("moe_align", r"align|sort|permute"), ("moe_sum", r"moe_sum|reduce"))


def step_sequence_from_inventory(inv, step: int) -> pl.DataFrame:
    """One step's kernels one row per launch, in launch order (the order ncu profiles them)."""
    a = inv.step_acts(step).filter(pl.col("is_kernel"))
    return (a.sort("launch_start", "start", nulls_last=True)
            .select(pl.col("name").cast(pl.String), pl.col("demangled").cast(pl.String),
                    pl.col("class").cast(pl.String), *DIMS,
                    (pl.col("end") - pl.col("start")).alias("time_ns")))


def _align(a: list[str | None], b: list[str | None]) -> dict[int, int]:
    """Position in `a` -> position in `b` for the longest common subsequence of equal names
    (the n-th kernel of the step is the n-th profiled kernel, unless one side has extra ones)."""
    from difflib import SequenceMatcher

    m = SequenceMatcher(None, a, b, autojunk=False)
    out: dict[int, int] = {}
    for blk in m.get_matching_blocks():
        for k in range(blk.size):
            out[blk.a + k] = blk.b + k
    return out


def _order_op(cls: str, name: str, gemm_ordinal: int | None, n_gemm: int, layers: int,
              bytes_per_call: int | None, plan_by_op: dict) -> str | None:
    """The op of the step plan a kernel stands for, from its class and its place in the step."""
    if cls == "gemm":
        if n_gemm == 4 * layers + 1 and gemm_ordinal is not None:
            return "gemm:lm_head" if gemm_ordinal == n_gemm - 1 else GEMM_ORDER[gemm_ordinal % 4]
        if bytes_per_call is None:
            return None
        # another GEMM layout: the projection whose minimum is nearest the bytes it moved
        gemms = [o for o in plan_by_op if o.startswith("gemm:")]
        return min(gemms, key=lambda o: abs(plan_by_op[o]["min_bytes_per_call"] - bytes_per_call))
    if cls == MOE_ROUTING:  # top-k, align/sort or moe_sum, by the kernel's name
        return next((op for op, rx in ROUTING_OPS if re.search(rx, name or "", re.I) and op in plan_by_op), None)
    if cls == MOE_GEMM:  # gate_up or down: the one whose minimum is nearest the bytes it moved
        moe = [o for o in plan_by_op if o.startswith("moe_gemm:")]
        if bytes_per_call is None or not moe:
            return None
        return min(moe, key=lambda o: abs(plan_by_op[o]["min_bytes_per_call"] - bytes_per_call))
    op = CLASS_TO_OP.get(cls)
    if op == "add_norm" and "fused_add" not in (name or ""):
        op = "norm"
    return op


def budget_order(seq: pl.DataFrame, cells: pl.DataFrame, card: Any, batch: int, context: int,
                 phase: str, gpu_name: str | None = None, peak_bps: float | None = None,
                 tp: int = 1, memops: pl.DataFrame | None = None) -> BudgetResult:
    """The budget of a step whose own kernels were measured (stepcells.py): the n-th kernel of
    the step joined to the n-th profiled kernel when their names agree (`join` = "order";
    the longest common subsequence of the two name lists when one side has kernels the other
    lacks). Each kernel keeps the bytes of its own launch; its op follows from its class and
    place: the GEMMs of a layer are qkv, o, gate_up, down in launch order and the last GEMM of
    the step is the LM head (or, for another layout, the projection whose minimum is nearest
    the bytes it moved). `memops` (step_kernels_from_inventory(memops=True) rows of class
    memops) join by the bytes the trace records, as in budget()."""
    from stepscope.bytes.minbytes import shape_of

    check_gpu(cells, gpu_name, "the cells")
    if peak_bps is None:
        gpus = sorted({g for g in (cells["gpu"].to_list() if "gpu" in cells.columns else []) if g})
        peak_bps = peak_hbm_bps(gpu_name) or (peak_hbm_bps(gpus[0]) if gpus else None)
    plan_rows = step_rows(card, batch, context, phase)
    plan_by_op = {r["op"]: r for r in plan_rows}
    layers = shape_of(card).layers
    c = _usable_cells(cells).sort("launch")
    cell_rows = c.to_dicts()
    ks = seq.to_dicts()
    names_step = [kernel_base(k.get("demangled")) or kernel_base(k.get("name")) for k in ks]
    names_ncu = [kernel_base(r.get("kernel")) for r in cell_rows]
    pos = _align(names_step, names_ncu)
    gemm_pos = [i for i, k in enumerate(ks) if k["class"] == "gemm"]
    gemm_ord = {i: n for n, i in enumerate(gemm_pos)}
    out: list[dict] = []
    last_gemm_op = None
    for i, k in enumerate(ks):
        hit = cell_rows[pos[i]] if i in pos else None
        bpc = int(hit["bytes_per_call"]) if hit else None
        op = _order_op(k["class"], k.get("name") or "", gemm_ord.get(i), len(gemm_pos), layers, bpc,
                       plan_by_op)
        if k["class"] in ("gemm", MOE_GEMM):
            last_gemm_op = op
        elif k["class"] == "splitk_reduce":
            op = last_gemm_op  # the split-K reduce finishes the GEMM launched before it
        elif k["class"] == "activation" and (last_gemm_op in _ACT_AFTER or op not in plan_by_op):
            # the activation of the gate_up GEMM before it: an MoE layer's experts' or shared
            # experts' (a model without a dense layer has no silu_mul in its plan)
            op = _ACT_AFTER.get(last_gemm_op or "", "moe_act" if "moe_act" in plan_by_op else op)
        cls = k["class"]
        if op in plan_by_op and cls in ("framework", "other"):
            cls = plan_by_op[op]["class"]
        out.append({
            "name": k.get("name"), "demangled": k.get("demangled"), "class": cls, "trace_class": k["class"],
            "grid": f"({k['grid_x']}, {k['grid_y']}, {k['grid_z']})" if k.get("grid_x") is not None else None,
            "block": f"({k['block_x']}, {k['block_y']}, {k['block_z']})" if k.get("block_x") is not None else None,
            "count": 1, "time_ns": int(k["time_ns"]), "join": "order" if hit else None,
            "cell": hit.get("cell") if hit else None, "op": op if hit else None,
            "cell_bytes_per_call": bpc, "scale": 1.0 if hit else None, "bytes_per_call": bpc,
            "shared": 1 if hit else None, "measured_bytes": bpc,
            "reason": None if hit else "no profiled kernel of this name at this place in the step",
            "l2_hit_pct": hit.get("l2_hit_pct") if hit else None,
        })
    if memops is not None:
        for k in memops.filter(pl.col("class") == "memops").to_dicts():
            tb = int(k.get("trace_bytes") or 0)
            nm = (k.get("name") or "").lower()
            tb *= 2 if ("dtod" in nm or "device to device" in nm) else 1
            out.append({"name": k.get("name"), "demangled": k.get("demangled"), "class": "memops",
                        "trace_class": "memops", "count": int(k["count"]), "time_ns": int(k["time_ns"]),
                        "join": "trace", "op": nm or "memop", "bytes_per_call": round(tb / max(1, int(k["count"]))),
                        "measured_bytes": tb, "shared": 1})
    res = _summarize(out, plan_rows, peak_bps, gpu_name, batch, context, phase, tp)
    res.notes.extend(_notes(card, batch, context, phase))
    n_step, n_ncu, n_join = len(ks), len(cell_rows), len(pos)
    res.step["order"] = {"step_kernels": n_step, "profiled_kernels": n_ncu, "joined": n_join}
    if n_join < max(n_step, n_ncu):
        res.warnings.append(f"launch-order join: {n_join} of the step's {n_step} kernels matched one of the "
                            f"{n_ncu} profiled kernels by name and place; the rest have no bytes")
    meta = {k: cells[k].drop_nulls().unique().to_list() for k in ("phase", "batch", "context", "model")
            if k in cells.columns}
    want = {"phase": phase, "batch": batch, "context": context}
    off = [f"{k} {meta[k][0]} (step: {v})" for k, v in want.items()
           if meta.get(k) and str(meta[k][0]) != str(v)]
    if off:
        res.warnings.append("the cells were measured on another step shape: " + ", ".join(off))
    other = other_model_warning(cells, card)
    if other:
        res.warnings.insert(0, other)
    return res


def other_model_warning(cells: pl.DataFrame, card: Any) -> str | None:
    """The warning for cells that record only other models than the step's card (None: they
    record the card's model, or no model): each byte joined to them by name or op is another
    model's kernel's, so measured against minimum, and the floor, say nothing about this step."""
    name = card if isinstance(card, str) else getattr(card, "name", None)  # a card or its name
    if not name or "model" not in cells.columns:
        return None
    models = sorted({m for m in cells["model"].drop_nulls().unique().to_list() if m})
    if not models or name in models:
        return None
    return (f"the cells were measured on {', '.join(models)}, not on {name}: the bytes joined to them are another "
            f"model's kernels' (scaled by the minimums), so measured vs minimum and the bandwidth floor are not this "
            f"step's; measure this model's cells (stepscope cells run --model {name})")
