"""What-if CUDA graph: predict a graph-mode step from an eager trace alone.

A graph replay removes the host from the model's forward: what remains is the device work, a
small device-side gap between consecutive graph nodes, and the cost of the one cudaGraphLaunch
before the first node runs. What an engine does *before* the forward stays on the host under
CUDA graphs too: vLLM prepares each step's inputs with a dozen eager launches and copies
(`_prepare_pos_seq_lens_kernel`, `_compute_slot_mappings_kernel`, FA3's scheduler metadata, ...)
and only then replays its graph, and the GPU waits for that. The eager trace shows this
prologue: the launches of the step issued before its embedding kernel (a step whose embedding
is not recognized, e.g. fused into another kernel, has no measured prologue: 0). So

    predicted = prologue_host_ns + graph_launch_lead_ns
                + device_floor_ns(eager) − prologue_busy_ns + n_kernels × node_gap_ns

prologue_host_ns = end of the prologue's last launch call − step begin (0 without a prologue,
as in stepscope's torch engine, whose step starts with the embedding); prologue_busy_ns is the
device time of the prologue's own activities, which ran while the host was still preparing.
Launches after the forward (vLLM's LM head and sampling, issued by sample_tokens outside the
graph) cost nothing extra: by the time the replay ends the host has long issued them.

The device floor is the GPU busy time less what the step's collectives spent waiting for a
slower rank (floors.py): in an eager TP step most of an all-reduce is one rank waiting for its
peer's host, which a graph replay removes; the transfer stays. On one GPU it is the busy time.

The two constants are measured from graph traces (`graph_constants`); the defaults below are
the mean over three committed H200 graph captures on two machines (nsys 2025.3 with
--cuda-graph-trace=node), and a test recomputes them from those files. The launch lead varies
most between machines (0.18 ms to 1.11 ms): give a graph trace of your own machine for better.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from stepscope.analysis.inventory import Inventory


@dataclass(frozen=True)
class GraphConstants:
    node_gap_ns: float          # idle per kernel inside a replay (device-side launch latency)
    graph_launch_lead_ns: float  # end of the prologue (or step begin) → first kernel of the replay
    source: str


# Mean of llama8b_decode_b1_graph, _b8_graph (1-GPU H200) and _b1_graph_r4 (2-GPU H200 machine).
GRAPH_FIXTURES = ("llama8b_decode_b1_graph", "llama8b_decode_b8_graph", "llama8b_decode_b1_graph_r4")
DEFAULT = GraphConstants(node_gap_ns=683.769, graph_launch_lead_ns=754444.3,
                         source="mean of the H200 fixtures " + ", ".join(GRAPH_FIXTURES))


def graph_constants(inv: Inventory, source: str = "trace") -> GraphConstants | None:
    """Measure the constants from the graph-replay steps of a trace (None if it has none)."""
    s = _graph_steps(inv)
    if s.is_empty():
        return None
    s = s.join(prologue(inv), on="step", how="left")
    first_node = inv.acts.filter(pl.col("graph_node_id").is_not_null() & pl.col("step").is_not_null()).group_by(
        "step").agg(pl.col("start").min().alias("_node0"))
    s = s.join(first_node, on="step", how="left").with_columns(
        (pl.col("_node0") - pl.coalesce("prologue_end", "step_begin")).alias("_lead"))
    return GraphConstants(
        node_gap_ns=float((s["idle_ns"] / s["n_kernels"]).mean()),
        graph_launch_lead_ns=float(s["_lead"].mean()),
        source=source,
    )


# A forward starts with its embedding. Without a recognized embedding kernel the start is not
# known (a norm can follow a gather the classes call framework, attention metadata kernels can
# precede the embedding), and no prologue is counted.
FORWARD_START = ("embedding",)


def prologue(inv: Inventory) -> pl.DataFrame:
    """Per step, the launches issued before its forward (see the module docstring):
    step, prologue_launches, prologue_end (ns, null without a prologue), prologue_host_ns,
    prologue_busy_ns. In a graph replay step the forward starts with the graph launch."""
    a = inv.in_steps("step", "start", "end", "class", "graph_node_id", "launch_start", "launch_end")
    cls = pl.col("class").cast(pl.String)
    # the forward's first launch, per step (a window over the step-sorted slice: no join of the
    # million activities with a per-step table)
    fwd = pl.coalesce(
        pl.col("launch_start").filter(pl.col("graph_node_id").is_not_null()).min().over("step"),
        pl.col("launch_start").filter(cls.is_in(FORWARD_START)).min().over("step"))
    pre = (a.filter(pl.col("launch_start") < fwd)
           .group_by("step").agg(prologue_launches=pl.len().cast(pl.Int64),
                                 prologue_end=pl.col("launch_end").max(),
                                 prologue_busy_ns=(pl.col("end") - pl.col("start")).sum()))
    out = inv.steps.select("step", "step_begin").join(pre, on="step", how="left")
    return out.select(
        "step", pl.col("prologue_launches").fill_null(0), "prologue_end",
        (pl.col("prologue_end") - pl.col("step_begin")).clip(lower_bound=0).fill_null(0).alias("prologue_host_ns"),
        pl.col("prologue_busy_ns").fill_null(0)).sort("step")


def _graph_steps(inv: Inventory) -> pl.DataFrame:
    return inv.steps.join(inv.graph_steps, on="step", how="semi")


def is_graph_trace(inv: Inventory) -> bool:
    return not _graph_steps(inv).is_empty()


def predicted_expr(consts: GraphConstants = DEFAULT) -> pl.Expr:
    """The what-if graph step of a step that is not a replay, from its columns prologue_host_ns,
    device_floor_ns, prologue_busy_ns and n_kernels (unrounded)."""
    return (pl.col("prologue_host_ns") + consts.graph_launch_lead_ns
            + (pl.col("device_floor_ns") - pl.col("prologue_busy_ns")).clip(lower_bound=0)
            + pl.col("n_kernels") * consts.node_gap_ns)


def predict_graph_step(inv: Inventory, consts: GraphConstants = DEFAULT,
                       work: pl.DataFrame | None = None, pro: pl.DataFrame | None = None) -> pl.DataFrame:
    """Per step: the predicted graph-mode step time (null for a step that already is a replay).
    `work`: (step, device_floor_ns), e.g. floors(); when not given, from the collectives."""
    if work is None:
        from stepscope.analysis.collectives import collectives

        work = inv.steps.join(collectives(inv).work, on="step", how="left").select(
            "step", pl.coalesce("device_work_ns", "gpu_busy_ns").alias("device_floor_ns"))
    replayed = _graph_steps(inv)["step"].to_list()
    predicted = predicted_expr(consts)
    return inv.steps.join(work.select("step", "device_floor_ns"), on="step", how="left", maintain_order="left").join(
        (prologue(inv) if pro is None else pro).select("step", "prologue_host_ns", "prologue_busy_ns"),
        on="step", how="left",
        maintain_order="left").select(
        "step",
        pl.when(pl.col("step").is_in(replayed)).then(None).otherwise(predicted.round(0))
        .cast(pl.Int64).alias("predicted_graph_step_time_ns"),
    )
