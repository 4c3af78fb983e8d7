"""`stepscope calibrate`: the what-if's constants measured on the user's own graph captures."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from stepscope.commands.app import AsJson, NoCache, Rules, StepRegex, Strict


def calibrate(
    traces: Annotated[list[Path], typer.Argument(
        help="graph captures (nsys exports with --cuda-graph-trace=node); an eager capture named like one "
             "(graph → eager in the file name) is its twin")],
    output: Annotated[Optional[Path], typer.Option(
        "-o", "--output", metavar="F",
        help="calibration file to write (default: $XDG_CONFIG_HOME/stepscope/calibration.json, which "
             "analyze, compare, tp and report then use)")] = None,
    as_json: AsJson = False, step_regex: StepRegex = None, strict: Strict = False, rules: Rules = None, no_cache: NoCache = False,
) -> None:
    """Measure the what-if CUDA-graph constants (graph launch lead, gaps between graph nodes,
    prologue) on graph captures of this machine and write them as a calibration file."""
    from stepscope import library
    from stepscope.analysis.whatif import user_calibration_path
    from stepscope.paths import refuse_overwrite
    from stepscope.render import progress

    out = output if output is not None else user_calibration_path()
    refuse_overwrite(out, list(traces))
    with progress.shown(not as_json):
        cal = library.calibrate(traces, out, step_regex=step_regex, rules=rules, cache=not no_cache, strict=strict)
    if as_json:
        import json

        typer.echo(json.dumps({**json.loads(cal.to_json()), "written": str(out), "notes": list(cal.notes)}))
        return
    from stepscope.render.console import page
    from stepscope.render.names import term
    from stepscope.render.sentences import calibration_lines

    for n in cal.notes:
        typer.echo(f"stepscope: note: {n}", err=True)
    con = page()  # wrapped to the terminal, a figure never parted from its unit
    for line in calibration_lines(cal, out):
        con.print(term(line, 2000), highlight=False)
