"""CUDA graphs traced whole (nsys's default `--cuda-graph-trace=graph`): each replay is one GPU
row of CUPTI_ACTIVITY_KIND_GRAPH_TRACE, with the start, end, device, stream and correlation id
of the `cudaGraphLaunch` that ran it, and no row for the kernels inside it.

Both readers add these rows to the kernels frame as one activity per replay, under a name of
their own (`REPLAY_NAME`, string id `REPLAY_ID`, which no export uses: nsys's ids are >= 0), so
that a step that replays a graph holds the GPU time of the replay: its GPU busy, gaps and floors
are measured on what the GPU did, and the `cuda_graph` class (data/classes.toml) names the time
whose kernels the capture does not show. The capture's `graph_level` defect still says so first.
"""

from __future__ import annotations

import polars as pl

from stepscope.ingest.typed import INT32 as I32, Col as C, Query

TABLE = "CUPTI_ACTIVITY_KIND_GRAPH_TRACE"
REPLAY_ID = -2
REPLAY_NAME = "CUDA graph replay (traced whole: --cuda-graph-trace=graph)"

QUERY = Query(TABLE, [C("pid", "globalPid"), C("device", "deviceId", I32), C("stream", "streamId", I32),
                            C("corr", "correlationId", required=False), C("start", "start"), C("end", "end")])


def with_replays(kernels: pl.DataFrame, replays: pl.DataFrame) -> pl.DataFrame:
    """`kernels` (the model's kernel columns) with one row per graph replay of `replays` (QUERY's
    columns, pid unpacked), in start order; `kernels` itself when there is none."""
    if replays.is_empty():
        return kernels
    rows = replays.select(
        *(pl.col(c).cast(kernels.schema[c]) if c in replays.columns else
          pl.lit(REPLAY_ID if c in ("short_id", "demangled_id") else None, kernels.schema[c]).alias(c)
          for c in kernels.columns))
    return pl.concat([kernels, rows]).sort("start", maintain_order=True)


def with_replay_name(strings: pl.DataFrame, kernels: pl.DataFrame) -> pl.DataFrame:
    """`strings` with REPLAY_NAME when a replay row is among `kernels`."""
    if not (kernels["short_id"] == REPLAY_ID).any():
        return strings
    return pl.concat([strings, pl.DataFrame({"id": [REPLAY_ID], "value": [REPLAY_NAME]}, schema=strings.schema)])
