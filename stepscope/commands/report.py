"""`stepscope report` (HTML / Markdown, chosen by -o's extension) and `stepscope export` (Perfetto)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from stepscope.commands.app import CalibrationFile, Force, Rules, StepRegex, Steps, TraceArg, output_option, steps_option, Strict


def is_stdout(path) -> bool:
    from stepscope.render.output import is_stdout as stdout

    return stdout(path)


def report(
    trace: TraceArg,
    output: Annotated[Path, output_option("report.html (self-contained, offline) or report.md")],
    compare: Annotated[Optional[Path], typer.Option(help="a second trace: its step is drawn beside the first")] = None,
    cells: Annotated[Optional[Path], typer.Option(help="cells table (stepscope cells): adds the byte budget")] = None,
    steps: Annotated[Optional[str], steps_option(
        "; the report draws the one selected, or a typical one among several (default: all)", old_name=True)] = None,
    compare_steps: Annotated[Optional[str], typer.Option(
        "--compare-steps", "--compare-step", metavar="S", help="the same, for the --compare trace")] = None,
    step_regex: StepRegex = None, strict: Strict = False, rules: Rules = None, calibration: CalibrationFile = None,
    model: Annotated[Optional[str], typer.Option(help="with --cells: the model card (default: from the step's "
                                                      "name or the capture's sidecar, as budget reads it)")] = None,
    batch: Annotated[Optional[int], typer.Option(help="with --cells: sequences in the step")] = None,
    context: Annotated[Optional[int], typer.Option(help="with --cells: context length (decode) / prompt length "
                                                        "(prefill)")] = None,
    phase: Annotated[Optional[str], typer.Option(help="with --cells: decode | prefill")] = None,
    format: Annotated[Optional[str], typer.Option(
        "--format", metavar="html|md", help="the format, when -o's extension does not say it (-o -: html)")] = None,
    force: Force = False,
) -> None:
    """Write one step's report: the verdict, timeline, class breakdown, gaps, floors."""
    from stepscope import library
    from stepscope.pipeline import Options
    from stepscope.render import progress

    with progress.shown():
        done = library.report(trace, output, Options(rules=rules, step_regex=step_regex, strict=strict,
                                                    calibration=calibration),
                              format=format, compare=compare, cells=cells, steps=steps, compare_steps=compare_steps,
                              model=model, batch=batch, context=context, phase=phase, force=force)
    if is_stdout(output):  # stdout holds the report alone
        return
    typer.echo(f"wrote {output} ({output.stat().st_size / 1024:,.0f} KiB): step {done.steps[0]} of {trace}"
               + (f" vs step {done.steps[1]} of {compare}" if compare is not None else ""))


def export(trace: TraceArg,
           output: Annotated[Path, output_option("Chrome trace JSON for ui.perfetto.dev (step.json, or step.json.gz "
                                                 "for gzip)")],
           steps: Steps = "all", step_regex: StepRegex = None, strict: Strict = False,
           rules: Rules = None, force: Force = False) -> None:
    """Write chosen steps as Chrome trace JSON: kernel class as category, a track per stream
    (overlapping kernels on lanes of their own), host launch calls, and flow arrows from each
    launch call to its kernel."""
    from stepscope import library
    from stepscope.pipeline import Options
    from stepscope.render import progress

    with progress.shown():
        done = library.export(trace, output, Options(rules=rules, step_regex=step_regex, strict=strict),
                              steps=steps, force=force)
    if is_stdout(output):  # stdout holds the export alone
        return
    from stepscope.render.units import plural

    typer.echo(f"wrote {output}: {plural(len(done.steps), 'step')}, {done.activities:,} GPU activities; "
               "open it at https://ui.perfetto.dev")
