"""`stepscope report` (HTML / Markdown, chosen by -o's extension) and `stepscope export` (Perfetto)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from stepscope.cli import app, fail
from stepscope.selection import STEPS_HELP

REPORT_FORMATS = {".html": "html", ".htm": "html", ".md": "markdown", ".markdown": "markdown"}


def _load(trace: Path, step_regex: Optional[str], rules: Optional[Path]):
    from stepscope.commands.analyze import load_inventory

    return load_inventory(trace, step_regex, rules, launch_config=True)  # grid/block: budget, export args


@app.command()
def report(
    trace: Path = typer.Argument(..., help="nsys SQLite export or PyTorch-profiler trace (.json/.json.gz)"),
    output: Path = typer.Option(..., "-o", "--output", help="report.html (self-contained, offline) or report.md"),
    compare: Optional[Path] = typer.Option(None, "--compare", help="a second trace: its step is drawn beside the first"),
    cells: Optional[Path] = typer.Option(None, "--cells", help="cells table (stepscope cells): adds the byte budget"),
    steps: Optional[str] = typer.Option(
        None, "--steps", "--step", metavar="S",
        help=f"{STEPS_HELP}; the report draws the one selected, or a typical one among several (default: all)"),
    compare_steps: Optional[str] = typer.Option(
        None, "--compare-steps", "--compare-step", metavar="S", help="the same, for the --compare trace"),
    step_regex: Optional[str] = typer.Option(None, "--step-regex", help="regex for NVTX / annotation step names"),
    rules: Optional[Path] = typer.Option(None, "--rules", help="TOML file of extra classification rules"),
) -> None:
    """Write one step's report: timeline, class breakdown, gaps, floors and verdict."""
    from stepscope.errors import StepscopeError
    from stepscope.render import progress
    from stepscope.selection import check_steps

    fmt = REPORT_FORMATS.get(output.suffix.lower())
    if fmt is None:
        fail(f"-o {output}: the extension picks the format; use .html or .md")
    try:
        check_steps(steps)  # a bad selection fails before any trace is read
        check_steps(compare_steps)
        from stepscope.analysis.diagnosis import diagnose
        from stepscope.paths import refuse_overwrite
        from stepscope.render.output import write_atomic
        from stepscope.render.report_data import budget_for, chosen, pick_step, step_view

        refuse_overwrite(output, [trace, compare, cells, rules])  # before the work, not after
        with progress.shown():
            inv = _load(trace, step_regex, rules)
            progress.stage(f"finding gaps, launch overhead and floors of {trace.name}")
            d = diagnose(inv)  # once: the picked step, its floors and its TP peers all read it
            view = step_view(inv, pick_step(inv, steps, d), d, chosen=chosen(inv, steps))
            other = None
            if compare is not None:
                inv2 = _load(compare, step_regex, rules)
                progress.stage(f"finding gaps, launch overhead and floors of {compare.name}")
                d2 = diagnose(inv2)
                other = step_view(inv2, pick_step(inv2, compare_steps, d2), d2, chosen=chosen(inv2, compare_steps))
            budget, budget_note = budget_for(view, cells)
            progress.stage(f"writing {output.name}")
            if fmt == "html":
                from stepscope.render.html import render_html

                text = render_html(view, other, budget=budget, budget_note=budget_note)
            else:
                from stepscope.render.markdown import render_markdown

                text = render_markdown(view, other, budget=budget, budget_note=budget_note)
            write_atomic(output, text)
    except StepscopeError as e:
        fail(str(e))
    typer.echo(f"wrote {output} ({output.stat().st_size / 1024:,.0f} KiB): step {view.step} of {trace}"
               + (f" vs step {other.step} of {compare}" if other else ""))


@app.command()
def export(
    trace: Path = typer.Argument(..., help="nsys SQLite export or PyTorch-profiler trace (.json/.json.gz)"),
    output: Path = typer.Option(..., "-o", "--output",
                                help="Chrome trace JSON for ui.perfetto.dev (step.json, or step.json.gz for gzip)"),
    steps: str = typer.Option("all", "--steps", help=STEPS_HELP),
    step_regex: Optional[str] = typer.Option(None, "--step-regex", help="regex for NVTX / annotation step names"),
    rules: Optional[Path] = typer.Option(None, "--rules", help="TOML file of extra classification rules"),
) -> None:
    """Write chosen steps as Chrome trace JSON: kernel class as category, a track per stream
    (overlapping kernels on lanes of their own), host launch calls, and flow arrows from each
    launch call to its kernel."""
    from stepscope.errors import StepscopeError
    from stepscope.render import progress

    try:
        from stepscope.paths import refuse_overwrite
        from stepscope.render.output import write_atomic
        from stepscope.render.perfetto import encode, export_document
        from stepscope.selection import check_steps, parse_steps

        refuse_overwrite(output, [trace, rules])
        check_steps(steps)  # a bad selection fails before the trace is read
        with progress.shown():
            inv = _load(trace, step_regex, rules)
            ids = parse_steps(steps, inv.step_ids())
            progress.stage(f"writing {len(ids)} step(s) to {output.name}")
            doc = export_document(inv, ids)
            write_atomic(output, encode(doc, gzipped=output.suffix.lower() == ".gz"))
    except StepscopeError as e:
        fail(str(e))
    n = sum(1 for e in doc["traceEvents"] if e["ph"] == "X" and e.get("cat") not in ("launch", "step"))
    typer.echo(f"wrote {output}: {len(ids)} step(s), {n:,} GPU activities; open it at https://ui.perfetto.dev")
