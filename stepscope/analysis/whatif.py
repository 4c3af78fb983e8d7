"""What-if CUDA graph: predict a graph-mode step from an eager trace alone — one model, with the
constants it needs measured on graph captures (a calibration) and a range from their spread.

A graph replay removes the host from the model's forward. What an engine does *before* the
forward stays on the host under CUDA graphs too: vLLM prepares each step's inputs with a dozen
eager launches and copies and only then replays its graph, and the GPU waits for that. The eager
trace shows this prologue (`prologue`). So, per step (docs/DEFINITIONS.md, "What-if graph step"):

    predicted = prologue_host_ns + graph_launch_prep_ns + graph_launch_lead_ns
                + max(device_floor_ns − prologue_busy_ns, 0)
                + forward_kernels × node_gap_ns + forward_memops × memop_gap_ns

`graph_step` is that formula as a pure function of a step's figures (floats or polars
expressions), so it applies to any step of any run. Its four constants are measured on each
graph capture of a calibration (`measure`):

* graph_launch_prep_ns: the host between the prologue's end (or step begin) and the
  cudaGraphLaunch call's start;
* graph_launch_lead_ns: that call's start → the replay's first node start: one graph launch's
  host-to-GPU latency (under nsys's node tracing: 0.09 ms on some H200 machines, 1.1 ms on others);
* node_gap_ns: the device idle inside the replay between two kernels, per kernel;
* memop_gap_ns: the idle next to a memset/memcpy node, per memop (5–7 µs on the H200, ten times a
  kernel's: cuDNN's per-layer memset costs more than its kernels' gaps together).

The point prediction takes the median of each constant over the calibration's captures of the
step's engine (all captures when none is of that engine); the range is the lowest and highest
prediction with each of those captures' own constants. The bundled calibration
(stepscope/data/calibration.json) is measured from the committed graph captures; a test measures
them again. `stepscope calibrate` writes one from the user's own captures.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from stepscope.analysis.inventory import Inventory
from stepscope.calibration import (CONSTANTS, MEMSET_EVERY, Calibration, Capture, GraphConstants,  # noqa: F401
                                   bundled, default_calibration, read_calibration, user_calibration_path,
                                   with_memsets)

def chosen(calibration: str | Path | Calibration | GraphConstants | None) -> Calibration | GraphConstants:
    """The calibration an analysis uses, given explicitly (Options.calibration, `--calibration`):
    a Calibration or one set of constants as it is, a path read, None the default (the user's
    file when it exists, else the bundled one). No module state: each call says which it uses."""
    if calibration is None:
        return default_calibration()
    if isinstance(calibration, (Calibration, GraphConstants)):
        return calibration
    return read_calibration(calibration)


def graph_paths(prologue_launches, prologue_host, device_floor, prologue_busy, forward_kernels, forward_memops,
                c: GraphConstants, queued=False):
    """(host path, GPU path) of the what-if graph step (docs/DEFINITIONS.md): numbers, or polars
    expressions for a frame of steps. The host path is None when `c` has no host_after_ns.
    `queued` (a bool, or a boolean expression): the step's replay is queued behind the previous
    step's GPU work (async scheduling), so its GPU path is the replay alone (prologue, prep and
    lead overlap the previous step)."""
    expr = isinstance(device_floor, pl.Expr)
    work = device_floor - prologue_busy
    work = pl.max_horizontal(work, pl.lit(0)) if expr else max(work, 0)
    if c.prologue_host_ns is not None:  # the calibration's graph-mode prologue
        if c.prologue_always:
            prologue_host = pl.lit(c.prologue_host_ns) if expr else c.prologue_host_ns
        else:  # for a step that has one
            prologue_host = (pl.when(prologue_launches > 0).then(pl.lit(c.prologue_host_ns)).otherwise(prologue_host)
                             if expr else (c.prologue_host_ns if prologue_launches > 0 else prologue_host))
    body = work * c.device_ratio + forward_kernels * c.node_gap_ns + forward_memops * c.memop_gap_ns
    before = prologue_host + c.graph_launch_prep_ns + c.graph_launch_lead_ns
    if isinstance(queued, pl.Expr):
        gpu = pl.when(queued).then(body).otherwise(before + body)
    else:
        gpu = body if queued else before + body
    host = None if c.host_after_ns is None else prologue_host + c.graph_launch_prep_ns + c.host_after_ns
    return host, gpu


def graph_step(prologue_launches, prologue_host, device_floor, prologue_busy, forward_kernels, forward_memops,
               c: GraphConstants, queued=False):
    """The what-if graph step of one step from its figures (numbers, or polars expressions for a
    frame of steps): the later of its host and GPU paths (graph_paths)."""
    host, gpu = graph_paths(prologue_launches, prologue_host, device_floor, prologue_busy, forward_kernels,
                            forward_memops, c, queued)
    if host is None:
        return gpu
    return pl.max_horizontal(host, gpu) if isinstance(gpu, pl.Expr) else max(host, gpu)


def step_figures(row: dict) -> tuple:
    """graph_step's figures from a row of a step's columns (prologue and device floor)."""
    return tuple(row[k] for k in FIGURES)


FIGURES = ("prologue_launches", "prologue_host_ns", "device_floor_ns", "prologue_busy_ns", "forward_kernels",
           "forward_memops")


def _step_expr(c: GraphConstants, queued: pl.Expr | bool = False) -> pl.Expr:
    return graph_step(*[pl.col(k) for k in FIGURES], c, queued)


def _paths_expr(c: GraphConstants) -> tuple[pl.Expr, pl.Expr]:
    """(host path, GPU path) over a frame's FIGURES columns, not queued (host: 0 when `c` has none)."""
    host, gpu = graph_paths(*[pl.col(k) for k in FIGURES], c)
    return (pl.lit(0.0) if host is None else host), gpu


MEMSETS = (pl.col("forward_memops") > 0) & (pl.col("forward_memops") * MEMSET_EVERY >= pl.col("forward_kernels"))


def _by_mode(with_memsets_e: pl.Expr, plain_e: pl.Expr) -> pl.Expr:
    """Per step, the first expression for a forward with memsets (MEMSETS), else the second."""
    return pl.when(MEMSETS).then(with_memsets_e).otherwise(plain_e)


def _points(cal: Calibration | GraphConstants, engine: str | None) -> tuple[GraphConstants, GraphConstants]:
    """The point constants for a step of `engine` with memsets and without (one set: both)."""
    return (cal, cal) if isinstance(cal, GraphConstants) else (cal.point(engine, True), cal.point(engine, False))


def memsets_of(pro: pl.DataFrame) -> bool:
    """The memset mode (calibration.with_memsets) of a trace's forwards: its median step's."""
    if pro.is_empty():
        return False
    return with_memsets(pro["forward_memops"].median(), pro["forward_kernels"].median())


def scheduling(inv: Inventory) -> str:
    """"async" when a step's host work overlaps the previous step's GPU work in graph mode (vLLM's
    async scheduling: its default, unless the capture's sidecar says it was off), else "sync"."""
    cap = ((inv.trace.sidecar or {}).get("capture") or {}) if isinstance(inv.trace.sidecar, dict) else {}
    if isinstance(cap.get("sync_scheduling"), bool):
        return "sync" if cap["sync_scheduling"] else "async"
    return "async" if engine_of(inv) == "vllm" else "sync"


def queued_expr(point_memsets: GraphConstants, point_plain: GraphConstants, by=("pid", "device")) -> pl.Expr:
    """Over a frame of steps (FIGURES, step_begin, step_end, pid, device; sorted by step) of an
    async run: whether a step's graph replay would queue behind its predecessor's: the previous step
    on the same process and device ends its host path, plus the host's gap between the two steps
    (this step's begin − that step's end, as traced), before its GPU path ends."""
    hw, gw = _paths_expr(point_memsets)
    hn, gn = _paths_expr(point_plain)
    host, gpu = _by_mode(hw, hn), _by_mode(gw, gn)
    by = list(by)
    slack = (gpu - host).shift(1).over(by, order_by="step_begin")
    gap = (pl.col("step_begin") - pl.col("step_end").shift(1).over(by, order_by="step_begin")).clip(lower_bound=0)
    return (gap < slack).fill_null(False)


def predicted_expr(cal: Calibration | GraphConstants | None = None, engine: str | None = None,
                   queued: bool = False, by=("pid", "device")) -> pl.Expr:
    """The what-if graph step (unrounded) of a step that is not a replay, as an expression over
    its FIGURES columns: graph_step, the one model, with `cal`'s point for `engine` and each step's
    memset mode (`cal` None: the default calibration's); `queued`: an async run's frame (FIGURES,
    step_begin, step_end, pid, device), whose queued steps (queued_expr) drop their prologue and
    launch. The run view of several reports applies it to each rank's step."""
    pw, pn = _points(chosen(cal), engine)
    q = queued_expr(pw, pn, by) if queued else False
    return _by_mode(_step_expr(pw, q), _step_expr(pn, q))


def engine_of(inv: Inventory) -> str:
    """The engine the trace's step names say: vLLM's execute_context ranges, stepscope's torch
    engine's `step phase=…` ranges, else unknown."""
    return engine_of_names(inv.steps["name"])


def engine_of_names(names: pl.Series) -> str:
    """engine_of for a column of step names."""
    from stepscope.analysis.steps import VLLM_STEP_RE

    names = names.drop_nulls().cast(pl.String)
    if names.str.contains(VLLM_STEP_RE.pattern).any():
        return "vllm"
    if names.str.starts_with("step phase=").any():
        return "torch"
    return "unknown"


# A forward starts with its embedding. Without a recognized embedding kernel the start is not
# known (a norm can follow a gather the classes call framework, attention metadata kernels can
# precede the embedding), and no prologue is counted.
FORWARD_START = ("embedding",)


def prologue(inv: Inventory) -> pl.DataFrame:
    """Per step, the launches issued before its forward (see the module docstring):
    step, prologue_launches, prologue_end (ns, null without a prologue), prologue_host_ns,
    prologue_busy_ns, and the kernels and memops from the forward on (forward_kernels,
    forward_memops). In a graph replay step the forward starts with the graph launch."""
    a = inv.in_steps("step", "start", "end", "class", "graph_node_id", "launch_start", "launch_end", "is_kernel")
    cls = pl.col("class").cast(pl.String)
    # the forward's first launch, per step (a window over the step-sorted slice: no join of the
    # million activities with a per-step table)
    fwd = pl.coalesce(
        pl.col("launch_start").filter(pl.col("graph_node_id").is_not_null()).min().over("step"),
        pl.col("launch_start").filter(cls.is_in(FORWARD_START)).min().over("step"))
    a = a.with_columns((pl.col("launch_start") < fwd).fill_null(False).alias("_pre"))
    per = a.group_by("step").agg(
        prologue_launches=pl.col("_pre").sum().cast(pl.Int64),
        prologue_end=pl.col("launch_end").filter(pl.col("_pre")).max(),
        prologue_busy_ns=(pl.col("end") - pl.col("start")).filter(pl.col("_pre")).sum(),
        forward_kernels=(pl.col("is_kernel") & ~pl.col("_pre")).sum().cast(pl.Int64),
        forward_memops=(~pl.col("is_kernel") & ~pl.col("_pre")).sum().cast(pl.Int64))
    out = inv.steps.select("step", "step_begin").join(per, on="step", how="left")
    return out.select(
        "step", pl.col("prologue_launches").fill_null(0), "prologue_end",
        (pl.col("prologue_end") - pl.col("step_begin")).clip(lower_bound=0).fill_null(0).alias("prologue_host_ns"),
        pl.col("prologue_busy_ns").fill_null(0), pl.col("forward_kernels").fill_null(0),
        pl.col("forward_memops").fill_null(0)).sort("step")


def _graph_steps(inv: Inventory) -> pl.DataFrame:
    return inv.steps.join(inv.graph_steps, on="step", how="semi")


def is_graph_trace(inv: Inventory) -> bool:
    return not _graph_steps(inv).is_empty()


def replay_figures(inv: Inventory, pro: pl.DataFrame | None = None) -> pl.DataFrame:
    """Per graph-replay step: the four constants measured on it (module docstring), its nodes and
    memops, and its step time. Empty without a replay."""
    g = _graph_steps(inv)
    if g.is_empty():
        return pl.DataFrame()
    pro = prologue(inv) if pro is None else pro
    names = inv.launch_calls["api_name"].cast(pl.String)
    gl = (inv.launch_calls.filter(names.str.starts_with("cudaGraphLaunch") | names.str.starts_with("cuGraphLaunch"))
          .group_by("step").agg(pl.col("start").min().alias("_gl")))
    last_call = inv.launch_calls.group_by("step").agg(pl.col("end").max().alias("_call_end"))
    # one lazy chain over the activities: each eager step of it copied every kernel's columns
    a = inv.in_steps("step", "start", "end", "prev_end", "graph_node_id", "is_kernel").lazy()
    node = pl.col("graph_node_id").is_not_null()
    a = a.join(g.lazy().select("step"), on="step", how="semi", maintain_order="left").with_columns(
        _n0=pl.col("start").filter(node).min().over("step"), _nN=pl.col("end").filter(node).max().over("step"))
    # the replay: the activities from its first node's start to its last node's end; each idle
    # stretch before one of them goes to a memop when it or its predecessor is one
    r = a.filter((pl.col("start") >= pl.col("_n0")) & (pl.col("start") <= pl.col("_nN"))).with_columns(
        _gap=pl.when(pl.col("start") > pl.col("_n0")).then((pl.col("start") - pl.col("prev_end")).clip(lower_bound=0))
        .otherwise(0),
        _mem=(~pl.col("is_kernel") | ~pl.col("is_kernel").shift(1, fill_value=True).over("step")))
    per = r.group_by("step").agg(
        node0=pl.col("_n0").first(), nodes=pl.col("is_kernel").sum().cast(pl.Int64),
        memops=(~pl.col("is_kernel")).sum().cast(pl.Int64),
        _kgap=pl.col("_gap").filter(~pl.col("_mem")).sum(), _mgap=pl.col("_gap").filter(pl.col("_mem")).sum()).collect()
    return (g.select("step", "step_begin", "step_end", "last_end", "step_time_ns").join(per, on="step")
            .join(gl, on="step", how="left").join(last_call, on="step", how="left")
            .join(pro.select("step", "prologue_end", "prologue_launches", "prologue_host_ns"), on="step", how="left")
            .select("step", "step_time_ns", "nodes", "memops",
                    pl.when(pl.col("prologue_launches") > 0).then(pl.col("prologue_host_ns").cast(pl.Float64))
                    .alias("prologue_host_ns"),
                    (pl.col("_gl") - pl.coalesce("prologue_end", "step_begin")).clip(lower_bound=0)
                    .alias("graph_launch_prep_ns"),
                    (pl.col("node0") - pl.col("_gl")).clip(lower_bound=0).alias("graph_launch_lead_ns"),
                    (pl.col("_kgap") / pl.col("nodes")).alias("node_gap_ns"),
                    pl.when(pl.col("memops") > 0).then(pl.col("_mgap") / pl.col("memops")).alias("memop_gap_ns"),
                    # the host's CUDA work from the graph launch on (the call, the launches after the
                    # replay's, e.g. vLLM's sampling) and its own tail after its last CUDA work
                    (pl.col("_call_end") - pl.col("_gl")
                     + (pl.col("step_end") - pl.max_horizontal("last_end", "_call_end")).clip(lower_bound=0))
                    .cast(pl.Float64).alias("host_after_ns"))
            .drop_nulls("graph_launch_lead_ns").sort("step"))


def measure(inv: Inventory, source: str, pro: pl.DataFrame | None = None,
            work: pl.DataFrame | None = None, figures: pl.DataFrame | None = None) -> Capture | None:
    """The calibration capture of a graph trace: the medians of replay_figures over its replay
    steps (None without one). `work`: (step, device_floor_ns), e.g. floors(); else GPU busy.
    `figures`: replay_figures(inv, pro), when already known."""
    pro = prologue(inv) if pro is None else pro
    f = replay_figures(inv, pro) if figures is None else figures
    if f.is_empty():
        return None
    w = (inv.steps.select("step", pl.col("gpu_busy_ns").alias("device_floor_ns")) if work is None
         else work.select("step", "device_floor_ns"))
    f = f.join(w, on="step", how="left").join(pro.select("step", "prologue_busy_ns"), on="step", how="left")
    gpu = inv.trace.gpus["name"][0] if inv.trace.gpus.height else None
    med = {k: f[k].median() for k in ("step_time_ns", "nodes", "memops", "prologue_host_ns", "device_floor_ns",
                                      "prologue_busy_ns", "host_after_ns", *CONSTANTS)}
    return Capture(source=source, gpu=gpu, engine=engine_of(inv), nodes=int(round(med["nodes"])),
                   memops=int(round(med["memops"])), steps=f.height, step_time_ns=int(round(med["step_time_ns"])),
                   device_floor_ns=int(round(med["device_floor_ns"])),
                   prologue_busy_ns=int(round(med["prologue_busy_ns"])),
                   # unrounded: a capture's own constants reproduce its own step to the nanosecond
                   **{k: None if med[k] is None else float(med[k])
                      for k in (*CONSTANTS, "prologue_host_ns", "host_after_ns")})


def with_twin(c: Capture, eager, source: str) -> Capture:
    """`c` with its eager twin (`eager`: the Diagnosis of the same step shape run eagerly): the
    ratio of the replay's device work to the twin's, and the model's residual on the pair with
    the capture's own constants (both medians over the twin's steps)."""
    from dataclasses import replace

    work = (eager.floors["device_floor_ns"] - eager.prologue["prologue_busy_ns"]).median()
    ratio = (c.device_floor_ns - c.prologue_busy_ns) / max(work, 1)
    own = replace(c.constants(), device_ratio=ratio)
    p = predict_graph_step(eager.inv, own, work=eager.floors, pro=eager.prologue)["predicted_graph_step_time_ns"]
    p = p.median()
    return replace(c, eager_twin=source, device_ratio=ratio,
                   residual=round((c.step_time_ns - p) / c.step_time_ns, 5))


def held_out_error(cal: Calibration, c: Capture, eager) -> float:
    """How far `cal`'s point without capture `c` misses `c`'s own step from its eager twin (a
    Diagnosis): (predicted − measured) / measured, the median over the twin's steps."""
    rest = Calibration(tuple(x for x in cal.captures if x is not c), "held out")
    p = predict_graph_step(eager.inv, rest, work=eager.floors, pro=eager.prologue)
    return (p["predicted_graph_step_time_ns"].median() - c.step_time_ns) / c.step_time_ns


def graph_constants(inv: Inventory, source: str = "trace", calibration: Calibration | None = None) -> GraphConstants | None:
    """A graph trace's own constants (None if it has no replay); the memop gap and prologue it
    does not measure from `calibration`'s point (None: the default calibration)."""
    c = measure(inv, source)
    return None if c is None else c.constants(chosen(calibration).point(c.engine))


def point_of(inv: Inventory, calibration: Calibration | GraphConstants | None = None,
             pro: pl.DataFrame | None = None, memsets: bool | None = None) -> GraphConstants:
    """The point constants that apply to `inv`'s steps (its engine's and memset mode's — `memsets`,
    else its median step's from `pro` or prologue(inv) — from `calibration`, None: the default)."""
    cal = chosen(calibration)
    if isinstance(cal, GraphConstants):
        return cal
    if memsets is None:
        memsets = memsets_of(prologue(inv) if pro is None else pro)
    return cal.point(engine_of(inv), memsets)


def describe_for(inv: Inventory, cal: Calibration, pro: pl.DataFrame | None = None) -> dict:
    """cal.describe for `inv`'s engine and its median step's memset mode (what point_of uses)."""
    return cal.describe(engine_of(inv), memsets_of(prologue(inv) if pro is None else pro))


def predict_graph_step(inv: Inventory, calibration: Calibration | GraphConstants | None = None,
                       work: pl.DataFrame | None = None, pro: pl.DataFrame | None = None) -> pl.DataFrame:
    """Per step: the predicted graph-mode step time and its range (null for a step that already is a
    replay). `calibration`: a Calibration (point and range), or one set of constants (point only);
    None: the default calibration (`chosen`). `work`: (step, device_floor_ns), e.g. floors(); when not given, from the
    collectives."""
    if work is None:
        from stepscope.analysis.collectives import collectives

        work = inv.steps.join(collectives(inv).work, on="step", how="left").select(
            "step", pl.coalesce("device_work_ns", "gpu_busy_ns").alias("device_floor_ns"))
    cal = chosen(calibration)
    eng = engine_of(inv)
    pw, pn = _points(cal, eng)
    spread = [cal] if isinstance(cal, GraphConstants) else cal.spread(eng)
    replayed = _graph_steps(inv)["step"].to_list()
    s = inv.steps.select("step", "pid", "device", "step_begin", "step_end").join(
        work.select("step", "device_floor_ns"), on="step", how="left", maintain_order="left").join(
        (prologue(inv) if pro is None else pro), on="step", how="left", maintain_order="left").sort("step")
    own = pl.col("step").is_in(replayed)
    queued = queued_expr(pw, pn) if scheduling(inv) == "async" else pl.lit(False)
    s = s.with_columns(queued.alias("graph_queued"))
    q = pl.col("graph_queued")

    def out(e: pl.Expr, name: str) -> pl.Expr:
        return pl.when(own).then(None).otherwise(e).cast(pl.Int64).alias(name)

    lo_e, hi_e = (0.0, 0.0) if isinstance(cal, GraphConstants) else cal.errors(eng)
    p = _by_mode(_step_expr(pw, q), _step_expr(pn, q))
    each = [p, *[_step_expr(c, q) for c in spread]]
    # a host pause (a JIT compilation, a garbage collection: analysis/pauses.py) is no launch
    # overhead: a graph replay does not remove it, so the GPU's idle time in it stays in the step
    pause = (pl.col("host_pause_ns").fill_null(0) if "host_pause_ns" in work.columns else pl.lit(0))
    if "host_pause_ns" in work.columns:
        s = s.join(work.select("step", "host_pause_ns"), on="step", how="left", maintain_order="left")
    return s.select("step", out((p + pause).round(0), "predicted_graph_step_time_ns"),
                    out(pl.min_horizontal(*each, p * (1 + lo_e)).floor() + pause, "predicted_graph_step_low_ns"),
                    out(pl.max_horizontal(*each, p * (1 + hi_e)).ceil() + pause, "predicted_graph_step_high_ns"),
                    pl.when(own).then(None).otherwise(q).alias("predicted_graph_queued"))
