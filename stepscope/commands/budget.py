"""`stepscope budget TRACE --cells CELLS`: one step's HBM bytes, measured vs minimum.

Registered from stepscope/commands/cells.py (imported by cli.py), so cli.py carries a single
registration line for the byte side.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from stepscope.cli import app, fail
from stepscope.selection import STEPS_HELP


@app.command("budget")
def budget_cmd(
    trace: Path = typer.Argument(..., help="nsys SQLite export of the engine step(s)"),
    cells: Path = typer.Option(..., "--cells", help="cells file from `stepscope cells run/import`"),
    model: Optional[str] = typer.Option(None, help="model card (default: from the step's NVTX name)"),
    batch: Optional[int] = typer.Option(None, help="sequences in the step"),
    context: Optional[int] = typer.Option(None, help="context length (decode) / prompt length (prefill)"),
    phase: Optional[str] = typer.Option(None, help="decode | prefill"),
    steps: Optional[str] = typer.Option(
        None, "--steps", "--step", metavar="S",
        help=f"{STEPS_HELP}: the first step selected is budgeted (default: the trace's first step)"),
    as_json: bool = typer.Option(False, "--json", help="machine-readable output"),
) -> None:
    """Join each kernel of a step to a measured byte cell; bytes, minimum, removable, floor."""
    from stepscope import options as opt
    from stepscope.errors import StepscopeError
    from stepscope.selection import check_steps

    from stepscope.render import progress

    try:
        check_steps(steps)
        opt.integer(batch, "--batch", 1, opt.MAX_BATCH)
        opt.integer(context, "--context", 1, opt.MAX_CONTEXT)
        with progress.shown(not as_json):
            doc, res = _run(trace, cells, model, batch, context, phase, steps)
    except StepscopeError as e:
        fail(str(e), e.exit_code)
        return
    if as_json:
        typer.echo(json.dumps(doc, indent=1, default=str))
    else:
        _render(doc, res)


def _run(trace, cells_path, model, batch, context, phase, steps):
    import polars as pl

    from stepscope.analysis.steps import step_shape
    from stepscope.bytes.budget import budget, step_kernels_from_inventory
    from stepscope.bytes.cells import read_cells
    from stepscope.errors import InputError
    from stepscope.selection import parse_steps

    from stepscope.commands.analyze import load_inventory
    from stepscope.paths import shown
    from stepscope.render import progress

    cells = read_cells(cells_path)
    inv = load_inventory(trace, None, None, launch_config=True)  # grid/block: the join to cells
    if inv.steps.height == 0:
        raise InputError(f"{trace}: no steps found")
    picked = parse_steps(steps, inv.step_ids())
    sid = picked[0]
    if steps not in (None, "") and len(picked) > 1:
        typer.echo(f"stepscope: budget of step {sid}, the first of the {len(picked)} steps selected", err=True)
    fig = inv.steps.filter(pl.col("step") == sid).row(0, named=True)
    # the step's name first; what stepscope trace recorded beside the export (vLLM's step names
    # carry neither the model nor the context) fills the rest
    shape = {**((inv.trace.sidecar or {}).get("shape") or {}), **step_shape(fig.get("name"))}
    model = model or shape.get("model")
    phase = phase or shape.get("phase") or fig.get("phase")
    batch = batch or shape.get("batch")
    context = context or shape.get("context")
    lacking = [n for n, v in (("--model", model), ("--phase", phase), ("--batch", batch),
                              ("--context", context)) if not v]
    if lacking:
        raise InputError(f"the step's name does not record {', '.join(lacking)}: pass them")
    gpus = inv.trace.gpus
    gpu_name = gpus["name"][0] if gpus.height else None
    peak = None
    if gpus.height and gpus["memory_bandwidth_bps"][0]:
        peak = float(gpus["memory_bandwidth_bps"][0])
    progress.stage(f"joining step {sid}'s kernels to {cells_path.name}")
    sk = step_kernels_from_inventory(inv, sid, memops=True)
    tp = shape.get("tp") if isinstance(shape.get("tp"), int) else 1
    from stepscope.bytes.stepcells import is_step_cells

    if is_step_cells(cells):  # the step's own kernels, measured one by one in launch order
        from stepscope.bytes.budget import budget_order, step_sequence_from_inventory

        res = budget_order(step_sequence_from_inventory(inv, sid), cells, model, int(batch), int(context),
                           str(phase), gpu_name, peak, tp=tp, memops=sk)
    else:
        res = budget(sk, cells, model, int(batch), int(context), str(phase), gpu_name, peak, tp=tp)
    doc = {"trace": shown(trace), "cells": shown(cells_path), "step_index": sid, "model": model,
           **res.to_dict()}
    doc["step"] = {**res.step, "model": model}
    return doc, res


def _render(doc, res) -> None:
    import polars as pl
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
    for r in res.rows.iter_rows(named=True):
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
    below = res.rows.filter(pl.col("note").is_not_null())
    if below.height:
        con.print("below their minimum (DRAM bytes only: inputs the previous kernel left in L2 were read "
                  "from L2, outputs still in the write-back L2 at the kernel's end are not counted; ncu's "
                  "hit rate exceeds 100 % on tiny kernels and is shown as 100): "
                  + ", ".join(f"{r['op'] or r['class']} ({r['note'].split(': ', 1)[-1]})"
                              for r in below.iter_rows(named=True)))
    for u in st["unjoined_kernels"][:15]:
        con.print(f"  [yellow]no cell[/] {term(u['class']):<16} {u['count']:>4}× {term(u['name'])}"
                  + (f" [dim]({term(u['reason'])})[/]" if u.get("reason") else ""))
    for w in doc.get("warnings", []):
        con.print(f"[yellow]warning:[/] {term(w, 2000)}")
