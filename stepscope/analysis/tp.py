"""Tensor-parallel width projection with Equation 1.3, and the per-rank view of TP traces.

Per rank at width w (seed 003, "Tensor parallelism across 4 A100s"):
  CPU floor    = N_k · t_launch                  (the launch count per rank does not change)
  device floor = U + S · w0 / w + C(w)           U unsharded work, S sharded work measured at
                                                 the trace's width w0, C(w) = layers · c_layer
                                                 for w > 1 (the collectives), 0 at w = 1
  step         = max(CPU floor, device floor)
Sharded: projection GEMMs, attention and their split-K reduces. From a trace, U and S come from
its class times, scaled so that w = w0 reproduces its measured GPU busy time exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from stepscope.analysis.inventory import Inventory

SHARDED = ("gemm", "splitk_reduce", "attention_prefill", "attention_decode")
# Two all-reduces per layer (after O and after down). Default cost of one when no TP trace is
# given: the mean transfer time (waits removed) of the collectives in the committed H200 TP=2
# fixture (llama8b_decode_b1_eager_tp2.sqlite, NCCL ring LL, bf16), recomputed by a test.
ALLREDUCES_PER_LAYER = 2
DEFAULT_ALLREDUCE_NS = 7_200


@dataclass
class Projection:
    rows: list[dict]
    launch_bound_from_tp: int | None
    inputs: dict
    notes: list[str] = field(default_factory=list)


def project(
    n_launch: int, t_launch_ns: float, sharded_ns: float, unsharded_ns: float = 0.0,
    widths=(1, 2, 4, 8), base_tp: int = 1, layers: int = 0, collective_per_layer_ns: float = 0.0,
    scale: float = 1.0,
) -> Projection:
    cpu = n_launch * t_launch_ns
    rows = []
    for w in widths:
        device = scale * (unsharded_ns + sharded_ns * base_tp / w + (layers * collective_per_layer_ns if w > 1 else 0))
        rows.append({
            "tp": w,
            "cpu_floor_ns": int(round(cpu)),
            "device_floor_ns": int(round(device)),
            "step_time_ns": int(round(max(cpu, device))),
            "bound": "launch-bound" if cpu > device else "device-bound",
        })
    bound_at = [r["tp"] for r in rows if r["bound"] == "launch-bound"]
    return Projection(rows, min(bound_at) if bound_at else None, {
        "n_launch": n_launch, "t_launch_ns": t_launch_ns, "sharded_ns": sharded_ns,
        "unsharded_ns": unsharded_ns, "base_tp": base_tp, "layers": layers,
        "collective_per_layer_ns": collective_per_layer_ns, "scale": scale,
    })


def project_trace(inv: Inventory, floors: pl.DataFrame, widths=(1, 2, 4, 8),
                  collective_us: float | None = None) -> Projection:
    """Project the trace's median step (by step time) of its first rank."""
    s = inv.steps
    first_pid = s.sort("step")["pid"][0]
    ranks = s.select("pid", "device").unique().height
    mine = s.filter(pl.col("pid") == first_pid).sort("step_time_ns")
    med = mine.row(mine.height // 2, named=True)
    step = med["step"]
    shape_tp = _step_tp(med["name"])
    base_tp = shape_tp or ranks
    c = inv.classes.filter(pl.col("step") == step)
    t = dict(zip(c["class"].to_list(), c["time_ns"].to_list()))
    sharded = float(sum(t.get(k, 0) for k in SHARDED))
    comm = float(t.get("comm", 0))
    unsharded = float(sum(v for k, v in t.items() if k not in SHARDED and k != "comm"))
    layers = med["layers"] or 0
    per_rank = rank_table(inv) if comm else None
    notes = []
    if collective_us is not None:
        c_layer = collective_us * 1e3 * ALLREDUCES_PER_LAYER
        notes.append(f"collective cost given: {collective_us} µs per all-reduce")
    elif comm and layers and base_tp > 1:
        transfer = per_rank["comm_time_ns"] - per_rank["comm_wait_ns"]
        c_layer = float(transfer.median()) / layers if per_rank.height else comm / layers
        notes.append("collective cost measured from this TP trace (transfer time, waits removed)")
    else:
        c_layer = DEFAULT_ALLREDUCE_NS * ALLREDUCES_PER_LAYER
        notes.append(f"collective cost estimated: {ALLREDUCES_PER_LAYER} all-reduces per layer × "
                     f"{DEFAULT_ALLREDUCE_NS / 1e3:.1f} µs (measured on the H200 TP=2 fixture); "
                     "give a TP trace or --collective-us to replace it")
    f = floors.filter(pl.col("step") == step).row(0, named=True)
    work_base = unsharded + sharded + (layers * c_layer if base_tp > 1 else 0)
    # the device floor excludes time a collective spent waiting for a slower peer
    wait = 0
    if per_rank is not None:
        r = per_rank.filter(pl.col("step") == step)
        wait = int(r["comm_wait_ns"][0]) if r.height else 0
    device_base = med["gpu_busy_ns"] - wait
    scale = device_base / work_base if work_base else 1.0
    p = project(med["n_launch_calls"], f["t_launch_ns"], sharded, unsharded, widths, base_tp, layers,
                c_layer, scale)
    p.inputs.update({"step": step, "pid": med["pid"], "device": med["device"],
                     "measured_step_time_ns": med["step_time_ns"], "gpu_busy_ns": med["gpu_busy_ns"],
                     "comm_wait_ns": wait})
    p.notes = notes
    return p


def _step_tp(name: str | None) -> int | None:
    from stepscope.analysis.steps import step_shape

    tp = step_shape(name).get("tp")
    return tp if isinstance(tp, int) else None


def rank_table(inv: Inventory) -> pl.DataFrame:
    """Per rank (process, device), per step ordinal: step time, NCCL time, and its waiting part.

    The i-th collective kernel of a step on each rank is one collective; a rank whose kernel
    started before the last rank's did was waiting for it: wait = latest start − own start
    (capped at the kernel's duration); the rest of the kernel is transfer.
    """
    s = inv.steps.select("step", "pid", "device", "step_time_ns").sort("step")
    s = s.with_columns(ordinal=pl.int_range(pl.len()).over("pid", "device"))
    comm = (
        inv.acts.filter((pl.col("class") == "comm") & pl.col("step").is_not_null())
        .select("step", "start", "end").sort("step", "start")
        .join(s.select("step", "pid", "device", "ordinal"), on="step")
        .with_columns(i=pl.int_range(pl.len()).over("step"))
    )
    if comm.is_empty():
        return s.with_columns(comm_time_ns=pl.lit(0, pl.Int64), comm_wait_ns=pl.lit(0, pl.Int64)).drop("ordinal")
    last = comm.group_by("ordinal", "i").agg(last_start=pl.col("start").max())
    comm = comm.join(last, on=["ordinal", "i"]).with_columns(
        wait=pl.min_horizontal(pl.col("last_start") - pl.col("start"), pl.col("end") - pl.col("start")))
    per = comm.group_by("step").agg(comm_time_ns=(pl.col("end") - pl.col("start")).sum(),
                                    comm_wait_ns=pl.col("wait").sum())
    return s.join(per, on="step", how="left").fill_null(0).drop("ordinal").sort("step")
