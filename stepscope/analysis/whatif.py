"""What-if CUDA graph: predict a graph-mode step from an eager trace alone.

A graph replay removes the host from the step: what remains is the device work, a small
device-side gap between consecutive graph nodes, and the cost of the one cudaGraphLaunch
before the first node runs. So

    predicted = graph_launch_lead_ns + device_floor_ns(eager) + n_kernels × node_gap_ns

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
    graph_launch_lead_ns: float  # step begin → first kernel of the replay
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
    return GraphConstants(
        node_gap_ns=float((s["idle_ns"] / s["n_kernels"]).mean()),
        graph_launch_lead_ns=float((s["first_start"] - s["step_begin"]).mean()),
        source=source,
    )


def _graph_steps(inv: Inventory) -> pl.DataFrame:
    graph_launch_steps = (
        inv.acts.filter(pl.col("graph_node_id").is_not_null() & pl.col("step").is_not_null())
        .select("step").unique()
    )
    return inv.steps.join(graph_launch_steps, on="step", how="semi")


def is_graph_trace(inv: Inventory) -> bool:
    return not _graph_steps(inv).is_empty()


def predict_graph_step(inv: Inventory, consts: GraphConstants = DEFAULT,
                       work: pl.DataFrame | None = None) -> pl.DataFrame:
    """Per step: the predicted graph-mode step time (null for a step that already is a replay).
    `work`: (step, device_floor_ns), e.g. floors(); when not given, from the collectives."""
    if work is None:
        from stepscope.analysis.collectives import collectives

        work = inv.steps.join(collectives(inv).work, on="step", how="left").select(
            "step", pl.coalesce("device_work_ns", "gpu_busy_ns").alias("device_floor_ns"))
    replayed = _graph_steps(inv)["step"].to_list()
    predicted = consts.graph_launch_lead_ns + pl.col("device_floor_ns") + pl.col("n_kernels") * consts.node_gap_ns
    return inv.steps.join(work.select("step", "device_floor_ns"), on="step", how="left", maintain_order="left").select(
        "step",
        pl.when(pl.col("step").is_in(replayed)).then(None).otherwise(predicted.round(0))
        .cast(pl.Int64).alias("predicted_graph_step_time_ns"),
    )
