"""`stepscope analyze`: a trace → its steps, each with its classes, gaps, floors and verdict."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from stepscope.commands.app import AsJson, NoCache, Rules, StepRegex, Steps, app

DefaultTrace = Annotated[Optional[Path], typer.Argument(help="nsys SQLite export (default: a bundled real H200 trace)")]


@app.command()
def analyze(trace: DefaultTrace = None, step_regex: StepRegex = None, rules: Rules = None, as_json: AsJson = False,
            steps: Steps = "all", no_cache: NoCache = False,
            kinds: bool = typer.Option(False, "--kinds", help="a run of many kinds of step: also each kind's "
                                       "verdict and diagnosis below the run view")) -> None:
    """Split a trace into steps and inventory each step's kernels by class."""
    from stepscope import library
    from stepscope.analysis.memory import ONE_SHOT
    from stepscope.render import progress
    from stepscope.selection import check_steps, parse_steps

    check_steps(steps)  # a bad --steps fails before the trace is read
    with progress.shown(not as_json):
        d = library.diagnosis(trace, step_regex, rules, cache=not no_cache, memory=ONE_SHOT)
        ids = parse_steps(steps, d.inv.steps)
    if as_json:
        from stepscope.render.json import analyze_json

        from stepscope.analysis.run import run_view

        run = run_view(d)
        ONE_SHOT.results_ready(d)  # the document needs only the per-step results
        typer.echo(analyze_json(d.inv, ids, d, run=run))
        return
    from stepscope.render.terminal import render_steps

    from stepscope.analysis.run import run_view

    render_steps(d, ids, run=run_view(d), kinds=kinds)
