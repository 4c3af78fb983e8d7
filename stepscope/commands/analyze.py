"""`stepscope analyze`: a trace → its per-step inventory."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Optional

import typer

from stepscope.cli import app, fail
from stepscope.selection import STEPS_HELP


def bundled_trace() -> Path:
    """The real H200 decode-step trace shipped inside the package (the README's first command)."""
    return Path(str(resources.files("stepscope.data").joinpath("fixtures/default.sqlite")))


NO_CACHE_HELP = "read the export itself, not its Parquet cache (and write none)"


def load_inventory(trace: Optional[Path], step_regex: Optional[str], rules: Optional[Path],
                   cache: bool = True, release_input: bool = False, launch_config: bool = False):
    """Read a trace and analyze its steps, naming both stages on the progress line.

    `launch_config`: also read kernels' grid and block (the byte budget and the exports need
    them). `cache=False` neither reads nor writes the Parquet cache (ingest/cache.py)."""
    from stepscope.analysis.classify import load_rules
    from stepscope.analysis.inventory import analyze_trace
    from stepscope.ingest import read_trace
    from stepscope.render import progress

    path = Path(trace or bundled_trace())
    progress.stage(f"reading {path.name}")
    trace_obj = read_trace(path, launch_config=launch_config, cache=None if cache else False)
    if trace_obj.cache_entry is not None:
        progress.notice(f"cached {path.name}'s frames in {trace_obj.cache_entry} (the next read of this export "
                        "skips SQLite; --no-cache reads without it)")
    progress.stage(f"analyzing {trace_obj.kernels.height:,} kernels of {path.name}")
    # read without grid/block; the few kernels whose launch configuration is phase evidence
    # are read from the export when a step's name records no phase
    reader = None
    if trace_obj.format == "nsys-sqlite" and not launch_config:
        from stepscope.launch_config import nsys_reader

        reader = nsys_reader(trace_obj.path)
    return analyze_trace(trace_obj, step_regex, load_rules(rules), release_input=release_input,
                         launch_config=reader)


@app.command()
def analyze(
    trace: Optional[Path] = typer.Argument(None, help="nsys SQLite export (default: a bundled real H200 trace)"),
    step_regex: Optional[str] = typer.Option(None, "--step-regex", help="regex for NVTX step range names"),
    rules: Optional[Path] = typer.Option(None, "--rules", help="TOML file of extra classification rules"),
    json_out: bool = typer.Option(False, "--json", help="print one JSON document on stdout"),
    steps: str = typer.Option("all", "--steps", help=STEPS_HELP),
    no_cache: bool = typer.Option(False, "--no-cache", help=NO_CACHE_HELP),
) -> None:
    """Split a trace into steps and inventory each step's kernels by class."""
    from stepscope.errors import StepscopeError
    from stepscope.selection import check_steps, parse_steps

    from stepscope.render import progress

    with progress.shown(not json_out):
        try:
            check_steps(steps)  # a bad --steps fails before the trace is read
            inv = load_inventory(trace, step_regex, rules, cache=not no_cache, release_input=True)
            ids = parse_steps(steps, inv.step_ids())
        except StepscopeError as e:
            fail(str(e))
        from stepscope.analysis.diagnosis import diagnose
        from stepscope.render.json import analyze_json

        progress.stage("finding gaps, launch overhead and floors")
        diag = diagnose(inv)
    if json_out:
        diag.drop_event_frames()  # the document needs only per-step results
        typer.echo(analyze_json(inv, ids, diag))
        return
    from stepscope.render.terminal import render_analyze, render_diagnosis, verdict_line

    render_analyze(inv, ids, extra=lambda step, members, console: render_diagnosis(diag, step, console),
                   headline=lambda step: verdict_line(diag, step))
