"""`stepscope analyze`: a trace → its steps, each with its classes, gaps, floors and verdict;
several reports of one run → one run view (stepscope/reports.py, analysis/reports_run.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, List, Optional

import typer

from stepscope.commands.app import AsJson, CalibrationFile, NoCache, Rules, StepRegex, Steps, Strict

DefaultTrace = Annotated[Optional[List[Path]], typer.Argument(
    help="nsys SQLite export (default: a bundled real H200 trace); several, a directory of exports or a glob: "
         "the reports of one run (one per rank or node), analyzed as one run")]
Scheduler = Annotated[Optional[str], typer.Option(
    "--scheduler", metavar="ADDRESS", help="several reports: analyze them on this dask cluster (tcp://host:8786); "
    "its workers must see the reports' paths")]
WindowSteps = Annotated[Optional[int], typer.Option(
    "--window-steps", metavar="N", min=0, help="a long run: analyze it N step ranges (vLLM scheduler ranges, "
    "engine-loop steps) at a time, in bounded memory (default: sized by the export, windows only past 2M kernels; 0: read it whole)")]
Workers = Annotated[Optional[int], typer.Option(
    "--workers", metavar="N", help="several reports: the local dask cluster's workers (default: sized to the machine)")]


def analyze(trace: DefaultTrace = None, step_regex: StepRegex = None, strict: Strict = False, rules: Rules = None, as_json: AsJson = False,
            steps: Steps = "all", no_cache: NoCache = False, calibration: CalibrationFile = None,
            kinds: bool = typer.Option(False, "--kinds", help="a run of many kinds of step: also each kind's "
                                       "verdict and diagnosis below the run view"),
            scheduler: Scheduler = None, workers: Workers = None, window_steps: WindowSteps = None) -> None:
    """Split a trace into steps and inventory each step's kernels by class; several reports of
    one run: every rank's steps, the cross-rank skew, the binding rank, transfer vs wait."""
    from stepscope import library
    from stepscope.analysis.memory import ONE_SHOT
    from stepscope.pipeline import Options, render
    from stepscope.render import progress
    from stepscope.selection import check_steps

    check_steps(steps)  # a bad --steps fails before the trace is read
    traces = list(trace or [])
    if len(traces) > 1 or (traces and _is_many(traces[0])):
        return _analyze_run(traces, step_regex, rules, as_json, steps, no_cache, scheduler, workers, strict)
    options = Options(rules=rules, step_regex=step_regex, strict=strict, calibration=calibration, memory=ONE_SHOT,
                      window_steps=window_steps)
    library.check_cluster(scheduler, workers)  # one line for a bad address, before the trace is read
    # under --json the progress shows only while the document goes to a terminal, never to a pipe
    with progress.shown(not as_json or _stdout_is_terminal()):
        result = library.analyze(traces[0] if traces else None, options, steps=steps, cache=not no_cache,
                                 views=not as_json, events=not as_json, scheduler=scheduler, workers=workers)
    if as_json:
        return _print_json(result)
    from stepscope.render.terminal import TerminalRenderer

    typer.echo(render(result, TerminalRenderer(kinds=kinds)), nl=False)


def _print_json(result) -> None:
    """The document on stdout as bytes, written a few steps at a time: a long run's document is
    never held whole (JsonRenderer.write)."""
    import sys

    from stepscope.render.json import JsonRenderer

    out = sys.stdout.buffer
    JsonRenderer().write(result, out)
    out.write(b"\n")
    out.flush()


def _stdout_is_terminal() -> bool:
    import sys

    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):
        return False


def _is_many(p: Path) -> bool:
    """A directory, or a glob pattern that names no file itself: the reports of a run."""
    import glob

    try:
        # a folder of Parquet files is one report (nsys export --type=parquetdir), not a run's reports
        return (p.is_dir() and not any(p.glob("*.parquet"))) or (not p.exists() and glob.has_magic(str(p)))
    except OSError:  # a name too long, a loop: the one-file path says what is wrong with it
        return False


def _analyze_run(traces, step_regex, rules, as_json, steps, no_cache, scheduler, workers, strict) -> None:
    from stepscope import library
    from stepscope.render import progress
    from stepscope.render.reports_run import render_run, run_dict

    with progress.shown(not as_json):
        view = library.run(traces, step_regex=step_regex, rules=rules, steps=steps, cache=not no_cache,
                           scheduler=scheduler, workers=workers, strict=strict)
    if as_json:
        from stepscope.render.json import dumps

        typer.echo(dumps(run_dict(view)))
        return
    render_run(view)
