"""`stepscope compare` and `stepscope tp`: two traces side by side, and Equation 1.3 per TP width."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from stepscope.commands.app import AsJson, CalibrationFile, NoCache, Rules, StepRegex, steps_option, Strict


def _echo_json(doc: dict) -> None:
    from stepscope.render.json import dumps

    typer.echo(dumps(doc))


def compare(
    a: Annotated[Path, typer.Argument(help="trace A (typically eager, or 'before')")],
    b: Annotated[Path, typer.Argument(help="trace B (typically CUDA graph, or 'after')")],
    as_json: AsJson = False,
    fail_above: Annotated[Optional[float], typer.Option(
        "--fail-above", metavar="PCT",
        help="exit 1 when B's step time is worse than A's by more than PCT percent (CI gating)")] = None,
    graph_gap_ns: Annotated[Optional[float], typer.Option(help="what-if: device gap per graph node")] = None,
    graph_launch_ns: Annotated[Optional[float], typer.Option(help="what-if: graph launch lead")] = None,
    step_regex: StepRegex = None, strict: Strict = False, rules: Rules = None, no_cache: NoCache = False,
    steps: Annotated[str, steps_option(": the steps whose medians stand for each trace")] = "all",
    steps_b: Annotated[Optional[str], typer.Option("--steps-b", metavar="S", help="B's steps, when not --steps")] = None,
    calibration: CalibrationFile = None,
) -> None:
    """Compare two traces: step time, kernels, GPU busy, idle by kind, floors, per-class deltas."""
    from stepscope import library, options
    from stepscope.pipeline import Options
    from stepscope.render import progress

    options.number(fail_above, "--fail-above", -100, 1e9)
    with progress.shown(not as_json):
        doc = library.compare(a, b, Options(rules=rules, step_regex=step_regex, strict=strict, calibration=calibration),
                              steps=steps, steps_b=steps_b, graph_gap_ns=graph_gap_ns,
                              graph_launch_ns=graph_launch_ns, cache=not no_cache)
    if as_json:
        _echo_json(doc)
    else:
        from stepscope.render.terminal import render_compare

        render_compare(doc)
    for w in doc["warnings"]:
        typer.echo(f"stepscope: warning: {w}", err=True)
    worse = 100 * (1 / doc["speedup"] - 1) if doc["speedup"] else None
    if fail_above is not None and worse is not None and worse > fail_above:
        typer.echo(f"stepscope: B's step time is {worse:.1f}% worse than A's (limit {fail_above}%)", err=True)
        raise typer.Exit(1)


def tp(
    trace: Annotated[Optional[Path], typer.Argument(help="a trace to project (one or more ranks)")] = None,
    widths: Annotated[str, typer.Option(help="TP widths to project")] = "1,2,4,8",
    kernels: Annotated[Optional[int], typer.Option(help="numbers alone: launches per step")] = None,
    launch_us: Annotated[Optional[float], typer.Option(help="numbers alone: host µs per launch")] = None,
    device_ms: Annotated[Optional[float], typer.Option(help="numbers alone: device floor at TP=1")] = None,
    collective_us: Annotated[Optional[float], typer.Option(help="cost of one all-reduce (µs)")] = None,
    as_json: AsJson = False, step_regex: StepRegex = None, strict: Strict = False, rules: Rules = None, no_cache: NoCache = False,
    steps: Annotated[str, steps_option(": the steps projected")] = "all",
    calibration: CalibrationFile = None,
    expert_parallel: Annotated[bool, typer.Option(
        "--expert-parallel", help="MoE: the experts split across the GPUs (vLLM's --enable-expert-parallel) "
        "instead of each expert sharded; needs --model")] = False,
    model: Annotated[Optional[str], typer.Option(help="with --expert-parallel: the MoE model card")] = None,
) -> None:
    """Project the step time per tensor-parallel width (Equation 1.3) and name where launches bind."""
    from stepscope import library
    from stepscope.pipeline import Options
    from stepscope.render import progress

    with progress.shown(not as_json and trace is not None):
        doc = library.tp(trace, Options(rules=rules, step_regex=step_regex, strict=strict, calibration=calibration),
                         widths=widths, kernels=kernels, launch_us=launch_us, device_ms=device_ms,
                         collective_us=collective_us, steps=steps, cache=not no_cache,
                         expert_parallel=expert_parallel, model=model)
    if as_json:
        _echo_json(doc)
        return
    from stepscope.render.terminal import render_tp

    render_tp(doc)
    for w in doc.get("warnings", []):
        typer.echo(f"stepscope: warning: {w}", err=True)
