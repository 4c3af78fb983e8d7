"""What a step of a serving run holds: its composition and its graph mode (DEFINITIONS.md,
"Serving runs").

- Composition: prompt requests and tokens, decode requests and tokens, from vLLM's step range
  name (`execute_context_<n>(<t>)_generation_<n>(<t>)`, either spelling); `requests` = their
  sum. Steps named otherwise keep nulls there (their phase and tokens come from phase.py).
- Phase: `mixed` when a step holds prompt work and decodes (chunked prefill beside continuous
  batching), else `prefill` or `decode` (steps.composed_phase).
- Graph mode, from the trace: `eager` (no graph launch in the step), `full` (one graph launch:
  the whole forward replays), `piecewise` (several launches: the pieces between eager
  attention, as vLLM's torch.compile splits them).
- Kind of a serving step: phase × graph mode × batch bucket (requests in powers of two:
  1, 2, 3–4, 5–8, …), the unit the run view counts.
"""

from __future__ import annotations

import polars as pl

from stepscope.analysis.steps import step_shape

COMPOSITION = ("prompt_reqs", "prompt_tokens", "decode_reqs", "decode_tokens")
GRAPH_MODES = ("eager", "full", "piecewise")


def _names(steps: pl.DataFrame) -> pl.DataFrame:
    names = steps["name"].drop_nulls().unique().to_list()
    rows = [{"name": n, **{k: step_shape(n).get(k) for k in COMPOSITION}} for n in names]
    return pl.DataFrame(rows, schema={"name": pl.String, **{k: pl.Int64 for k in COMPOSITION}})


def with_composition(steps: pl.DataFrame, graph_nodes: pl.DataFrame,
                     calls: pl.DataFrame) -> pl.DataFrame:
    """The steps frame with COMPOSITION, requests, n_graph_nodes, n_graph_launches and
    graph_mode; names are parsed once per distinct name."""
    launches = calls.lazy().filter(pl.col("api_name").cast(pl.String).str.contains("GraphLaunch")).group_by("step").agg(
        n_graph_launches=pl.len().cast(pl.Int64)).collect()
    s = (steps.join(_names(steps), on="name", how="left")
         .join(graph_nodes, on="step", how="left").join(launches, on="step", how="left")
         .with_columns(pl.col("n_graph_nodes").fill_null(0), pl.col("n_graph_launches").fill_null(0)))
    return s.with_columns(
        requests=pl.col("prompt_reqs") + pl.col("decode_reqs"),
        graph_mode=pl.when(pl.col("n_graph_launches") == 0).then(pl.lit("eager"))
        .when(pl.col("n_graph_launches") == 1).then(pl.lit("full")).otherwise(pl.lit("piecewise")),
    )


def bucket_expr(col: str = "requests") -> pl.Expr:
    """`1`, `2`, `3–4`, `5–8`, … of a count (null stays null)."""
    n = pl.col(col)
    hi = (2 ** (n.cast(pl.Float64).log(2).ceil())).cast(pl.Int64)
    lo = hi // 2 + 1
    return (pl.when(n.is_null()).then(None).when(n <= 2).then(n.cast(pl.String))
            .otherwise(pl.format("{}–{}", lo, hi)))


def kind_expr() -> pl.Expr:
    """The serving kind label of a step: `mixed · piecewise · 17–32 reqs`."""
    b = bucket_expr()
    head = pl.concat_str([pl.col("phase").fill_null("phase unknown"), pl.col("graph_mode")], separator=" · ")
    reqs = pl.concat_str([b, pl.when(pl.col("requests") == 1).then(pl.lit(" req")).otherwise(pl.lit(" reqs"))])
    # a step whose name records no requests is told by its phase and graph mode alone
    return pl.when(b.is_null()).then(head).otherwise(pl.concat_str([head, reqs], separator=" · "))
