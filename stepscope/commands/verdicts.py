"""`stepscope compare` and `stepscope tp`: from inventories to verdicts."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from stepscope.cli import app, fail


def _diagnosis(path: Path, step_regex: Optional[str], rules: Optional[Path], cache: bool = True):
    from stepscope.analysis.diagnosis import diagnose
    from stepscope.commands.analyze import load_inventory
    from stepscope.errors import StepscopeError

    try:
        return diagnose(load_inventory(path, step_regex, rules, cache))
    except StepscopeError as e:
        fail(str(e))


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
) -> None:
    """Compare two traces: step time, kernels, GPU busy, idle by kind, floors, per-class deltas."""
    from stepscope import options as opt
    from stepscope.analysis.compare import compare as run_compare
    from stepscope.analysis.whatif import DEFAULT, GraphConstants
    from stepscope.errors import StepscopeError

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
    doc = run_compare(_diagnosis(a, step_regex, rules, not no_cache), _diagnosis(b, step_regex, rules, not no_cache),
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
) -> None:
    """Project the step time per tensor-parallel width (Equation 1.3) and name where launches bind."""
    from stepscope import options as opt
    from stepscope.analysis import tp as tpm
    from stepscope.errors import StepscopeError

    ws = _widths(widths)
    try:
        opt.integer(kernels, "--kernels", 0, opt.MAX_KERNELS)
        opt.number(launch_us, "--launch-us", 0, opt.MAX_HOST_US)
        opt.number(device_ms, "--device-ms", 0, opt.MAX_DEVICE_MS)
        opt.number(collective_us, "--collective-us", 0, opt.MAX_COLLECTIVE_US)
    except StepscopeError as e:
        fail(str(e))
    numbers = (kernels, launch_us, device_ms)
    ranks = None
    if trace is None:
        if None in numbers:
            fail("give a trace, or all of --kernels, --launch-us and --device-ms")
        layers = 32 if collective_us else 0
        proj = tpm.project(kernels, launch_us * 1e3, device_ms * 1e6, 0.0, ws, 1, layers,
                           (collective_us or 0) * 1e3 * tpm.ALLREDUCES_PER_LAYER)
        if collective_us:
            proj.notes.append(f"collective: {tpm.ALLREDUCES_PER_LAYER} all-reduces × {collective_us} µs "
                              "per layer, 32 layers assumed")
    else:
        if any(v is not None for v in numbers):
            fail("give either a trace or --kernels/--launch-us/--device-ms, not both")
        d = _diagnosis(trace, step_regex, rules, not no_cache)
        proj = tpm.project_trace(d.inv, d.floors, ws, collective_us)
        r = tpm.rank_table(d.inv)
        if r.select("pid", "device").unique().height > 1:
            ranks = r
        else:
            proj.notes.append("single-rank trace: the collective cost is estimated, not measured")
    doc = {"inputs": proj.inputs, "projection": proj.rows, "launch_bound_from_tp": proj.launch_bound_from_tp,
           "notes": proj.notes}
    if ranks is not None:
        doc["ranks"] = ranks.drop("step").to_dicts()
        doc["rank_skew_ns"] = int(ranks["step_time_ns"].max() - ranks["step_time_ns"].min())
    if json_out:
        from stepscope.render.json import dumps

        typer.echo(dumps(doc))
        return
    from stepscope.render.terminal import render_tp

    render_tp(doc)
