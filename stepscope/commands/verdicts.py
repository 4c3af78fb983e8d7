"""`stepscope compare` and `stepscope tp`: from inventories to verdicts."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from stepscope.cli import app, fail
from stepscope.selection import STEPS_HELP


def _diagnosis(path: Path, step_regex: Optional[str], rules: Optional[Path], cache: bool = True,
               steps: Optional[str] = None):
    from stepscope.analysis.diagnosis import diagnose
    from stepscope.commands.analyze import load_inventory
    from stepscope.errors import StepscopeError
    from stepscope.render import progress

    try:
        inv = load_inventory(path, step_regex, rules, cache)
        progress.stage(f"finding gaps, launch overhead and floors of {path.name}")
        return only_steps(diagnose(inv), steps)
    except StepscopeError as e:
        fail(str(e))


def only_steps(d, spec: Optional[str]):
    """The diagnosis narrowed to the steps `spec` selects (stepscope.selection's grammar), for
    the commands that summarize steps (compare, tp). On a trace with TP steps a selected step
    brings its whole TP step along (every rank's step of that group): a TP step's binding rank
    and waits are only defined over all of its ranks.

    The analyses run on the whole trace first, so each kept step's figures are exactly those
    `analyze` reports for it (a step's begin depends on its predecessor's GPU work).
    Built here from the frames' step columns until the analysis offers a selection itself."""
    from dataclasses import fields, replace

    import polars as pl

    from stepscope.selection import parse_steps

    if spec in (None, "", "all"):
        return d
    ids = parse_steps(spec, d.inv.step_ids())
    if d.tp is not None and d.tp.height:
        groups = d.tp.filter(pl.col("step").is_in(ids))["group"].unique().to_list()
        ids = sorted(set(ids) | set(d.tp.filter(pl.col("group").is_in(groups))["step"].to_list()))
    keep = pl.col("step").is_in(ids)
    inv = replace(d.inv, steps=d.inv.steps.filter(keep), classes=d.inv.classes.filter(keep),
                  kernels=d.inv.kernels.filter(keep))
    # every per-step frame of the diagnosis (gaps, floors, tp, untraced, ...), whatever it holds
    per_step = {f.name: getattr(d, f.name).filter(keep) for f in fields(d)
                if isinstance(getattr(d, f.name), pl.DataFrame) and "step" in getattr(d, f.name).columns}
    return replace(d, inv=inv, **per_step, _sections=None)


@app.command()
def compare(
    a: Path = typer.Argument(..., help="trace A (typically eager, or 'before')"),
    b: Path = typer.Argument(..., help="trace B (typically CUDA graph, or 'after')"),
    json_out: bool = typer.Option(False, "--json", help="print one JSON document on stdout"),
    fail_above: Optional[float] = typer.Option(
        None, "--fail-above", metavar="PCT",
        help="exit 1 when B's step time is worse than A's by more than PCT percent (CI gating)"),
    graph_gap_ns: Optional[float] = typer.Option(None, "--graph-gap-ns", help="what-if: device gap per graph node"),
    graph_launch_ns: Optional[float] = typer.Option(None, "--graph-launch-ns", help="what-if: graph launch lead"),
    step_regex: Optional[str] = typer.Option(None, "--step-regex"),
    rules: Optional[Path] = typer.Option(None, "--rules"),
    no_cache: bool = typer.Option(False, "--no-cache", help="read the exports, not their Parquet caches"),
    steps: str = typer.Option("all", "--steps", metavar="S",
                              help=f"{STEPS_HELP}: the steps whose medians stand for each trace"),
    steps_b: Optional[str] = typer.Option(None, "--steps-b", metavar="S", help="B's steps, when not --steps"),
) -> None:
    """Compare two traces: step time, kernels, GPU busy, idle by kind, floors, per-class deltas."""
    from stepscope import options as opt
    from stepscope.analysis.compare import compare as run_compare
    from stepscope.analysis.whatif import DEFAULT, GraphConstants
    from stepscope.errors import StepscopeError
    from stepscope.selection import check_steps

    try:
        check_steps(steps)
        check_steps(steps_b)
    except StepscopeError as e:
        fail(str(e))

    try:
        opt.number(graph_gap_ns, "--graph-gap-ns", 0, opt.MAX_GRAPH_NS)
        opt.number(graph_launch_ns, "--graph-launch-ns", 0, opt.MAX_GRAPH_NS)
        opt.number(fail_above, "--fail-above", -100, 1e9)
    except StepscopeError as e:
        fail(str(e))
    consts = GraphConstants(
        graph_gap_ns if graph_gap_ns is not None else DEFAULT.node_gap_ns,
        graph_launch_ns if graph_launch_ns is not None else DEFAULT.graph_launch_lead_ns,
        DEFAULT.source if graph_gap_ns is None and graph_launch_ns is None else "given on the command line",
    )
    from stepscope.render import progress

    with progress.shown(not json_out):
        doc = run_compare(_diagnosis(a, step_regex, rules, not no_cache, steps),
                          _diagnosis(b, step_regex, rules, not no_cache, steps if steps_b is None else steps_b),
                          consts)
    if json_out:
        from stepscope.render.json import dumps

        typer.echo(dumps(doc))
    else:
        from stepscope.render.terminal import render_compare

        render_compare(doc)
    for w in doc["warnings"]:
        typer.echo(f"stepscope: warning: {w}", err=True)
    if fail_above is not None and doc["speedup"] and (1 / doc["speedup"] - 1) * 100 > fail_above:
        typer.echo(f"stepscope: B's step time is {100 * (1 / doc['speedup'] - 1):.1f}% worse than A's "
                   f"(limit {fail_above}%)", err=True)
        raise typer.Exit(1)


def _mode(p) -> dict | None:
    return None if p is None else {"rows": p.rows, "launch_bound_from_tp": p.launch_bound_from_tp}


def _widths(text: str) -> list[int]:
    from stepscope.options import MAX_WIDTH
    from stepscope.selection import is_index

    parts = [x.strip() for x in text.split(",") if x.strip()]
    if not parts or not all(is_index(x) for x in parts):
        fail(f"--widths takes comma-separated whole numbers like 1,2,4,8, not {text[:80]!r}")
    w = [int(x) for x in parts]
    if any(not 1 <= x <= MAX_WIDTH for x in w):
        fail(f"--widths takes widths from 1 to {MAX_WIDTH:,}, not {text[:80]!r}")
    return w


@app.command()
def tp(
    trace: Optional[Path] = typer.Argument(None, help="a trace to project (one or more ranks)"),
    widths: str = typer.Option("1,2,4,8", "--widths", help="TP widths to project"),
    kernels: Optional[int] = typer.Option(None, "--kernels", help="numbers alone: launches per step"),
    launch_us: Optional[float] = typer.Option(None, "--launch-us", help="numbers alone: host µs per launch"),
    device_ms: Optional[float] = typer.Option(None, "--device-ms", help="numbers alone: device floor at TP=1"),
    collective_us: Optional[float] = typer.Option(None, "--collective-us", help="cost of one all-reduce (µs)"),
    json_out: bool = typer.Option(False, "--json", help="print one JSON document on stdout"),
    step_regex: Optional[str] = typer.Option(None, "--step-regex"),
    rules: Optional[Path] = typer.Option(None, "--rules"),
    no_cache: bool = typer.Option(False, "--no-cache", help="read the export, not its Parquet cache"),
    steps: str = typer.Option("all", "--steps", metavar="S", help=f"{STEPS_HELP}: the steps projected"),
) -> None:
    """Project the step time per tensor-parallel width (Equation 1.3) and name where launches bind."""
    from stepscope import options as opt
    from stepscope.analysis import tp as tpm
    from stepscope.errors import StepscopeError
    from stepscope.selection import check_steps

    try:
        check_steps(steps)
    except StepscopeError as e:
        fail(str(e))

    ws = _widths(widths)
    try:
        opt.integer(kernels, "--kernels", 0, opt.MAX_KERNELS)
        opt.number(launch_us, "--launch-us", 0, opt.MAX_HOST_US)
        opt.number(device_ms, "--device-ms", 0, opt.MAX_DEVICE_MS)
        opt.number(collective_us, "--collective-us", 0, opt.MAX_COLLECTIVE_US)
    except StepscopeError as e:
        fail(str(e))
    numbers = (kernels, launch_us, device_ms)
    if trace is None:
        if None in numbers:
            fail("give a trace, or all of --kernels, --launch-us and --device-ms")
        layers = 32 if collective_us else 0
        proj = tpm.project(kernels, launch_us * 1e3, device_ms * 1e6, 0.0, ws, 1, layers,
                           (collective_us or 0) * 1e3 * tpm.ALLREDUCES_PER_LAYER)
        if collective_us:
            proj.notes.append(f"collective: {tpm.ALLREDUCES_PER_LAYER} all-reduces × {collective_us} µs "
                              "per layer, 32 layers assumed")
        doc = {"inputs": proj.inputs, "mode": "eager", "projection": proj.rows,
               "launch_bound_from_tp": proj.launch_bound_from_tp,
               "projections": {"eager": _mode(proj), "graph": None}, "notes": proj.notes}
    else:
        if any(v is not None for v in numbers):
            fail("give either a trace or --kernels/--launch-us/--device-ms, not both")
        from stepscope.render import progress

        with progress.shown(not json_out):
            d = _diagnosis(trace, step_regex, rules, not no_cache, steps)
        proj = tpm.project_trace(d, ws, collective_us)
        doc = {"inputs": proj.inputs, "mode": proj.mode, "projection": proj.own.rows,
               "launch_bound_from_tp": proj.own.launch_bound_from_tp,
               "projections": {"eager": _mode(proj.eager), "graph": _mode(proj.graph)}, "notes": proj.notes}
        ranks = tpm.rank_rows(d)
        if ranks:
            doc["ranks"] = ranks
        groups = tpm.tp_steps(d)
        if groups:
            doc["tp_steps"] = groups
            skews = [g["rank_skew_ns"] for g in groups if g["rank_skew_ns"] is not None]
            doc["rank_skew_ns"] = max(skews) if skews else None
    if json_out:
        from stepscope.render.json import dumps

        typer.echo(dumps(doc))
        return
    from stepscope.render.terminal import render_tp

    render_tp(doc)
