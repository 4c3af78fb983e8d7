"""`stepscope budget TRACE --cells CELLS`: one step's HBM bytes, measured vs minimum.

Listed in stepscope/commands/__init__.py's COMMANDS, as every command.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from stepscope.commands.app import AsJson, steps_option


def budget_cmd(
    trace: Annotated[Path, typer.Argument(help="nsys SQLite export of the engine step(s)")],
    cells: Annotated[Path, typer.Option("--cells", help="cells file from `stepscope cells run/import`")],
    model: Annotated[Optional[str], typer.Option(help="model card (default: from the step's NVTX name)")] = None,
    batch: Annotated[Optional[int], typer.Option(help="sequences in the step")] = None,
    context: Annotated[Optional[int], typer.Option(help="context length (decode) / prompt length (prefill)")] = None,
    phase: Annotated[Optional[str], typer.Option(help="decode | prefill")] = None,
    steps: Annotated[Optional[str], steps_option(
        ": the first step selected is budgeted (default: the trace's first step)", old_name=True)] = None,
    as_json: AsJson = False,
) -> None:
    """Join each kernel of a step to a measured byte cell; bytes, minimum, removable, floor."""
    from stepscope import library
    from stepscope.render import progress

    with progress.shown(not as_json):
        doc = library.budget(trace, cells, model=model, batch=batch, context=context, phase=phase, steps=steps)
    from stepscope.render.bytes import budget_json, render_budget

    if as_json:
        typer.echo(budget_json(doc))
    else:
        render_budget(doc)
