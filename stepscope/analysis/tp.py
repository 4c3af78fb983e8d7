"""Tensor-parallel width projection with Equation 1.3, and the per-rank view of TP traces.

Per rank at width w (seed 003, "Tensor parallelism across 4 A100s"), in eager mode:
  CPU floor    = N_k · t_launch                  (the launch count per rank does not change)
  device floor = U + S · w0 / w + C(w)           U unsharded work, S sharded work measured at
                                                 the trace's width w0, C(w) = layers · c_layer
                                                 for w > 1 (the collectives' transfer), 0 at w = 1
  step         = max(CPU floor, device floor)
and in graph mode the step is the what-if graph step (whatif.graph_step, the one model analyze
and compare quote) of the projected step with its device floor at width w: the host before the
replay (prologue, graph launch) then the device work and the replay's gaps, so that at the trace's
own width it is analyze's prediction. More GPUs keep shortening a graph step long after an eager
one has become launch-bound.
Sharded: projection GEMMs, attention and their split-K reduces, and an MoE step's expert GEMMs
(each expert's intermediate dimension split, vLLM's TP without expert parallelism: moe.TP_ASSUMPTION
says it in words, with expert parallelism's difference); its routing stays whole. From a trace, U and S come from
its class times, scaled so that w = w0 reproduces the device floor of the projected step (its
device work: GPU busy less the collectives' waiting for a slower rank, collectives.py). The
projected step is the median step of one rank: the binding rank of a multi-rank trace.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from stepscope.analysis.collectives import summary_rank
from stepscope.analysis.moe import MOE_GEMM, MOE_ROUTING
from stepscope.analysis.representative import representative
from stepscope.analysis.verdict import LAUNCH_BOUND, verdict_of
from stepscope.classes import TP_SHARDED

SHARDED = TP_SHARDED  # the classes whose work TP divides: the class table's tp_sharded column
# Two all-reduces per layer (after O and after down). Default cost of one when no TP trace is
# given: the mean transfer time (waits removed) of the collectives in the committed H200 TP=2
# fixture (llama8b_decode_b1_eager_tp2.sqlite, NCCL ring LL, bf16), recomputed by a test.
ALLREDUCES_PER_LAYER = 2
DEFAULT_ALLREDUCE_NS = 7_109


@dataclass
class Projection:
    rows: list[dict]
    launch_bound_from_tp: int | None
    inputs: dict
    notes: list[tuple[str, dict]] = field(default_factory=list)  # (kind, fields): render/sentences.py's tp_note


def project(
    n_launch: int, t_launch_ns: float, sharded_ns: float, unsharded_ns: float = 0.0,
    widths=(1, 2, 4, 8), base_tp: int = 1, layers: int = 0, collective_per_layer_ns: float = 0.0,
    scale: float = 1.0, fixed_device_ns: float = 0.0, ep_ns: float = 0.0, ep_share: dict | None = None,
) -> Projection:
    """`fixed_device_ns`: device time that does not shrink with the width (a graph replay's gaps
    between its kernels). `ep_ns`: expert GEMM time under expert parallelism, measured at the
    trace's width and scaled by `ep_share` (width → the busiest GPU's share of the reached
    experts, moe.ep_slowest_share) instead of 1/w."""
    cpu = n_launch * t_launch_ns
    rows = []
    for w in widths:
        ep = ep_ns * ep_share[w] / ep_share[base_tp] if ep_ns and ep_share else 0.0
        device = scale * (unsharded_ns + sharded_ns * base_tp / w + ep
                          + (layers * collective_per_layer_ns if w > 1 else 0))
        device += fixed_device_ns
        rows.append({
            "tp": w,
            "cpu_floor_ns": int(round(cpu)),
            "device_floor_ns": int(round(device)),
            "step_time_ns": int(round(max(cpu, device))),
            "bound": verdict_of(cpu, device),
            "measured_step_time_ns": None,
        })
    bound_at = [r["tp"] for r in rows if r["bound"] == LAUNCH_BOUND]
    return Projection(rows, min(bound_at) if bound_at else None, {
        "n_launch": n_launch, "t_launch_ns": t_launch_ns, "sharded_ns": sharded_ns,
        "unsharded_ns": unsharded_ns, "base_tp": base_tp, "layers": layers,
        "collective_per_layer_ns": collective_per_layer_ns, "scale": scale, "fixed_device_ns": fixed_device_ns,
        **({"expert_parallel_ns": ep_ns, "ep_share_by_width": {str(w): ep_share[w] for w in sorted(ep_share)}}
           if ep_ns and ep_share else {}),
    })


def project_graph(figures: dict, consts, sharded_ns: float, unsharded_ns: float = 0.0, widths=(1, 2, 4, 8),
                  base_tp: int = 1, layers: int = 0, collective_per_layer_ns: float = 0.0,
                  scale: float = 1.0, queued: bool = False, ep_ns: float = 0.0,
                  ep_share: dict | None = None) -> Projection:
    """Graph mode: per width, whatif.graph_step of a step's `figures` (whatif.FIGURES) with its
    device floor projected as in project(): cpu_floor_ns its host path, device_floor_ns its GPU
    path (whatif.graph_paths; `queued`: behind the previous step's replay), step_time_ns the larger."""
    from stepscope.analysis.whatif import graph_paths, step_figures

    base = project(0, 0.0, sharded_ns, unsharded_ns, widths, base_tp, layers, collective_per_layer_ns, scale,
                   ep_ns=ep_ns, ep_share=ep_share)
    host = None
    for r in base.rows:
        host, gpu = graph_paths(*step_figures({**figures, "device_floor_ns": r["device_floor_ns"]}), consts, queued)
        cpu = host if host is not None else 0.0
        r.update(cpu_floor_ns=int(round(cpu)), device_floor_ns=int(round(gpu)),
                 step_time_ns=int(round(max(cpu, gpu))), bound=verdict_of(cpu, gpu))
    bound_at = [r["tp"] for r in base.rows if r["bound"] == LAUNCH_BOUND]
    inputs = {**base.inputs, "n_launch": 1, "t_launch_ns": host or 0.0, "fixed_device_ns": 0.0,
              "graph_constants": {k: getattr(consts, k) for k in ("graph_launch_prep_ns", "graph_launch_lead_ns",
                                                                  "node_gap_ns", "memop_gap_ns", "prologue_host_ns",
                                                                  "device_ratio", "host_after_ns", "source")},
              "step_figures": dict(figures)}
    return Projection(base.rows, min(bound_at) if bound_at else None, inputs)


@dataclass
class TraceProjection:
    """Both modes projected from one step of a trace; `mode` is the trace's own."""

    mode: str                    # "eager" | "graph"
    eager: Projection | None     # None for a graph trace: it has no per-kernel launch cost
    graph: Projection
    inputs: dict
    notes: list[tuple[str, dict]] = field(default_factory=list)  # (kind, fields): render/sentences.py's tp_note

    @property
    def own(self) -> Projection:
        return self.graph if self.mode == "graph" else self.eager


def project_trace(d, widths=(1, 2, 4, 8), collective_us: float | None = None,
                  expert_parallel: dict | None = None) -> TraceProjection:
    """Project the trace's representative step (the median by step time of the most common kind
    of its summary rank's steps: the step compare and report quote), in eager and graph mode.
    `d`: the trace's Diagnosis. `expert_parallel`: {"experts": E, "top_k": k} of an MoE model run
    with expert parallelism: its expert GEMMs scale with the busiest GPU's share of the experts the
    step's tokens reach (moe.ep_slowest_share), not with 1/w."""
    from stepscope.analysis.whatif import FIGURES, is_graph_trace, point_of, with_memsets

    inv = d.inv
    rank = summary_rank(d.collectives.ranks, d.tp)
    mine = inv.steps.filter((pl.col("pid") == rank["pid"]) & (pl.col("device") == rank["device"]))
    # the step compare and report quote too
    rep = representative(inv, d)
    step = rep["step"]
    med = mine.filter(pl.col("step") == step).row(0, named=True)
    base_tp = _step_tp(med["name"]) or rank["ranks"]
    from stepscope.options import MAX_WIDTH

    if not 1 <= base_tp <= MAX_WIDTH:
        # the trace's word, not a checked option: tp=2^62 projected every width from it (sharded
        # time x 2^62) and the document's integers left 64 bits
        from stepscope.errors import InputError

        raise InputError(f"step {step}'s name says tp={base_tp}, outside 1..{MAX_WIDTH:,}: not a width stepscope "
                         "can project from (fix the range name, or give --kernels/--launch-us/--device-ms)")
    t = _class_times(inv, step)
    if t.get("cuda_graph"):
        # a graph recorded whole is one activity: which of its kernels TP shards is not in the trace
        from stepscope.errors import InputError

        raise InputError(f"step {step} replays CUDA graphs recorded whole (--cuda-graph-trace=graph): the kernels "
                         "inside them, which TP shards or not, are not rows of the trace, so no width can be "
                         "projected from it; capture with --cuda-graph-trace=node (or give --kernels/--launch-us/--device-ms)")
    sharded = float(sum(t.get(k, 0) for k in SHARDED))
    comm = float(t.get("comm", 0))
    unsharded = float(sum(v for k, v in t.items() if k not in SHARDED and k != "comm"))
    ep_ns, ep_share = 0.0, None
    if expert_parallel and t.get(MOE_GEMM):
        from stepscope.analysis.moe import ep_slowest_share

        ep_ns = float(t[MOE_GEMM])
        sharded -= ep_ns
        tokens = int(med.get("tokens") or 1)
        ep_share = {w: ep_slowest_share(expert_parallel["experts"], expert_parallel["top_k"], tokens, w)
                    for w in {*widths, base_tp}}
    layers = med["layers"] or 0
    tp = d.tp.filter(pl.col("step") == step).row(0, named=True) if d.tp is not None and d.tp.height else None
    notes: list[tuple[str, dict]] = []
    if t.get(MOE_GEMM):
        notes.append(("moe_sharding", {"moe_gemm_ns": int(t[MOE_GEMM]), "moe_routing_ns": int(t.get(MOE_ROUTING, 0)),
                                       "expert_parallel": ({**expert_parallel, "tokens": int(med.get("tokens") or 1)}
                                                           if ep_share else None)}))
    elif expert_parallel:
        notes.append(("moe_none", {}))
    if rank["ranks"] > 1:
        notes.append(("projected_step", {"step": step, "pid": rank["pid"], "device": rank["device"], "why": rep["why"]}))
    elif mine.height > 1:
        notes.append(("projected_step", {"step": step, "why": rep["why"]}))
    if collective_us is not None:
        c_layer = collective_us * 1e3 * ALLREDUCES_PER_LAYER
        notes.append(("collective_given", {"allreduce_us": collective_us}))
    elif comm and layers and base_tp > 1 and tp is not None and tp["split"]:
        c_layer = float(tp["collective_transfer_ns"]) / layers
        notes.append(("collective_measured", {}))
    else:
        c_layer = DEFAULT_ALLREDUCE_NS * ALLREDUCES_PER_LAYER
        unsplit = bool(comm and tp is not None and not tp["split"])
        notes.append(("collective_default", {"allreduces_per_layer": ALLREDUCES_PER_LAYER,
                                             "allreduce_ns": DEFAULT_ALLREDUCE_NS, "unsplit": unsplit,
                                             "split_note": tp["split_note"] if unsplit else None}))
    f = d.floors.filter(pl.col("step") == step).row(0, named=True)
    work_base = unsharded + sharded + ep_ns + (layers * c_layer if base_tp > 1 else 0)
    device_base = f["device_floor_ns"]
    scale = device_base / work_base if work_base else 1.0
    graph_trace = is_graph_trace(inv)
    mode = "graph" if graph_trace else "eager"
    eager = None
    if not graph_trace:
        eager = project(med["n_launch_calls"], f["t_launch_ns"], sharded, unsharded, widths, base_tp, layers,
                        c_layer, scale, ep_ns=ep_ns, ep_share=ep_share)
    else:
        notes.append(("eager_not_projected", {}))
    # graph mode: the what-if graph step of this step; a graph trace's own constants (its device
    # work already is a replay's), else the calibration's, as analyze uses them
    pro = d.prologue.filter(pl.col("step") == step).row(0, named=True)
    figs = {**{k: pro[k] for k in FIGURES if k in pro}, "device_floor_ns": device_base}
    memsets = with_memsets(pro["forward_memops"], pro["forward_kernels"])  # the calibration's mode for this step
    # a step whose replay would queue behind its predecessor's (async scheduling), as analyze has it
    queued = bool(d.graph_prediction.filter(pl.col("step") == step)["predicted_graph_queued"]
                  .fill_null(False).any())
    if graph_trace and d.replay is not None:
        from dataclasses import replace

        g_consts = replace(d.replay.constants(point_of(inv, d.calibration, memsets=memsets)), device_ratio=1.0,
                           prologue_host_ns=None, prologue_always=False)
        # an async run's replay launched while the GPU still ran the previous step: its measured
        # "lead" is that wait (10.4 ms of the Qwen3-MoE run's 14.7 ms decode steps), not a cost the
        # step pays; its GPU path is the replay alone
        queued = queued or _replay_queued(inv, step)
        notes.append(("graph_own", {"node_gap_ns": g_consts.node_gap_ns, "lead_ns": g_consts.lead_ns,
                                    "queued": queued}))
    else:
        g_consts = point_of(inv, d.calibration, memsets=memsets)
        notes.append(("graph_whatif", {"launch_ns": g_consts.lead_ns, "node_gap_ns": g_consts.node_gap_ns,
                                       "source": g_consts.source, "queued": queued}))
    graph = project_graph(figs, g_consts, sharded, unsharded, widths, base_tp, layers, c_layer, scale, queued,
                          ep_ns=ep_ns, ep_share=ep_share)
    own_rows = (graph if graph_trace else eager).rows
    for r in own_rows:
        if r["tp"] == base_tp:
            r["measured_step_time_ns"] = med["step_time_ns"]
    if not any(r["tp"] == base_tp for r in own_rows):
        notes.append(("measured_width_missing", {"tp": base_tp}))
    inputs = {**(eager or graph).inputs, "step": step, "rank": rank["rank"], "pid": med["pid"],
              "device": med["device"], "measured_step_time_ns": med["step_time_ns"],
              "gpu_busy_ns": med["gpu_busy_ns"], "device_floor_ns": device_base,
              "collective_wait_ns": (tp or {}).get("collective_wait_ns") or 0, "mode": mode}
    if t.get(MOE_GEMM):  # an MoE step: its expert GEMMs (in sharded_ns) and routing (in unsharded_ns)
        inputs.update(moe_gemm_ns=int(t[MOE_GEMM]), moe_routing_ns=int(t.get(MOE_ROUTING, 0)))
    return TraceProjection(mode, eager, graph, inputs, notes)


def _replay_queued(inv, step: int) -> bool:
    """Whether the step's graph launch was called before the previous step's GPU work ended on
    its device (the replay queued behind it)."""
    st = inv.steps.sort("step").with_columns(
        prev_end=pl.col("last_end").shift(1).over("pid", "device", order_by="step_begin"))
    prev = st.filter(pl.col("step") == step)["prev_end"]
    names = inv.launch_calls["api_name"].cast(pl.String)
    gl = inv.launch_calls.filter((pl.col("step") == step) & (names.str.starts_with("cudaGraphLaunch")
                                                             | names.str.starts_with("cuGraphLaunch")))["start"]
    return bool(prev.len() and prev[0] is not None and gl.len() and gl.min() < prev[0])


def _class_times(inv, step: int) -> dict[str, float]:
    """The step's time per class (the MoE classes' rows of data/classes.toml among them)."""
    c = inv.classes.filter(pl.col("step") == step)
    return dict(zip(c["class"].to_list(), c["time_ns"].to_list()))


def _step_tp(name: str | None) -> int | None:
    from stepscope.analysis.steps import step_shape

    tp = step_shape(name).get("tp")
    return tp if isinstance(tp, int) else None


RANK_STEP_COLUMNS = ("step", "group", "step_time_ns", "gpu_busy_ns", "collectives", "collective_ns",
                     "collective_transfer_ns", "collective_wait_ns", "split", "split_note", "cpu_floor_ns",
                     "device_floor_ns", "verdict")


def rank_rows(d) -> list[dict]:
    """One row per rank (rank, pid, device) with its steps nested: step, group, step time, GPU
    busy, collectives (time, transfer, wait, split, why not), floors and verdict. Empty for a
    single-GPU trace without collectives."""
    if d.tp is None or d.tp.is_empty():
        return []
    s = (d.tp.join(d.inv.steps.select("step", "pid", "device", "step_time_ns", "gpu_busy_ns"), on="step")
         .join(d.floors.select("step", "cpu_floor_ns", "device_floor_ns", "verdict"), on="step")
         .sort("rank", "group"))
    out = []
    for (rank,), grp in s.group_by("rank", maintain_order=True):
        first = grp.row(0, named=True)
        out.append({"rank": rank, "pid": first["pid"], "device": first["device"],
                    "steps": grp.select(RANK_STEP_COLUMNS).to_dicts()})
    return out


def tp_steps(d) -> list[dict]:
    """One row per step group of a multi-rank trace: its ranks, the slowest rank's step time,
    the rank skew, the binding rank and what binds it (bound, the binding rank's floors, the
    others' waits: render/sentences.py's tp_sentence says it)."""
    if d.tp is None or d.tp.is_empty() or d.collectives.ranks.height < 2:
        return []
    s = d.tp.join(d.inv.steps.select("step", "step_time_ns"), on="step")
    g = s.group_by("group").agg(
        ranks=pl.len(), step_time_ns=pl.col("step_time_ns").max(), rank_skew_ns=pl.col("rank_skew_ns").first(),
        binding_rank=pl.col("binding_rank").first(),
        *[pl.col(c).first() for c in ("bound", "binding_cpu_floor_ns", "binding_device_floor_ns", "waits")])
    return g.sort("group").to_dicts()
