"""`stepscope budget TRACE --cells CELLS`: one step's HBM bytes, measured vs minimum.

Registered from stepscope/commands/cells.py (imported by cli.py), so cli.py carries a single
registration line for the byte side.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from stepscope.commands.app import AsJson, app, steps_option


@app.command("budget")
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
    if as_json:
        typer.echo(json.dumps(doc, indent=1, default=str))
    else:
        _render(doc)


def _render(doc) -> None:
    from rich.console import Console
    from rich.table import Table

    from stepscope.render.names import term
    from stepscope.render.units import MISSING, nbytes, us

    con = Console()
    st = doc["step"]
    t = Table(title=f"HBM byte budget — step {doc['step_index']} ({term(st['phase'])}, batch "
              f"{st['batch']}, context {st['context']}, {term(doc['model'])}) on {term(doc['gpu'] or '?')}")
    for c in ("class", "op", "calls", "bytes/call", "measured", "minimum", "ampl.",
              "removable", "floor", "kernel time"):
        t.add_column(c, justify="left" if c in ("class", "op") else "right")
    for r in doc["rows"]:
        amp = r["amplification"]
        t.add_row(term(r["class"]), term(r["op"]) if r["op"] else "[dim](no cell)[/]", str(r["calls"]),
                  nbytes(r["measured_bytes_per_call"]), nbytes(r["measured_bytes"]), nbytes(r["min_bytes"]),
                  f"{amp:.2f}" if amp is not None else MISSING, nbytes(r["removable_bytes"]),
                  us(r["floor_ns"]), us(r["time_ns"]))
    t.add_row("[bold]step[/]", "", str(st["calls"]), "", nbytes(st["measured_bytes"]),
              nbytes(st["min_bytes"]),
              f"{st['amplification']:.2f}" if st["amplification"] else MISSING,
              nbytes(st["removable_bytes"]),
              us(st["floor_ns"]), us(st["time_ns"]))
    con.print(t)
    ranked = [c for c in doc["classes"] if c["removable_bytes"] is not None]
    if ranked:
        con.print("classes by removable bytes: " + ", ".join(
            f"{term(c['class'])} {nbytes(c['removable_bytes'])}" for c in ranked[:5]))
    j = st["joined"]
    if j.get("order"):
        o = st["order"]
        con.print(f"joined by launch order: {j['order']} of the step's {o['step_kernels']} kernels to the "
                  f"{o['profiled_kernels']} profiled kernels of the step's own ncu run, checked by name; "
                  f"{j.get('trace', 0)} memops by their trace bytes")
    else:
        con.print(f"joined: {j['launch']} calls by kernel+grid+block, {j['name']} by name only, "
                  f"{j['op']} by op, {j.get('trace', 0)} memops by their trace bytes; "
                  f"{len(st['unjoined_kernels'])} kernel(s) without a cell")
    if st.get("unjoined_ops"):
        con.print(f"minimum over the joined ops: {nbytes(st['min_bytes'])}; ops no kernel joined "
                  f"({', '.join(st['unjoined_ops'])}) add {nbytes(st['unjoined_min_bytes'])} to the step's "
                  f"{nbytes(st['plan_min_bytes'])}")
    below = [r for r in doc["rows"] if r.get("note") is not None]
    if below:
        con.print("below their minimum (DRAM bytes only: inputs the previous kernel left in L2 were read "
                  "from L2, outputs still in the write-back L2 at the kernel's end are not counted; ncu's "
                  "hit rate exceeds 100 % on tiny kernels and is shown as 100): "
                  + ", ".join(f"{r['op'] or r['class']} ({r['note'].split(': ', 1)[-1]})"
                              for r in below))
    for u in st["unjoined_kernels"][:15]:
        con.print(f"  [yellow]no cell[/] {term(u['class']):<16} {u['count']:>4}× {term(u['name'])}"
                  + (f" [dim]({term(u['reason'])})[/]" if u.get("reason") else ""))
    for w in doc.get("warnings", []):
        con.print(f"[yellow]warning:[/] {term(w, 2000)}")
